"""The agent contract (remote_ops/agent/contract.py) against the sources of both sides.

Every failure kind the agent raises is declared and maps to an exit status; every operation the agent
serves is declared with the argument keys it reads; the controller sends only declared operations and
argument keys. Adding a kind or an operation without declaring it fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from remote_ops.agent.contract import KINDS, OPS
from remote_ops.errors import AgentError, Exit, RefusedError, agent_error, exit_for_kind

ROOT = Path(__file__).resolve().parent.parent / "remote_ops"
AGENT_FILES = sorted((ROOT / "agent").glob("*.py"))
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
    out = {}
    for p in AGENT_FILES:
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("op_"):
                out[f"{p.stem}.{node.name[3:]}"] = node
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


def _controller_requests():
    """(file:line, op, literal argument keys or None) for the operations the controller sends:
    ``x.call("m.f", {...})``, ``x.stream("m.f", {...})`` and ``("m.f", {...})`` pairs of call_many."""
    for p in CONTROLLER_FILES:
        for node in ast.walk(ast.parse(p.read_text())):
            parts = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("call", "stream") and node.args:
                parts = node.args[:2]
            elif isinstance(node, ast.Tuple) and len(node.elts) == 2 and isinstance(node.elts[1], ast.Dict):
                parts = node.elts
            if not parts or not (isinstance(parts[0], ast.Constant) and isinstance(parts[0].value, str)):
                continue
            op = parts[0].value
            if op.count(".") != 1 or not all(x.isidentifier() for x in op.split(".")):
                continue
            keys = None
            if len(parts) > 1 and isinstance(parts[1], ast.Dict):
                keys = {k.value for k in parts[1].keys if isinstance(k, ast.Constant)}
            yield f"{p.relative_to(ROOT)}:{node.lineno}", op, keys


def test_the_controller_sends_declared_operations_and_keys():
    requests = list(_controller_requests())
    assert len(requests) > 15
    for where, op, keys in requests:
        assert op in OPS, f"{where}: {op} is not an operation of contract.OPS"
        if keys is not None:
            assert keys <= set(OPS[op].args), f"{where}: {op} gets undeclared keys {sorted(keys - set(OPS[op].args))}"
