"""benchmarks/gpu/lib/connector.py: the server flow's playbook and server interpreter with the async
connector in vLLM's place, as the GPU harnesses build them (pure: no GPU)."""
import json
import subprocess

import pytest

from benchmarks.gpu.lib import connector
from benchmarks.gpu.lib.harness import write_interpreter
from remote_ops.connect.inventory import Host
from remote_ops.extract import jobs
from remote_ops.playbook import loader as playbook
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped"


@pytest.mark.parametrize("name", ["eagle3-speculators-0.9.0.yaml", "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"])
def test_the_copy_differs_only_by_the_connector(tmp_path, name):
    host = Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python")
    stock = jobs.parse_spec(playbook.load(str(SHIPPED / name)), host).server.command
    copy = connector.async_playbook(SHIPPED / name, tmp_path / name)
    mine = jobs.parse_spec(playbook.load(str(copy)), host).server.command
    i = stock.index("--kv_transfer_config") + 1
    assert mine[:i] == stock[:i] and mine[i + 1:] == stock[i + 1:]
    kv_stock, kv_mine = json.loads(stock[i]), json.loads(mine[i])
    assert kv_stock["kv_connector"] == "ExampleHiddenStatesConnector"
    assert kv_mine == {**kv_stock, "kv_connector": "AsyncHiddenStatesConnector",
                       "kv_connector_module_path": "hs_async_connector"}


def test_a_playbook_without_the_stock_connector_is_refused(tmp_path):
    src = tmp_path / "other.yaml"
    src.write_text((SHIPPED / "eagle3-speculators-0.3.0.yaml").read_text())
    with pytest.raises(ValueError, match="found it 0 times"):
        connector.async_playbook(src, tmp_path / "out.yaml")


def test_the_server_interpreter_finds_the_module_first(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "hs_async_connector.py").write_text("WHERE = 'site'\n")
    base = subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "bin" / "server").mkdir(parents=True)
    wrapper = write_interpreter(tmp_path, "server/python", base, [str(tmp_path / "site")])
    pb, py = connector.server_setup("async", SHIPPED / "eagle3-speculators-0.9.0.yaml", wrapper, tmp_path / "s")
    out = subprocess.run([str(py), "-c", "import hs_async_connector as m, sys; print(m.__file__)"],
                         capture_output=True, text=True)
    # the import fails past the path lookup (no torch/vllm here) but names the lib's file, not site's
    assert str(connector.MODULE) in out.stderr or out.stdout.strip() == str(connector.MODULE)
    assert connector.server_setup("vllm", pb, wrapper, tmp_path / "s") == (pb, wrapper)
    with pytest.raises(ValueError, match="one of vllm, async"):
        connector.server_setup("fast", pb, wrapper, tmp_path)
