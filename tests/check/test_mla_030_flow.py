"""The MLA / TP checks of the server flow (mla-tp-page-size for vLLM #51016 / fix #50894,
mla-kv-groups for the connector's "MLA verifiers are unsupported") and the 0.3.0 flow, on the real sources of vLLM
0.20.0, 0.22.0, 0.26.0, 0.33.0 and speculators 0.3.0 (PyPI wheels through pkgsource).

The finding, read there: both bugs live in the hidden-state KV cache group that only the server flow creates.
``HiddenStateCacheSpec`` is built only by ``model_executor/models/extract_hidden_states.py`` (the draft model of the
speculative method ``extract_hidden_states``), and the "MLA verifiers are unsupported" refusal is only in
ExampleHiddenStatesConnector; speculators 0.3.0's generator builds its VllmConfig with model, cache, parallel
(its worker extension), scheduler, device and load configs: no speculative_config, no kv_transfer_config. So the
0.3.0 flow at tensor_parallel_size > 1 on an MLA checkpoint meets neither, and check adds no such finding for it
(``serverflow.check`` runs for a playbook with a server only)."""

from __future__ import annotations

import ast
import re

import pytest

from remote_ops import pkgsource

VERSIONS = ("0.20.0", "0.22.0", "0.26.0", "0.33.0")


def _grep(src, needle):
    return sorted(str(p.relative_to(src)) for p in (src / "vllm").rglob("*.py") if needle in p.read_text(errors="replace"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_hidden_state_group_and_the_mla_refusal_belong_to_the_server_flow_only(version):
    src = pkgsource.unpacked("vllm", version)
    built = [f for f in _grep(src, "HiddenStateCacheSpec(") if re.search(r"HiddenStateCacheSpec\(\s*\n?\s*\w+\s*=",
                                                                             (src / f).read_text())]
    refusal = _grep(src, "MLA verifiers are unsupported")
    if version == "0.20.0":        # no separate hidden-state group yet (serverflow.check: "no separate group")
        assert built == [] and refusal == []
        return
    assert built == ["vllm/model_executor/models/extract_hidden_states.py"], built
    assert refusal in ([], ["vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"])
    assert (version in ("0.26.0", "0.33.0")) == bool(refusal)
    # #50894's page-size fix: in 0.33.0's planning code, not in 0.22.0's or 0.26.0's (serverflow.PAGE_FIX)
    from remote_ops.agent.serverflow import PAGE_FIX
    assert bool(_grep(src, PAGE_FIX)) == (version == "0.33.0")


def test_speculators_030_generator_config_has_no_speculative_method_or_connector():
    src = pkgsource.unpacked("speculators", "0.3.0")
    tree = ast.parse((src / "speculators/data_generation/vllm_hidden_states_generator.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "VllmConfig"]
    assert len(calls) == 1
    keys = {k.arg for k in calls[0].keywords}
    assert keys == {"model_config", "cache_config", "parallel_config", "scheduler_config", "device_config",
                    "load_config"}, keys
    assert "speculative_config" not in keys and "kv_transfer_config" not in keys
    text = (src / "speculators/data_generation/vllm_hidden_states_generator.py").read_text()
    assert "extract_hidden_states" not in text and "ExampleHiddenStatesConnector" not in text
