"""extract's launch plan (remote_ops/extract/plan.py) and its host-side parts: the output disk's write test
(agent/job/diskspeed.py), the model's active parameters (agent/job/activeparams.py), the plan built from
recorded agent answers (a recorded statvfs and write test), and which bound a running job is at. Over the
real sshd: tests/extract/test_jobs.py (test_launch_plan_*)."""

from __future__ import annotations

import json
import os
import time
import types

import pytest

from remote_ops.agent.job import activeparams, diskneed, diskspeed
from remote_ops.agent.job import jobfiles as sup
from remote_ops.commands.extract import plan_line
from remote_ops.extract import plan as P
from remote_ops.extract import preflight as PF
from remote_ops.extract.tail import bound_text


def _leftovers(directory):
    return [n for n in os.listdir(directory) if n.startswith(diskspeed.PREFIX)]


class Clock:
    """A recorded clock: each call advances by ``step`` seconds."""

    def __init__(self, step):
        self.t, self.step = 0.0, step

    def __call__(self):
        self.t += self.step
        return self.t


# ------------------------------------------------------------------ the write test
def test_measure_writes_in_blocks_fsyncs_and_leaves_nothing(tmp_path, monkeypatch):
    writes, synced = [], []
    real_write, real_fsync = os.write, os.fsync
    monkeypatch.setattr(diskspeed.os, "write", lambda fd, b: writes.append(len(b)) or real_write(fd, b))
    monkeypatch.setattr(diskspeed.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    r = diskspeed.measure(str(tmp_path / "out" / "not-made"), size=3 * 2**20, block=2**20, clock=Clock(0.5))
    assert writes == [2**20] * 3 and len(synced) == 1
    # the clock's reads: start, one after each block, the end after fsync: 4 steps of 0.5 s after the start
    assert r["bytes"] == 3 * 2**20 and r["seconds"] == 2.0 and r["bytes_per_s"] == int(3 * 2**20 / 2.0)
    assert r["directory"] == str(tmp_path) and "fsync" in r["method"] and "1 MiB blocks" in r["method"]
    assert _leftovers(tmp_path) == []


def test_measure_stops_at_its_time_budget(tmp_path):
    r = diskspeed.measure(str(tmp_path), size=10 * 2**20, block=2**20, budget=1.0, clock=Clock(0.6))
    assert r["bytes"] == 2 * 2**20           # the second block's check (1.2 s) passed the budget
    assert _leftovers(tmp_path) == []


@pytest.mark.parametrize("fault", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_the_temporary_file_is_removed_on_error_and_interrupt(tmp_path, monkeypatch, fault):
    real_write, calls = os.write, []

    def write(fd, b):
        calls.append(1)
        if len(calls) == 2:
            raise fault
        return real_write(fd, b)
    monkeypatch.setattr(diskspeed.os, "write", write)
    with pytest.raises(type(fault)):
        diskspeed.measure(str(tmp_path), size=4 * 2**20, block=2**20)
    assert len(calls) == 2 and _leftovers(tmp_path) == []


def test_a_file_left_by_a_killed_measurement_is_removed_by_the_next(tmp_path):
    dead = tmp_path / f"{diskspeed.PREFIX}999999999-abc"      # no such pid
    alive = tmp_path / f"{diskspeed.PREFIX}{os.getppid()}-abc"  # a live process's: left alone
    dead.write_bytes(b"x")
    alive.write_bytes(b"x")
    diskspeed.measure(str(tmp_path), size=2**20, block=2**20)
    assert not dead.exists() and alive.exists()


def test_the_speed_is_cached_per_filesystem_and_remeasured_on_refresh(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    calls = []

    def recorded(path, size):
        calls.append((path, size))
        return {"bytes_per_s": 1_250_000_000, "bytes": size, "seconds": size / 1.25e9, "method": "recorded"}
    (tmp_path / "a").mkdir()
    first = diskspeed.for_dir(str(tmp_path / "a"), size=2**27, measure_fn=recorded)
    assert first["cached"] is False and first["age_s"] == 0.0 and len(calls) == 1
    fs = diskspeed.fs_key(str(tmp_path))
    saved = json.loads((tmp_path / "state" / "diskspeed" / f"{fs['key']}.json").read_text())
    assert (saved["dev"], saved["mount"], saved["bytes_per_s"]) == (os.stat(tmp_path).st_dev, fs["mount"], 1_250_000_000)
    # another directory of the same filesystem (not made yet): the cache, no second measurement
    again = diskspeed.for_dir(str(tmp_path / "b" / "c"), measure_fn=recorded)
    assert again["cached"] is True and again["bytes_per_s"] == 1_250_000_000 and again["age_s"] >= 0
    assert len(calls) == 1
    assert diskspeed.lookup(str(tmp_path), now=saved["measured_at"] + 90)["age_s"] == 90.0
    diskspeed.for_dir(str(tmp_path / "a"), refresh=True, measure_fn=recorded)
    assert len(calls) == 2


def _profile(seconds, nbytes, waited):
    return {"seconds": seconds, "tokens": 1000, "writer": {"threads": 8, "files": 10, "bytes": nbytes,
                                                           "put_wait_s": waited}}


def test_a_jobs_writes_measure_its_disk_only_when_held_back_and_longer_than_the_test():
    gib = 2**30
    obs, why = diskspeed.observed_from_profile(_profile(20.0, 25 * gib, 6.0), test_bytes=2**28)
    assert why is None and obs == {"bytes_per_s": int(25 * gib / 20.0), "bytes": 25 * gib, "seconds": 20.0,
                                   "waited_s": 6.0}
    # held back for under a tenth of its run: the GPU, not the disk, set its pace
    obs, why = diskspeed.observed_from_profile(_profile(20.0, 25 * gib, 1.9), test_bytes=2**28)
    assert obs is None and why.startswith("the disk did not hold it back (it waited 1.9 s of 20.0 s")
    # no more bytes than 4 write tests: a burst like the test itself
    obs, why = diskspeed.observed_from_profile(_profile(1.0, 4 * 2**28 - 1, 0.5), test_bytes=2**28)
    assert obs is None and "under the %d that make a measure" % (4 * 2**28) in why
    assert diskspeed.observed_from_profile(_profile(1.0, 4 * 2**28, 0.5), test_bytes=2**28)[0] is not None
    # without a test: TEST_BYTES is the yardstick
    assert diskspeed.observed_from_profile(_profile(1.0, 4 * diskspeed.TEST_BYTES - 1, 0.5))[0] is None
    for bad in (None, {"seconds": 1.0}, _profile(0, gib, 0), _profile(None, gib, 1.0), _profile(2.0, gib, True)):
        assert diskspeed.observed_from_profile(bad)[0] is None


def _test_record(tmp_path, bytes_per_s):
    fs = diskspeed.fs_key(str(tmp_path))
    path = tmp_path / "state" / "diskspeed" / f"{fs['key']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bytes_per_s": bytes_per_s, "bytes": 2**28, "seconds": 2**28 / bytes_per_s,
                                "method": "recorded", "dev": fs["dev"], "mount": fs["mount"], "key": fs["key"],
                                "measured_at": 1000.0}))
    return path


