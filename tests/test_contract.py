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

ROOT = Path(__file__).resolve().parent.parent / "remote_ops"
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
