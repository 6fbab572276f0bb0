"""The agent contract (remote_ops/agent/contract.py) against the sources of both sides.

Every failure kind the agent raises is declared and maps to an exit status; every operation the agent
serves is declared with the argument keys it reads; the controller sends only declared operations and
argument keys. Adding a kind or an operation without declaring it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote_ops.agent.contract import KINDS, OPS
from remote_ops.connect.bundle import agent_source_files
from remote_ops.errors import AgentError, Exit, RefusedError, agent_error, exit_for_kind
from tests.conftest import REPO

ROOT = REPO / "remote_ops"
AGENT_FILES = sorted(agent_source_files().values())
CONTROLLER_FILES = sorted(p for p in ROOT.rglob("*.py") if "agent" not in p.relative_to(ROOT).parts)


def raised_kinds(path: Path, text: str | None = None) -> dict[str, list[str]]:
    """{kind: [file:line]} for every ``AgentFailure(kind, ...)`` in a source file. A kind held in a
    variable counts with every string constant assigned to that variable in the same function."""
    tree = ast.parse(text if text is not None else path.read_text())
    out: dict[str, list[str]] = {}
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in funcs or [tree]:
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AgentFailure"):
                continue
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                values = [arg.value]
            elif isinstance(arg, ast.Name):
                values = [c.value for a in ast.walk(fn) if isinstance(a, ast.Assign)
                          and any(getattr(t, "id", None) == arg.id for t in a.targets)
                          for c in ast.walk(a.value) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                assert values, f"{path.name}:{node.lineno}: the kind {arg.id} is never given a literal value"
            else:
                raise AssertionError(f"{path.name}:{node.lineno}: AgentFailure's kind must be a literal")
            for v in values:
                out.setdefault(v, []).append(f"{path.name}:{node.lineno}")
    return out


def all_raised() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in AGENT_FILES:
        for k, where in raised_kinds(p).items():
            out.setdefault(k, []).extend(where)
    return out


def test_every_raised_kind_is_declared():
    raised = all_raised()
    assert len(raised) > 20       # the enumeration found the agent's kinds (not an empty walk)
    undeclared = {k: w for k, w in raised.items() if k not in KINDS}
    assert not undeclared, f"declare these kinds in remote_ops/agent/contract.py KINDS: {undeclared}"


def test_the_enumeration_catches_an_undeclared_kind(tmp_path):
    src = ("def op_x(args):\n    raise AgentFailure('brand-new', 'm')\n"
           "def op_y(args):\n    kind = 'disk-full' if args else 'also-new'\n    raise AgentFailure(kind, 'm')\n")
    found = raised_kinds(tmp_path / "x.py", src)
    assert set(found) == {"brand-new", "disk-full", "also-new"}
    assert {k for k in found if k not in KINDS} == {"brand-new", "also-new"}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_declared_kind_maps_to_one_error_and_exit_status(kind):
    spec = KINDS[kind]
    exc = agent_error({"kind": kind, "message": "m", "hint": "h", "traceback": "tb"}, "host1")
    assert exc.exit_status == Exit[spec.exit]
    assert exc.kind == kind and exc.host == "host1" and exc.message == "m" and exc.hint == "h"
    if spec.refusal:
        assert isinstance(exc, RefusedError) and exit_for_kind(kind) == Exit[spec.exit]
    else:
        assert isinstance(exc, AgentError) and exc.remote_traceback == "tb" and exc.exit_status == Exit.REMOTE
        assert exit_for_kind(kind) == Exit.REFUSED      # a preflight refuses on a failed probe
    assert spec.doc


def test_exit_statuses_scripts_rely_on():
    assert agent_error({"kind": "import-failed"}).exit_status == Exit.IMPORT == 9
    assert agent_error({"kind": "no-job"}).exit_status == Exit.USAGE
    assert agent_error({"kind": "runtime-import-failed"}).exit_status == Exit.REMOTE
    assert agent_error({"kind": "patched-import-failed"}).exit_status == Exit.REFUSED
    for kind in ("changed", "locked", "busy", "no-workdir", "no-torch", "no-output", "bad-args", "missing-target"):
        assert agent_error({"kind": kind}).exit_status == Exit.REFUSED, kind
    unknown = agent_error({"kind": "never-declared", "message": "x"})
    assert isinstance(unknown, AgentError) and unknown.exit_status == Exit.REMOTE


def _op_functions() -> dict[str, ast.FunctionDef]:
    """{"module.op": function} of every ``op_*`` in the agent; the protocol finds an op's module by its
    name at the top of the package, so an ``op_*`` in a subpackage is a mistake (it could never be called)."""
    out = {}
    for key, p in agent_source_files().items():
        module = key.split(".", 1)[1]
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("op_"):
                assert "." not in module, f"{module}.{node.name}: operations live in top-level agent modules"
                out[f"{module}.{node.name[3:]}"] = node
    return out


def _keys_read(fn: ast.FunctionDef) -> set[str]:
    arg = fn.args.args[0].arg
    keys = set()
    for n in ast.walk(fn):
        if isinstance(n, ast.Subscript) and getattr(n.value, "id", None) == arg and isinstance(n.slice, ast.Constant):
            keys.add(n.slice.value)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                and getattr(n.func.value, "id", None) == arg and n.args and isinstance(n.args[0], ast.Constant):
            keys.add(n.args[0].value)
    return keys


def test_every_agent_operation_is_declared_with_the_keys_it_reads():
    ops = _op_functions()
    assert set(ops) == set(OPS), (f"undeclared: {sorted(set(ops) - set(OPS))}; "
                                  f"declared but not served: {sorted(set(OPS) - set(ops))}")
    for name, fn in ops.items():
        extra = _keys_read(fn) - set(OPS[name].args)
        assert not extra, f"{name} reads argument keys not declared in contract.OPS: {sorted(extra)}"


def _op_literals(files):
    """(file:line, op) for every string constant that is an agent op name in ``files`` (the
    controller's sources, remote_ops/connect/agent_requests.py excepted)."""
    for p in files:
        if p.name == "agent_requests.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in OPS:
                yield f"{p.name}:{node.lineno}", node.value


def test_every_operation_has_one_typed_request_and_only_declared_parameters():
    import inspect

    from remote_ops.connect import agent_requests as rq
    builders = {name: fn for name, fn in vars(rq).items() if inspect.isfunction(fn) and not name.startswith("_")}
    assert set(builders) == {op.replace(".", "_") for op in OPS}, "one request function per contract.OPS entry"
    for name, fn in builders.items():
        op = name.replace("_", ".", 1)
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY]
        assert {p.name for p in params} <= set(OPS[op].args), f"{name} takes undeclared keys"
    # the request refuses what the contract does not declare (a typo fails here, not on a host)
    with pytest.raises(TypeError, match="does not take"):
        rq.patching_apply(playbook="x", playbook_path="y")
    assert rq.jobs_stop(job_id="j", grace=1.0) == ("jobs.stop", {"job_id": "j", "grace": 1.0})
    assert rq.jobs_status(key="k") == ("jobs.status", {"key": "k"})    # only what was given is sent


