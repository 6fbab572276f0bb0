"""benchmarks/gpu/throughput.py on the CPU: its pure parts, the wheel list its (c) part needs
(against the REAL vLLM 0.20.0 sources from PyPI), and a STAND-IN rehearsal of its (a) part: the
harness drives `remote-ops extract` over a `connection: local` host for AFTER (this checkout) and
BEFORE (git show of main's script and playbook), with the sandbox's torch-CPU stand-in generator in
place of vLLM, and measures from the job's own files; then benchmarks/render/gpu_results.py renders it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
import torch

from remote_ops import pkgsource
from tests.conftest import REPO, load_extract_script

from benchmarks.render import gpu_results  # noqa: E402
from benchmarks.gpu import throughput as gt  # noqa: E402


def test_arguments():
    a = gt.parse_args(["--out", "x.json"])
    assert (a.samples, a.min_tokens, a.max_tokens, a.model, a.budget_s) == (300, 200, 4000, "1.1b", 510)
    assert a.parts == "disk,a_before,a_after,a_tmpfs,b,c" and a.before_rev == gt.BEFORE_REV
    for argv in (["--out", "x", "--parts", "a,zz"], ["--out", "x", "--min-tokens", "9", "--max-tokens", "3"], [],
                 ["--out", "x", "--parts", "disk,a_after,a_before"],     # BEFORE's patch cannot follow AFTER's
                 ["--out", "x", "--parts", "a_before,b,b_before"]):
        with pytest.raises(SystemExit):
            gt.parse_args(argv)
    assert gt.parse_args(["--prepare-before"]).out is None
    assert gt.parse_args(["--out", "x", "--parts", "disk,b_before,a_before,a_after,b,c"]).parts.startswith("disk,b_before")
    assert gt.parse_args(["--out", "x", "--parts", "c,b_before,b,disk"]).parts == "c,b_before,b,disk"   # c: no patch


def test_the_before_revision_is_mains_playbook_without_the_zero_copy_slots(tmp_path):
    got = gt.prepare_before(gt.BEFORE_REV, tmp_path)
    assert got == f"git show {gt.BEFORE_REV}"
    old = (tmp_path / "playbooks" / "scripts" / "extract_hidden_states.py").read_text()
    assert "class Writer" in old and "--handoff-dir" in old
    # every file the playbook's extract.files ships, where the playbook's relative paths find it
    assert (tmp_path / "remote_ops" / "agent" / "outputs" / "run_identity.py").read_text().startswith('"""')
    playbook = (tmp_path / "playbooks" / "eagle3-speculators-0.3.0.yaml").read_text()
    assert "captured-states-through-shared-memory" in playbook and "zero-copy" not in playbook
    assert "captured-states-zero-copy-stream" in gt.PLAYBOOK.read_text()
    assert gt.prepare_before("0" * 40, tmp_path / "none") is None


def test_dataset_lengths_cut_and_roofline():
    rows = gt.make_dataset(300, 200, 4000, 32000)
    assert rows == gt.make_dataset(300, 200, 4000, 32000)               # seeded
    assert all(200 <= len(r) <= 4000 and r[0] == 1 and min(r[1:]) >= 4 and max(r) < 32000 for r in rows)
    lengths = gt.cut_lengths(rows, 2048)
    assert max(lengths) == 2047 and sum(1 for r in rows if len(r) > 2047) > 100
    r = gt.roofline(10**9, [1000, 3000], layers=2, hidden=8)
    assert r["tokens"] == 4000 and r["tokens_per_s"] == pytest.approx(989e12 / 2e9, rel=1e-6)
    assert r["attention_flops"] == 2 * (1000**2 + 3000**2) * 8 * 2 and "datasheet" in r["peak_source"]
    doc = {"a_after": {"tokens_per_s": 90.0}, "a_before": {"tokens_per_s": 45.0}, "b_generator": {"tokens_per_s": 100.0},
           "c_vllm_prefill": {"tokens_per_s": 200.0}, "d_roofline": {"tokens_per_s": 400.0}}
    doc["a_tmpfs"] = {"tokens_per_s": 95.0}
    doc["a_server"] = {"tokens_per_s": 120.0}
    assert gt.ratios(doc) == {"a/b": 0.9, "b/c": 0.5, "c/d": 0.5, "a/c": 0.45, "a_before/b": 0.45,
                              "a_after/a_before": 2.0, "a_tmpfs/b": 0.95, "a_tmpfs/c": 0.475, "a_before/c": 0.225,
                              "a_server/c": 0.6, "a_server/a_after": 1.3333, "a_server/b": 1.2,
                              "b_before/c": None, "b/b_before": None, "a_before_tmpfs/c": None,
                              "a_tmpfs/a_before_tmpfs": None, "a_2dirs/a_after": None,
                              "a_tmpfs_gil5/c": None, "a_tmpfs_gil5/a_tmpfs": None,
                              "a_tmpfs_w8/c": None, "a_tmpfs_w8/a_tmpfs": None,
                              "a_tmpfs_k1/c": None, "a_tmpfs_k1/a_tmpfs": None,
                              "a_tmpfs_w0/c": None, "a_tmpfs_w0/a_tmpfs": None, "a_tmpfs_w4/c": None,
                              "a_tmpfs_w4/a_tmpfs": None, "a_after_w8/a_after": None, "a_after_w4/a_after": None,
                              # no (c_best) here: every ratio against it is None
                              "a_tmpfs/c_best": None, "a_server/c_best": None, "b/c_best": None, "a/c_best": None,
                              "c/c_best": None, "c_best/d": None,
                              # no server flow on a tmpfs either
                              "a_server_tmpfs/a_server": None, "a_server_tmpfs/c_best": None,
                              "a_server_tmpfs_c64/c_best": None, "a_server_tmpfs_c64/a_server_tmpfs": None,
                              "a_server_tmpfs_b64k/c_best": None, "a_server_tmpfs_b64k/a_server_tmpfs": None,
                              "a_server_tmpfs_async/c_best": None, "a_server_tmpfs_async/a_server_tmpfs": None,
                              "a_server_tmpfs_async_b64k/c_best": None,
                              "a_server_tmpfs_async_b64k/a_server_tmpfs": None,
                              "a_server_tmpfs_async_b64k_x4/c_best": None,
                              "a_server_tmpfs_async_b64k_x4/a_server_tmpfs": None,
                              "a_server_tmpfs_x4/c_best": None, "a_server_tmpfs_x4/a_server_tmpfs": None,
                              "a_server_tmpfs_x8/c_best": None, "a_server_tmpfs_x8/a_server_tmpfs": None,
                              "a_server_tmpfs_x8_api4/c_best": None, "a_server_tmpfs_x8_api4/a_server_tmpfs": None,
                              "a_server_tmpfs_async_b64k_x8/c_best": None,
                              "a_server_tmpfs_async_b64k_x8/a_server_tmpfs": None}
    doc["a_tmpfs_gil5"] = {"tokens_per_s": 76.0}
    assert gt.ratios(doc)["a_tmpfs_gil5/c"] == 0.38 and gt.ratios(doc)["a_tmpfs_gil5/a_tmpfs"] == 0.8
    doc["a_after_w8"] = {"tokens_per_s": 117.0}
    assert gt.ratios(doc)["a_after_w8/a_after"] == 1.3
    assert set(gpu_results.TMPFS_VARIANT_LABELS) == set(gt.TMPFS_VARIANTS)     # each variant has its row
    doc["b_generator_before"] = {"tokens_per_s": 50.0}
    assert (gt.ratios(doc)["b_before/c"], gt.ratios(doc)["b/b_before"]) == (0.25, 2.0)
    assert gt.ratios({})["a/c"] is None


def test_dd_output_is_parsed(tmp_path):
    r = subprocess.run(["dd", "if=/dev/zero", f"of={tmp_path / 'f'}", "bs=1M", "count=4", "conv=fsync"],
                       capture_output=True, text=True)
    got = gt.parse_dd(r.stderr)
    assert got["bytes"] == 4 << 20 and got["seconds"] > 0 and got["bytes_per_s"] > 0
    assert gt.parse_dd("dd: error writing") is None


