"""extract.server (a two-process job) in the playbook schema, the shipped speculators 0.9.0 playbook, and
verify's hs_<N>.safetensors layout checks (pure: no host)."""

from __future__ import annotations

import json

import pytest
import yaml

from remote_ops.connect.inventory import Host
from remote_ops.errors import ConfigError
from remote_ops.extract import jobs
from remote_ops.playbook import loader as playbook
from tests.conftest import REPO
from tests.helpers_ops import drain

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.9.0.yaml"


def test_shipped_playbook_is_speculators_launch_vllm_plus_generate_offline_data():
    pb = playbook.load(str(SHIPPED))
    assert pb.requires == {"speculators": "==0.9.0", "vllm": ">=0.24,<0.34"}
    host = Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python", workdir="/data/eagle3",
                vars={"layer_ids": [2, 4, 5, 8], "port": 8123, "tensor_parallel_size": 2, "gpus": 2})
    spec = jobs.parse_spec(pb, host)
    srv = spec.server
    assert srv.command[:5] == ["/opt/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "/data/models/target"]
    assert srv.port == 8123 and srv.health_path == "/health" and srv.health_timeout == 1800
    assert srv.python == "/opt/venv/bin/python"     # server_python defaults to the host's: "{python}" in a var
    spec_cfg = json.loads(srv.command[srv.command.index("--speculative_config") + 1])
    assert spec_cfg == {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 5, 8]}}}
    kv = json.loads(srv.command[srv.command.index("--kv_transfer_config") + 1])
    assert kv == {"kv_connector": "ExampleHiddenStatesConnector", "kv_role": "kv_producer",
                  "kv_connector_extra_config": {"shared_storage_path": "/data/eagle3/preprocessed/.hs_staging"}}
    assert srv.command[srv.command.index("--tensor-parallel-size") + 1] == "2" and spec.gpu_count == 2
    # through the shipped launcher (uploaded into the workdir): one client by default, the health wait, the
    # client's imports first; then speculators' own entry point, as its docs run it
    assert spec.command[:12] == ["/opt/venv/bin/python", "run_clients.py", "--clients", "1",
                                 "--health", "http://127.0.0.1:8123/health",
                                 "--preload", "speculators.cli.generate_offline_data",
                                 "--", "-m", "speculators", "generate-offline-data"]
    assert [(f.local.name, f.name) for f in spec.files] == [("run_clients.py", "run_clients.py")]
    assert spec.files[0].data == (REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "run_clients.py").read_bytes()
    assert "--world-size" not in spec.command and "--rank" not in spec.command      # the launcher adds them for N > 1
    four = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python",
                                    vars={"clients": 4}))
    assert four.command[four.command.index("--clients") + 1] == "4"
    assert spec.command[spec.command.index("--endpoint") + 1] == "http://127.0.0.1:8123/v1"
    assert spec.command[spec.command.index("--output") + 1] == spec.output_dir == \
        "/data/eagle3/preprocessed/hidden_states"
    assert spec.layout == "hs_safetensors" and spec.expected_samples == 5000
    assert spec.import_check == ["speculators.cli.generate_offline_data"]
    assert "vllm.entrypoints.openai.api_server" in srv.import_check
    # another interpreter for the server (a host var), found by the import probe as a python
    spec2 = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/client/bin/python",
                                     vars={"server_python": "/opt/server/bin/python"}))
    assert spec2.server.python == "/opt/server/bin/python" and spec2.job_python == "/opt/client/bin/python"