def test_the_controller_names_operations_only_through_typed_requests():
    literals = list(_op_literals(CONTROLLER_FILES))
    assert not literals, f"spell agent ops through remote_ops/connect/agent_requests.py: {literals}"


def test_the_literal_scan_sees_an_op_name(tmp_path):
    """The scan above can fail: a module that spells an op name is found."""
    bad = tmp_path / "bad.py"
    bad.write_text('def f(session):\n    return session.call("jobs.stop", {"job_id": "x", "grace": 1})\n')
    assert [op for _, op in _op_literals([bad])] == ["jobs.stop"]


# ------------------------------------------------------------------ finding kinds: declared once

# Where each check emits a finding kind: (source file or folder under remote_ops/agent, the call's
# name, which positional argument is the kind, the contract's list). A dict literal with a "kind" key
# and a "message" key (a finding record) in those files counts too.
EMITTERS = (
    ("check", "add", 2, "FINDING_KINDS"),            # agent/check/records.py Findings.add
    ("resolve/sigmodel.py", "problems.append", 0, "FINDING_KINDS"),   # bind's (kind, name, message)
    ("drift/compare.py", "_rec", 1, "DRIFT_KINDS"),
    ("model.py", "finding", 0, "MODEL_FINDING_KINDS"),
    ("model.py", None, None, "MODEL_FINDING_KINDS"),
    ("serverflow.py", "add", 0, "SERVER_CHECK_IDS"),  # _Checks.add
    ("serverflow.py", "_fields", 1, "SERVER_CHECK_IDS"),
)


