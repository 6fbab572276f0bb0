"""The agent runs on hosts with nothing installed: stdlib only, Python 3.10 syntax."""

from __future__ import annotations

import ast
import sys

import pytest

from remote_ops.connect.bundle import agent_source_files
from tests.conftest import REPO

AGENT = REPO / "remote_ops" / "agent"
FILES = sorted(agent_source_files().values())


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(AGENT)) for p in FILES])
def test_agent_module_is_stdlib_only_and_parses_as_310(path):
    tree = ast.parse(path.read_text(), feature_version=(3, 10))
    allowed_lazy = {"torch"}  # verify.py imports the HOST's torch inside the op, on purpose
    # stdlib under another name in a later Python the agent supports (imported by version):
    # CPython 3.12 merged _sha256 into _sha2
    later_stdlib = {"_sha2"} if sys.version_info < (3, 12) else set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                continue
            names = [(node.module or "").split(".")[0]]
        else:
            continue
        for name in names:
            assert name in sys.stdlib_module_names or name in allowed_lazy or name in later_stdlib, \
                f"{path.name}:{node.lineno} imports non-stdlib {name!r}"
            assert name != "remote_ops", f"{path.name} imports the controller"


def test_bootstrap_runs_under_plain_python(tmp_path):
    import subprocess

    from remote_ops.connect import bundle
    proc = subprocess.run(["sh", "-c", bundle.agent_command(sys.executable)],
                          input=bundle.encode_request([{"op": "ping.ping", "args": {"echo": "ok"}},
                                                       {"op": "../etc.passwd", "args": {}}]),
                          capture_output=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    import json
    res = json.loads(proc.stdout.splitlines()[-1])["results"]
    assert res[0]["result"]["echo"] == "ok"
    assert res[1]["ok"] is False and res[1]["error"]["kind"] == "bad-op"


def _op_modules() -> set[str]:
    return {k.split(".")[1] for k in agent_source_files() if k.count(".") == 1} - {"__init__", "protocol", "contract"}


@pytest.mark.parametrize("path", [p for p in FILES if p.parent != AGENT], ids=lambda p: str(p.relative_to(AGENT)))
def test_a_part_never_imports_an_op_module(path):
    """Parts (agent/<feature>/*.py) serve the ops; an op module is an entry point, never a library."""
    ops = _op_modules()
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.ImportFrom) and node.level):
            continue
        depth = len(path.relative_to(AGENT).parts) - 1
        if node.level != depth + 1:
            continue      # inside its own package, or deeper
        names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
        bad = sorted(set(names) & ops)
        assert not bad, f"{path.relative_to(AGENT)}:{node.lineno} imports the op module(s) {bad}"


def test_subpackage_inits_are_empty():
    for p in FILES:
        if p.name == "__init__.py" and p.parent != AGENT:
            assert p.read_text().strip() == "", f"{p.relative_to(AGENT)}: keep it empty (an op loads only what it imports)"