def test_the_no_chunked_prefill_sibling_differs_only_by_the_flag_and_its_range():
    """vLLM 0.22.0-0.23.0 refuse ExampleHiddenStatesConnector with chunked prefill on, and on 0.17.0-0.21.0 it
    leaves a chunked prompt's last chunk unwritten (check last-chunk): the sibling playbook is the shipped one
    plus --no-enable-chunked-prefill, claiming exactly those releases."""
    from packaging.specifiers import SpecifierSet

    main = playbook.load(str(SHIPPED))
    nocp = playbook.load(str(SHIPPED.with_name("eagle3-speculators-0.9.0-no-chunked-prefill.yaml")))
    host = Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python")
    a, b = jobs.parse_spec(main, host), jobs.parse_spec(nocp, host)
    assert [x for x in b.server.command if x != "--no-enable-chunked-prefill"] == a.server.command
    assert "--no-enable-chunked-prefill" in b.server.command and "--no-enable-chunked-prefill" not in a.server.command
    assert a.command == b.command and a.output_dir == b.output_dir and a.layout == b.layout
    assert [(f.name, f.sha256) for f in a.files] == [(f.name, f.sha256) for f in b.files]
    assert main.doc.data["vars"]["clients"] == nocp.doc.data["vars"]["clients"] == 1
    assert a.server.import_check == b.server.import_check and a.env == b.env
    main_range, nocp_range = SpecifierSet(main.requires["vllm"]), SpecifierSet(nocp.requires["vllm"])
    every = ("0.17.0", "0.17.1", "0.18.0", "0.20.0", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.33.0")
    for v in every:
        assert (v in main_range) != (v in nocp_range), v          # every release: exactly one of the two
    assert [v for v in every if v in nocp_range] == list(every[:8])
    assert "0.16.0" not in main_range and "0.16.0" not in nocp_range and "0.34.0" not in main_range


def _pb(tmp_path, extract):
    p = tmp_path / "pb.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "extract": extract}, sort_keys=False))
    return playbook.load(str(p))


BASE = {"command": ["{python}", "client.py", "--url", "http://127.0.0.1:{port}/v1"], "output_dir": "/out",
        "server": {"command": ["{python}", "server.py", "--port", "{port}"], "port": 8001}}


@pytest.mark.parametrize("change, message", [
    ({"server": {"command": ["s"]}}, "server.port must be a port number (1-65535), got None"),
    ({"server": {"command": ["s"], "port": 70000}}, "server.port must be a port number"),
    ({"server": {"port": 8000}}, "extract.server needs a 'command'"),
    ({"server": {"command": ["s"], "port": 8000, "helth": {}}}, "helth"),
    ({"server": {"command": ["s"], "port": 8000, "health": {"path": "health"}}}, "health.path must be a URL path"),
    ({"server": {"command": ["s"], "port": 8000, "health": {"timeout_seconds": 0}}}, "timeout_seconds must be a number >= 1"),
    ({"server": {"command": ["s"], "port": 8000, "client_start": "early"}},
     "server.client_start must be one of healthy, launch, got 'early'"),
    ({"output_layout": "npz"}, "output_layout must be one of data_pt, hs_safetensors"),
    ({"server": None, "command": ["{python}", "c.py", "{port}"]}, "unknown template {port}"),
])
def test_server_schema_errors_name_file_and_line(tmp_path, change, message):
    ex = {**BASE, **change}
    if ex.get("server") is None:
        ex.pop("server")
    pb = _pb(tmp_path, ex)
    with pytest.raises(ConfigError) as e:
        jobs.parse_spec(pb, Host(name="h", hostname="h"))
    assert message in str(e.value) and "pb.yaml:" in str(e.value)


def test_port_template_fills_both_commands(tmp_path):
    spec = jobs.parse_spec(_pb(tmp_path, BASE), Host(name="h", hostname="h", python="/p/python"))
    assert spec.command[-1] == "http://127.0.0.1:8001/v1" and spec.server.command[-1] == "8001"
    assert spec.server.to_wire() == {"command": ["/p/python", "server.py", "--port", "8001"], "port": 8001,
                                     "env": {}, "health_path": "/health", "health_timeout": 600.0}
    assert spec.server.client_start == "healthy" and spec.server.to_json()["client_start"] == "healthy"
    assert spec.layout is None      # data_pt, the default


def test_client_start_launch_reaches_the_host(tmp_path):
    """client_start: launch (a var's value too) is in the spec's JSON and the launch; the default is left
    out of the launch, which then reaches the host as before the key existed."""
    ex = {**BASE, "server": {**BASE["server"], "client_start": "{vars.start}"}}
    p = tmp_path / "pb.yaml"
    p.write_text(yaml.safe_dump({"name": "x", "vars": {"start": "launch"}, "extract": ex}, sort_keys=False))
    spec = jobs.parse_spec(playbook.load(str(p)), Host(name="h", hostname="h", python="/p/python"))
    assert spec.server.client_start == "launch" and spec.to_json()["server"]["client_start"] == "launch"
    assert spec.server.to_wire()["client_start"] == "launch"
    from remote_ops.agent.jobs import _server_args
    assert _server_args(spec.server.to_wire())["client_start"] == "launch"
    assert "client_start" not in _server_args({"command": ["s"], "port": 8001})


# ------------------------------------------------------------------ verify's hs_safetensors layout
def _write(path, hidden_states, token_ids):
    torch = pytest.importorskip("torch")
    from remote_ops.sandbox_assets.server_standin import save_safetensors, tensor_bytes
    hs = hidden_states.to(torch.bfloat16)
    save_safetensors(str(path), {"hidden_states": ("BF16", hs.shape, tensor_bytes(torch, hs)),
                                 "token_ids": ("I64", token_ids.shape, tensor_bytes(torch, token_ids))})


def _verify(out, expected):
    from remote_ops.agent import verify
    return drain(verify.op_verify({"output_dir": str(out), "expected": expected, "all": True,
                                   "layout": "hs_safetensors"}))


def test_verify_finds_every_kind_of_broken_sample(tmp_path):
    torch = pytest.importorskip("torch")
    for i in range(6):
        _write(tmp_path / f"hs_{i}.safetensors", torch.randn(5 + i, 4, 8), torch.arange(5 + i))
    from tests.run_records import record_run
    record_run(tmp_path, [list(range(5 + i)) for i in range(6)], layer_ids=[2, 4, 6, 7])   # run.json: what they were made from
    res = _verify(tmp_path, 6)
    assert res["ok"] and res["files"] == 6 and res["layers_hidden"] == [[4, 8]] and res["dtypes"] == ["BF16"]
    bad = torch.randn(7, 4, 8)
    bad[3, 1, 2] = float("nan")
    _write(tmp_path / "hs_1.safetensors", bad, torch.arange(7))                          # NaN
    _write(tmp_path / "hs_2.safetensors", torch.randn(6, 4, 8), torch.arange(5))         # rows != tokens
    _write(tmp_path / "hs_3.safetensors", torch.randn(5, 1, 8), torch.arange(5))         # no last layer
    _write(tmp_path / "hs_4.safetensors", torch.randn(5, 4, 16), torch.arange(5))        # another hidden size
    data = (tmp_path / "hs_5.safetensors").read_bytes()
    (tmp_path / "hs_5.safetensors").write_bytes(data[:-10])                              # truncated copy
    (tmp_path / "cmpl-1-0.safetensors.lock").write_text("")
    res = _verify(tmp_path, 8)
    assert not res["ok"]
    assert [b["index"] for b in res["unloadable"]] == [5] and "truncated" in res["unloadable"][0]["error"]
    assert res["non_finite"] == [{"index": 1, "problem": "hidden_states has 1 NaN/inf values"}]
    problems = {(p["index"], p["problem"]) for p in res["inconsistent"]}
    assert (2, "hidden_states has 6 rows for 5 tokens") in problems
    assert any(i == 3 and "at least 2" in p for i, p in problems)
    assert any(i == 4 and "hidden size 16" in p for i, p in problems)
    assert res["missing_after_last"] == 2 and res["temporaries"] == ["cmpl-1-0.safetensors.lock"]


@pytest.mark.parametrize("name", ["eagle3-speculators-0.9.0.yaml", "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"])
def test_max_num_batched_tokens_is_vllms_default_until_a_host_sets_it(name):
    """The var max_num_batched_tokens (null: vLLM's own default) gives the server no flag; a host's number gives
    --max-num-batched-tokens N, and nothing else of the command moves."""
    pb = playbook.load(str(SHIPPED.with_name(name)))
    assert pb.doc.data["vars"]["max_num_batched_tokens"] is None
    plain = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python"))
    assert not any("max-num-batched-tokens" in x for x in plain.server.command)
    set_ = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python",
                                    vars={"max_num_batched_tokens": 65536}))
    i = set_.server.command.index("--max-num-batched-tokens")
    assert set_.server.command[i + 1] == "65536"
    assert set_.server.command[:i] + set_.server.command[i + 2:] == plain.server.command


@pytest.mark.parametrize("name", ["eagle3-speculators-0.9.0.yaml", "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"])
def test_api_server_count_is_vllms_default_until_a_host_sets_it(name):
    """The var api_server_count (null: vLLM's own default, one API-server process) gives the server no flag; a
    host's number gives --api-server-count N, and nothing else of the server or client command moves."""
    pb = playbook.load(str(SHIPPED.with_name(name)))
    assert pb.doc.data["vars"]["api_server_count"] is None
    plain = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python"))
    assert not any("api-server-count" in x or x == "-asc" for x in plain.server.command)
    set_ = jobs.parse_spec(pb, Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python",
                                    vars={"api_server_count": 4}))
    i = set_.server.command.index("--api-server-count")
    assert set_.server.command[i + 1] == "4"
    assert set_.server.command[:i] + set_.server.command[i + 2:] == plain.server.command
    assert set_.command == plain.command
