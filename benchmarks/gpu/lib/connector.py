"""Which server-flow playbook a GPU harness runs on the lent machine's vLLM 0.20.0 (issue 47 item 2).

Since check last-chunk, the shipped playbooks split vLLM's range: eagle3-speculators-0.9.0 (chunked prefill on)
claims 0.24-0.33, and eagle3-speculators-0.9.0-no-chunked-prefill claims 0.17-0.23, because vLLM 0.17-0.21's
ExampleHiddenStatesConnector never writes a last chunk that needs no new block. The harnesses' choices:

  vllm-no-chunked  the shipped no-chunked-prefill playbook as it is: what a 0.20.0 user runs
  vllm             the shipped eagle3-speculators-0.9.0 playbook as it is (refused on 0.20.0 by its requires)
  async            a copy of eagle3-speculators-0.9.0 whose server loads AsyncHiddenStatesConnector
                   (benchmarks/gpu/lib/hs_async_connector.py: vLLM 0.22's write path, each request written once
                   at the step that completes its prompt) through ``kv_connector_module_path``; its requires
                   claims vLLM 0.17-0.21, the releases that class is written against
  vllm-chunked     a copy of eagle3-speculators-0.9.0 claiming 0.17-0.33: vLLM's own connector with chunked
                   prefill on, as shipped before check last-chunk (to show that bug on the GPU)

The copies' server interpreter has this folder first on its PYTHONPATH: the harnesses' interpreters are wrappers
that set PYTHONPATH themselves, so an env var would not reach the server."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

LIB = Path(__file__).resolve().parent
MODULE = LIB / "hs_async_connector.py"
SHIPPED = LIB.parents[2] / "remote_ops" / "playbook" / "shipped"
MAIN = SHIPPED / "eagle3-speculators-0.9.0.yaml"
NO_CHUNKED = SHIPPED / "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"
STOCK = '"kv_connector": "ExampleHiddenStatesConnector"'
ASYNC = '"kv_connector": "AsyncHiddenStatesConnector", "kv_connector_module_path": "hs_async_connector"'
CONNECTORS = ("vllm-no-chunked", "vllm", "async", "vllm-chunked")
COPIES = {"async": ">=0.17,<0.22", "vllm-chunked": ">=0.17,<0.34"}


def playbook_copy(src: Path, dest: Path, *, vllm: str | None = None, async_connector: bool = False) -> Path:
    """``src`` claiming ``vllm`` (when given), with its server's connector replaced when ``async_connector``
    (refused unless the server command names vLLM's connector exactly once). Several clients are the shipped
    playbooks' own var ``clients`` (run_clients.py), not a change of the copy."""
    data = yaml.safe_load(Path(src).read_text())
    if async_connector:
        cmd = ((data.get("extract") or {}).get("server") or {}).get("command") or []
        # the connector's argument, at the top of the command or in a command item's cases ({select, cases}:
        # eagle3-speculators-0.9.0's hidden_states_dtype, whose bf16 case names vLLM's connector)
        hits = list(_strings_with(cmd, STOCK))
        if len(hits) != 1 or hits[0][0][hits[0][1]].count(STOCK) != 1:
            raise ValueError(f"{src}: expected {STOCK} once in the server command, found it {len(hits)} times")
        where, key = hits[0]
        where[key] = where[key].replace(STOCK, ASYNC)
    if vllm:
        data["requires"]["vllm"] = vllm
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(data, sort_keys=False, width=1000))
    return dest


def _strings_with(node, text):
    """(container, key) of every string holding ``text`` in a command's nested lists and mappings."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(value, str):
            if text in value:
                yield node, key
        else:
            yield from _strings_with(value, text)


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


def server_setup(connector: str, server_python: Path, scratch: Path) -> tuple[Path, Path]:
    """(playbook, server interpreter) for ``connector`` (CONNECTORS)."""
    if connector not in CONNECTORS:
        raise ValueError(f"connector {connector!r}: one of {', '.join(CONNECTORS)}")
    shipped = {"vllm-no-chunked": NO_CHUNKED, "vllm": MAIN}.get(connector)
    if shipped:
        return shipped, Path(server_python)
    pb = playbook_copy(MAIN, Path(scratch) / "playbooks" / connector / MAIN.name,
                       vllm=COPIES.get(connector), async_connector=connector == "async")
    if connector == "async":
        return pb, interpreter_with(server_python, LIB, Path(scratch) / "bin" / "server-async" / "python")
    return pb, Path(server_python)