def emitted_kinds(path: Path, call, index, text: str | None = None) -> list[tuple[str, int]]:
    """(kind, line) of every literal kind a file emits: a string, or a family "prefix-" + name."""
    out = []
    tree = ast.parse(text if text is not None else path.read_text())
    for node in ast.walk(tree):
        if call is None and isinstance(node, ast.Dict):
            keys = [k.value if isinstance(k, ast.Constant) else None for k in node.keys]
            if "kind" in keys and "message" in keys:
                arg = node.values[keys.index("kind")]
            else:
                continue
            if isinstance(arg, ast.Name):     # kind = "a" if ... else "b"; {"kind": kind, ...} in one function
                fn = next(f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                          and node in ast.walk(f) and not any(g is not f and isinstance(g, ast.FunctionDef)
                                                              and node in ast.walk(g) for g in ast.walk(f)))
                for a in ast.walk(fn):
                    if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == arg.id for t in a.targets):
                        values = [a.value.body, a.value.orelse] if isinstance(a.value, ast.IfExp) else [a.value]
                        out += [(v.value, node.lineno) for v in values
                                if isinstance(v, ast.Constant) and isinstance(v.value, str)]
                continue
        elif call is not None and isinstance(node, ast.Call) and len(node.args) > index:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if "." in call:      # owner.method: a tuple whose first item is the kind
                name = ast.unparse(node.func)
            if name != call:
                continue
            arg = node.args[index]
            if "." in call:
                if not (isinstance(arg, ast.Tuple) and arg.elts):
                    continue
                arg = arg.elts[0]
        else:
            continue
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            out.append((arg.value, node.lineno))
        elif isinstance(arg, ast.BinOp) and isinstance(arg.left, ast.Constant) and isinstance(arg.left.value, str):
            out.append((arg.left.value, node.lineno))       # a family: "layer-forward-" + kind
    return out


def test_every_emitted_finding_kind_is_declared_in_the_contract():
    from remote_ops.agent import contract
    agent = Path(contract.__file__).parent
    missing, seen = [], {}
    for where, call, index, declared in EMITTERS:
        files = sorted((agent / where).rglob("*.py")) if (agent / where).is_dir() else [agent / where]
        for f in files:
            for kind, line in emitted_kinds(f, call, index):
                seen.setdefault(declared, set()).add(kind)
                if kind not in getattr(contract, declared):
                    missing.append(f"{f.relative_to(agent)}:{line}: {kind!r} is not in contract.{declared}")
    assert not missing, "declare each finding kind once in remote_ops/agent/contract.py:\n" + "\n".join(missing)
    # and every declared kind is emitted somewhere (none left over from a check that went)
    for declared, kinds in seen.items():
        assert set(getattr(contract, declared)) == kinds, declared
    assert set(seen) == {"FINDING_KINDS", "DRIFT_KINDS", "MODEL_FINDING_KINDS", "SERVER_CHECK_IDS"}
    assert set(contract.SERVED_MODEL_CHECKS) <= set(contract.SERVER_CHECK_IDS)


def test_the_kind_scan_sees_literals_families_and_records():
    src = ('def f(r, c, fwd, kind):\n'
           '    r.finding("new-kind", fwd)\n'
           '    r.finding("family-" + kind, fwd)\n'
           '    kind = "a-kind" if fwd else "b-kind"\n'
           '    return [{"kind": "rec-kind", "message": "m"}, {"kind": kind, "message": "m"}]\n')
    assert emitted_kinds(Path("x.py"), "finding", 0, src) == [("new-kind", 2), ("family-", 3)]
    assert sorted(emitted_kinds(Path("x.py"), None, None, src)) == [("a-kind", 5), ("b-kind", 5), ("rec-kind", 5)]
    src = 'def bind(problems, out):\n    problems.append(("too-many", None, "m"))\n    out.append("*")\n'
    assert emitted_kinds(Path("x.py"), "problems.append", 0, src) == [("too-many", 2)]
