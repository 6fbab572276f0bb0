"""benchmarks/gpu/lib/connector.py: which server-flow playbook and server interpreter a GPU harness runs on
vLLM 0.20.0, as the harnesses build them (pure: no GPU)."""
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

from benchmarks.gpu.lib import connector
from benchmarks.gpu.lib.harness import write_interpreter
from remote_ops.connect.hosts import Host
from remote_ops.extract import jobs
from remote_ops.playbook import loader as playbook

HOST = Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python")


def command(pb):
    return jobs.parse_spec(playbook.load(str(pb)), HOST).server.command


def wrapper(tmp_path):
    (tmp_path / "bin" / "server").mkdir(parents=True, exist_ok=True)
    base = subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True).stdout.strip()
    return write_interpreter(tmp_path, "server/python", base, [str(tmp_path / "site")])


def test_async_differs_from_the_shipped_playbook_only_by_the_connector_and_its_range(tmp_path):
    pb, _ = connector.server_setup("async", wrapper(tmp_path), tmp_path / "s")
    stock, mine = command(connector.MAIN), command(pb)
    i = stock.index("--kv_transfer_config") + 1
    assert mine[:i] == stock[:i] and mine[i + 1:] == stock[i + 1:]
    assert json.loads(mine[i]) == {**json.loads(stock[i]), "kv_connector": "AsyncHiddenStatesConnector",
                                   "kv_connector_module_path": "hs_async_connector"}
    spec = SpecifierSet(playbook.load(str(pb)).requires["vllm"])
    assert "0.20.0" in spec and "0.17.0" in spec and "0.22.0" not in spec   # written against 0.17-0.21's base
    assert "0.20.0" not in SpecifierSet(playbook.load(str(connector.MAIN)).requires["vllm"])


def test_each_choice_on_vllm_0_20(tmp_path):
    py = wrapper(tmp_path)
    assert connector.server_setup("vllm-no-chunked", py, tmp_path) == (connector.NO_CHUNKED, py)
    assert connector.server_setup("vllm", py, tmp_path) == (connector.MAIN, py)
    pb, same = connector.server_setup("vllm-chunked", py, tmp_path)
    assert same == py and command(pb) == command(connector.MAIN)           # vLLM's connector, chunked prefill on
    assert "0.20.0" in SpecifierSet(playbook.load(str(pb)).requires["vllm"])
    assert "--no-enable-chunked-prefill" in command(connector.NO_CHUNKED)
    with pytest.raises(ValueError, match="one of vllm-no-chunked, vllm, async, vllm-chunked"):
        connector.server_setup("fast", py, tmp_path)


def test_a_playbook_without_the_stock_connector_is_refused(tmp_path):
    with pytest.raises(ValueError, match="found it 0 times"):
        connector.playbook_copy(connector.SHIPPED / "eagle3-speculators-0.3.0.yaml", tmp_path / "o.yaml",
                                vllm=">=0.17", async_connector=True)


def test_the_async_server_interpreter_finds_the_module_first(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hs_async_connector.py").write_text("WHERE = 'site'\n")
    _, py = connector.server_setup("async", wrapper(tmp_path), tmp_path / "s")
    out = subprocess.run([str(py), "-c", "import hs_async_connector as m; print(m.__file__)"],
                         capture_output=True, text=True)
    # the import fails past the path lookup here (no torch/vllm) but names the lib's file, not site's
    assert str(connector.MODULE) in out.stderr or out.stdout.strip() == str(connector.MODULE)


def test_several_clients_are_the_shipped_playbooks_var_and_the_copies_keep_it(tmp_path):
    """clients is the shipped playbooks' own var (run_clients.py); the harness's copies change only the connector
    and requires, so a copy runs N clients exactly as the shipped playbook does."""
    for shipped in (connector.NO_CHUNKED, connector.MAIN):
        raw = yaml.safe_load(shipped.read_text())
        assert raw["vars"]["clients"] == 1
        assert raw["extract"]["command"][1] == "run_clients.py" and "{vars.clients}" in raw["extract"]["command"]
    pb, _ = connector.server_setup("async", wrapper(tmp_path), tmp_path / "s")
    copy = yaml.safe_load(Path(pb).read_text())
    assert copy["extract"]["command"] == yaml.safe_load(connector.MAIN.read_text())["extract"]["command"]
    assert copy["extract"]["files"] == yaml.safe_load(connector.MAIN.read_text())["extract"]["files"]
    spec = jobs.parse_spec(playbook.load(str(pb)), Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python",
                                                        vars={"clients": 4}))
    assert spec.command[spec.command.index("--clients") + 1] == "4"
