"""The playbook var hidden_states_dtype (bf16 | fp8) of eagle3-speculators-0.9.0 and serverflow.check of the FP8
connector it selects, on the real sources: hs_connectors 0.9.0's FP8HiddenStatesConnector subclasses vLLM's
ExampleHiddenStatesConnector and overrides only _write_tensors, which that connector calls from vLLM 0.22.0
(0.20.0's never does: the override would never run and the files would be bf16)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.agent import serverflow as agent_sf
from remote_ops.check import serverflow
from remote_ops.connect.inventory import Host
from remote_ops.errors import ConfigError
from remote_ops.extract.extract_spec import client_command, server_command
from remote_ops.playbook import loader as pb_mod

MAIN = "eagle3-speculators-0.9.0"
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
HS = pkgsource.unpacked("hs-connectors", "0.9.0")   # the real wheel from PyPI (cached), never a skip
FP8_MODULE = str(HS / "hs_connectors" / "fp8_hidden_states_connector.py")


def _commands(**host_vars):
    pb = pb_mod.load(str(pb_mod.find(MAIN)))
    host = Host(name="t", hostname="h", python="python3", vars=host_vars)
    return server_command(pb, host), client_command(pb, host)


def _checks(version, server, client, hs=True):
    path = [str(pkgsource.unpacked("vllm", version))] + ([str(HS)] if hs else [])
    return {c["id"]: c for c in agent_sf.op_check({"command": server, "client": serverflow.CLIENT_FIELDS,
                                                   "client_command": client, "sys_path": path})["checks"]}


def test_the_var_selects_the_connector_and_drops_the_clients_validation():
    server, client = _commands()
    kv = json.loads(server[server.index("--kv_transfer_config") + 1])
    assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and "kv_connector_module_path" not in kv
    assert client[-1] == "--validate-outputs"
    server8, client8 = _commands(hidden_states_dtype="fp8")
    kv8 = json.loads(server8[server8.index("--kv_transfer_config") + 1])
    # what hs_connectors' FP8Backend.build_kv_transfer_config (transfer.py) gives launch_vllm.py
    assert kv8 == {**kv, "kv_connector": "FP8HiddenStatesConnector",
                   "kv_connector_module_path": "hs_connectors.fp8_hidden_states_connector"}
    assert "--validate-outputs" not in client8 and client8 == client[:-1]
    assert [a for a in server8 if a != server8[server8.index("--kv_transfer_config") + 1]] == \
        [a for a in server if a != server[server.index("--kv_transfer_config") + 1]]


def test_an_unknown_dtype_is_refused_with_the_playbooks_line():
    with pytest.raises(ConfigError) as exc:
        _commands(hidden_states_dtype="fp16")
    assert "eagle3-speculators-0.9.0.yaml:" in str(exc.value)
    assert "'{vars.hidden_states_dtype}' gives 'fp16': one of bf16, fp8" in str(exc.value)


@pytest.mark.parametrize("version,line", [("0.24.0", 384), ("0.26.0", 427), ("0.33.0", 436)])
def test_fp8_on_the_playbooks_releases_passes_with_the_hooks_line(version, line):
    checks = _checks(version, *_commands(hidden_states_dtype="fp8"))
    mod = checks["connector-module"]
    assert mod["ok"] is True and mod["where"] == FP8_MODULE + ":30"
    assert "ExampleHiddenStatesConnector" in mod["detail"]
    hook = checks["connector-hook-_write_tensors"]
    assert hook["ok"] is True and hook["where"] == f"{CONNECTOR}:{line}", hook
    # the vLLM connector's own checks still apply to what the subclass inherits
    assert checks["connector"]["ok"] and checks["last-chunk"]["ok"] and checks["connector-write-lock"]["ok"]
    assert checks["kv-transfer-config-keys"]["ok"] is True
    assert not [c for c in checks.values() if c["ok"] is False], [c for c in checks.values() if c["ok"] is False]


def test_fp8_on_020_is_a_finding_the_override_is_never_run():
    checks = _checks("0.20.0", *_commands(hidden_states_dtype="fp8"))
    hook = checks["connector-hook-_write_tensors"]
    assert hook["ok"] is False and "never calls _write_tensors" in hook["detail"] and "bf16" in hook["detail"]
    assert "0.22.0" in hook["fix"] and FP8_MODULE + ":41" in hook["what"]
    assert checks["connector-module"]["ok"] is True


def test_fp8_without_hs_connectors_on_the_servers_path():
    checks = _checks("0.33.0", *_commands(hidden_states_dtype="fp8"), hs=False)
    mod = checks["connector-module"]
    assert mod["ok"] is False and "not on the server interpreter's search path" in mod["detail"]
    assert "hs-connectors==0.9.0" in mod["fix"]
    assert "connector" not in checks and "connector-hook-_write_tensors" not in checks


def test_bf16_has_no_module_checks():
    checks = _checks("0.33.0", *_commands())
    assert "connector-module" not in checks and not [k for k in checks if k.startswith("connector-hook-")]
    assert checks["connector"]["ok"] is True
