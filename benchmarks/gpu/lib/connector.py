"""The server flow with benchmarks/gpu/lib/hs_async_connector.py in vLLM's place (issue 47 item 2): a copy of
a shipped 0.9.0 playbook whose server loads AsyncHiddenStatesConnector through vLLM's
``kv_connector_module_path``, and a server interpreter with this folder first on its PYTHONPATH (the harnesses'
interpreters are wrappers that set PYTHONPATH themselves, so an env var would not reach the server)."""
from __future__ import annotations

import re
from pathlib import Path

LIB = Path(__file__).resolve().parent
MODULE = LIB / "hs_async_connector.py"
STOCK = '"kv_connector": "ExampleHiddenStatesConnector"'
ASYNC = '"kv_connector": "AsyncHiddenStatesConnector", "kv_connector_module_path": "hs_async_connector"'
CONNECTORS = ("vllm", "async")


def async_playbook(src: Path, dest: Path) -> Path:
    """``src`` with its server's connector replaced; refused unless the connector is named exactly once."""
    text = Path(src).read_text()
    if text.count(STOCK) != 1:
        raise ValueError(f"{src}: expected {STOCK} once in the server command, found it {text.count(STOCK)} times")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text.replace(STOCK, ASYNC))
    return dest


def interpreter_with(wrapper: Path, first: Path, dest: Path) -> Path:
    """A copy of the wrapper ``harness.write_interpreter`` wrote, with ``first`` first on its PYTHONPATH."""
    text = Path(wrapper).read_text()
    m = re.search(r"PYTHONPATH=(\S*) exec ", text)
    if not m:
        raise ValueError(f"{wrapper}: not an interpreter wrapper (no 'PYTHONPATH=... exec')")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text.replace(m.group(0), f"PYTHONPATH={first}{':' + m.group(1) if m.group(1) else ''} exec ", 1))
    dest.chmod(0o755)
    return dest


def server_setup(connector: str, playbook: Path, server_python: Path, scratch: Path) -> tuple[Path, Path]:
    """(playbook, server interpreter) for ``connector``: the shipped ones for "vllm", the copies for "async"."""
    if connector not in CONNECTORS:
        raise ValueError(f"connector {connector!r}: one of {', '.join(CONNECTORS)}")
    if connector == "vllm":
        return Path(playbook), Path(server_python)
    return (async_playbook(playbook, Path(scratch) / "playbooks" / Path(playbook).name),
            interpreter_with(server_python, LIB, Path(scratch) / "bin" / "server-async" / "python"))