def test_output_rate_from_the_jobs_files(tmp_path):
    for i in range(3):
        torch.save({"x": torch.zeros(10)}, tmp_path / f"data_{i}.pt")
        os.utime(tmp_path / f"data_{i}.pt", (1000 + 2 * i, 1000 + 2 * i))
    (tmp_path / "data_config.json").write_text("{}")
    os.utime(tmp_path / "data_config.json", (996, 996))
    r = gt.output_rate(tmp_path, [100, 200, 300, 400])
    assert (r["files"], r["tokens"], r["seconds"], r["tokens_per_s"]) == (3, 600, 8.0, 75.0)
    assert r["bytes"] == sum((tmp_path / f"data_{i}.pt").stat().st_size for i in range(3))
    assert gt.output_rate(tmp_path / "missing", [1])["tokens_per_s"] is None
    lines = gt.job_lines('{"event": "line", "text": "generator ready in 1.0s"}\nnot json\n{"event": "progress"}\n')
    assert lines == ["generator ready in 1.0s"]


def test_llm_wheels_cover_what_from_vllm_import_llm_adds():
    """The REAL vLLM 0.20.0 sources: what vllm/entrypoints/llm.py imports at module level beyond the
    generator's modules is in benchmarks/gpu/wheels/llm.txt or on the GPU machine (GPU-NOTES.md)."""
    root = pkgsource.unpacked("vllm", "0.20.0")
    extra = gt.llm_only_imports(root)
    assert {"fastapi", "starlette", "partial_json_parser"} <= set(extra)
    wheels = [l.strip() for l in (REPO / "benchmarks" / "gpu" / "wheels" / "llm.txt").read_text().splitlines() if l.strip()]
    names = {w.split("==")[0].lower() for w in wheels}
    assert all(w.count("==") == 1 for w in wheels)
    on_machine = {"jinja2", "tokenizers"}        # torch needs jinja2; transformers needs tokenizers
    assert set(extra) - on_machine <= names
    assert {"anyio", "annotated_doc", "idna"} <= names    # what fastapi 0.128 / starlette 0.50 import


def test_standin_rehearsal_of_part_a_and_its_rendering(tmp_path):
    """The harness end to end on the CPU with the STAND-IN generator: BEFORE from git, AFTER this
    checkout, both through remote-ops extract; tokens/s from the files; the section renders it."""
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "throughput.py"), "--standin",
                        "--work", str(tmp_path / "w"), "--out", str(out), "--samples", "6", "--min-tokens", "5",
                        "--max-tokens", "30", "--dd-mib", "64", "--parts",
                        "disk,a_before,a_before_tmpfs,a_after,a_tmpfs,a_tmpfs_gil5,a_tmpfs_w8,a_tmpfs_k1,a_tmpfs_w0,"
                        "a_after_w8,a_after_w4,a_tmpfs_w4,a_2dirs"],
                       capture_output=True,
                       text=True, timeout=400,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    assert d["before_source"]["source"] == "git" and d["standin"]
    lengths = [min(len(json.loads(l)["input_ids"]), 2047)
               for l in (tmp_path / "w" / "throughput" / "dataset.jsonl").read_text().splitlines()]
    for k in ("a_after", "a_before", "a_tmpfs", "a_before_tmpfs", "a_tmpfs_gil5", "a_tmpfs_w8", "a_tmpfs_k1", "a_tmpfs_w0",
              "a_after_w8", "a_after_w4", "a_tmpfs_w4", "a_2dirs"):
        assert d[k]["rc"] == 0 and d[k]["complete"] and d[k]["tokens"] == sum(lengths) and d[k]["tokens_per_s"] > 0
    # AFTER's script says where its time went; BEFORE's (7a3c5d8) prints no such line
    for k, switch, threads in (("a_after", 0.5, 8), ("a_tmpfs", 0.5, 8), ("a_tmpfs_gil5", 0, 8), ("a_tmpfs_w8", 0.5, 8),
                               ("a_after_w8", 0.5, 8), ("a_after_w4", 0.5, 4), ("a_tmpfs_w4", 0.5, 4), ("a_2dirs", 0.5, 8)):
        prof = d[k]["profile"]
        assert prof["writer"]["files"] == 6 and prof["tokens"] == sum(lengths) and prof["gil_switch_ms"] == switch
        assert prof["writer"]["bytes"] > 0 and prof["writer"]["threads"] == threads
    assert d["a_before"]["profile"] is None and d["a_before_tmpfs"]["profile"] is None
    # measured, then removed: a long dataset's outputs would fill the disk or the RAM
    assert not list((tmp_path / "w" / "throughput").glob("out-*/data_*.pt"))
    # the script says how the states came (the stand-in has no vLLM worker), BEFORE's as AFTER's
    for k in ("a_after", "a_before"):
        assert d[k]["handoff_line"] == ("captured states did not come through shared memory: the STAND-IN "
                                        "generator computes them in this process (no vLLM worker to hand them over)")
    assert d["a_2dirs"]["per_directory"] == [3, 3]          # samples alternate over the two directories
    assert d["ratios"]["a_after/a_before"] == round(d["a_after"]["tokens_per_s"] / d["a_before"]["tokens_per_s"], 4)
    assert d["disk"]["dd_direct"]["bytes"] == 64 << 20
    # the long dd: as many bytes as a job writes (the stand-in's few KB), never fewer than --dd-mib
    assert d["disk"]["dd_direct_sustained"]["bytes"] == 64 << 20 and d["disk"]["dd_sustained_rc"] == 0
    use = d["disk_use"]
    assert use["disk_bound_from"] == "dd_direct_sustained"
    assert use["disk_bound_tokens_per_s"] == round(use["dd_direct_sustained_bytes_per_s"] / use["bytes_per_token"], 1)
    assert use["burst_bound_tokens_per_s"] == round(use["dd_direct_bytes_per_s"] / use["bytes_per_token"], 1)
    assert use["a_after/min(c,disk_bound)"] == round(d["a_after"]["tokens_per_s"] / use["disk_bound_tokens_per_s"], 4)
    assert d["ratios"]["a_after_w8/a_after"] == round(d["a_after_w8"]["tokens_per_s"] / d["a_after"]["tokens_per_s"], 4)
    text = "\n".join(gpu_results.throughput_section("r.json", d))
    assert "STAND-IN rehearsal on the CPU: not GPU figures" in text
    assert f"{d['a_after']['files']} files, {d['a_after']['tokens']} tokens in {d['a_after']['seconds']} s" in text
    assert "(b) the generator alone, no writes | - | None generate() calls" in text and "(not run)" in text
    assert "| (a) AFTER, files spread over two directories of the same disk |" in text and "6 files (3 + 3)" in text
    assert "| (a) BEFORE, files on a tmpfs |" in text
    assert "| (a) AFTER on the disk, 8 writer threads (writer_threads 8) |" in text
    assert "| (a) AFTER on the disk, 4 writer threads (writer_threads 4) |" in text
    assert "(as many bytes as a job writes)" in text and "(a)/min((c), disk bound)" in text
    assert "| (a) AFTER, files on a tmpfs, Python's own 5 ms thread switch interval (gil_switch_ms 0) |" in text
    # the variants' own settings reached the script: its ready line says the steps a call and the window (the
    # stand-in's engine takes batch_steps auto as 1)
    assert "1 step(s) per generate() call" in d["a_tmpfs_k1"]["generator_ready_line"]
    assert "filled from" not in d["a_tmpfs_k1"]["generator_ready_line"]
    assert "filled from" not in d["a_tmpfs_w0"]["generator_ready_line"]
    assert "filled from the next 16 pending" in d["a_tmpfs"]["generator_ready_line"]
    assert "| (a) AFTER, files on a tmpfs, 8 writer threads (writer_threads 8) |" in text
    p = d["a_tmpfs_gil5"]["profile"]
    assert (f"| AFTER on a tmpfs, Python's own 5 ms thread switch interval (gil_switch_ms 0) | {p['seconds']} | {p['generate_s']} | {p['build_s']} | {p['hand_over_s']} "
            f"({p['writer']['put_wait_s']}) | {p['drain_s']} | 6 | {p['writer']['save_s']} (8) |") in text
    assert "| BEFORE on a tmpfs |" not in text.split("Where the job's time went")[1]


