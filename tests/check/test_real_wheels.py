"""`compat.check` on the real packages from PyPI (wheels cached by pkgsource).

speculators 0.3.0 against the vLLM it pins (0.11.0) must be clean; against vLLM 0.17.0 it must
give exactly the breakages verified by reading vLLM 0.17.0's source:

- vllm/v1/core/kv_cache_utils.py  get_kv_cache_config_from_groups(vllm_config, kv_cache_groups,
  available_memory): kv_cache_specs is gone.
- vllm/v1/core/sched/scheduler.py  Scheduler.__init__(..., structured_output_manager, block_size,
  mm_registry=..., ...): block_size is required.
- vllm/config/scheduler.py  @config SchedulerConfig: `is_encoder_decoder: InitVar[bool]` has no
  default (pydantic dataclass with extra="forbid", see vllm/config/utils.py): required.
- vllm/v1/request.py  Request.__init__ no longer has eos_token_id.
"""

from __future__ import annotations

import pytest

from remote_ops import pkgsource
from remote_ops.agent.compat import op_check, op_inspect

GEN = "speculators.data_generation.vllm_hidden_states_generator"
EXPECTED_017 = {
    (GEN, 136, "unexpected-keyword", "vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups", "kv_cache_specs"),
    (GEN, 148, "missing-argument", "vllm.v1.core.sched.scheduler.Scheduler", "block_size"),
    (GEN, 194, "missing-argument", "vllm.config.SchedulerConfig", "is_encoder_decoder"),
    (GEN, 234, "unexpected-keyword", "vllm.v1.request.Request", "eos_token_id"),
}


@pytest.fixture(scope="module")
def paths():
    spec = str(pkgsource.unpacked("speculators", "0.3.0"))
    return {v: [spec, str(pkgsource.unpacked("vllm", v))] for v in ("0.11.0", "0.17.0")}


def _keys(res):
    return {(f["module"], f["line"], f["kind"], f["symbol"], f["name"]) for f in res["findings"]}


def test_pinned_vllm_is_clean(paths):
    res = op_check({"sys_path": paths["0.11.0"], "trace": True})
    assert res["versions"] == {"speculators": "0.3.0", "vllm": "0.11.0"}
    assert res["findings"] == []
    assert {t["module"].rsplit(".", 1)[-1] for t in res["targets"]} == {
        "config_generator", "custom_worker", "vllm_hidden_states_generator"}
    # every library call of the generator was bound against a real signature
    assert res["unknown"] == []
    assert res["calls_checked"] >= 30
    symbols = {c["symbol"] for c in res["trace"]}
    assert {"vllm.v1.core.sched.scheduler.Scheduler.add_request",
            "vllm.v1.core.sched.scheduler.Scheduler.finish_requests",
            "vllm.v1.executor.multiproc_executor.MultiprocExecutor.collective_rpc",
            "vllm.v1.executor.multiproc_executor.MultiprocExecutor.execute_model",
            "vllm.v1.executor.multiproc_executor.MultiprocExecutor.initialize_from_config",
            "vllm.sampling_params.SamplingParams", "vllm.sequence.IntermediateTensors"} <= symbols


def test_vllm_017_gives_every_real_breakage(paths):
    # (no timing assertion: the time per pair is printed by benchmarks/evidence/check_matrix.py)
    res = op_check({"sys_path": paths["0.17.0"]})
    assert res["versions"] == {"speculators": "0.3.0", "vllm": "0.17.0"}
    assert _keys(res) == EXPECTED_017
    assert res["unknown"] == []
    by_name = {f["name"]: f for f in res["findings"]}
    assert by_name["block_size"]["fix"]["constant"] == "VLLM_BLOCK_SIZE"
    assert by_name["eos_token_id"]["fix"] == {"action": "remove-keyword", "keyword": "eos_token_id"}
    assert by_name["kv_cache_specs"]["signature"].startswith("(vllm_config: VllmConfig, kv_cache_groups")


def test_recheck_of_edited_text_in_same_op(paths):
    """What patch validation does: the findings its edits target are gone from the new text."""
    import os

    src = os.path.join(paths["0.17.0"][0], *GEN.split(".")) + ".py"
    text = open(src).read()
    new = text.replace("            eos_token_id=self.tokenizer.eos_token_id,\n", "") \
              .replace("            kv_cache_specs=kv_cache_spec,\n", "") \
              .replace("            structured_output_manager=structured_output_manager,\n        )",
                       "            structured_output_manager=structured_output_manager,\n"
                       "            block_size=VLLM_BLOCK_SIZE,\n        )") \
              .replace("                max_num_batched_tokens=max_num_batched_tokens,\n            ),",
                       "                max_num_batched_tokens=max_num_batched_tokens,\n"
                       "                is_encoder_decoder=False,\n            ),")
    assert new != text
    before = op_check({"sys_path": paths["0.17.0"], "targets": [GEN]})
    assert {(f["kind"], f["name"]) for f in before["findings"]} == {
        ("unexpected-keyword", "eos_token_id"), ("unexpected-keyword", "kv_cache_specs"),
        ("missing-argument", "block_size"), ("missing-argument", "is_encoder_decoder")}
    res = op_check({"sys_path": paths["0.17.0"], "targets": [GEN], "override_sources": {GEN: new}})
    assert res["findings"] == [] and res["unknown"] == []
    # the same calls were checked in the edited text (it was analysed, not skipped)
    assert res["calls_checked"] == before["calls_checked"] > 0


