"""extract's launch plan over the real sshd: the plan line and its --json key, the disk's write test run on the
host once and then read from the host's cache (no temporary file left), a recorded write test's figures in
the plan, the refusal with the plan's numbers, and which bound a running job is at in status and --tail.
The parts on recorded answers: tests/extract/test_launch_plan.py."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from remote_ops.agent.job import diskneed, diskspeed
from tests.extract.test_jobs import Env, _no_job_left_behind, cli_json  # noqa: F401  (its autouse fixture)
from tests.conftest import FIXTURES

pytestmark = pytest.mark.timeout(180)

CONFIG = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 704,
          "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2}
PLAN_KEYS = {"samples", "tokens", "tokens_exact", "tokens_how", "bytes", "bytes_per_token", "free_bytes", "fits",
             "disk_path", "disk_bytes_per_s", "disk_speed", "disk_hours", "disk_unknown", "gpus", "active_params",
             "params_how", "flops_per_token", "efficiency", "efficiency_model", "efficiency_from", "compute_tokens_per_s", "compute_hours",
             "compute_unknown", "bound", "cold_start"}


def _h200_nvidia_smi(tmp_path):
    """nvidia-smi answering with the recorded idle H200 (tests/fixtures/nvidia-smi) and no compute process."""
    fix = FIXTURES / "nvidia-smi"
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"""#!{sys.executable}
import sys
a = " ".join(sys.argv[1:])
if "--query-gpu=" in a: sys.stdout.write(open({str(fix / 'query-gpu_idle.csv')!r}).read())
""")
    exe.chmod(0o755)
    return exe


def _env(tmp_path, sshd, samples=30, seq=40, extra=()):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(CONFIG))
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": [1] * seq}) + "\n" for _ in range(samples)))
    disk = {"dataset": str(ds), "max_model_len": 2048, "model": str(model)}
    return Env(tmp_path, sshd, ["--max-samples", str(samples), "--seq-len", str(seq), *extra],
               {"expected_samples": samples, "disk": disk},
               host_env={"REMOTE_OPS_NVIDIA_SMI": str(_h200_nvidia_smi(tmp_path))})


def _cache_file(env):
    return env.state / "diskspeed" / (diskspeed.fs_key(str(env.out))["key"] + ".json")


def _record_write_test(env, bytes_per_s, nbytes=2**28):
    """A recorded write test in the host's cache for the output directory's filesystem."""
    fs = diskspeed.fs_key(str(env.out))
    path = _cache_file(env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bytes_per_s": bytes_per_s, "bytes": nbytes, "seconds": nbytes / bytes_per_s,
                                "method": "recorded", "dev": fs["dev"], "mount": fs["mount"], "key": fs["key"],
                                "measured_at": time.time() - 600}))


def test_launch_plan_dry_run_measures_the_disk_once_then_reads_the_cache(tmp_path, sshd, cli):
    env = _env(tmp_path, sshd)
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, err
    plan = rec["preflight"]["plan"]
    assert set(plan) == PLAN_KEYS
    assert (plan["samples"], plan["tokens"], plan["tokens_exact"]) == (30, 30 * 40, True)
    assert plan["bytes"] == diskneed.need_bytes(256, 4, 1200, 30) and plan["fits"] is True
    sp = plan["disk_speed"]
    assert sp["cached"] is False and sp["bytes"] > 0 and "fsync" in sp["method"] and plan["disk_bytes_per_s"] > 0
    assert plan["disk_hours"] == pytest.approx(plan["bytes"] / plan["disk_bytes_per_s"] / 3600, rel=1e-9)
    assert [g["model"] for g in plan["gpus"]] == ["H200 SXM"] and plan["compute_hours"] > 0
    assert plan["bound"] in ("disk", "compute")
    cached = json.loads(_cache_file(env).read_text())
    assert cached["bytes_per_s"] == plan["disk_bytes_per_s"]
    leftovers = [p for p in tmp_path.rglob(diskspeed.PREFIX + "*")]
    assert leftovers == [] and not env.out.exists()

    # the second extract reads the host's cache: no second write test (the cache file is not rewritten)
    stamp = _cache_file(env).stat().st_mtime_ns
    s, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert s == 0, err
    (line,) = [l.strip() for l in out.splitlines() if l.strip().startswith("plan: ")]
    assert line.startswith("plan: 30 samples, 1,200 tokens (exact), ") and "cached " in line and " ago)" in line
    assert "compute ~" in line and "1 x H200 SXM" in line and line.endswith(f"bound: {plan['bound']}")
    assert _cache_file(env).stat().st_mtime_ns == stamp
    # --remeasure-disk: measured again
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run", "--remeasure-disk")
    assert s == 0 and rec["preflight"]["plan"]["disk_speed"]["cached"] is False
    assert _cache_file(env).stat().st_mtime_ns != stamp
    assert [p for p in tmp_path.rglob(diskspeed.PREFIX + "*")] == []


def test_launch_plan_figures_are_the_recorded_write_test(tmp_path, sshd, cli):
    env = _env(tmp_path, sshd)
    _record_write_test(env, 1_250_000_000)
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, err
    plan = rec["preflight"]["plan"]
    assert plan["disk_bytes_per_s"] == 1_250_000_000 and plan["disk_speed"]["cached"] is True
    assert plan["disk_speed"]["age_s"] >= 600 and plan["disk_speed"]["method"] == "recorded"
    assert plan["disk_hours"] == plan["bytes"] / 1.25e9 / 3600


def test_launch_plan_refusal_when_it_cannot_fit(tmp_path, sshd, cli):
    """A job too big for the free space: refused with diskneed's line, the plan printed with the same
    bytes, and no write test on a disk the job would not fit on."""
    import shutil
    env = _env(tmp_path, sshd)
    free = shutil.disk_usage(tmp_path).free
    cfg = dict(CONFIG, hidden_size=int(free * 2 / (4 * 2 * 1200)) + 1)      # about twice the free space
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    s, out, err = cli(*env.argv("extract", "testhost", "--json"))
    assert s == 8
    doc = json.loads(out)
    assert doc["error"] == "RefusedError" and doc["message"].endswith(doc["preflight"]["problems"][-1])
    plan = doc["preflight"]["plan"]
    assert plan["fits"] is False and plan["bytes"] == diskneed.need_bytes(cfg["hidden_size"], 4, 1200, 30)
    assert plan["disk_speed"] is None and plan["disk_unknown"].startswith("not measured")
    s, out, err = cli(*env.argv("extract", "testhost"))
    assert s == 8 and "not enough disk at " in err and "plan: 30 samples, 1,200 tokens (exact)" in err
    assert env.jobdirs() == [] and not _cache_file(env).exists()


def _wait_tokens(cli, env):
    deadline = time.time() + 60
    while time.time() < deadline:
        s, rec, _ = cli_json(cli, env, "status", "testhost")
        if rec["job"].get("tokens_per_s"):
            return rec
        time.sleep(0.3)
    raise AssertionError("the job never reported tokens/s")


def test_status_and_tail_say_which_bound_the_running_job_is_at(tmp_path, sshd, cli):
    env = _env(tmp_path, sshd, samples=100, extra=["--sleep", "0.3", "--progress-seconds", "0"])
    _record_write_test(env, 1000)             # a disk of 1 kB/s: any job writes faster, so it is disk-bound
    s, rec, err = cli_json(cli, env, "extract", "testhost")
    assert s == 0, err
    bpt = rec["preflight"]["plan"]["bytes_per_token"]
    assert bpt == round(diskneed.need_bytes(256, 4, 100 * 40, 100) / (100 * 40), 1)
    job = _wait_tokens(cli, env)["job"]
    assert job["write"]["bytes_per_token"] == bpt and job["write"]["disk"]["bytes_per_s"] == 1000
    b = job["bound"]
    assert b["bound"] == "disk" and b["ratio"] == round(b["write_bytes_per_s"] / 1000, 3)
    s, out, _ = cli(*env.argv("status", "testhost"))
    assert "disk-bound (writes at " in out and "of the disk's measured 0.00 GB/s)" in out
    _record_write_test(env, 10**15)           # a disk no job can keep busy: GPU-bound
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["bound"]["bound"] == "gpu" and rec["job"]["bound"]["ratio"] < 0.8
    s, out, _ = cli(*env.argv("status", "testhost"))
    assert "GPU-bound (writes at 0.00 of the disk's measured 1000000.00 GB/s)" in out
    # the follower's snapshots (extract --tail and logs --follow: extract/follow.py) carry the same label;
    # following THIS job with logs --follow (extract --tail after its end would launch a resume)
    s, out, err = cli(*env.argv("logs", "testhost", "--follow", "--json"))
    assert s == 0, err
    events = [json.loads(l) for l in out.splitlines() if l.strip()]
    snaps = [e for e in events if e.get("event") == "snapshot" and e.get("state") == "running" and e.get("tokens_per_s")]
    assert snaps and all(e["bound"]["bound"] == "gpu" for e in snaps)
    end = [e for e in events if e.get("event") == "end"][-1]["status"]
    assert end["state"] == "succeeded" and "bound" not in end
    # the job was held back by its --sleep, not by its disk: its writes are no measure of the disk
    obs = end["disk_observed"]
    assert obs["recorded"] is False and obs["why"].startswith("the disk did not hold it back"), obs
    assert "observed" not in json.loads(_cache_file(env).read_text())
    assert [p for p in tmp_path.rglob(diskspeed.PREFIX + "*")] == []
    assert os.path.exists(env.out)


def _wait_end(cli, env, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        s, rec, _ = cli_json(cli, env, "status", "testhost")
        if rec["job"]["state"] not in ("starting", "running") and rec["job"].get("disk_observed") is not None:
            return rec["job"]
        time.sleep(0.3)
    raise AssertionError("the job did not end")


def test_a_disk_bound_jobs_own_writes_are_the_next_plans_disk_speed(tmp_path, sshd, cli):
    """A job held back by its disk (a save of 40 ms a file, one writer thread, a 0.1 MB queue) ends: its
    supervisor keeps its own write speed beside the write test (a 256 KiB burst at 10 GB/s), status says
    so, the next plan uses the lower figure and names the job, and --remeasure-disk forgets it."""
    env = _env(tmp_path, sshd, samples=60,
               extra=["--writer-threads", "1", "--write-queue-mb", "0.1", "--save-ms", "40"])
    _record_write_test(env, 10**10, nbytes=2**18)
    s, rec, err = cli_json(cli, env, "extract", "testhost")
    assert s == 0, err
    assert rec["preflight"]["plan"]["disk_speed"]["source"] == "test"
    job = _wait_end(cli, env)
    assert job["state"] == "succeeded", job
    d = job["disk_observed"]
    assert d["recorded"] is True, d
    o = d["observed"]
    assert o["bytes"] >= 4 * 2**18 and o["bytes_per_s"] == int(o["bytes"] / o["seconds"])
    assert o["waited_s"] >= 0.1 * o["seconds"] and o["job_id"] == job["job_id"]
    # the job's own figure: its extract-profile line, as the script printed it in the job's log
    (line,) = [l for l in Path(job["log"]).read_text().splitlines() if l.startswith("extract-profile ")]
    prof = json.loads(line[len("extract-profile "):])
    assert (o["bytes"], o["seconds"], o["waited_s"]) == (prof["writer"]["bytes"], prof["seconds"],
                                                         prof["writer"]["put_wait_s"])
    cached = json.loads(_cache_file(env).read_text())
    assert cached["bytes_per_s"] == 10**10 and cached["observed"]["bytes_per_s"] == o["bytes_per_s"]
    s, out, _ = cli(*env.argv("status", "testhost"))
    assert (f"disk: this job wrote {o['bytes_per_s'] / 1e9:.2f} GB/s, waiting {o['waited_s']:.1f} s of "
            f"{o['seconds']:.1f} s for it; kept for the next plan on {d['mount']} (the lower of it and the write "
            "test)") in out

    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run", "--overwrite")
    assert s == 0, err
    plan = rec["preflight"]["plan"]
    assert plan["disk_bytes_per_s"] == o["bytes_per_s"] and plan["disk_speed"]["source"] == "job"
    assert plan["disk_speed"]["job_id"] == job["job_id"] and plan["disk_speed"]["test"]["bytes_per_s"] == 10**10
    assert plan["disk_hours"] == pytest.approx(plan["bytes"] / o["bytes_per_s"] / 3600, rel=1e-9)
    s, out, err = cli(*env.argv("extract", "testhost", "--dry-run", "--overwrite"))
    (line,) = [l.strip() for l in out.splitlines() if l.strip().startswith("plan: ")]
    assert f"writes {o['bytes_per_s'] / 1e9:.2f} GB/s (job {job['job_id']}'s own writes, " in line
    assert "; the write test: 10.00 GB/s) -> " in line
    # --remeasure-disk: a new write test, the job's figure forgotten
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run", "--overwrite", "--remeasure-disk")
    assert s == 0, err
    assert rec["preflight"]["plan"]["disk_speed"]["source"] == "test"
    assert "observed" not in json.loads(_cache_file(env).read_text())