def test_the_lower_of_the_write_test_and_a_jobs_own_writes_is_the_plans_speed(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    path = _test_record(tmp_path, 1_600_000_000)
    out = tmp_path / "out"
    r = diskspeed.record_observed([str(out)], _profile(24.55, 25_669_140_480, 6.2), "job-1", now=2000.0)
    assert r["recorded"] is True and r["observed"]["bytes_per_s"] == int(25_669_140_480 / 24.55)
    saved = json.loads(path.read_text())
    assert saved["bytes_per_s"] == 1_600_000_000 and saved["observed"]["job_id"] == "job-1"
    got = diskspeed.lookup(str(out), now=2090.0)
    assert got["source"] == "job" and got["bytes_per_s"] == r["observed"]["bytes_per_s"] and got["cached"] is True
    assert got["age_s"] == 90.0 and got["job_id"] == "job-1" and got["test"]["bytes_per_s"] == 1_600_000_000
    assert got["method"].startswith("the writes of job job-1: 25669140480 bytes in 24.6 s, 6.2 s of it waiting")
    # the plan is made from it (same figures as the refusal's)
    need = {"samples": 10, "tokens": 1000, "need_bytes": 10**12, "free_bytes": 10**13, "fits": True}
    plan = P.build(need, got, None, None, str(out))
    assert plan.disk_hours == 10**12 / got["bytes_per_s"] / 3600
    assert plan.disk_bytes_per_s == got["bytes_per_s"] and plan.disk_speed["source"] == "job"
    line = plan_line(plan.to_json())
    assert "writes 1.05 GB/s (job job-1's own writes, 1m30s ago; the write test: 1.60 GB/s) -> " in line
    # a job faster than the test: the test's figure stays the plan's (the lower one)
    _test_record(tmp_path, 500_000_000)
    diskspeed.record_observed([str(out)], _profile(24.55, 25_669_140_480, 6.2), "job-2", now=3000.0)
    got = diskspeed.lookup(str(out), now=3000.0)
    assert got["source"] == "test" and got["bytes_per_s"] == 500_000_000 and got["observed"]["job_id"] == "job-2"


def test_a_later_job_faster_without_waiting_drops_the_figure(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    path = _test_record(tmp_path, 1_600_000_000)
    diskspeed.record_observed([str(tmp_path)], _profile(25.0, 25 * 10**9, 6.0), "slow", now=1.0)   # 1.0 GB/s
    # slower and not held back: says nothing of the disk, the figure stays
    r = diskspeed.record_observed([str(tmp_path)], _profile(50.0, 25 * 10**9, 0.0), "gpu-bound", now=2.0)
    assert r["recorded"] is False and "dropped" not in r and json.loads(path.read_text())["observed"]["job_id"] == "slow"
    # faster than the figure without waiting: the disk is faster now than "slow" found it
    r = diskspeed.record_observed([str(tmp_path)], _profile(20.0, 25 * 10**9, 0.0), "fast", now=3.0)
    assert r["recorded"] is False and r["dropped"]["job_id"] == "slow"
    assert "observed" not in json.loads(path.read_text())
    assert diskspeed.lookup(str(tmp_path))["source"] == "test"
    # held back but too short to be a measure: a burst, which drops nothing
    diskspeed.record_observed([str(tmp_path)], _profile(25.0, 25 * 10**9, 6.0), "slow", now=4.0)
    r = diskspeed.record_observed([str(tmp_path)], _profile(0.1, 10**9, 0.05), "burst", now=5.0)
    assert r["recorded"] is False and "dropped" not in r and "under the" in r["why"]
    assert json.loads(path.read_text())["observed"]["job_id"] == "slow"


def test_no_figure_from_an_output_over_several_filesystems_or_without_a_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    assert os.stat("/proc").st_dev != os.stat(tmp_path).st_dev
    r = diskspeed.record_observed([str(tmp_path), "/proc"], _profile(20.0, 25 * 2**30, 6.0), "j")
    assert r == {"recorded": False, "why": "its output spans 2 filesystems"}
    assert diskspeed.record_observed([], _profile(20.0, 25 * 2**30, 6.0), "j")["recorded"] is False
    assert diskspeed.lookup(str(tmp_path)) is None


def test_for_dir_keeps_a_jobs_figure_and_refresh_forgets_it(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    diskspeed.record_observed([str(tmp_path)], _profile(25.0, 25 * 10**9, 6.0), "j", now=time.time())
    calls = []

    def recorded(path, size):
        calls.append(size)
        return {"bytes_per_s": 2_000_000_000, "bytes": size, "seconds": size / 2e9, "method": "recorded"}
    # a job's figure alone: the test is still made, and the lower one used
    got = diskspeed.for_dir(str(tmp_path), size=2**27, measure_fn=recorded)
    assert len(calls) == 1 and got["source"] == "job" and got["bytes_per_s"] == 10**9 and got["cached"] is False
    again = diskspeed.for_dir(str(tmp_path), measure_fn=recorded)
    assert len(calls) == 1 and again["source"] == "job" and again["cached"] is True
    fresh = diskspeed.for_dir(str(tmp_path), refresh=True, size=2**27, measure_fn=recorded)
    assert len(calls) == 2 and fresh["source"] == "test" and fresh["bytes_per_s"] == 2_000_000_000


def test_the_profile_line_is_read_from_this_jobs_part_of_the_log(tmp_path):
    log = tmp_path / "log"
    first = "extract-profile " + json.dumps(_profile(1.0, 1, 0.0)) + "\n"
    log.write_text("x\n" + first)
    start = log.stat().st_size
    assert sup.last_json_line(str(log), "extract-profile ") == _profile(1.0, 1, 0.0)
    assert sup.last_json_line(str(log), "extract-profile ", start) is None   # the earlier run's line is not this job's
    with open(log, "a") as fh:
        fh.write("extract-profile " + json.dumps(_profile(2.0, 2, 1.0)) + "\nextract-profile {broken\ndone\n")
    assert sup.last_json_line(str(log), "extract-profile ", start) == _profile(2.0, 2, 1.0)
    assert sup.last_json_line(str(tmp_path / "none"), "extract-profile ") is None


def test_a_test_without_a_speed_is_returned_as_measured(tmp_path, monkeypatch):
    """A measure of no time (bytes_per_s None) is still the answer, not a crash; the plan has no speed."""
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    got = diskspeed.for_dir(str(tmp_path), size=2**27, measure_fn=lambda path, size: {
        "bytes_per_s": None, "bytes": 0, "seconds": 0.0, "method": "recorded"})
    assert got["bytes_per_s"] is None and got["cached"] is False and got["source"] == "test"
    assert diskspeed.lookup(str(tmp_path)) is None


def test_no_test_on_a_disk_too_small_for_one_block(tmp_path, monkeypatch):
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    r = diskspeed.for_dir(str(tmp_path), size=2**20, measure_fn=lambda *a, **k: pytest.fail("measured"))
    assert r["error"].startswith("not measured")


# ------------------------------------------------------------------ active parameters
TINYLLAMA = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048,
             "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4}


def test_dense_gqa_count_matches_the_benchmarks_decoder_parameters():
    """benchmarks/GPU_RESULTS.md's 1.1B Llama: 968976384 parameters in the decoder layers (torch's count);
    the plan leaves out the two RMSNorm weights of each layer (2 x 2048 x 22) and the final norm (2048)."""
    r = activeparams.count(TINYLLAMA)
    assert r["active_params"] == 968_884_224
    assert r["active_params"] + 22 * 2 * 2048 + 2048 == 968_976_384
    assert "GQA 32/4" in r["how"] and "embeddings" in r["how"]


def test_moe_counts_the_routed_and_shared_experts_only():
    mixtral = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2}
    attn = 4096 * 4096 * 2 + 4096 * 1024 * 2
    assert activeparams.count(mixtral)["active_params"] == 32 * (attn + 2 * 3 * 4096 * 14336 + 4096 * 8)
    # DeepSeek-V3's MLA and MoE fields (its config.json), as Kimi-K2's text_config has them
    ds = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
          "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
          "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1,
          "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1}
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * (512 + 64) + 512 * 128 * 256 + 128 * 128 * 7168
    moe = 9 * 3 * 7168 * 2048 + 7168 * 256
    r = activeparams.count({"architectures": ["KimiK25ForConditionalGeneration"], "text_config": ds})
    assert r["active_params"] == 61 * mla + 58 * moe + 3 * 3 * 7168 * 18432
    assert r["moe_layers"] == 58 and "MoE 8 of 256 experts + 1 shared" in r["how"] and "MLA" in r["how"]


def test_a_missing_field_is_unknown_not_a_guess():
    assert "num_attention_heads" in activeparams.count({"hidden_size": 8, "num_hidden_layers": 2})["unknown"]
    assert "num_experts_per_tok" in activeparams.count(dict(TINYLLAMA, num_experts=8))["unknown"]
    assert "intermediate_size" in activeparams.count({k: v for k, v in TINYLLAMA.items()
                                                      if k != "intermediate_size"})["unknown"]


# ------------------------------------------------------------------ the plan from recorded answers
H200_GPUS = {"present": True, "gpus": [{"index": i, "name": "NVIDIA H200"} for i in range(8)]}
WRITE_TEST = {"bytes_per_s": 1_250_000_000, "bytes": 2**28, "seconds": 0.2147, "method": "recorded",
              "mount": "/data", "cached": True, "age_s": 120.0}


def _need(tmp_path, monkeypatch, free_blocks, lengths=(3000,) * 10, hidden=2048, layers=4):
    """diskneed.preflight on a recorded statvfs (f_bavail x 4096 bytes free)."""
    monkeypatch.setattr(diskneed.os, "statvfs", lambda p: types.SimpleNamespace(f_bavail=free_blocks, f_frsize=4096))
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": [1] * n}) + "\n" for n in lengths))
    v = diskneed.preflight(hidden, layers, str(ds), str(tmp_path / "out"), max_model_len=2048)
    v["active"] = activeparams.count(TINYLLAMA)
    return v


def test_the_plans_figures_are_the_recorded_statvfs_and_write_test(tmp_path, monkeypatch):
    need = _need(tmp_path, monkeypatch, free_blocks=10**8)
    p = P.build(need, WRITE_TEST, H200_GPUS, 2, "/data/out")
    tokens = 10 * 2047
    assert (p.samples, p.tokens, p.tokens_exact, p.free_bytes) == (10, tokens, True, 4096 * 10**8)
    assert p.bytes == diskneed.need_bytes(2048, 4, tokens, 10) == need["need_bytes"]
    assert p.disk_bytes_per_s == 1_250_000_000 and p.disk_hours == p.bytes / 1.25e9 / 3600
    assert p.disk_speed["age_s"] == 120.0 and p.disk_speed["cached"] is True
    eff = P.efficiency_for(968_884_224)["factor"]
    assert [g["model"] for g in p.gpus] == ["H200 SXM"] * 2            # gpu_count 2 of the host's 8
    assert p.flops_per_token == 2 * 968_884_224
    assert p.compute_hours == pytest.approx(tokens * 2 * 968_884_224 / (2 * 989.5e12 * eff) / 3600, rel=1e-12)
    assert p.bound == ("disk" if p.disk_hours >= p.compute_hours else "compute") == "disk"
    line = plan_line(p.to_json())
    assert line.startswith(f"plan: 10 samples, {tokens:,} tokens (exact), ")
    assert "writes 1.25 GB/s (cached 2m00s ago)" in line and line.endswith("bound: disk")
    assert f"{eff:g} of peak as measured on a dense model of 0.97B parameters" in line and "2 x H200 SXM" in line
    assert p.efficiency_from.startswith("dense model of 0.97B parameters, median of ")
    assert p.efficiency_model == "dense model of 0.97B parameters"


def test_a_slow_gpu_table_entry_makes_it_compute_bound(tmp_path, monkeypatch):
    need = _need(tmp_path, monkeypatch, free_blocks=10**8)
    p = P.build(need, dict(WRITE_TEST, bytes_per_s=10**13), {"gpus": [{"name": "NVIDIA A100-SXM4-80GB"}]}, None, "/o")
    assert p.gpus[0]["bf16_dense_tflops"] == 312 and p.bound == "compute"


def test_an_unknown_gpu_or_model_leaves_the_compute_bound_unknown(tmp_path, monkeypatch):
    need = _need(tmp_path, monkeypatch, free_blocks=10**8)
    p = P.build(need, WRITE_TEST, {"gpus": [{"name": "Tesla T4"}]}, None, "/o")
    assert p.compute_hours is None and "Tesla T4" in p.compute_unknown and p.bound == "unknown"
    assert P.gpu_peak("NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition") is None
    assert P.gpu_peak("NVIDIA RTX PRO 6000 Blackwell Server Edition")["bf16_dense_tflops"] == 503.8
    assert P.gpu_peak("NVIDIA H100 80GB HBM3")["model"] == "H100 SXM"
    assert P.gpu_peak("NVIDIA H100 PCIe")["model"] == "H100 PCIe"
    no_model = dict(need, active={"unknown": "no num_attention_heads"})
    assert "no num_attention_heads" in P.build(no_model, WRITE_TEST, H200_GPUS, 1, "/o").compute_unknown
    p = P.build(need, {"error": "not measured: a job writes there"}, H200_GPUS, 1, "/o")
    assert p.disk_hours is None and p.disk_unknown == "not measured: a job writes there" and p.bound == "unknown"
    assert "write speed unknown" in plan_line(p.to_json())
    assert P.build({"unknown": "no model"}, WRITE_TEST, H200_GPUS, 1, "/o") is None


def test_every_table_figure_has_a_source():
    data = P.peaks()
    assert all(e["source"].startswith("http") and e["bf16_dense_tflops"] > 0 for e in data["gpus"])
    # the efficiency points are the committed GPU results' (c)/(d), as benchmarks/render/plan_efficiency.py
    # computes them now: the table cannot drift from the results, nor the markdown from either
    import importlib.util
    root = P.PEAKS_FILE.parents[2]
    spec = importlib.util.spec_from_file_location("plan_efficiency", root / "benchmarks" / "render" / "plan_efficiency.py")
    pe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pe)
    runs = pe.runs()
    assert data["efficiency"]["points"] == pe.points(runs) and len(runs) >= 2
    assert (root / "benchmarks" / "PLAN_EFFICIENCY.md").read_text() == pe.markdown(runs, pe.points(runs))
    assert all(0 < p["factor"] < 1 and p["source"].startswith("benchmarks/PLAN_EFFICIENCY.md") for p in data["efficiency"]["points"])


def test_the_efficiency_is_the_point_nearest_the_models_size():
    pts = sorted(P.peaks()["efficiency"]["points"], key=lambda p: p["active_params"])
    small, large = pts[0], pts[-1]
    assert P.efficiency_for(small["active_params"]) == small and P.efficiency_for(1) == small
    assert P.efficiency_for(large["active_params"] * 1000) == large           # beyond the largest: the largest's
    mid = int((small["active_params"] * large["active_params"]) ** 0.5)    # the geometric middle splits them
    assert P.efficiency_for(int(mid * 0.9)) == small and P.efficiency_for(int(mid * 1.1)) == large


def test_the_preflight_plan_and_the_refusal_share_the_numbers(tmp_path, monkeypatch):
    """The Disk part refuses with diskneed's line; the LaunchPlan part's figures are that verdict's."""
    need = _need(tmp_path, monkeypatch, free_blocks=100)      # 400 KiB free: the job does not fit
    c = PF.Context(types.SimpleNamespace(label="h1"), PF.ExtractSpec(key="pf", command=["x"], workdir="/w",
                                                                     output_dir="/data/out", gpu_count=1), None)
    pf = PF.Preflight(disk={"free_bytes": need["free_bytes"], "need": need, "speed": WRITE_TEST}, gpu=H200_GPUS)
    PF.Disk().read(c, pf, {})
    PF.LaunchPlan().read(c, pf, {})
    assert pf.problems == [need["line"]] and need["line"].startswith("not enough disk at")
    assert pf.plan["fits"] is False and pf.plan["bytes"] == need["need_bytes"] and pf.plan["free_bytes"] == 409600
    from remote_ops.units import human_bytes
    assert f"{human_bytes(pf.plan['bytes'])} to write" in plan_line(pf.plan)
    assert pf.to_json()["plan"] == pf.plan


def test_the_probe_asks_for_the_disk_speed_only_with_a_disk_need():
    sp = PF.ExtractSpec(key="pf", command=["x"], workdir="/w", output_dir="/o", disk={"dataset": "d"})
    (_, req), = PF.RunningJob().ops(PF.Context(None, sp, types.SimpleNamespace(doc=None), remeasure_disk=True)).items()
    assert req[1]["speed"] == {"refresh": True}
    (_, req), = PF.RunningJob().ops(PF.Context(None, PF.ExtractSpec(key="pf", command=["x"], workdir="/w",
                                                                    output_dir="/o"), types.SimpleNamespace(doc=None))).items()
    assert "speed" not in req[1]


# ------------------------------------------------------------------ which bound a running job is at
def _status(tokens_per_s, disk_bytes_per_s, bytes_per_token=16401.7):
    return {"state": "running", "tokens_per_s": tokens_per_s,
            "write": {"bytes_per_token": bytes_per_token,
                      "bytes_per_s": round(tokens_per_s * bytes_per_token) if tokens_per_s and bytes_per_token else None,
                      "disk": None if disk_bytes_per_s is None else {"bytes_per_s": disk_bytes_per_s}}}


def test_bound_of_a_running_job():
    disk = _status(70_000, 1_250_000_000)        # 1.148 GB/s written: 0.92 of the disk
    assert P.bound_of(disk)["bound"] == "disk" and P.bound_of(disk)["ratio"] == 0.918
    assert bound_text(disk) == "disk-bound (writes at 0.92 of the disk's measured 1.25 GB/s)"
    gpu = _status(20_000, 1_250_000_000)
    assert P.bound_of(gpu)["bound"] == "gpu" and bound_text(gpu).startswith("GPU-bound (writes at 0.26 of")
    at = 1_250_000_000 * P.DISK_BOUND_AT / 16401.7
    assert P.bound_of(_status(at * 1.001, 1_250_000_000))["bound"] == "disk"
    assert P.bound_of(_status(at * 0.999, 1_250_000_000))["bound"] == "gpu"
    assert bound_text(_status(20_000, None)).startswith("bound unknown: no measured disk speed")
    assert "without a plan" in P.bound_of(_status(20_000, 10**9, bytes_per_token=None))["why"]
    assert bound_text(dict(disk, state="succeeded")) == "" and bound_text({"state": "running"}) == ""
    # the live line of --tail: a job without a plan (or without tokens/s yet) says nothing of its bound
    from remote_ops.extract.tail import snapshot_text
    no_plan = _status(20_000, 10**9, bytes_per_token=None)
    assert bound_text(no_plan, brief=True) == "" and "bound" not in snapshot_text(no_plan)
    assert "GPU-bound (writes at 0.26" in snapshot_text(gpu)
    assert "bound unknown: no measured disk speed" in snapshot_text(_status(20_000, None))


def test_sigterm_while_measuring_removes_the_file_then_terminates(tmp_path):
    """A SIGTERM (a dropped session, `kill`) during the write test: the file is unlinked, then the signal
    does what it would have done (the process ends by SIGTERM)."""
    import signal
    import subprocess
    import sys
    code = f"""
import os, sys, time
sys.path.insert(0, {str(P.PEAKS_FILE.parents[2])!r})
from remote_ops.agent.job import diskspeed
real = os.write
def slow(fd, b):
    print("writing", flush=True)
    time.sleep(0.2)
    return real(fd, b)
diskspeed.os.write = slow
diskspeed.measure({str(tmp_path)!r}, size=100 * 2**20, block=2**20, budget=60)
print("returned", flush=True)
"""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert _leftovers(tmp_path) != []                    # the test file exists while it writes
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM and "returned" not in out
    assert _leftovers(tmp_path) == []