def test_inspect_static_signatures(paths):
    res = op_inspect({"sys_path": paths["0.17.0"], "symbols": [
        "vllm.v1.request:Request", "vllm.v1.core.sched.scheduler:Scheduler.add_request",
        "vllm.config:SchedulerConfig", "vllm.v1.request:NoSuchThing"]})
    req, add, sc, missing = res["symbols"]
    assert req["mode"] == "static" and req["object"] == "class"
    names = [p["name"] for p in req["parameters"]]
    assert names[:4] == ["request_id", "prompt_token_ids", "sampling_params", "pooling_params"]
    assert "eos_token_id" not in names
    assert [p["name"] for p in add["parameters"]] == ["self", "request"]
    iv = {p["name"]: p for p in sc["parameters"]}
    assert iv["is_encoder_decoder"]["required"] and iv["is_encoder_decoder"]["kind"] == "positional-or-keyword"
    assert "max_num_encoder_input_tokens" not in iv      # Field(init=False)
    assert "DEFAULT_MAX_NUM_SEQS" not in iv               # ClassVar
    assert missing["kind"] == "missing"


# vLLM 0.33.0 moved the kv-cache planning helpers out of vllm.v1.core.kv_cache_utils (verified in its
# source: vllm/v1/core/kv_cache_planning.py defines get_kv_cache_config_from_groups,
# _get_kv_cache_groups_uniform_spec and unify_hybrid_kv_cache_specs at top level; kv_cache_utils has
# no __getattr__ and no re-export), and its top-level `vllm/__init__.py` re-exports lazily through a
# module __getattr__ over MODULE_ATTRS. Scheduler(block_size), SchedulerConfig(is_encoder_decoder:
# InitVar[bool]) and Request (no eos_token_id) are as in 0.17.0.
KVU = "vllm.v1.core.kv_cache_utils."
EXPECTED_033 = {
    (GEN, 15, "missing-symbol", KVU + "_get_kv_cache_groups_uniform_spec", "_get_kv_cache_groups_uniform_spec"),
    (GEN, 15, "missing-symbol", KVU + "get_kv_cache_config_from_groups", "get_kv_cache_config_from_groups"),
    (GEN, 15, "missing-symbol", KVU + "unify_hybrid_kv_cache_specs", "unify_hybrid_kv_cache_specs"),
    (GEN, 148, "missing-argument", "vllm.v1.core.sched.scheduler.Scheduler", "block_size"),
    (GEN, 194, "missing-argument", "vllm.config.SchedulerConfig", "is_encoder_decoder"),
    (GEN, 234, "unexpected-keyword", "vllm.v1.request.Request", "eos_token_id"),
}


@pytest.fixture(scope="module")
def vllm_033():
    return str(pkgsource.unpacked("vllm", "0.33.0"))


def test_vllm_033_moved_helpers_and_signatures(vllm_033):
    spec = str(pkgsource.unpacked("speculators", "0.3.0"))
    res = op_check({"sys_path": [spec, vllm_033]})
    assert res["versions"] == {"speculators": "0.3.0", "vllm": "0.33.0"}
    assert _keys(res) == EXPECTED_033
    assert res["unknown"] == []
    for f in res["findings"]:
        if f["kind"] == "missing-symbol":
            assert f["fix"]["to"] == "vllm.v1.core.kv_cache_planning", f
    # the lazy top-level re-exports resolve to the real classes (not "unknown: __getattr__")
    ins = op_inspect({"sys_path": [vllm_033], "symbols": ["vllm:SamplingParams", "vllm:LLM", "vllm:NoSuch"]})
    sp, llm, nosuch = ins["symbols"]
    assert sp["object"] == "class" and "n" in [p["name"] for p in sp["parameters"]]
    assert llm["object"] == "class" and llm["parameters"][0]["name"] == "model"
    assert nosuch["kind"] == "missing"


def test_speculators_040_pinned_clean_and_newest(vllm_033):
    """speculators 0.4.0 requires vllm>=0.12.0,<=0.16.0: clean on both ends; on 0.33.0 the moved
    helpers and Request(eos_token_id) (its Scheduler call already passes block_size)."""
    spec = str(pkgsource.unpacked("speculators", "0.4.0"))
    for v in ("0.12.0", "0.16.0"):
        res = op_check({"sys_path": [spec, str(pkgsource.unpacked("vllm", v))]})
        assert res["findings"] == [] and res["unknown"] == [], (v, res["findings"], res["unknown"])
        assert res["calls_checked"] >= 30
    res = op_check({"sys_path": [spec, vllm_033]})
    assert {(f["kind"], f["name"]) for f in res["findings"]} == {
        ("missing-symbol", "_get_kv_cache_groups_uniform_spec"),
        ("missing-symbol", "get_kv_cache_config_from_groups"),
        ("missing-symbol", "unify_hybrid_kv_cache_specs"),
        ("unexpected-keyword", "eos_token_id")}
    assert res["unknown"] == []


def test_speculators_without_vllm_imports_says_nothing_was_checked():
    """From 0.5.0 on, speculators talks to a vLLM server over HTTP (data_generation/vllm_client.py):
    no module of the package imports vllm, so there is nothing to bind; the check must say so
    rather than look clean."""
    spec = str(pkgsource.unpacked("speculators", "0.5.0"))
    res = op_check({"sys_path": [spec]})
    assert res["targets"] == [] and res["findings"] == [] and res["calls_checked"] == 0
    assert "nothing was checked" in res["note"] and "no module of speculators imports it" in res["note"]