FAKE_GENERATOR = '''
"""TEST FAKE of speculators' VllmHiddenStatesGenerator: its constructor, generate() driving an
executor's collective_rpc and a scheduler's schedule() as the real one does, and shutdown()."""
import torch

class Sched:
    max_num_scheduled_tokens, max_num_running_reqs = 50, 32
    def schedule(self):
        return None

class Executor:
    def collective_rpc(self, method, *a, **kw):
        return [torch.zeros(1)] if method == "_get_captured_states" else None
    def shutdown(self):
        pass

class VllmHiddenStatesGenerator:
    def __init__(self, model_path, layer_ids, max_model_len, gpu_memory_utilization, tensor_parallel_size):
        self.layer_ids, self.scheduler, self.executor = [0, 1], Sched(), Executor()
    def generate(self, token_ids):
        self.executor.collective_rpc("_reset_capture")
        self.scheduler.schedule()
        self.executor.collective_rpc("execute_model")
        self.executor.collective_rpc("_get_captured_states", unique_reply_rank=0)
        return [{"input_ids": torch.tensor(ids), "hidden_states": [], "loss_mask": None} for ids in token_ids]
'''

FAKE_VLLM = '''
"""TEST FAKE of vllm's LLM / SamplingParams: records its arguments, answers one output per prompt."""
import json, os
class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw
class _Out:
    def __init__(self, ids):
        self.prompt_token_ids = ids
class LLM:
    def __init__(self, **kw):
        with open(os.environ["FAKE_LLM_ARGS"], "w") as fh:
            json.dump(kw, fh)
        sc = type("SC", (), {"max_num_batched_tokens": kw["max_num_batched_tokens"], "max_num_seqs": 256,
                             "enable_chunked_prefill": True})()
        self.llm_engine = type("E", (), {"vllm_config": type("V", (), {"scheduler_config": sc})()})()
    def generate(self, prompts, sp, use_tqdm=True):
        assert sp.kw == {"max_tokens": 1, "temperature": 0.0}
        return [_Out(p["prompt_token_ids"]) for p in prompts]
'''


def test_the_generator_and_llm_parts_run_their_scripts(tmp_path):
    """GEN_ALONE and LLM_PREFILL as the harness runs them (files, argv, the shipped script's own
    dataset reading, packing and budget), against TEST FAKE speculators / vllm packages."""
    import time
    fake = tmp_path / "fake"
    mod = fake / "speculators" / "data_generation"
    mod.mkdir(parents=True)
    for d in (fake / "speculators", mod):
        (d / "__init__.py").write_text("")
    (mod / "vllm_hidden_states_generator.py").write_text(FAKE_GENERATOR)
    (fake / "vllm").mkdir()
    (fake / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    rows = gt.make_dataset(20, 5, 30, 100)
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    env = {**os.environ, "PYTHONPATH": str(fake), "FAKE_LLM_ARGS": str(tmp_path / "llm_args.json")}
    (tmp_path / "gen.py").write_text(gt.GEN_ALONE)
    r = subprocess.run([sys.executable, str(tmp_path / "gen.py"), str(gt.SCRIPT), "m", str(ds), "2048", "8", "0.8",
                        str(tmp_path / "b.json"), str(time.time() + 60)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["tokens"] == sum(map(len, rows)) and b["engine_budget"] == [50, 32] and b["batch_size_cap"] == 8
    assert b["count_batches"]["batches"] == 3 and b["count_batches"]["tokens"] == b["tokens"]
    assert b["batches"] == b["profile_calls"]["rpc:execute_model"] == b["profile_calls"]["scheduler.schedule"]
    assert set(b["profile_s"]) >= {"rpc:_get_captured_states", "rpc:execute_model", "rpc:_reset_capture"}
    ehs = load_extract_script("ehs_gt")
    # the (fake) engine's budget, at the script's own steps a call and packing window
    want = list(ehs.pack_batches(list(range(20)), [len(r) for r in rows], 50, 8, ehs.DEFAULT_BATCH_STEPS,
                                 ehs.DEFAULT_PACK_WINDOW))
    assert b["steps_a_call_and_window"] == [ehs.DEFAULT_BATCH_STEPS, ehs.DEFAULT_PACK_WINDOW]
    lengths = [len(r) for r in rows]
    assert b["steps"] == len(list(ehs.pack_steps(list(range(20)), lengths, 50, 8, ehs.DEFAULT_PACK_WINDOW)))
    assert b["steps_in_order"] == len(list(ehs.pack_steps(list(range(20)), lengths, 50, 8))) >= b["steps"]
    assert b["batches"] == len(want) >= 2 and len(want) < len(list(ehs.pack_batches(list(range(20)),
                                                                                 [len(r) for r in rows], 50, 8)))
    r = subprocess.run([sys.executable, str(tmp_path / "gen.py"), str(gt.SCRIPT), "m", str(ds), "2048", "8", "0.8",
                        str(tmp_path / "b2.json"), str(time.time() - 1)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert json.loads((tmp_path / "b2.json").read_text())["count_batches"] == {"skipped": "time budget"}
    (tmp_path / "llm.py").write_text(gt.LLM_PREFILL)
    r = subprocess.run([sys.executable, str(tmp_path / "llm.py"), str(gt.SCRIPT), "m", str(ds), "16", "8192", "0.8",
                        str(tmp_path / "c.json")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    c = json.loads((tmp_path / "c.json").read_text())
    assert c["tokens"] == sum(min(len(x), 15) for x in rows) and c["requests"] == 20     # cut like the script
    assert c["scheduler"] == {"max_num_batched_tokens": 8192, "max_num_seqs": 256, "enable_chunked_prefill": True}
    args = json.loads((tmp_path / "llm_args.json").read_text())
    assert args == {"model": "m", "max_model_len": 16, "max_num_batched_tokens": 8192, "gpu_memory_utilization": 0.8,
                    "enforce_eager": True, "enable_prefix_caching": False, "tensor_parallel_size": 1, "seed": 0}


def test_the_before_generator_is_rendered_beside_the_after_one_with_both_profiles():
    prof = {"rpc:execute_model": 1.5, "rpc:_get_captured_states": 0.9}
    d = {"b_generator_before": {"tokens_per_s": 100000.0, "batches": 63, "mean_tokens_per_batch": 7270.8,
                                "seconds": 4.0, "profile_s": {**prof, "other": 1.6}, "profile_calls": {}},
         "b_generator": {"tokens_per_s": 200000.0, "batches": 63, "mean_tokens_per_batch": 7270.8, "seconds": 2.0,
                         "profile_s": {"rpc:execute_model": 1.5, "other": 0.5}, "profile_calls": {}},
         "c_vllm_prefill": {"tokens_per_s": 250000.0}}
    d["ratios"] = gt.ratios(d)
    text = "\n".join(gpu_results.throughput_section("r.json", d))
    assert "| (b) BEFORE: the generator alone with BEFORE's playbook | 100.0k | 63 generate() calls" in text
    assert "BEFORE (b)/(c) 0.4, (b) AFTER/BEFORE 2.0" in text
    assert "Where the generator's time goes (b):" in text and "Where the generator's time goes (b) BEFORE:" in text
    assert "| rpc:_get_captured_states | 0.9 | 22% |" in text      # of BEFORE's 4.0 s


def test_plan_check_section_renders_each_run_and_its_ratio_to_dd():
    """gpu_results renders benchmarks/gpu/plan_check.py's JSON: one row per run with the write test over dd
    oflag=direct, '-' where a measure is missing, the GPU peak and the efficiency the plan uses."""
    d = {"dir": "/root/e2e", "fs": {"key": "65024-root"}, "leftovers": [], "efficiency": 0.4657,
         "gpus": [{"name": "NVIDIA H200", "table": {"model": "H200 SXM", "bf16_dense_tflops": 989.5}}],
         "runs": [{"write_test": {"bytes_per_s": 1_500_000_000}, "dd_direct": {"bytes_per_s": 1_600_000_000},
                   "dd_fsync": {"bytes_per_s": 1_300_000_000}},
                  {"write_test": {"bytes_per_s": 900_000_000}, "dd_direct": None, "dd_fsync": {}}]}
    lines = gpu_results.render_plan_check("plan_check_x.json", d)
    text = "\n".join(lines)
    assert "## Launch plan's measures on the GPU machine: plan_check_x.json" in text
    assert "NVIDIA H200 -> H200 SXM, 989.5 TFLOP/s bf16 dense; efficiency (c)/(d) 0.4657" in text
    assert "| 1 | 1500 MB/s | 1600 MB/s | 1300 MB/s | 0.9375 |" in lines
    assert "| 2 | 900 MB/s | - | - | - |" in lines
    assert "filesystem 65024-root); temporaries left behind: 0" in text


def test_a_before_that_ran_over_afters_slots_is_flagged():
    """BEFORE (7a3c5d8) makes no zero-copy slot file: a BEFORE job whose states came through one ran over
    AFTER's edits left in the install, and the section says it was not BEFORE; a BEFORE through its own
    shared-memory file is not flagged."""
    d = {"code_rev": "abc", "a_tmpfs": {"tokens_per_s": 170000.0},
         "a_before_tmpfs": {"tokens_per_s": 190000.0, "handoff_line": "captured states came through shared memory "
                            "(/dev/shm/remote-ops-hs-5016-y67txfsq/slot-5098-0-1)"},
         "ratios": {"a_tmpfs/a_before_tmpfs": 0.8947}}
    text = "\n".join(gpu_results.throughput_section("r.json", d))
    assert "**Not BEFORE:** (a) BEFORE on a tmpfs took its states through a zero-copy slot file" in text
    d["a_before_tmpfs"]["handoff_line"] = "captured states came through shared memory (/dev/shm/remote-ops-hs-1438-x/hs-1528-1)"
    assert "Not BEFORE" not in "\n".join(gpu_results.throughput_section("r.json", d))
    d["speculators_copy"] = {"copied": True, "as_installed": False, "differ_from_record": ["speculators/x.py"]}
    assert "**The run's copy of speculators was NOT as installed** (differing from its RECORD: speculators/x.py)" in \
        "\n".join(gpu_results.throughput_section("r.json", d))


def test_each_run_patches_its_own_copy_of_speculators_as_installed(tmp_path):
    """The install an earlier run patched in place (custom_worker.py differs from RECORD): the run's own
    copy gets the file back from the bundle, is recorded as installed, and leaves the install alone."""
    import base64
    import hashlib
    import tarfile
    work = tmp_path / "w"
    site = work / "site"
    (site / "speculators" / "data_generation").mkdir(parents=True)
    files = {"speculators/__init__.py": b"", "speculators/data_generation/custom_worker.py": b"release = 1\n"}
    record = []
    for rel, data in files.items():
        (site / rel).write_bytes(data)
        record.append(f"{rel},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},")
    (site / "speculators-0.3.0.dist-info").mkdir()
    (site / "speculators-0.3.0.dist-info" / "RECORD").write_text("\n".join(record) + "\n")
    with tarfile.open(work / "bundle.tar.gz", "w:gz") as tf:
        tf.add(site / "speculators/data_generation/custom_worker.py",
               arcname="site/speculators/data_generation/custom_worker.py")
    (site / "speculators/data_generation/custom_worker.py").write_bytes(b"release = 1\n# patched by AFTER\n")
    b = gt.Bench(gt.parse_args(["--work", str(work), "--out", str(tmp_path / "r.json")]))
    spec = Path(b.own_speculators())
    assert spec == work / "throughput" / "spec"
    assert (spec / "speculators/data_generation/custom_worker.py").read_bytes() == b"release = 1\n"
    copy = b.doc["speculators_copy"]
    assert copy["as_installed"] and copy["restored_from_bundle"] == ["speculators/data_generation/custom_worker.py"]
    assert b"patched by AFTER" in (site / "speculators/data_generation/custom_worker.py").read_bytes()


def test_afters_patch_is_made_on_the_files_as_installed_after_befores_is_rolled_back(tmp_path):
    """BEFORE's patch, then AFTER's: BEFORE's is rolled back first (an edit whose text changed since
    BEFORE finds neither text on top of it); a failed rollback or patch raises, and nothing is
    recorded as patched."""
    b = gt.Bench(gt.parse_args(["--work", str(tmp_path / "w"), "--out", str(tmp_path / "r.json")]))
    calls, replies = [], {}

    def ro(*args, timeout=300):
        calls.append(args[:2])
        return {"rc": replies.get(args[:2], 0), "seconds": 0.1, "stdout": "", "stderr": "boom" if replies.get(args[:2]) else ""}
    b.ro = ro
    b.part_patch("before")
    assert b.patched_before and calls == [("patch", "before")]
    b.part_patch("after")
    assert calls[1:] == [("rollback", "before"), ("patch", "after")] and not b.patched_before
    assert b.doc["patch"]["rc"] == 0 and b.doc["patch"]["rollback_before"]["rc"] == 0
    # AFTER alone (no BEFORE part): nothing to roll back
    calls.clear()
    b.part_patch("after")
    assert calls == [("patch", "after")]
    # a rollback that fails: AFTER's patch is not tried, the part's rc says so
    b.patched_before, replies[("rollback", "before")] = True, 8
    calls.clear()
    with pytest.raises(RuntimeError, match="rollback of BEFORE's patch failed"):
        b.part_patch("after")
    assert calls == [("rollback", "before")] and b.doc["patch"]["rc"] == 8


def test_parts_whose_patch_failed_are_skipped_not_measured_on_the_other_code(tmp_path):
    b = gt.Bench(gt.parse_args(["--work", str(tmp_path / "w"), "--out", str(tmp_path / "r.json")]))
    b.doc["before_source"] = {"source": "git"}
    ran = []

    def patch(which):
        b.doc["patch" if which == "after" else "patch_before"] = {"rc": 8 if which == "after" else 0}
        if which == "after":
            raise RuntimeError("patch after failed (exit 8): anchor not found")
    b.part_patch = patch
    plan = {p: ((lambda p=p: ran.append(p) or b.doc.__setitem__(gt.PARTS[p], {"tokens_per_s": 1.0})), 0)
            for p in ("c", "a_before_tmpfs", "a_tmpfs", "b")}
    gt.run_parts(b, ["c", "a_before_tmpfs", "a_tmpfs", "b"], plan, standin=False)
    assert ran == ["c", "a_before_tmpfs"]
    for key in ("a_tmpfs", "b_generator"):
        assert b.doc[key]["skipped"].startswith("AFTER's patch was not made (RuntimeError: patch after failed")
    assert b.doc["patch"]["rc"] == 8 and "error" in b.doc["patch"]


def test_a_failed_after_patch_is_said_and_a_second_run_is_paired_with_the_first():
    base = {"gpus": ["G"], "versions": {"vllm": "0.20.0"}, "model": {"params": 5, "layers": 2, "hidden": 8},
            "dataset": {"samples": 10, "tokens": 100, "max_model_len": 64}, "settings": {"samples": 10}}
    first = {**base, "code_rev": "r1", "patch": {"rc": 8, "stderr": "anchor not found"},
             "c_vllm_prefill": {"tokens_per_s": 200.0}, "a_before_tmpfs": {"tokens_per_s": 100.0},
             "b_generator_before": {"tokens_per_s": 110.0}, "b_generator": {"tokens_per_s": 120.0},
             "a_tmpfs": {"tokens_per_s": 101.0}}
    text = "\n".join(gpu_results.throughput_section("x.json", first))
    assert "**AFTER's patch failed in this run** (exit 8: anchor not found). The parts after it (a_tmpfs, b_generator)" in text
    second = {**base, "code_rev": "r1", "a_tmpfs": {"tokens_per_s": 170.0}, "b_generator": {"tokens_per_s": 190.0}}
    assert "AFTER's patch failed" not in "\n".join(gpu_results.throughput_section("x_after.json", second))
    pair = "\n".join(gpu_results.paired_section("x.json", first, "x_after.json", second))
    assert "| (a) AFTER on a tmpfs / (c) (goal 0.8) | 0.85 |" in pair and "| (b) AFTER / (c) | 0.95 |" in pair
    assert "| (a) on a tmpfs AFTER / BEFORE | 1.7 |" in pair and "| (b) AFTER / BEFORE | 1.7273 |" in pair
    assert "what the playbook's generator edits since BEFORE add at the same batches | 1.5833 |" in pair
    other = {**second, "dataset": {**base["dataset"], "tokens": 99}}
    assert "Not paired: the runs differ in dataset." in "\n".join(gpu_results.paired_section("x.json", first, "y.json", other))


FAKE_SWEEP_VLLM = '''
"""TEST FAKE of vllm's LLM for (c_best): refuses to start when FAKE_REFUSE holds the budget, keeps a
scheduler in vllm.v1.core.sched.scheduler as vLLM 0.20 does, logs the budget each generate() ran at."""
import json, os
from vllm.v1.core.sched.scheduler import Scheduler
class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw
class _Out:
    def __init__(self, ids):
        self.prompt_token_ids = ids
class _EngineCore:        # the engine core: holds the scheduler, runs a callable as the worker's (uni executor)
    def __init__(self, scheduler):
        self.scheduler = scheduler
    def collective_rpc(self, fn, args=()):
        return [fn(None, *args)]
class LLM:
    def __init__(self, **kw):
        if str(kw["max_num_batched_tokens"]) in os.environ.get("FAKE_REFUSE", "").split(","):
            raise ValueError("max_num_batched_tokens (%d) is too large for this fake" % kw["max_num_batched_tokens"])
        self.kw, self._core = kw, _EngineCore(Scheduler(kw["max_num_batched_tokens"]))
        import gc
        gc.freeze()          # as vLLM 0.20's engine core does after its start: gc.get_objects() misses it then
        sc = type("SC", (), {"max_num_batched_tokens": kw["max_num_batched_tokens"], "max_num_seqs": 256,
                             "enable_chunked_prefill": kw["enable_chunked_prefill"], "async_scheduling": True})()
        cc = type("CC", (), {"mode": 3 if not kw["enforce_eager"] else 0, "cudagraph_mode": "FULL_AND_PIECEWISE",
                             "max_cudagraph_capture_size": 512})()
        self.llm_engine = type("E", (), {"vllm_config": type("V", (), {"scheduler_config": sc,
                                                                       "compilation_config": cc})()})()
    def collective_rpc(self, fn, args=()):
        return self._core.collective_rpc(fn, args)
    def generate(self, prompts, sp, use_tqdm=True):
        assert sp.kw == {"max_tokens": 1, "temperature": 0.0}
        budget = self._core.scheduler.max_num_scheduled_tokens
        with open(os.environ["FAKE_LOG"], "a") as fh:
            fh.write(json.dumps([len(prompts), budget]) + "\\n")
        if budget == int(os.environ.get("FAKE_DIE_AT", "0")):
            raise RuntimeError("EngineDeadError: the engine core died")
        return [_Out(p["prompt_token_ids"]) for p in prompts]
'''


def _fake_sweep_vllm(tmp_path):
    fake = tmp_path / "fake"
    sched = fake / "vllm" / "v1" / "core" / "sched"
    sched.mkdir(parents=True)
    for d in (fake / "vllm" / "v1", fake / "vllm" / "v1" / "core", sched):
        (d / "__init__.py").write_text("")
    (sched / "scheduler.py").write_text("class Scheduler:\n    def __init__(self, n):\n"
                                        "        self.max_num_scheduled_tokens = n\n")
    (fake / "vllm" / "__init__.py").write_text(FAKE_SWEEP_VLLM)
    return fake


def test_the_c_best_sweep_lowers_the_running_budget_and_records_refusals(tmp_path):
    """LLM_SWEEP as the harness runs it, against a TEST FAKE vllm: the engine starts at the largest budget
    it accepts (the refused one is a point with the engine's words), the smaller ones run by lowering the
    running scheduler's budget (the fake's generate() sees each), an engine that dies names its point."""
    fake = _fake_sweep_vllm(tmp_path)
    rows = gt.make_dataset(20, 5, 30, 100)
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows))
    (tmp_path / "sweep.py").write_text(gt.LLM_SWEEP)
    log = tmp_path / "log.jsonl"
    env = {**os.environ, "PYTHONPATH": str(fake), "FAKE_LOG": str(log), "FAKE_REFUSE": "65536"}

    def sweep(out, eager, chunked, extra_env=None):
        r = subprocess.run([sys.executable, str(tmp_path / "sweep.py"), str(gt.SCRIPT), "m", str(ds), "16", "0.8",
                            str(out), eager, chunked, "65536,32768,16384,8192", "4"],
                           env={**env, **(extra_env or {})}, capture_output=True, text=True, timeout=120)
        return r, json.loads(out.read_text())
    r, got = sweep(tmp_path / "s.json", "0", "1")
    assert r.returncode == 0, r.stderr
    assert got["engine_max_num_batched_tokens"] == 32768 and got["compilation"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    pts = got["points"]
    assert [p["max_num_batched_tokens"] for p in pts] == [65536, 32768, 16384, 8192]
    assert pts[0]["refused"].startswith("engine start: ValueError: max_num_batched_tokens (65536) is too large")
    assert [p.get("how") for p in pts[1:]] == ["the engine's own"] + ["the running scheduler's budget lowered"] * 2
    assert all(p["tokens"] == sum(min(len(x), 15) for x in rows) and p["tokens_per_s"] > 0 for p in pts[1:])
    assert pts[2]["schedulers_set"] == [[16384]] and pts[3]["schedulers_set"] == [[8192]]
    # the warm-up at the engine's budget, then each point at its own
    assert [json.loads(l) for l in log.read_text().splitlines()] == [[4, 32768], [20, 32768], [20, 16384], [20, 8192]]
    r, got = sweep(tmp_path / "d.json", "1", "0", {"FAKE_DIE_AT": "16384"})
    assert r.returncode == 0 and got["enforce_eager"] is True and got["enable_chunked_prefill"] is False
    assert [p["max_num_batched_tokens"] for p in got["points"]] == [65536, 32768, 16384]
    assert got["points"][2]["refused"] == "RuntimeError: EngineDeadError: the engine core died"
    # the harness names the budget the engine never reached, and picks the best of the points run
    pts = gt.sweep_points((True, False), [65536, 32768, 16384, 8192], got, 0, "last words\n")
    assert pts[-1] == {"enforce_eager": True, "enable_chunked_prefill": False, "max_num_batched_tokens": 8192,
                       "refused": "not reached: the engine's sweep stopped at its refused budget 16384"}
    killed = gt.sweep_points((True, False), [65536, 32768], {"points": []}, 124, "x\n[timed out after 200s]\n")
    assert [p["refused"] for p in killed] == ["not reached: the engine's process ended with exit 124 "
                                              "([timed out after 200s])"] * 2
    sweep_doc = {"points": pts + [{"enforce_eager": False, "enable_chunked_prefill": True,
                                   "max_num_batched_tokens": 16384, "how": "the running scheduler's budget lowered",
                                   "tokens_per_s": 1e12}]}
    best = gt.best_point(sweep_doc)
    assert best["tokens_per_s"] == 1e12 and best["best"]["max_num_batched_tokens"] == 16384
    assert (best["points_run"], best["points_refused"]) == (2, 3)
    sweep_doc["confirm"] = {"max_num_batched_tokens": 16384, "tokens_per_s": 2e12, "enforce_eager": False,
                            "enable_chunked_prefill": True}
    assert gt.best_point(sweep_doc)["best"]["how"] == "confirming engine started at this budget"


def test_c_best_ratios_and_its_sweep_are_rendered():
    sweep = {"budgets": [65536, 8192], "how": "one engine a pair",
             "engines": [{"enforce_eager": False, "enable_chunked_prefill": True, "engine_ready_s": 41.5,
                          "compilation": {"mode": "3", "cudagraph_mode": "FULL_AND_PIECEWISE",
                                          "max_cudagraph_capture_size": 512}},
                         {"enforce_eager": True, "enable_chunked_prefill": False, "skipped": "time budget: 20s left"}],
             "points": [{"enforce_eager": False, "enable_chunked_prefill": True, "max_num_batched_tokens": 65536,
                         "how": "the engine's own", "tokens_per_s": 300000.0},
                        {"enforce_eager": False, "enable_chunked_prefill": True, "max_num_batched_tokens": 8192,
                         "refused": "RuntimeError: boom"}]}
    sweep.update(gt.best_point(sweep))
    d = {"c_best": sweep, "c_vllm_prefill": {"tokens_per_s": 240000.0}, "a_tmpfs": {"tokens_per_s": 200000.0},
         "b_generator": {"tokens_per_s": 225000.0}, "d_roofline": {"tokens_per_s": 500000.0},
         "model": {"layers": 22, "shape": {"layers": 22, "hidden": 2048, "experts": 0, "moe": False}}}
    d["ratios"] = gt.ratios(d)
    assert (d["ratios"]["a_tmpfs/c_best"], d["ratios"]["b/c_best"], d["ratios"]["c/c_best"]) == (0.6667, 0.75, 0.8)
    assert d["ratios"]["a_server/c_best"] is None and d["ratios"]["c_best/d"] == 0.6
    text = "\n".join(gpu_results.throughput_section("r.json", d))
    assert ("| (c_best) vLLM at its best: the sweep's fastest point | 300.0k | CUDA graphs, chunked prefill on, "
            "max_num_batched_tokens 65536 (the engine's own); 1 points run, 1 refused") in text
    assert "| CUDA graphs, chunked prefill on | 8192 | refused: RuntimeError: boom | - | 41.5 |" in text
    assert "| enforce_eager, chunked prefill off | - | not run: time budget: 20s left | - | - |" in text
    assert "Against vLLM at its best (c_best): (c)/c_best 0.8, (b)/c_best 0.75, (a) on a tmpfs/c_best 0.6667" in text
    assert "model.shape: layers 22, hidden 2048, experts 0, moe False" in text


def test_model_shape_names_moe_and_a_wrappers_text_model():
    from benchmarks.gpu.lib.harness import model_shape
    dense = model_shape({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 22, "hidden_size": 2048,
                         "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 5632,
                         "vocab_size": 32000})
    assert dense == {"architecture": "LlamaForCausalLM", "layers": 22, "hidden": 2048, "heads": 32, "kv_heads": 4,
                     "intermediate": 5632, "vocab": 32000, "experts": 0, "moe": False}
    kimi = model_shape({"architectures": ["KimiK25ForConditionalGeneration"],
                        "text_config": {"num_hidden_layers": 4, "hidden_size": 256, "n_routed_experts": 16,
                                        "num_experts_per_tok": 4, "n_shared_experts": 1, "moe_intermediate_size": 64,
                                        "kv_lora_rank": 64, "q_lora_rank": 96}})
    assert kimi["moe"] is True and kimi["experts"] == 16 and kimi["experts_per_token"] == 4
    assert kimi["architecture"] == "KimiK25ForConditionalGeneration" and kimi["mla"]["kv_lora_rank"] == 64


def test_a_server_run_beside_a_c_best_run_is_paired_only_when_alike():
    base = {"gpus": ["H200"], "versions": {"vllm": "0.20.0"}, "model": {"params": 1, "layers": 22, "hidden": 2048},
            "dataset": {"samples": 10, "tokens": 100, "max_model_len": 2048}}
    d0 = {**base, "c_best": {"tokens_per_s": 200000.0}, "c_vllm_prefill": {"tokens_per_s": 160000.0},
          "a_tmpfs": {"tokens_per_s": 100000.0}}
    d1 = {**base, "a_server": {"tokens_per_s": 20000.0, "seconds": 60.0, "server_ready_after_s": 130.0,
                               "wall_s": 270.0, "from_first_file": {"tokens_per_s": 40000.0, "seconds": 35.0}}}
    text = "\n".join(gpu_results.server_pair_section("x.json", d0, "x_server.json", d1))
    assert "| server flow / (c_best) (goal 0.8) | 0.1 |" in text and "| server flow / (c) | 0.125 |" in text
    assert "| server flow from its first file on / (c_best) | 0.2 |" in text and "its first file 25.0 s after" in text
    other = {**d1, "dataset": {**base["dataset"], "tokens": 99}}
    assert "Not paired: the runs differ in dataset" in "\n".join(
        gpu_results.server_pair_section("x.json", d0, "x_server.json", other))


def test_server_phases_from_cold_start_files_and_the_clients_postfix():
    log = ("Generating: 50%|#####| 5/10 [00:01<00:01, ok=5, err=0, rps=4.0, vllm=900ms, write=3ms]\r"
           "Generating: 100%|##########| 10/10 [00:02<00:00, ok=10, err=0, rps=5.5, vllm=1100ms, write=2ms]\n")
    ph = gt.server_phases({"ready_after_s": 130.0, "first_file_after_s": 150.0}, 1000.0, [1020.0, 1030.5, 1025.0], log)
    assert (ph["launch_to_healthy_s"], ph["healthy_to_first_file_s"], ph["first_to_last_file_s"]) == (130.0, 20.0, 10.5)
    assert ph["client"] == {"ok": 10, "errors": 0, "requests_per_s": 5.5, "mean_request_ms": 1100, "mean_move_ms": 2,
                            "from": "generate-offline-data's progress bar, last postfix (one client's, with several)"}
    assert "client" not in gt.server_phases(None, None, [], "ok=0, err=0")      # the bar's first postfix has no means
    assert "clients" not in ph                                                # one client: run_clients prints nothing
    lines = ("[run_clients] rank 1/3: imports 4.2 s, server ready after 95.0 s\n"
             "[run_clients] rank 0/3: imports 3.1 s, server ready after 96.5 s\n"
             "[run_clients] rank 2/3: imports 5.0 s, no health check\n")
    assert gt.server_phases(None, None, [], lines)["clients"] == {
        "n": 3, "started": 3, "imports_s_max": 5.0, "ready_after_s_max": 96.5,
        "from": "run_clients.py's line per rank (seconds from the client's own start)"}
    base = {"gpus": ["H200"], "versions": {}, "model": {}, "dataset": {}}
    text = "\n".join(gpu_results.server_pair_section("x.json", {**base, "c_best": {"tokens_per_s": 1.0}}, "x_server.json",
                                                     {**base, "a_server": {"tokens_per_s": 0.5, "phases": ph}}))
    assert ("launch to health check 130.0 s, health check to first file 20.0 s, first to last file 10.5 s; the client "
            "(generate-offline-data's progress bar, last postfix (one client's, with several)): 5.5 requests/s, a request 1100 ms in the server on "
            "average, a move 2 ms") in text


def test_server_parts_ratios_against_c_best_and_the_tmpfs_server_flow():
    """Each server part gets <part>/c_best; a variant also its ratio to a_server_tmpfs; a_server_tmpfs its ratio
    to the server flow on the disk. Every server part has its own inventory host and result key."""
    doc = {"c_best": {"tokens_per_s": 250000.0}, "a_server": {"tokens_per_s": 25000.0},
           "a_server_tmpfs": {"tokens_per_s": 50000.0}, "a_server_tmpfs_b64k": {"tokens_per_s": 200000.0}}
    q = gt.ratios(doc)
    assert (q["a_server/c_best"], q["a_server_tmpfs/c_best"], q["a_server_tmpfs_b64k/c_best"]) == (0.1, 0.2, 0.8)
    assert (q["a_server_tmpfs/a_server"], q["a_server_tmpfs_b64k/a_server_tmpfs"]) == (2.0, 4.0)
    assert q["a_server_tmpfs_c64/c_best"] is None and "a_server_tmpfs/a_server_tmpfs" not in q
    assert gt.SERVER_PARTS[0] == "a_server" and set(gt.SERVER_VARIANTS) <= set(gt.PARTS)
    assert all(gt.PARTS[p] == p for p in gt.SERVER_PARTS)
    assert [gt.Bench.server_host(p) for p in gt.SERVER_PARTS] == ["server", "server_tmpfs", "server_tmpfs_c64",
                                                                 "server_tmpfs_b64k", "server_tmpfs_async",
                                                                 "server_tmpfs_async_b64k", "server_tmpfs_async_b64k_x4",
                                                                 "server_tmpfs_x4", "server_tmpfs_x8",
                                                                 "server_tmpfs_x8_api4", "server_tmpfs_async_b64k_x8"]
    # "connector" picks the playbook, never a var
    assert gt.server_vars("a_server_tmpfs_async") == {} and gt.server_connector("a_server_tmpfs_async") == "async"
    # clients is the shipped playbooks' var (run_clients.py)
    assert gt.server_vars("a_server_tmpfs_async_b64k_x4") == {"max_num_batched_tokens": 65536, "clients": 4}
    assert gt.server_vars("a_server_tmpfs_x8") == {"clients": 8} and gt.server_connector("a_server_tmpfs_x8") == \
        "vllm-no-chunked"
    # api_server_count is the shipped playbooks' var (vllm serve --api-server-count): a_server_tmpfs_x8 otherwise
    assert gt.server_vars("a_server_tmpfs_x8_api4") == {"clients": 8, "api_server_count": 4}
    assert gt.server_connector("a_server_tmpfs_x8_api4") == gt.server_connector("a_server_tmpfs_x8")
    doc["a_server_tmpfs_x8"], doc["a_server_tmpfs_x8_api4"] = {"tokens_per_s": 60000.0}, {"tokens_per_s": 125000.0}
    q = gt.ratios(doc)
    assert (q["a_server_tmpfs_x8_api4/c_best"], q["a_server_tmpfs_x8_api4/a_server_tmpfs"]) == (0.5, 2.5)
    # the vars a part runs with: its own, then --server-vars over them
    assert gt.server_vars("a_server") == {}
    assert gt.server_vars("a_server_tmpfs_b64k") == {"max_num_batched_tokens": 65536, "concurrency": 64}
    assert gt.server_vars("a_server_tmpfs_b64k", {"concurrency": 128, "request_timeout": 600}) == \
        {"max_num_batched_tokens": 65536, "concurrency": 128, "request_timeout": 600}
    a = gt.parse_args(["--out", "x", "--parts", "a_server_tmpfs_b64k", "--server-vars", '{"concurrency": 96}'])
    assert a.server_vars == {"concurrency": 96} and gt.parse_args(["--out", "x"]).server_vars is None
    for bad in ('[1]', '{oops'):
        with pytest.raises(SystemExit):
            gt.parse_args(["--out", "x", "--server-vars", bad])


def test_server_parts_hosts_put_the_dataset_staging_and_outputs_on_one_file_system(tmp_path):
    """a_server keeps its data in the scratch's srv-data (the disk); every tmpfs part's preprocessed_data is the
    tmpfs (the rehearsal's own scratch), so the dataset, the staging dir and the outputs share a file system;
    each host carries the part's vars over the playbook's."""
    b = gt.Bench(gt.parse_args(["--work", str(tmp_path / "w"), "--out", str(tmp_path / "r.json"),
                                "--parts", "a_server,a_server_tmpfs_b64k", "--server-vars", '{"request_timeout": 600}']))
    assert b.server_parts() == ["a_server", "a_server_tmpfs_b64k"]
    assert b.server_data("a_server") == b.scratch / "srv-data"
    assert b.server_data("a_server_tmpfs") == b.server_data("a_server_tmpfs_b64k") == Path(gt.SERVER_TMPFS)
    assert gt.SERVER_TMPFS.startswith("/dev/shm/")
    b.scratch.mkdir(parents=True)
    (b.scratch / "bin" / "server").mkdir(parents=True)
    (b.scratch / "bin" / "server" / "python").write_text("#!/bin/sh\nPYTHONPATH=/e2e/site exec python3 \"$@\"\n")
    b.model, b.max_model_len = {"layers": 22}, 2048
    b.before_files = lambda: {"source": "flags"}
    b.inventory()
    hosts = json.loads(b.inv.read_text())["hosts"]
    v = hosts["server_tmpfs_b64k"]["vars"]
    assert v["preprocessed_data"] == gt.SERVER_TMPFS and v["layer_ids"] == [2, 11, 19, 22]
    assert (v["max_num_batched_tokens"], v["concurrency"], v["request_timeout"]) == (65536, 64, 600)
    assert hosts["server"]["vars"]["preprocessed_data"] == str(b.scratch / "srv-data")
    assert "max_num_batched_tokens" not in hosts["server"]["vars"] and hosts["server"]["vars"]["request_timeout"] == 600
    # on vLLM 0.20.0 the shipped no-chunked-prefill playbook (check last-chunk), but for the async parts
    from benchmarks.gpu.lib import connector
    assert hosts["server_tmpfs"]["playbook"] == hosts["server"]["playbook"] == str(connector.NO_CHUNKED)
    a = hosts["server_tmpfs_async_b64k"]
    assert "AsyncHiddenStatesConnector" in Path(a["playbook"]).read_text() and "connector" not in a["vars"]
    assert (a["vars"]["max_num_batched_tokens"], a["vars"]["concurrency"]) == (65536, 64)
    assert f"PYTHONPATH={connector.LIB}:/e2e/site exec" in Path(a["vars"]["server_python"]).read_text()
    assert hosts["server_tmpfs"]["vars"]["server_python"] == str(b.scratch / "bin" / "server" / "python")
    x4 = hosts["server_tmpfs_async_b64k_x4"]
    assert x4["vars"]["clients"] == 4 and "AsyncHiddenStatesConnector" in Path(x4["playbook"]).read_text()
    assert gt.server_connector("a_server_tmpfs_async") == "async" and gt.server_connector("a_server") == \
        "vllm-no-chunked"
    # a_server_tmpfs_x8_api4: a_server_tmpfs_x8's host (the shipped playbook as it is, 8 clients) plus the var
    # api_server_count, which that playbook renders as vLLM's --api-server-count 4 (a_server_tmpfs_x8's: no flag)
    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import server_command
    from remote_ops.playbook import loader
    api4, x8 = hosts["server_tmpfs_x8_api4"], hosts["server_tmpfs_x8"]
    assert api4["playbook"] == x8["playbook"] == str(connector.NO_CHUNKED)
    assert api4["vars"] == {**x8["vars"], "api_server_count": 4} and api4["vars"]["clients"] == 8
    cmds = {k: server_command(loader.load(h["playbook"]), Host(name=k, hostname="localhost", python="python3",
                                                               vars=h["vars"])) for k, h in (("api4", api4), ("x8", x8))}
    i = cmds["api4"].index("--api-server-count")
    assert cmds["api4"][i + 1] == "4" and cmds["api4"][:i] + cmds["api4"][i + 2:] == cmds["x8"]


def test_c_best_from_an_earlier_result_of_the_same_shape(tmp_path):
    """--c-best-from copies c_best (so every <part>/c_best ratio) from an earlier result and says where from;
    a result without a measured c_best, of another model shape, or whose c_best was itself copied is refused."""
    shape = {"layers": 22, "hidden": 2048, "experts": 0, "moe": False}
    ds = {"samples": 1000, "tokens": 1500000, "max_model_len": 2048}
    src = {"code_rev": "4f28b5f", "started_at": "2026-12-04T10:00:00Z", "gpus": ["NVIDIA H200"],
           "versions": {"vllm": "0.20.0"}, "model": {"shape": shape}, "dataset": ds,
           "c_best": {"tokens_per_s": 261858.0, "best": {"max_num_batched_tokens": 65536}, "points": []}}
    f = tmp_path / "cbest.json"
    f.write_text(json.dumps(src))
    doc = {"model": {"shape": dict(shape)}, "dataset": dict(ds), "a_server_tmpfs": {"tokens_per_s": 52371.6}}
    got = gt.copied_c_best(f, doc)
    assert got["c_best"] == src["c_best"]
    assert got["c_best_from"] == {"path": str(f), "code_rev": "4f28b5f", "started_at": "2026-12-04T10:00:00Z",
                                  "gpus": ["NVIDIA H200"], "vllm": "0.20.0", "same_dataset": True,
                                  "why": "copied, not measured in this run: (c_best) of an earlier result of the "
                                         "same model shape"}
    doc.update(got)
    assert gt.ratios(doc)["a_server_tmpfs/c_best"] == 0.2
    assert gt.copied_c_best(f, {**doc, "dataset": {**ds, "samples": 300}})["c_best_from"]["same_dataset"] is False
    for bad, words in (({**src, "model": {"shape": {**shape, "hidden": 4096}}}, "is not this run's"),
                       ({**src, "c_best": {"skipped": "time budget"}}, "no measured c_best"),
                       ({**src, "c_best_from": {"path": "older.json"}}, "itself copied (from older.json)")):
        f.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=re.escape(words)):
            gt.copied_c_best(f, doc)
    with pytest.raises(ValueError, match="cannot read it as JSON"):
        gt.copied_c_best(tmp_path / "none.json", doc)
    with pytest.raises(SystemExit):            # copy or measure, not both
        gt.parse_args(["--out", "x", "--parts", "c_best,a_server_tmpfs", "--c-best-from", str(f)])


def test_standin_rehearsal_of_the_server_parts_with_c_best_copied(tmp_path):
    """The server parts end to end on the CPU with the sandbox's server and client STAND-INs through remote-ops
    extract: on the disk and on a tmpfs (the rehearsal's own scratch), a variant's vars reach its host and its
    result, c_best comes from an earlier result of the same shape, and every server part gets <part>/c_best."""
    shape = {"architecture": None, "layers": 8, "hidden": 64, "heads": None, "kv_heads": None, "intermediate": None,
             "vocab": 1000, "experts": 0, "moe": False}       # the stand-in's (build() with --standin)
    earlier = tmp_path / "cbest.json"
    earlier.write_text(json.dumps({"code_rev": "abc1234", "model": {"shape": shape},
                                   "c_best": {"tokens_per_s": 1000.0, "points": []}}))
    out = tmp_path / "r.json"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "throughput.py"), "--standin",
                        "--work", str(tmp_path / "w"), "--out", str(out), "--samples", "6", "--min-tokens", "5",
                        "--max-tokens", "30", "--parts", "a_server,a_server_tmpfs,a_server_tmpfs_b64k",
                        "--server-vars", '{"request_timeout": 600}', "--c-best-from", str(earlier)],
                       capture_output=True, text=True, timeout=300, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    d = json.loads(out.read_text())
    tokens = sum(min(len(json.loads(l)["input_ids"]), 2047)
                 for l in (tmp_path / "w" / "throughput" / "dataset.jsonl").read_text().splitlines())
    assert d["c_best_from"]["path"] == str(earlier) and d["c_best_from"]["code_rev"] == "abc1234"
    assert d["c_best"]["tokens_per_s"] == 1000.0
    for part, on, want in (("a_server", "disk", {"request_timeout": 600}),
                           ("a_server_tmpfs", "tmpfs", {"request_timeout": 600}),
                           ("a_server_tmpfs_b64k", "tmpfs", {"max_num_batched_tokens": 65536, "concurrency": 64,
                                                             "request_timeout": 600})):
        x = d[part]
        assert x["rc"] == 0 and x["complete"] and x["tokens"] == tokens and x["tokens_per_s"] > 0, (part, x)
        assert x["vars"] == want and x["on"] == on and x["state"] == "succeeded" and "STAND-IN" in x["standin"]
        assert d["ratios"][f"{part}/c_best"] == round(x["tokens_per_s"] / 1000.0, 4)
    assert d["a_server"]["data_dir"] == str(tmp_path / "w" / "throughput" / "srv-data")
    assert d["a_server_tmpfs"]["data_dir"] == str(tmp_path / "w" / "throughput" / "srv-tmpfs")
    assert d["ratios"]["a_server_tmpfs_b64k/a_server_tmpfs"] == round(
        d["a_server_tmpfs_b64k"]["tokens_per_s"] / d["a_server_tmpfs"]["tokens_per_s"], 4)
    # the client ran with the variant's concurrency (its command line, in the job's record)
    inv = json.loads((tmp_path / "w" / "throughput" / "inventory.yaml").read_text())
    assert inv["hosts"]["server_tmpfs_b64k"]["vars"]["concurrency"] == 64
    assert "concurrency" not in inv["hosts"]["server_tmpfs"]["vars"]
    # measured, then removed: the tmpfs holds nothing after the run
    assert not (tmp_path / "w" / "throughput" / "srv-tmpfs").exists()
    text = "\n".join(gpu_results.throughput_section("r.json", d))
    b64k = d["a_server_tmpfs_b64k"]
    assert (f"| (a) server flow on a tmpfs, max_num_batched_tokens 65536, concurrency 64 | "
            f"{gpu_results._rate(b64k['tokens_per_s'])} | 6 files, {tokens} tokens in {b64k['seconds']} s") in text
    assert '"concurrency": 64, "max_num_batched_tokens": 65536, "request_timeout": 600' in text
    assert "(c_best) was not measured in this run: copied from cbest.json (remote-ops commit abc1234" in text
    assert (f"(a) server flow on a tmpfs (dataset, staging and outputs in RAM)/c_best "
            f"{d['ratios']['a_server_tmpfs/c_best']}") in text
    assert set(gpu_results.SERVER_VARIANT_LABELS) == set(gt.SERVER_VARIANTS)      # each variant has its row
    # another shape's c_best is refused in one line, before any part runs
    earlier.write_text(json.dumps({"model": {"shape": {**shape, "hidden": 4096}}, "c_best": {"tokens_per_s": 1.0}}))
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu" / "throughput.py"), "--standin",
                        "--work", str(tmp_path / "w2"), "--out", str(tmp_path / "r2.json"), "--samples", "2",
                        "--parts", "a_server_tmpfs", "--c-best-from", str(earlier)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 2 and "is not this run's" in r.stderr.strip().splitlines()[-1]
    assert "a_server_tmpfs" not in json.loads((tmp_path / "r2.json").read_text())
    # a file without a measured c_best is refused before anything is built
    earlier.write_text(json.dumps({"model": {"shape": shape}, "c_best": {"skipped": "time budget"}}))
    assert gt.main(["--standin", "--work", str(tmp_path / "w3"), "--out", str(tmp_path / "r3.json"),
                    "--parts", "a_server_tmpfs", "--c-best-from", str(earlier)]) == 2
    assert not (tmp_path / "w3").exists() and not (tmp_path / "r3.json").exists()
