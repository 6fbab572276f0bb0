"""Extraction throughput on a GPU: the shipped job against the generator, vLLM's own prefill and the roofline.

Runs ON the lent H200 (../shared/GPU-NOTES.md: offline, Python 3.12, torch 2.11; the bundle of
benchmarks/gpu/lib/bundle.py unpacked at --work with site/ and tf/, plus llm/ from
benchmarks/gpu/wheels/llm.txt for vLLM's own `LLM`). Everything is built on the spot: a random
Llama-shaped checkpoint of realistic width (default TinyLlama's shape: 22 layers, hidden 2048, 1.1B
parameters, bf16 safetensors) and a seeded JSONL dataset of --samples prompts of uniformly 200-4,000
tokens (cut to max_model_len - 1 by the script, as always). In ONE run, each part in its own
subprocess with a timeout:

  (a) `remote-ops extract --tail` with the shipped playbook and script over a `connection: local`
      host (the agent and requests are the ones SSH carries), at the playbook's default settings;
      AFTER = this checkout, BEFORE = the script and playbook of --before-rev (git show; without git,
      this script with --batch-tokens 0 --write-queue-mb 0, which is the old loop). Tokens/s once the
      engine is up: tokens of the files / (newest data_<N>.pt mtime - data_config.json mtime; the
      script writes data_config.json right after the generator is ready, in both versions). Each part
      keeps AFTER's `extract-profile` line (where the job's time went: generate(), the hand-over to the
      writer and its waits, the writer threads' saves, the hand-off slots) and removes its files once
      measured (--keep-outputs keeps them). Variants of AFTER on a tmpfs, one playbook var changed
      (TMPFS_VARIANTS): a_tmpfs_gil5, Python's own thread switch interval (gil_switch_ms 0, i.e. 5 ms,
      beside a_tmpfs at the playbook's 0.5 ms); a_tmpfs_w8 and a_tmpfs_w4, 8 and 4 writer threads (the
      playbook's: 8 since 7749280, 4 before); a_tmpfs_k1, one engine step a generate() call in order
      (batch_steps 1, pack_window 0: the loop before those vars); a_tmpfs_w0, the playbook's steps a call,
      each filled in order (pack_window 0). Variants of AFTER on the disk (DISK_VARIANTS): a_after_w8,
      a_after_w4. The disk part times dd over 2 GiB and again over as many bytes as a job writes
      (--dd-sustained-mib): the disk bound is the second.
  (a) server flow (--parts a_server): the same rows through playbooks/eagle3-speculators-0.9.0.yaml
      (vLLM's OpenAI server with extract_hidden_states + ExampleHiddenStatesConnector, speculators
      0.9.0's generate-offline-data as the client; the rows given as `speculators prepare-data` writes
      them, cut like the script cuts them) at the playbook's defaults, layer ids [2, n//2, n-3, n]
      (launch_vllm.py's: 4 layers, as the 0.3.0 flow's default). Tokens/s once the server answered
      its health check (the supervisor's healthy_at) to the newest hs_<N>.safetensors; also from the
      first file on, and the whole job's wall time with the server's start. a_server_tmpfs: the same on a
      tmpfs (the Arrow dataset copied there, so that the staging directory, the outputs and the dataset
      share one file system, as a_tmpfs's files do); named variants change playbook vars (SERVER_VARIANTS:
      a_server_tmpfs_c64, concurrency 64; a_server_tmpfs_b64k, max_num_batched_tokens 65536 and
      concurrency 64; a_server_tmpfs_x4 / _x8, the var clients: 4 / 8 client processes, run_clients.py;
      a_server_tmpfs_x8_api4, 8 clients and the var api_server_count: 4, vLLM's --api-server-count 4;
      "connector" picks a harness copy of the playbook instead of a var), and --server-vars JSON changes vars
      of every server part of the run. Each part's
      result says the vars it ran with; ratios give <part>/c_best for each.
  (b) the generator alone, no writes: the patched speculators VllmHiddenStatesGenerator driven with
      AFTER's batches (the script's own pack_batches and engine_budget, at its default steps a call
      and packing window), generate() timed from the
      first call to the last return; with a profile of where generate() spends its time
      (executor RPCs: execute_model, sample_tokens, _get_captured_states; the scheduler; the rest);
      then, if the budget leaves (c) its time, a second pass with BEFORE's batches (8 samples each).
  (c) vLLM's own prefill: `LLM.generate(max_tokens=1)` on the same (cut) prompts, same
      max_num_batched_tokens, max_model_len, gpu_memory_utilization, enforce_eager=True and prefix
      caching off (as the generator); vLLM's defaults otherwise (chunked prefill on).
  (c_best) vLLM's own prefill at its best on the same prompts: LLM.generate(max_tokens=1) swept over
      max_num_batched_tokens (--c-best-tokens, default 64k, 32k, 16k, 8k), CUDA graphs (vLLM's default
      compile and cudagraph mode) against enforce_eager, and chunked prefill on and off (C_BEST_PAIRS).
      One engine a (graphs, chunked) pair, started at the largest budget it accepts: max_num_batched_tokens
      is in vLLM 0.20's compile hash (SchedulerConfig.compute_hash), so an engine started at another budget
      compiles again; the smaller budgets lower the running scheduler's token budget a step instead
      (Scheduler.max_num_scheduled_tokens, which vLLM 0.20's Scheduler.schedule() reads each step, set in
      the engine core's process through collective_rpc, found on that call's stack; chunked prefill is read
      from the scheduler config each step too). A budget the engine refuses (at its start, or the process ending) is a point with the
      engine's error. The best point is tokens_per_s.c_best; when it was a lowered budget and time allows,
      one engine started at that budget confirms it (c_best.confirm). Ratios are also given against it.
      --c-best-from PATH copies c_best from an earlier result of the same model shape instead (a run that
      cannot afford the sweep), recorded as c_best_from {path, code_rev, ...}.
  (d) the bf16 roofline: 2 x parameters x tokens / 989 TFLOP/s (H200 dense BF16: NVIDIA's H200
      datasheet gives 1,979 TFLOPS BF16 Tensor Core "with sparsity"; dense is half). Parameters are
      the decoder layers' (embedding lookups and the one-token lm_head are not prefill matmuls);
      the causal attention term is reported beside it.
  disk: sequential write speed of --work's filesystem (dd oflag=direct, and buffered + fsync as the
      script writes), against the bytes/s (a) AFTER wrote.

Prints the ratios (a)/(b), (b)/(c), (c)/(d) and (a)/(c), and writes --out JSON (after every part,
so a timeout still leaves what was measured). `python benchmarks/render/gpu_results.py` renders it.

    python3 benchmarks/gpu/throughput.py --work /root/e2e --out $OUT/gpu_throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks import provenance  # noqa: E402
from benchmarks.gpu.lib.connector import server_setup  # noqa: E402
from benchmarks.gpu.lib.dataset import DATASET_BUILDER  # noqa: E402
from benchmarks.gpu.lib.harness import HOST_ENV, VERSIONS, WORD_TOKENIZER, last_json, model_shape  # noqa: E402  (one copy of each)

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
SCRIPT = REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "extract_hidden_states.py"
BEFORE_REV = "7a3c5d8"   # main before the zero-copy hand-off slots (issue 35 item 2; efd360d: before any hand-off)
H200_BF16_DENSE_FLOPS = 989e12
PARTS = {"disk": "disk", "a_before": "a_before", "a_before_tmpfs": "a_before_tmpfs", "a_after": "a_after",
         "a_tmpfs": "a_tmpfs", "a_tmpfs_gil5": "a_tmpfs_gil5", "a_tmpfs_w8": "a_tmpfs_w8",
         "a_tmpfs_k1": "a_tmpfs_k1", "a_tmpfs_w0": "a_tmpfs_w0", "a_after_w8": "a_after_w8",
         "a_after_w4": "a_after_w4", "a_tmpfs_w4": "a_tmpfs_w4", "a_2dirs": "a_2dirs", "a_server": "a_server", "b_before": "b_generator_before",
         "b": "b_generator", "c": "c_vllm_prefill", "c_best": "c_best",
         "a_server_tmpfs": "a_server_tmpfs", "a_server_tmpfs_c64": "a_server_tmpfs_c64",
         "a_server_tmpfs_b64k": "a_server_tmpfs_b64k"}       # --parts name: the result's key
# run with BEFORE's playbook patched in, before AFTER's goes on top
BEFORE_PARTS = ("a_before", "a_before_tmpfs", "b_before")
UNPATCHED_PARTS = ("disk", "c", "c_best")   # they use no speculators: run before, between or after either patch
# (c_best)'s engines, (enforce_eager, enable_chunked_prefill), the likeliest best first (a run cut by its
# budget keeps those); the second is (c)'s own mode, so its 8k point sits beside (c)
C_BEST_PAIRS = ((False, True), (True, True), (False, False), (True, False))
C_BEST_TOKENS = "65536,32768,16384,8192"
A_HOSTS = {"a_before": "before", "a_before_tmpfs": "before_tmpfs", "a_after": "after", "a_tmpfs": "tmpfs",
           "a_tmpfs_gil5": "tmpfs_gil5", "a_tmpfs_w8": "tmpfs_w8", "a_tmpfs_k1": "tmpfs_k1", "a_tmpfs_w0": "tmpfs_w0",
           "a_after_w8": "after_w8", "a_after_w4": "after_w4", "a_tmpfs_w4": "tmpfs_w4",
           "a_2dirs": "twodirs"}   # (a)'s parts: the inventory host each one extracts with
# AFTER on a tmpfs with one of the playbook's vars changed: part -> the vars (each against a_tmpfs)
TMPFS_VARIANTS = {"a_tmpfs_gil5": {"gil_switch_ms": 0}, "a_tmpfs_w8": {"writer_threads": 8},
                  # one engine step a generate() call, steps in order: the loop before batch_steps/pack_window
                  "a_tmpfs_k1": {"batch_steps": 1, "pack_window": 0},
                  # several steps a call, but each step filled in order
                  "a_tmpfs_w0": {"pack_window": 0},
                  # the playbook's writer_threads before 7749280 (8 since)
                  "a_tmpfs_w4": {"writer_threads": 4}}
# AFTER on the disk with one var changed (each against a_after): more fsyncs in flight at once
DISK_VARIANTS = {"a_after_w8": {"writer_threads": 8}, "a_after_w4": {"writer_threads": 4}}
CAPTURED_LAYERS = 4   # the generator's layer ids for these models (3 auxiliary + the last): bytes a token / hidden / 2
SERVER_PORT = 8810
# the server flow on a tmpfs (a_server_tmpfs) and with playbook vars changed: part -> the vars (each against
# a_server_tmpfs); all of them keep the dataset, the staging directory and the outputs in RAM
# "connector" (not a var) picks the playbook and server interpreter (benchmarks/gpu/lib/connector.py; default
# vllm-no-chunked: the shipped playbook that claims vLLM 0.20.0 since check last-chunk)
SERVER_VARIANTS = {"a_server_tmpfs": {},
                   # more requests in flight at vLLM's default step (8192 tokens)
                   "a_server_tmpfs_c64": {"concurrency": 64},
                   # (c_best)'s fastest budget, with requests enough to fill a step
                   "a_server_tmpfs_b64k": {"max_num_batched_tokens": 65536, "concurrency": 64},
                   # vLLM 0.22's write path (hs_async_connector.py), chunked prefill on: what 0.22-0.33 write with
                   "a_server_tmpfs_async": {"connector": "async"},
                   "a_server_tmpfs_async_b64k": {"connector": "async", "max_num_batched_tokens": 65536,
                                                 "concurrency": 64},
                   # four clients (the playbook var clients: run_clients.py gives each speculators' --world-size 4
                   # --rank r), 32 in flight each, at that write path and step
                   "a_server_tmpfs_async_b64k_x4": {"connector": "async", "clients": 4,
                                                    "max_num_batched_tokens": 65536},
                   # the shipped playbook for 0.20.0 as it is, but clients: 4 and 8
                   "a_server_tmpfs_x4": {"clients": 4},
                   "a_server_tmpfs_x8": {"clients": 8},
                   # the same eight clients against four API-server processes (the playbook var api_server_count:
                   # vllm serve --api-server-count 4): is vLLM's one API-server process the bound?
                   "a_server_tmpfs_x8_api4": {"clients": 8, "api_server_count": 4},
                   # eight clients at vLLM 0.22's write path and (c_best)'s step
                   "a_server_tmpfs_async_b64k_x8": {"connector": "async", "clients": 8,
                                                    "max_num_batched_tokens": 65536}}
SERVER_CONNECTOR = "vllm-no-chunked"
SERVER_PARTS = ("a_server", *SERVER_VARIANTS)     # every server-flow part
PARTS.update({part: part for part in SERVER_VARIANTS})
SERVER_TMPFS = "/dev/shm/remote-ops-throughput-srv"   # the tmpfs server parts' preprocessed_data
TMPFS_OUT = "/dev/shm/remote-ops-throughput-out"   # a_tmpfs: AFTER with its files in RAM (no disk)
FLOPS_SOURCE = ("NVIDIA H200 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity; "
                "dense = half = 989 TFLOP/s")

# TinyLlama-1.1B's shape (hidden 2048, 22 layers, GQA 32/4 heads, MLP 5632, vocab 32000)
MODEL_SHAPES = {
    "1.1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                 num_attention_heads=32, num_key_value_heads=4),
    # an 8B-class shape (Llama-3-8B's: hidden 4096, 32 layers, GQA 32/8, MLP 14336, vocab 128256)
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8),
    "tiny": dict(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                 num_attention_heads=4, num_key_value_heads=2),
}

MODEL_BUILDER = WORD_TOKENIZER + r'''
import json, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out, shape, device = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
out.mkdir(parents=True, exist_ok=True)
save_word_tokenizer(out, shape["vocab_size"], 8192)
torch.manual_seed(1234)
cfg = LlamaConfig(max_position_embeddings=8192, rms_norm_eps=1e-5, initializer_range=0.02, bos_token_id=1,
                  eos_token_id=2, pad_token_id=3, tie_word_embeddings=False, torch_dtype="bfloat16", **shape)
torch.set_default_dtype(torch.bfloat16)
with torch.device(device):           # random init on the GPU: seconds, not minutes, for 1.1B
    model = LlamaForCausalLM(cfg)
model.save_pretrained(out, safe_serialization=True)
total = sum(p.numel() for p in model.parameters())
emb = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
print(json.dumps({"params": total, "decoder_params": total - emb, "layers": cfg.num_hidden_layers,
                  "hidden": cfg.hidden_size, "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
                  "intermediate": cfg.intermediate_size, "vocab": cfg.vocab_size,
                  "bytes": sum(f.stat().st_size for f in out.glob("*.safetensors"))}))
'''

GEN_ALONE = r'''
import importlib.util, json, os, sys, time
from collections import defaultdict
if __name__ == "__main__":
    script, model, dataset, max_model_len, batch_size, util, out, count_deadline = sys.argv[1:9]
    spec = importlib.util.spec_from_file_location("ehs", script)
    ehs = importlib.util.module_from_spec(spec); spec.loader.exec_module(ehs)
    max_model_len, batch_size, util = int(max_model_len), int(batch_size), float(util)
    records = ehs.read_dataset(dataset)
    ehs.truncate(records, max_model_len)
    lengths = [len(r["input_ids"]) for r in records]
    t0 = time.perf_counter()
    handoff = ehs.open_handoff("auto", sys.stderr)      # as the script does: the patched worker's hand-off
    gen = ehs._load_generator(model, None, max_model_len, util, 1)
    ready = time.perf_counter() - t0
    import torch
    threads = ehs.set_copy_threads(torch, None)          # as the script does once the engine is up
    budget_tokens, budget_seqs = ehs.engine_budget(gen, max_model_len)
    # the script's own defaults: steps a call and packing window where it has them (BEFORE's has neither)
    try:                                                  # the model's width, as auto_batch_steps wants it
        cfg = json.load(open(os.path.join(model, "config.json")))
        hidden = cfg.get("hidden_size") or (cfg.get("text_config") or {}).get("hidden_size") or 0
    except (OSError, ValueError):
        hidden = 0                                        # (then auto_batch_steps gives its default)
    auto = (ehs.auto_batch_steps(budget_tokens, len(gen.layer_ids), hidden) if hasattr(ehs, "auto_batch_steps")
            else getattr(ehs, "DEFAULT_BATCH_STEPS", None))
    own = (auto, ehs.DEFAULT_PACK_WINDOW) if hasattr(ehs, "DEFAULT_BATCH_STEPS") else ()
    batches = list(ehs.pack_batches(list(range(len(records))), lengths, budget_tokens, batch_size, *own))
    prof, calls = defaultdict(float), defaultdict(int)
    ex, sched = gen.executor, gen.scheduler
    rpc, schedule = ex.collective_rpc, sched.schedule
    def timed_rpc(method, *a, **kw):
        t = time.perf_counter()
        try:
            return rpc(method, *a, **kw)
        finally:
            name = method if isinstance(method, str) else getattr(method, "__name__", "callable")
            prof["rpc:" + name] += time.perf_counter() - t; calls["rpc:" + name] += 1
    def timed_schedule(*a, **kw):
        t = time.perf_counter()
        try:
            return schedule(*a, **kw)
        finally:
            prof["scheduler.schedule"] += time.perf_counter() - t; calls["scheduler.schedule"] += 1
    ex.collective_rpc, sched.schedule = timed_rpc, timed_schedule
    def one_pass(batches):
        tokens, t1 = 0, time.perf_counter()
        for b in batches:
            res = gen.generate([records[i]["input_ids"] for i in b])
            tokens += sum(int(r["input_ids"].numel()) for r in res)
            del res
        return tokens, time.perf_counter() - t1
    tokens, secs = one_pass(batches)
    shm = getattr(gen, "_remote_ops_shm_mapped", None)
    first = {k: round(v, 3) for k, v in prof.items()}   # a copy: the second pass below adds to prof
    first["other (generate's own work in this process: requests, results; copies when not zero-copy)"] = round(secs - sum(first.values()), 3)
    doc = {"tokens": tokens, "seconds": round(secs, 3), "tokens_per_s": round(tokens / secs, 1),
           "engine_ready_s": round(ready, 1), "batches": len(batches), "steps_a_call_and_window": list(own),
           # the engine steps those calls hold as packed (the scheduler may fill one fuller), and in order
           "steps": len(list(ehs.pack_steps(list(range(len(records))), lengths, budget_tokens, batch_size, own[1])))
           if own else len(batches),
           "steps_in_order": len(list(ehs.pack_batches(list(range(len(records))), lengths, budget_tokens, batch_size))),
           "mean_tokens_per_batch": round(tokens / len(batches), 1), "engine_budget": [budget_tokens, budget_seqs],
           "batch_size_cap": batch_size, "profile_s": first, "profile_calls": dict(calls), "copy_threads": threads,
           "handoff": "shared memory: %s" % ", ".join([shm[0]] + [x for x in shm[1:] if isinstance(x, str)])
           if shm else "vLLM's RPC (handoff dir %s)" % handoff,
           # zero-copy slots the generator used, and batches that found every slot held (copied instead)
           "slots": len(getattr(gen, "_remote_ops_slots", {}) or {}),
           "slots_full": getattr(gen, "_remote_ops_slots_full", 0)}
    with open(out, "w") as fh:
        json.dump(doc, fh)
    if time.time() + 1.3 * secs < float(count_deadline):   # BEFORE's batches: batch_size samples each
        counted = [list(range(i, min(i + batch_size, len(records)))) for i in range(0, len(records), batch_size)]
        t2, s2 = one_pass(counted)
        doc["count_batches"] = {"tokens": t2, "seconds": round(s2, 3), "tokens_per_s": round(t2 / s2, 1),
                                "batches": len(counted), "mean_tokens_per_batch": round(t2 / len(counted), 1)}
    else:
        doc["count_batches"] = {"skipped": "time budget"}
    with open(out, "w") as fh:
        json.dump(doc, fh)
    try:
        ex.shutdown()
    except Exception as exc:
        print("shutdown: %s" % exc, file=sys.stderr)
    ehs.close_handoff(handoff)
    print(json.dumps(doc))
'''

LLM_PREFILL = r'''
import importlib.util, json, sys, time
if __name__ == "__main__":
    script, model, dataset, max_model_len, budget, util, out = sys.argv[1:8]
    spec = importlib.util.spec_from_file_location("ehs", script)
    ehs = importlib.util.module_from_spec(spec); spec.loader.exec_module(ehs)
    records = ehs.read_dataset(dataset)
    ehs.truncate(records, int(max_model_len))
    from vllm import LLM, SamplingParams
    t0 = time.perf_counter()
    llm = LLM(model=model, max_model_len=int(max_model_len), max_num_batched_tokens=int(budget),
              gpu_memory_utilization=float(util), enforce_eager=True, enable_prefix_caching=False,
              tensor_parallel_size=1, seed=0)
    ready = time.perf_counter() - t0
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    prompts = [{"prompt_token_ids": r["input_ids"]} for r in records]
    t1 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    secs = time.perf_counter() - t1
    tokens = sum(len(o.prompt_token_ids) for o in outs)
    doc = {"tokens": tokens, "seconds": round(secs, 3), "tokens_per_s": round(tokens / secs, 1),
           "engine_ready_s": round(ready, 1), "requests": len(outs), "max_num_batched_tokens": int(budget),
           "enforce_eager": True, "enable_prefix_caching": False}
    try:
        sc = llm.llm_engine.vllm_config.scheduler_config
        doc["scheduler"] = {k: getattr(sc, k, None) for k in ("max_num_batched_tokens", "max_num_seqs",
                                                               "enable_chunked_prefill")}
    except Exception as exc:   # the measurement stands without it
        doc["scheduler"] = {"error": repr(exc)}
    with open(out, "w") as fh:
        json.dump(doc, fh)
    print(json.dumps(doc))
'''

LLM_SWEEP = r'''
import importlib.util, json, os, sys, time


def set_budget(worker, n):
    """Runs in vLLM's engine core process (tensor parallel 1: the uni executor keeps the worker there),
    called by EngineCore.collective_rpc on its own thread: the scheduler of the engine core on this call's
    stack (its frame's ``self``) gets ``n`` as its token budget a step, which max_num_batched_tokens sets at
    the engine's start. Not through gc.get_objects(): the engine core freezes its heap after its start
    (vllm/v1/engine/core.py freeze_gc_heap), and frozen objects are not listed (the first H200 run of this
    sweep found no scheduler that way)."""
    import sys
    from vllm.v1.core.sched.scheduler import Scheduler
    found, f = [], sys._getframe(1)
    while f is not None:
        s = getattr(f.f_locals.get("self"), "scheduler", None)
        if isinstance(s, Scheduler) and not any(s is x for x in found):
            found.append(s)
        f = f.f_back
    for s in found:
        s.max_num_scheduled_tokens = n
    return [s.max_num_scheduled_tokens for s in found]


if __name__ == "__main__":
    script, model, dataset, max_model_len, util, out, eager, chunked, budgets, warm = sys.argv[1:11]
    spec = importlib.util.spec_from_file_location("ehs", script)
    ehs = importlib.util.module_from_spec(spec); spec.loader.exec_module(ehs)
    records = ehs.read_dataset(dataset)
    ehs.truncate(records, int(max_model_len))
    budgets, eager, chunked, warm = [int(x) for x in budgets.split(",")], eager == "1", chunked == "1", int(warm)
    doc = {"enforce_eager": eager, "enable_chunked_prefill": chunked, "points": []}

    def save():
        with open(out + ".tmp", "w") as fh:
            json.dump(doc, fh)
        os.replace(out + ".tmp", out)
    from vllm import LLM, SamplingParams
    llm = None
    for start in budgets:   # the largest budget the engine accepts; each one it refuses is a point
        t0 = time.perf_counter()
        try:
            llm = LLM(model=model, max_model_len=int(max_model_len), max_num_batched_tokens=start,
                      gpu_memory_utilization=float(util), enforce_eager=eager, enable_chunked_prefill=chunked,
                      enable_prefix_caching=False, tensor_parallel_size=1, seed=0)
        except Exception as exc:
            doc["points"].append({"max_num_batched_tokens": start, "refused": ("engine start: %s: %s" % (
                type(exc).__name__, exc))[:1000]})
            save()
            continue
        doc["engine_ready_s"], doc["engine_max_num_batched_tokens"] = round(time.perf_counter() - t0, 1), start
        break
    if llm is None:
        sys.exit(1)
    try:
        cfg = llm.llm_engine.vllm_config
        sc, cc = cfg.scheduler_config, cfg.compilation_config
        doc["scheduler"] = {k: getattr(sc, k, None) for k in ("max_num_batched_tokens", "max_num_seqs",
                                                               "enable_chunked_prefill", "async_scheduling")}
        doc["compilation"] = {"mode": str(getattr(cc, "mode", None)), "cudagraph_mode": str(cc.cudagraph_mode),
                              "max_cudagraph_capture_size": getattr(cc, "max_cudagraph_capture_size", None)}
    except Exception as exc:   # the measurement stands without it
        doc["scheduler"] = {"error": repr(exc)}
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    prompts = [{"prompt_token_ids": r["input_ids"]} for r in records]
    t0 = time.perf_counter()
    llm.generate(prompts[:warm], sp, use_tqdm=False)   # first-call work (kernels, buffers) left out of the points
    doc["warmup"] = {"prompts": min(warm, len(prompts)), "seconds": round(time.perf_counter() - t0, 3)}
    save()
    for n in budgets[budgets.index(start):]:
        point = {"max_num_batched_tokens": n,
                 "how": "the engine's own" if n == start else "the running scheduler's budget lowered"}
        try:
            if n != start:
                got = llm.collective_rpc(set_budget, args=(n,))
                point["schedulers_set"] = got
                if got != [[n]]:
                    raise RuntimeError("the engine core held %r schedulers' budgets, not [[%d]]" % (got, n))
            t1 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            secs = time.perf_counter() - t1
        except Exception as exc:
            point["refused"] = ("%s: %s" % (type(exc).__name__, exc))[:1000]
            doc["points"].append(point)
            save()
            break                      # the engine may be gone: the harness names the budgets left
        tokens = sum(len(o.prompt_token_ids) for o in outs)
        point.update(tokens=tokens, requests=len(outs), seconds=round(secs, 3), tokens_per_s=round(tokens / secs, 1))
        doc["points"].append(point)
        save()
    print(json.dumps(doc))
'''


# ------------------------------------------------------------------ pure parts (tested on the CPU)
def make_dataset(n: int, lo: int, hi: int, vocab: int, seed: int = 20261201) -> list[list[int]]:
    """``n`` prompts of uniformly ``lo``..``hi`` tokens: BOS (1) then random ids >= 4 (no specials)."""
    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, vocab) for _ in range(rng.randint(lo, hi) - 1)] for _ in range(n)]


def cut_lengths(rows: list[list[int]], max_model_len: int) -> list[int]:
    """Token counts after the script's cut to max_model_len - 1."""
    return [min(len(r), max_model_len - 1) for r in rows]


def roofline(decoder_params: int, lengths: list[int], layers: int, hidden: int,
             peak: float = H200_BF16_DENSE_FLOPS) -> dict:
    """(d): 2 x parameters x tokens / peak; and with the causal attention's matmuls (QK^T and AV,
    2 x s^2 x hidden per layer for a prompt of s tokens, half of it masked)."""
    tokens = sum(lengths)
    linear = 2.0 * decoder_params * tokens
    attention = sum(2.0 * s * s * hidden * layers for s in lengths)
    return {"tokens": tokens, "peak_flops": peak, "peak_source": FLOPS_SOURCE,
            "linear_flops": linear, "attention_flops": attention,
            "tokens_per_s": round(tokens / (linear / peak), 1),
            "tokens_per_s_with_attention": round(tokens / ((linear + attention) / peak), 1)}


def ratio(a, b):
    return round(a / b, 4) if a and b else None


def ratios(doc: dict) -> dict:
    """The ratios the issue asks for, from the parts' tokens/s (None where a part is missing)."""
    tps = lambda key: (doc.get(key) or {}).get("tokens_per_s")   # noqa: E731
    a, a0, b, c, d = tps("a_after"), tps("a_before"), tps("b_generator"), tps("c_vllm_prefill"), tps("d_roofline")
    t, srv, b0 = tps("a_tmpfs"), tps("a_server"), tps("b_generator_before")
    t0, two = tps("a_before_tmpfs"), tps("a_2dirs")
    return {"a/b": ratio(a, b), "b/c": ratio(b, c), "c/d": ratio(c, d), "a/c": ratio(a, c),
            "a_before_tmpfs/c": ratio(t0, c), "a_tmpfs/a_before_tmpfs": ratio(t, t0), "a_2dirs/a_after": ratio(two, a),
            "b_before/c": ratio(b0, c), "b/b_before": ratio(b, b0),
            "a_server/c": ratio(srv, c), "a_server/a_after": ratio(srv, a), "a_server/b": ratio(srv, b),
            "a_before/b": ratio(a0, b), "a_after/a_before": ratio(a, a0),
            "a_tmpfs/b": ratio(t, b), "a_tmpfs/c": ratio(t, c), "a_before/c": ratio(a0, c),
            **{k: v for part in TMPFS_VARIANTS for k, v in ((f"{part}/c", ratio(tps(part), c)),
                                                             (f"{part}/a_tmpfs", ratio(tps(part), t)))},
            **{f"{part}/a_after": ratio(tps(part), a) for part in DISK_VARIANTS},
            # against vLLM at its best (c_best), where it ran
            **{f"{k}/c_best": ratio(v, tps("c_best")) for k, v in (("a_tmpfs", t), ("a_server", srv), ("b", b),
                                                                    ("a", a), ("c", c))},
            "c_best/d": ratio(tps("c_best"), d),
            # the server flow on a tmpfs, and its variants against it and against vLLM at its best
            "a_server_tmpfs/a_server": ratio(tps("a_server_tmpfs"), srv),
            **{k: v for part in SERVER_VARIANTS for k, v in (
                (f"{part}/c_best", ratio(tps(part), tps("c_best"))),
                *(((f"{part}/a_server_tmpfs", ratio(tps(part), tps("a_server_tmpfs"))),)
                  if part != "a_server_tmpfs" else ()))}}


def server_vars(part: str, extra: dict | None = None) -> dict:
    """The playbook vars a server part changes: its SERVER_VARIANTS entry, then --server-vars on top."""
    return {k: v for k, v in {**SERVER_VARIANTS.get(part, {}), **(extra or {})}.items() if k != "connector"}


def server_connector(part: str) -> str:
    """The playbook a server part runs (benchmarks/gpu/lib/connector.py CONNECTORS)."""
    return SERVER_VARIANTS.get(part, {}).get("connector", SERVER_CONNECTOR)


def c_best_source(path: Path) -> dict:
    """--c-best-from's file, read: ValueError in one line when it is not JSON, has no measured c_best, or its
    c_best was itself copied (checked before the run builds anything)."""
    try:
        src = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--c-best-from {path}: cannot read it as JSON ({exc})") from None
    if not (src.get("c_best") or {}).get("tokens_per_s"):
        raise ValueError(f"--c-best-from {path}: it has no measured c_best (run --parts c_best, or name a "
                         "result that has one)")
    if "c_best_from" in src:
        raise ValueError(f"--c-best-from {path}: its c_best was itself copied (from "
                         f"{src['c_best_from'].get('path')}): name that file")
    return src


def copied_c_best(path: Path, doc: dict) -> dict:
    """--c-best-from: (c_best) of an earlier result file, for a run whose model has the same shape: the
    keys to put in this run's doc ({"c_best": ..., "c_best_from": {path, code_rev, ...}}). ValueError, in
    one line, when the file has no measured c_best or its model's shape differs."""
    src = c_best_source(path)
    cb = src["c_best"]
    theirs, ours = (src.get("model") or {}).get("shape"), (doc.get("model") or {}).get("shape")
    if not theirs or theirs != ours:
        raise ValueError(f"--c-best-from {path}: its model shape {theirs} is not this run's {ours}: "
                         "measure c_best here, or name a result of this --model")
    ds, ds0 = doc.get("dataset") or {}, src.get("dataset") or {}
    return {"c_best": cb, "c_best_from": {
        "path": str(path), "code_rev": src.get("code_rev"), "started_at": src.get("started_at"),
        "gpus": src.get("gpus"), "vllm": ((src.get("versions") or {}).get("vllm")),
        "same_dataset": all(ds.get(k) == ds0.get(k) for k in ("samples", "tokens", "max_model_len")),
        "why": "copied, not measured in this run: (c_best) of an earlier result of the same model shape"}}


def best_point(sweep: dict) -> dict:
    """(c_best)'s summary from its points (and its confirming engine, if one ran): the fastest point's
    settings and tokens/s, and the points the engine refused, by name."""
    points = list(sweep.get("points") or [])
    confirm = sweep.get("confirm") or {}
    ran = [p for p in points if p.get("tokens_per_s")] + (
        [{**confirm, "how": "confirming engine started at this budget"}] if confirm.get("tokens_per_s") else [])
    keys = ("enforce_eager", "enable_chunked_prefill", "max_num_batched_tokens", "how", "tokens_per_s")
    best = max(ran, key=lambda p: p["tokens_per_s"]) if ran else None
    return {"best": {k: best.get(k) for k in keys} if best else None,
            "tokens_per_s": best["tokens_per_s"] if best else None,
            "points_run": len([p for p in points if p.get("tokens_per_s")]),
            "points_refused": len([p for p in points if p.get("refused")])}


def sweep_points(pair: tuple, budgets: list[int], got: dict, rc: int, stderr: str) -> list[dict]:
    """One engine's points as the harness records them: what its process reported, and each budget it
    never reached named with why (the process's exit and its last stderr line), never left out."""
    eager, chunked = pair
    seen = {p.get("max_num_batched_tokens") for p in got.get("points") or []}
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    pts = [{"enforce_eager": eager, "enable_chunked_prefill": chunked, **p} for p in got.get("points") or []]
    stopped = next((p["max_num_batched_tokens"] for p in reversed(got.get("points") or []) if p.get("refused")), None)
    for n in budgets:
        if n not in seen:
            pts.append({"enforce_eager": eager, "enable_chunked_prefill": chunked, "max_num_batched_tokens": n,
                        "refused": f"not reached: the engine's sweep stopped at its refused budget {stopped}"
                        if stopped is not None and rc == 0 else
                        f"not reached: the engine's process ended with exit {rc}" + (f" ({last[:600]})" if last else "")})
    return pts


DD_RE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


def parse_dd(stderr: str) -> dict | None:
    """dd's summary line -> {bytes, seconds, bytes_per_s}."""
    m = DD_RE.search(stderr)
    if not m:
        return None
    n, s = int(m.group(1)), float(m.group(2))
    return {"bytes": n, "seconds": s, "bytes_per_s": round(n / s) if s else None}


def output_rate(out_dirs, lengths: list[int]) -> dict:
    """(a)'s tokens/s once the engine is up, from the job's own files: tokens of the data_<N>.pt
    present over (newest data_<N>.pt mtime - data_config.json mtime). ``out_dirs``: the output's
    directory, or its directories (an output spread over several: the earliest data_config.json)."""
    dirs = [out_dirs] if isinstance(out_dirs, Path) else list(out_dirs)
    files = sorted(f for d in dirs for f in d.glob("data_*.pt"))
    cfgs = [d / "data_config.json" for d in dirs if (d / "data_config.json").exists()]
    if not files or not cfgs:
        return {"files": len(files), "tokens_per_s": None}
    idx = [int(f.name[5:-3]) for f in files]
    tokens = sum(lengths[i] for i in idx if i < len(lengths))
    start = min(c.stat().st_mtime for c in cfgs)
    end = max(f.stat().st_mtime for f in files)
    size = sum(f.stat().st_size for f in files)
    secs = end - start
    return {"files": len(files), "tokens": tokens, "seconds": round(secs, 3), "bytes": size,
            "tokens_per_s": round(tokens / secs, 1) if secs > 0 else None,
            "bytes_per_s": round(size / secs) if secs > 0 else None,
            "bytes_per_token": round(size / tokens, 1) if tokens else None,
            "from_first_file": from_first_file(files, lengths, lambda f: int(f.name[5:-3])),
            **({"per_directory": [len(list(d.glob("data_*.pt"))) for d in dirs]} if len(dirs) > 1 else {})}


def from_first_file(files: list[Path], lengths: list[int], index) -> dict:
    """Tokens/s from the first output file on, the same for both flows: the tokens of the files written
    after the first one (its mtime; files of that same instant left out too) over newest - oldest mtime.
    Leaves out what comes before the first file (the 0.3.0 flow's first batch, the server flow's client
    start); ``index(path)`` is the sample index a file holds."""
    if len(files) < 2:
        return {"tokens_per_s": None}
    mt = {f: f.stat().st_mtime for f in files}
    first, last = min(mt.values()), max(mt.values())
    tokens = sum(lengths[index(f)] for f in files if mt[f] > first and index(f) < len(lengths))
    span = last - first
    return {"seconds": round(span, 3), "tokens": tokens, "tokens_per_s": round(tokens / span, 1) if span > 0 else None}


RUN_CLIENTS = re.compile(r"\[run_clients\] rank (\d+)/(\d+): imports ([\d.]+) s, "
                         r"(?:server ready after ([\d.]+) s|no health check)")
CLIENT_POSTFIX = re.compile(r"ok=(\d+), err=(\d+)(?:, rps=([\d.]+), vllm=(\d+)ms, write=(\d+)ms)?")


def server_phases(cold_start: dict | None, healthy_at: float | None, mtimes: list[float], log: str) -> dict:
    """Where the server flow's job spent its time (issue 47 item 2): launch to the server's health check and
    to the first file (the job's cold_start, agent/job/coldstart.py), health check to first file (the client's
    start: imports, dataset load, the existing files' check, the first requests), first to last file; and
    speculators 0.9.0's own per-sample means from its progress bar's last postfix (cli/generate_offline_data.py
    _worker: vllm = a request's time in the server with up to --concurrency in flight, write = the move from
    the connector's staging file into the output, the --validate-outputs reload not included)."""
    cs = cold_start or {}
    out = {"launch_to_healthy_s": cs.get("ready_after_s"), "launch_to_first_file_s": cs.get("first_file_after_s"),
           "healthy_to_first_file_s": round(min(mtimes) - healthy_at, 3) if mtimes and healthy_at else None,
           "first_to_last_file_s": round(max(mtimes) - min(mtimes), 3) if len(mtimes) > 1 else None}
    found = [m for m in CLIENT_POSTFIX.finditer(log) if m.group(3)]
    if found:
        m = found[-1]
        out["client"] = {"ok": int(m.group(1)), "errors": int(m.group(2)), "requests_per_s": float(m.group(3)),
                         "mean_request_ms": int(m.group(4)), "mean_move_ms": int(m.group(5)),
                         "from": "generate-offline-data's progress bar, last postfix (one client's, with several)"}
    ranks = {int(m.group(1)): (int(m.group(2)), float(m.group(3)), m.group(4) and float(m.group(4)))
             for m in RUN_CLIENTS.finditer(log)}
    if ranks:
        ready = [r[2] for r in ranks.values() if r[2] is not None]
        out["clients"] = {"n": max(r[0] for r in ranks.values()), "started": len(ranks),
                          "imports_s_max": max(r[1] for r in ranks.values()),
                          "ready_after_s_max": max(ready) if ready else None,
                          "from": "run_clients.py's line per rank (seconds from the client's own start)"}
    return out


def job_profile(lines: list[str]) -> dict | None:
    """The script's last ``extract-profile {json}`` line (where the job's time went), or None."""
    for line in reversed(lines):
        if line.startswith("extract-profile "):
            try:
                return json.loads(line[len("extract-profile "):])
            except ValueError:
                return None
    return None


def job_lines(tail_stdout: str) -> list[str]:
    """The job's log lines from `extract --tail --json` (its "line" events)."""
    out = []
    for raw in tail_stdout.splitlines():
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") == "line":
            out.append(ev.get("text") or "")
    return out


def prepare_before(rev: str, dest: Path) -> str | None:
    """Write the playbook of ``rev`` and every file its extract.files ships (the script, the run identity
    module ...) into ``dest`` as they sit in the repository (dest/playbooks/<playbook>, and each file at
    its path relative to it), by git show; None when git cannot show them (no repository on the GPU
    machine)."""
    def show(rel):
        try:
            r = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{rel}"], capture_output=True, text=True,
                               timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout if r.returncode == 0 else None
    pb_rel = "playbooks/" + PLAYBOOK.name
    text = show(pb_rel)
    if text is None:
        return None
    import yaml
    files = ((yaml.safe_load(text) or {}).get("extract") or {}).get("files") or {}
    texts = {pb_rel: text}
    for src in files:
        rel = os.path.normpath(os.path.join("playbooks", src))
        texts[rel] = show(rel)
        if texts[rel] is None:
            return None
    for rel, body in texts.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_text(body)
    return f"git show {rev}"


GENERATOR_MODULES = ("vllm.v1.executor.multiproc_executor", "vllm.v1.core.sched.scheduler", "vllm.config",
                     "vllm.v1.request", "vllm.v1.structured_output", "vllm.v1.core.kv_cache_utils",
                     "vllm.sampling_params", "vllm.distributed", "vllm.model_executor.models.interfaces",
                     "vllm.sequence", "vllm.v1.worker.gpu_worker")   # what the patched generator imports


def module_level_imports(root: Path, start: list[str], top: str = "vllm") -> dict[str, str]:
    """Outside packages imported at module level (not under TYPE_CHECKING, not in functions; a
    try: body counts) by the modules ``start`` and every ``top`` module they import, transitively,
    with their parent packages: {package: first module that imports it}. Static: nothing is imported."""
    import ast
    seen: set[str] = set()
    found: dict[str, str] = {}

    def modfile(name):
        p = root.joinpath(*name.split("."))
        if (p / "__init__.py").exists():
            return p / "__init__.py", True
        return (p.with_suffix(".py"), False) if p.with_suffix(".py").exists() else (None, False)

    def imports(body, out):
        for n in body:
            if isinstance(n, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(n.test):
                    imports(n.body, out)
                imports(n.orelse, out)
            elif isinstance(n, ast.Try):
                imports(n.body, out)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.append(n)
        return out

    def walk(name):
        if name in seen:
            return
        seen.add(name)
        parts = name.split(".")
        for i in range(1, len(parts)):
            walk(".".join(parts[:i]))
        path, is_pkg = modfile(name)
        if path is None:
            return
        for n in imports(ast.parse(path.read_text()).body, []):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif n.level:
                base = parts if is_pkg else parts[:-1]
                mod = ".".join(base[:len(base) - (n.level - 1)] + ([n.module] if n.module else []))
                names = [mod] + [f"{mod}.{a.name}" for a in n.names]
            else:
                names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            for m in names:
                if m.split(".")[0] == top:
                    if modfile(m)[0] is not None:
                        walk(m)
                elif m.split(".")[0] not in sys.stdlib_module_names:
                    found.setdefault(m.split(".")[0], name)
    for s in start:
        walk(s)
    return found


def llm_only_imports(vllm_root: Path) -> dict[str, str]:
    """What `from vllm import LLM` (vllm/entrypoints/llm.py) imports beyond the generator's path."""
    gen = module_level_imports(vllm_root, list(GENERATOR_MODULES))
    return {k: v for k, v in module_level_imports(vllm_root, ["vllm.entrypoints.llm"]).items() if k not in gen}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/root/e2e", help="bundle dir (site/, tf/, llm/); scratch goes under it")
    ap.add_argument("--out", default=None, help="result JSON (required unless --prepare-before)")
    ap.add_argument("--bundle", default=None, help="bundle.tar.gz to unpack into --work when site/ is missing")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--min-tokens", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=4000)
    ap.add_argument("--model", choices=sorted(MODEL_SHAPES), default="1.1b")
    ap.add_argument("--parts", default="disk,a_before,a_after,a_tmpfs,b,c",
                    help=f"comma list of {', '.join(PARTS)} (d is computed); BEFORE's playbook patches the run's "
                         "copy of speculators before a_before, a_before_tmpfs and b_before, AFTER's on top before "
                         "the others")
    ap.add_argument("--before-rev", default=BEFORE_REV, help="git revision of the BEFORE script and playbook")
    ap.add_argument("--before-dir", default=str(REPO / "benchmarks" / "gpu_before"),
                    help="where --prepare-before puts them for a GPU machine without git (travels untracked)")
    ap.add_argument("--prepare-before", action="store_true",
                    help="only write --before-rev's playbook and script into --before-dir, then exit")
    ap.add_argument("--budget-s", type=float, default=510, help="skip parts that would start after this")
    ap.add_argument("--base-python", default=None, help="the machine's python with torch (default: this one)")
    ap.add_argument("--code-rev", default=None, help="this checkout's commit (recorded)")
    ap.add_argument("--dd-mib", type=int, default=2048, help="MiB written by the disk test")
    ap.add_argument("--dd-sustained-mib", type=int, default=None,
                    help="MiB of the second, sustained disk test (default: as many as the job writes, at most half "
                         "the free space): a disk that takes a burst of --dd-mib fast may not keep it up")
    ap.add_argument("--keep-outputs", action="store_true",
                    help="keep each (a) part's files until the end (default: removed once measured)")
    ap.add_argument("--count-batches", action="store_true",
                    help="(b): a second pass with batches of 8 samples each (the old count batching), time allowing")
    ap.add_argument("--c-best-tokens", default=C_BEST_TOKENS,
                    help="(c_best): the max_num_batched_tokens budgets swept (comma list; the engine starts at the "
                         "largest it accepts)")
    ap.add_argument("--c-best-warmup", type=int, default=64,
                    help="(c_best): prompts generated once after each engine's start, before its points")
    ap.add_argument("--c-best-engine-s", type=float, default=200,
                    help="(c_best): one engine's process at most (start, compile, warm-up, every budget)")
    ap.add_argument("--c-best-engine-min-s", type=float, default=60,
                    help="(c_best): start another engine only with this many seconds of --budget-s left")
    ap.add_argument("--server-vars", default=None, type=_json_mapping,
                    help="JSON mapping of playbook vars for every server part of the run (a_server, "
                         f"{', '.join(SERVER_VARIANTS)}), over the part's own (SERVER_VARIANTS), e.g. "
                         "'{\"max_num_batched_tokens\": 32768}'")
    ap.add_argument("--c-best-from", default=None,
                    help="copy c_best (and so every <part>/c_best ratio) from this earlier result JSON of the same "
                         "model shape instead of sweeping (recorded as c_best_from)")
    ap.add_argument("--standin", action="store_true",
                    help="CPU rehearsal of the harness: (a) runs the sandbox's STAND-IN job (torch CPU, no vLLM) "
                         "through the same remote-ops extract; no model build, no patch, no (b)/(c); figures "
                         "are NOT GPU figures")
    args = ap.parse_args(argv)
    order = [p.strip() for p in args.parts.split(",") if p.strip() and p.strip() not in UNPATCHED_PARTS]
    first_after = next((i for i, p in enumerate(order) if p not in BEFORE_PARTS), len(order))
    if any(p in BEFORE_PARTS for p in order[first_after:]):
        ap.error("a_before and b_before must come before the other GPU parts: AFTER's patch is made on top of "
                 "BEFORE's")
    unknown = set(p.strip() for p in args.parts.split(",") if p.strip()) - set(PARTS)
    if unknown:
        ap.error(f"unknown part(s) {', '.join(sorted(unknown))}")
    if not args.out and not args.prepare_before:
        ap.error("--out is required")
    if args.c_best_from and "c_best" in [p.strip() for p in args.parts.split(",")]:
        ap.error("--c-best-from and the part c_best: choose one (copy an earlier c_best, or measure it here)")
    if not 1 <= args.min_tokens <= args.max_tokens:
        ap.error("--min-tokens must be >= 1 and <= --max-tokens")
    return args


def _json_mapping(text: str) -> dict:
    try:
        got = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(got, dict):
        raise argparse.ArgumentTypeError("must be a JSON mapping of playbook vars, e.g. '{\"concurrency\": 64}'")
    return got


# ------------------------------------------------------------------ the run
def run_cmd(cmd, *, timeout, env=None, cwd=None) -> dict:
    """One subprocess in its own session, killed with its whole group at the timeout."""
    started = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                         env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        rc, err = 124, (err or "") + f"\n[timed out after {timeout}s]"
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)    # vLLM workers left behind by the part
        except ProcessLookupError:
            pass
    return {"rc": rc, "stdout": out, "stderr": err, "seconds": round(time.monotonic() - started, 2)}


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work).resolve()
        self.scratch = self.work / "throughput"
        self.base_python = args.base_python or sys.executable
        self.t0 = time.monotonic()
        self.patched_before = False   # the run's copy of speculators carries BEFORE's patch
        self.doc: dict = {"check": "gpu_throughput", "code_rev": args.code_rev,
                          "written_by": provenance.written_by(__file__, args.code_rev),
                          "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          "settings": {"samples": args.samples, "tokens": [args.min_tokens, args.max_tokens],
                                       "model": args.model, "before_rev": args.before_rev}}
        self.out = Path(args.out)

    def save(self):
        self.doc["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        self.doc["ratios"] = ratios(self.doc)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=2, default=str))
        os.replace(tmp, self.out)

    def left(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.t0)

    def timeout(self, cap: float) -> float:
        """A part's timeout: at most ``cap``, and never past the budget by more than 20 s."""
        return max(10.0, min(cap, self.left() + 20))

    def part(self, name, fn, need_s):
        t = time.monotonic() - self.t0
        if self.left() < need_s:
            self.doc[name] = {"skipped": f"time budget: {self.left():.0f}s left, the part needs ~{need_s}s"}
        else:
            print(f"[{t:5.0f}s] {name} ...", file=sys.stderr, flush=True)
            try:
                fn()
            except Exception as exc:   # one broken part must not hide the others
                self.doc[name] = {**(self.doc.get(name) or {}), "error": f"{type(exc).__name__}: {exc}"}
        got = self.doc.get(name) or {}
        print(f"[{time.monotonic() - self.t0:5.0f}s] {name}: " + (
            f"{got['tokens_per_s']} tokens/s" if got.get("tokens_per_s") else
            str(got.get("skipped") or got.get("error") or f"exit {got.get('rc')}")), file=sys.stderr, flush=True)
        self.save()

    # ---------------------------------------------------------------- setup
    def setup(self):
        w = self.work
        missing = [d for d in ("site", "tf", "llm") if not (w / d).is_dir()]
        if missing and not self.args.standin:
            if not self.args.bundle:
                raise SystemExit(f"{w}: {', '.join(missing)} missing: give --bundle (see GPU-NOTES.md)")
            import tarfile
            with tarfile.open(self.args.bundle, "r:*") as tf:   # only what is missing (llm/ is newer)
                tf.extractall(w, members=[m for m in tf if m.name.split("/")[0] in missing], filter="data")
        shutil.rmtree(self.scratch, ignore_errors=True)
        (self.scratch / "bin").mkdir(parents=True)
        spec = "" if self.args.standin else self.own_speculators() + ":"
        for name, path in (("python", f"{spec}{w}/tf:{w}/site"), ("python-llm", f"{spec}{w}/tf:{w}/site:{w}/llm"),
                           # the server flow (benchmarks/gpu/server_check.py's interpreters): vLLM's API server with
                           # transformers 4.57.6, speculators 0.9.0's client with the machine's transformers
                           ("server/python", f"{w}/tf:{w}/server:{w}/site"),
                           ("client/python", f"{w}/spec090:{w}/server:{w}/site")):
            f = self.scratch / "bin" / name
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(f"#!/bin/sh\nPYTHONPATH={path} exec {self.base_python} \"$@\"\n")
            f.chmod(0o755)
        if self.args.standin:
            for name in ("python", "python-llm"):
                (self.scratch / "bin" / name).write_text(f"#!/bin/sh\nexec {self.base_python} \"$@\"\n")
            self.doc["standin"] = "STAND-IN rehearsal on the CPU: not GPU figures"
            return
        smi = run_cmd(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                      timeout=30)
        self.doc["gpus"] = [l.strip() for l in smi["stdout"].splitlines() if l.strip()]
        self.doc["llm_wheels_present"] = (w / "llm").is_dir()
        self.doc["versions"] = last_json(run_cmd([str(self.scratch / "bin" / "python"), "-c", VERSIONS],
                                                 timeout=120)["stdout"])
        for name, text in (("gen_alone.py", GEN_ALONE), ("llm_prefill.py", LLM_PREFILL)):
            (self.scratch / name).write_text(text)

    def own_speculators(self) -> str:
        """This run patches its own copy of speculators (scratch/spec, first on the interpreters' path), as
        installed (its RECORD; files an earlier run patched in place come back from the bundle): BEFORE's
        playbook must meet the release, not AFTER's edits left in the install by an earlier run (they were
        found "applied" and stayed: the repeats of gpu_throughput_h200_zero_copy and _long ran BEFORE's
        script over AFTER's zero-copy slots). Recorded as speculators_copy; returns the copy's directory."""
        from benchmarks.gpu.model_check import pristine_package_copy
        bundle = Path(self.args.bundle) if self.args.bundle else self.work / "bundle.tar.gz"
        self.doc["speculators_copy"] = pristine_package_copy(self.work / "site", self.scratch / "spec", bundle)
        return str(self.scratch / "spec")

    def build(self):
        s = self.scratch
        t = time.monotonic()
        if self.args.standin:   # the stand-in's own defaults (8 layers, hidden 64, vocab 1000)
            r = {"rc": 0, "stdout": json.dumps({"params": 0, "decoder_params": 8 * 2 * 64 * 64, "layers": 8,
                                                "hidden": 64, "vocab": 1000, "standin": True})}
        else:
            r = run_cmd([str(s / "bin" / "python"), "-c", MODEL_BUILDER, str(s / "model"),
                         json.dumps(MODEL_SHAPES[self.args.model]), "cuda"], timeout=240)
        if r["rc"] != 0:
            self.doc["model"] = {"ok": False, "rc": r["rc"], "stderr": r["stderr"][-3000:]}
            self.save()
            raise SystemExit("model build failed")
        self.model = last_json(r["stdout"])
        self.model["build_s"] = round(time.monotonic() - t, 1)
        # model.shape: the same keys in every result JSON (layers, hidden, heads, experts..., moe)
        self.model["shape"] = model_shape(
            {"num_hidden_layers": self.model["layers"], "hidden_size": self.model["hidden"],
             "vocab_size": self.model["vocab"]} if self.args.standin else
            json.loads((s / "model" / "config.json").read_text()))
        rows = make_dataset(self.args.samples, self.args.min_tokens, self.args.max_tokens, self.model["vocab"])
        with open(s / "dataset.jsonl", "w") as fh:
            for ids in rows:
                fh.write(json.dumps({"input_ids": ids}) + "\n")
        self.max_model_len = 2048           # the playbook's default
        self.lengths = cut_lengths(rows, self.max_model_len)
        self.doc["model"] = self.model
        self.doc["dataset"] = {"samples": len(rows), "tokens_before_cut": sum(map(len, rows)),
                               "tokens": sum(self.lengths), "max_model_len": self.max_model_len,
                               "cut": sum(1 for r in rows if len(r) > self.max_model_len - 1)}
        if self.server_parts() and self.args.standin:    # the rows as prepare-data saves them (pyarrow)
            from remote_ops.sandbox_assets.prepared_data import write
            write(str(s / "srv-data"), [ids[:self.max_model_len - 1] for ids in rows])
        elif self.server_parts():
            cut = s / "dataset-cut.jsonl"      # the rows as the 0.3.0 script cuts them: both flows get the same tokens
            with open(cut, "w") as fh:
                for ids in rows:
                    fh.write(json.dumps({"input_ids": ids[:self.max_model_len - 1]}) + "\n")
            t = time.monotonic()
            r = run_cmd([str(s / "bin" / "client" / "python"), "-c", DATASET_BUILDER, str(cut), str(s / "srv-data")],
                        timeout=300)
            self.doc["server_dataset"] = {"rc": r["rc"], "seconds": round(time.monotonic() - t, 1),
                                          "built": last_json(r["stdout"]),
                                          "stderr": r["stderr"][-1500:] if r["rc"] else ""}
        self.doc["d_roofline"] = roofline(self.model["decoder_params"], self.lengths, self.model["layers"],
                                          self.model["hidden"])
        self.save()

    def inventory(self):
        s = self.scratch

        def host(name, playbook, extra=None):
            (s / f"wd-{name}").mkdir(exist_ok=True)      # each uploads its own script there
            return {"connection": "local", "python": str(s / "bin" / "python"), "workdir": str(s / f"wd-{name}"),
                    "playbook": str(playbook), "env": {**HOST_ENV, "REMOTE_OPS_STATE_DIR": str(s / f"state-{name}")},
                    "vars": {"target_model": str(s / "model"), "dataset": str(s / "dataset.jsonl"),
                             "output_dir": str(s / f"out-{name}"), "max_samples": self.args.samples,
                             "gpus": 1, **self.standin_vars(name), **(extra or {})}}
        hosts = {"after": host("after", PLAYBOOK),
                 # AFTER with its files on a tmpfs: what the job does when the disk is not the limit
                 "tmpfs": host("tmpfs", PLAYBOOK, {"output_dir": str(self.out_dir("tmpfs"))}),
                 # the same with one var changed (TMPFS_VARIANTS)
                 **{A_HOSTS[part]: host(A_HOSTS[part], PLAYBOOK, {"output_dir": str(self.out_dir(A_HOSTS[part])),
                                                                  **change})
                    for part, change in TMPFS_VARIANTS.items()},
                 # AFTER on the disk with one var changed (DISK_VARIANTS)
                 **{A_HOSTS[part]: host(A_HOSTS[part], PLAYBOOK, change) for part, change in DISK_VARIANTS.items()},
                 # AFTER spreading its files over two directories (output_dir a list; one disk here)
                 "twodirs": host("twodirs", PLAYBOOK, {"output_dir": [str(d) for d in self.out_dirs("twodirs")]})}
        n = self.model["layers"]
        for part in SERVER_PARTS:
            name = self.server_host(part)
            (s / f"wd-{name}").mkdir(exist_ok=True)
            # the stand-ins (--standin) take the sandbox's playbook below, with no server interpreter of vLLM's
            playbook, server_py = (None, s / "bin" / "server" / "python") if self.args.standin else \
                server_setup(server_connector(part), s / "bin" / "server" / "python", s / name)
            hosts[name] = {
                "connection": "local", "python": str(s / "bin" / "client" / "python"), "workdir": str(s / f"wd-{name}"),
                "playbook": str(playbook), "env": {**HOST_ENV, "REMOTE_OPS_STATE_DIR": str(s / f"state-{name}")},
                # the playbook's defaults (concurrency, gpu_memory_utilization) except the model's own layer ids and
                # the 0.3.0 playbook's max_model_len (the same cut rows); then the part's own vars
                "vars": {"target_model": str(s / "model"), "preprocessed_data": str(self.server_data(part)),
                         "max_samples": self.args.samples, "layer_ids": [2, n // 2, n - 3, n], "port": SERVER_PORT,
                         "max_model_len": self.max_model_len, "server_python": str(server_py),
                         "server_ready_seconds": 420, "gpus": 1, **self.server_standin(name),
                         **server_vars(part, self.args.server_vars)}}
            if self.args.standin:
                hosts[name].update(python=str(s / "bin" / "python"), playbook=str(s / "server-standin.yaml"))
        before = self.before_files()
        for name, extra in (("before", {}), ("before_tmpfs", {"output_dir": str(self.out_dir("before_tmpfs"))})):
            if before["source"] == "git":
                hosts[name] = host(name, before["playbook"], extra)
            else:   # the old loop, by flags of the new script
                hosts[name] = host(name, PLAYBOOK, {"batch_tokens": 0, "write_queue_mb": 0, "handoff_dir": "off",
                                                    **extra})
        self.doc["before_source"] = before
        self.inv = s / "inventory.yaml"
        self.inv.write_text(json.dumps({"hosts": hosts, "default": "after"}, indent=2))

    def server_parts(self) -> list[str]:
        return [p.strip() for p in self.args.parts.split(",") if p.strip() in SERVER_PARTS]

    @staticmethod
    def server_host(part) -> str:
        """The inventory host a server part extracts with: server, server_tmpfs, server_tmpfs_b64k..."""
        return part[2:]

    def server_data(self, part) -> Path:
        """A server part's preprocessed_data (the Arrow dataset; hidden_states/ and .hs_staging/ go in it):
        the scratch's srv-data on the disk for a_server, a tmpfs for the others (the rehearsal: its scratch)."""
        if part == "a_server":
            return self.scratch / "srv-data"
        return (self.scratch / "srv-tmpfs") if self.args.standin else Path(SERVER_TMPFS)

    def out_dir(self, which) -> Path:
        if which.startswith(("tmpfs", "before_tmpfs")) and not self.args.standin:   # the rehearsal: own scratch
            return Path(TMPFS_OUT + ("" if which == "tmpfs" else "-" + which))
        return self.scratch / f"out-{which}"

    def out_dirs(self, which) -> list[Path]:
        if which == "twodirs":
            return [self.scratch / "out-twodirs-a", self.scratch / "out-twodirs-b"]
        return [self.out_dir(which)]

    def standin_vars(self, name) -> dict:
        """--standin: the sandbox's stand-in job in place of the real generator (it drives the script
        uploaded beside it, so BEFORE drives BEFORE's script)."""
        if not self.args.standin:
            return {}
        wd = self.scratch / f"wd-{name}"
        shutil.copy(REPO / "remote_ops" / "sandbox_assets" / "extract_standin.py", wd / "extract_standin.py")
        return {"extract_script": str(wd / "extract_standin.py"), "gpus": 0, "import_check": ["torch", "tqdm"],
                "target_model": "tiny-standin"}

    def server_standin(self, name) -> dict:
        """--standin: the sandbox's server and client STAND-INs (remote-ops sandbox's playbook: the shipped
        0.9.0 one with their commands; no vLLM, so the server ignores max_num_batched_tokens)."""
        if not self.args.standin:
            return {}
        from remote_ops import sandbox
        wd = self.scratch / f"wd-{name}"
        for f in ("server_standin.py", "client_standin.py"):
            shutil.copy(REPO / "remote_ops" / "sandbox_assets" / f, wd / f)
        (self.scratch / "server-standin.yaml").write_text(sandbox.server_playbook_text())
        return {"server_script": str(wd / "server_standin.py"), "client_script": str(wd / "client_standin.py"),
                "target_model": "tiny-standin", "standin_layers": CAPTURED_LAYERS, "standin_hidden": 64,
                "sample_delay": 0, "gpus": 0, "import_check": ["pyarrow"], "server_import_check": ["torch"],
                "server_python": str(self.scratch / "bin" / "python"), "server_ready_seconds": 60,
                "port": self.standin_port()}

    def standin_port(self) -> int:
        """--standin: one free loopback port for the stand-in server (tests run side by side)."""
        if not getattr(self, "_port", None):
            import socket
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                self._port = sock.getsockname()[1]
        return self._port

    def before_files(self) -> dict:
        """main's script and playbook at --before-rev, beside each other as the playbook expects:
        from git, else from --before-dir (written by --prepare-before where git is), else None."""
        d = self.scratch / "before"
        got = prepare_before(self.args.before_rev, d)
        if got is None and (Path(self.args.before_dir) / "playbooks" / PLAYBOOK.name).exists():
            shutil.copytree(self.args.before_dir, d, dirs_exist_ok=True)
            got = "copy of " + str(self.args.before_dir)
        if got is None:
            return {"source": "flags", "why": f"git cannot show {self.args.before_rev} here and no {self.args.before_dir}",
                    "flags": "--batch-tokens 0 --write-queue-mb 0 (count batches, writes in the main thread)"}
        return {"source": "git", "rev": self.args.before_rev, "from": got, "playbook": str(d / "playbooks" / PLAYBOOK.name)}

    def ro(self, *args, timeout=300) -> dict:
        cmd = [self.base_python, "-c", "import sys; sys.path.insert(0, sys.argv.pop(1)); "
               "from remote_ops.cli import main; sys.exit(main(sys.argv[1:]))", str(REPO), "-i", str(self.inv), *args]
        return run_cmd(cmd, timeout=timeout, env={"PYTHONPATH": str(self.work / "site"), "COLUMNS": "200"})

    def wait_gpu_free(self, limit=30.0):
        if self.args.standin:
            return 0.0
        t = time.monotonic()
        while time.monotonic() - t < limit:
            r = run_cmd(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], timeout=30)
            if r["rc"] != 0 or not r["stdout"].strip():
                return round(time.monotonic() - t, 1)
            time.sleep(1)
        return None

    # ---------------------------------------------------------------- parts
    def part_disk(self):
        target = self.scratch / "ddtest"
        n = self.args.dd_mib
        r = run_cmd(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={n // 16}", "oflag=direct",
                     "conv=fsync"], timeout=120)
        direct = parse_dd(r["stderr"])
        target.unlink(missing_ok=True)
        chunk = os.urandom(64 << 20)
        t = time.perf_counter()
        with open(target, "wb") as fh:         # what save_atomic does: buffered writes, then fsync
            for _ in range(n // 64):
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        secs = time.perf_counter() - t
        target.unlink(missing_ok=True)
        self.doc["disk"] = {"path": str(self.scratch), "dd_direct": direct, "dd_rc": r["rc"],
                            "buffered_fsync": {"bytes": (n // 64) * (64 << 20), "seconds": round(secs, 3),
                                               "bytes_per_s": round((n // 64) * (64 << 20) / secs)}}
        # the same dd over as many bytes as an (a) part writes: the disk's speed for the job's volume
        mib = self.sustained_mib()
        r = run_cmd(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={max(1, mib // 16)}", "oflag=direct",
                     "conv=fsync"], timeout=600)
        target.unlink(missing_ok=True)
        self.doc["disk"]["dd_direct_sustained"] = parse_dd(r["stderr"])
        self.doc["disk"]["dd_sustained_rc"] = r["rc"]

    def sustained_mib(self) -> int:
        """--dd-sustained-mib, else the bytes an (a) part writes (tokens x captured layers x hidden x 2 bytes),
        at most half the scratch's free space; at least --dd-mib."""
        if self.args.dd_sustained_mib:
            return self.args.dd_sustained_mib
        job = (self.doc.get("dataset") or {}).get("tokens", 0) * CAPTURED_LAYERS * self.model.get("hidden", 0) * 2
        st = os.statvfs(self.scratch)
        return max(self.args.dd_mib, min(job, st.f_bavail * st.f_frsize // 2) >> 20)

    def part_patch(self, which="after"):
        """Patch the run's copy of speculators with ``which``'s playbook: BEFORE's first, for the BEFORE
        parts; then BEFORE's patch rolled back byte for byte (``remote-ops rollback``) and AFTER's made on
        the files as installed (an edit whose text changed since BEFORE finds neither its old nor its new
        text on top of BEFORE's: on 6d8387f's first run AFTER's patch failed there, and the AFTER parts ran
        on BEFORE's generator)."""
        key = "patch" if which == "after" else f"patch_{which}"
        doc = self.doc[key] = {}
        if which == "after" and self.patched_before:
            rb = self.ro("rollback", "before", "--json", timeout=120)
            doc["rollback_before"] = {"rc": rb["rc"], "seconds": rb["seconds"], "stderr": rb["stderr"][-800:]}
            if rb["rc"] != 0:
                doc["rc"] = rb["rc"]
                raise RuntimeError(f"rollback of BEFORE's patch failed (exit {rb['rc']}): {rb['stderr'][-300:]}")
            self.patched_before = False
        r = self.ro("patch", which, "--yes", "--json", timeout=180)
        doc.update(rc=r["rc"], seconds=r["seconds"], stderr=r["stderr"][-800:])
        if r["rc"] != 0:
            raise RuntimeError(f"patch {which} failed (exit {r['rc']}): {r['stderr'][-300:]}")
        self.patched_before = which == "before"

    def part_a(self, name):
        which = A_HOSTS[name]
        for d in self.out_dirs(which):
            shutil.rmtree(d, ignore_errors=True)
        free = self.wait_gpu_free()
        r = self.ro("extract", which, "--skip-check", "--tail", "--json", timeout=self.timeout(300))
        lines = job_lines(r["stdout"])
        rate = output_rate(self.out_dirs(which), self.lengths)
        ready = next((l for l in lines if l.startswith("generator ready in")), None)
        progress = [l for l in lines if l.startswith("extract-progress ")]
        self.doc[name] = {"rc": r["rc"], "wall_s": r["seconds"], "gpu_free_after_s": free, **rate,
                          "complete": rate.get("files") == self.args.samples,
                          "generator_ready_line": ready, "last_progress": progress[-1] if progress else None,
                          "handoff_line": next((l for l in lines if l.startswith("captured states ")), None),
                          "profile": job_profile(lines),
                          "stderr_tail": r["stderr"][-1500:] if r["rc"] else "",
                          "log_tail": lines[-8:]}
        if not self.args.keep_outputs:   # measured: free the disk or RAM for the next part (a long dataset's
            for d in self.out_dirs(which):   # outputs are tens of GB each)
                shutil.rmtree(d, ignore_errors=True)

    def part_a_server(self, name="a_server"):
        s = self.scratch
        data = self.server_data(name)
        copied = None
        if data != s / "srv-data":    # the Arrow dataset beside the staging and the outputs: one file system
            t = time.monotonic()
            shutil.rmtree(data, ignore_errors=True)
            shutil.copytree(s / "srv-data", data, ignore=shutil.ignore_patterns("hidden_states", ".hs_staging"))
            copied = round(time.monotonic() - t, 2)
        out = data / "hidden_states"
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(data / ".hs_staging", ignore_errors=True)
        host = self.server_host(name)
        free = self.wait_gpu_free()
        r = self.ro("extract", host, "--skip-check", "--tail", "--json", timeout=self.timeout(480))
        st = self.ro("status", host, "--json", timeout=60)
        job = (last_json(st["stdout"]) or {}).get("job") or {}
        server = job.get("server") or {}
        healthy_at = None
        if server.get("log"):
            rec = Path(server["log"]).parent / "server.json"
            try:
                healthy_at = json.loads(rec.read_text()).get("healthy_at")
            except (OSError, ValueError):
                pass
        files = sorted(out.glob("hs_*.safetensors"))
        idx = [int(f.name[3:].split(".")[0]) for f in files]
        tokens = sum(self.lengths[i] for i in idx if i < len(self.lengths))
        size = sum(f.stat().st_size for f in files)
        mt = sorted(f.stat().st_mtime for f in files)
        doc = {"rc": r["rc"], "wall_s": r["seconds"], "gpu_free_after_s": free, "files": len(files), "tokens": tokens,
               "bytes": size, "complete": len(files) == self.args.samples, "layer_ids": [2, self.model["layers"] // 2,
                                                                                    self.model["layers"] - 3,
                                                                                    self.model["layers"]],
               "server_ready_after_s": server.get("ready_after_s"), "healthy_at": healthy_at,
               "state": job.get("state"), "reason": job.get("reason"),
               # what it ran with: the playbook's defaults but these vars, its data on this directory
               "vars": server_vars(name, self.args.server_vars), "connector": server_connector(name),
               "clients": server_vars(name, self.args.server_vars).get("clients", 1),
               "data_dir": str(data),
               "on": "disk" if name == "a_server" else "tmpfs", "dataset_copy_s": copied,
               **({"standin": "STAND-IN server and client (no vLLM): the client takes concurrency, the server "
                             "no engine var (max_num_batched_tokens does not reach it) and no api_server_count "
                             "(one process)"} if self.args.standin else {}),
               "stderr_tail": r["stderr"][-1500:] if r["rc"] else "", "log_tail": job_lines(r["stdout"])[-8:]}
        if files and healthy_at:
            # with client_start: launch the client polls /health itself and can see the server ready a poll before
            # the supervisor records healthy_at: the server was ready by its first file at the latest, so the
            # time counts from whichever came first (said by start_before_healthy_at_s when the file did)
            start = min(healthy_at, mt[0])
            secs = mt[-1] - start
            if start < healthy_at:
                doc["start_before_healthy_at_s"] = round(healthy_at - start, 3)
            doc.update({"seconds": round(secs, 3), "tokens_per_s": round(tokens / secs, 1) if secs > 0 else None,
                        "bytes_per_s": round(size / secs) if secs > 0 else None,
                        "bytes_per_token": round(size / tokens, 1) if tokens else None})
        # from the first file on: the client's start (imports, dataset load) left out
        doc["from_first_file"] = from_first_file(files, self.lengths, lambda f: int(f.name[3:].split(".")[0]))
        log = ""
        try:
            log = Path(job.get("log") or "").read_text(errors="replace") if job.get("log") else ""
        except OSError:
            pass
        doc["phases"] = server_phases(job.get("cold_start"), healthy_at, mt, log)
        self.doc[name] = doc
        if name != "a_server" and not self.args.keep_outputs:   # measured: free the RAM for the next part
            shutil.rmtree(data, ignore_errors=True)

    def part_b(self, which="after"):
        """(b) with the install as patched now: AFTER's playbook, or BEFORE's for b_before (then with
        AFTER's batches only: what changed between them is the generator's edits, not the batching)."""
        self.wait_gpu_free()
        s = self.scratch
        out = s / f"b_{which}.json"
        out.unlink(missing_ok=True)
        # a second pass with count batches (8 samples each) only with --count-batches and if (c) keeps ~70 s
        second = time.time() + self.left() - 70 if which == "after" and self.args.count_batches else 0
        r = run_cmd([str(s / "bin" / "python"), str(s / "gen_alone.py"), str(SCRIPT), str(s / "model"),
                     str(s / "dataset.jsonl"), str(self.max_model_len), "8", "0.8", str(out), str(second)],
                    timeout=self.timeout(300), env=HOST_ENV | {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
        got = json.loads(out.read_text()) if out.exists() else {}
        self.doc["b_generator" if which == "after" else "b_generator_before"] = {
            "rc": r["rc"], "wall_s": r["seconds"], **got, "stderr_tail": r["stderr"][-1500:] if r["rc"] or not got else ""}

    def part_c(self):
        self.wait_gpu_free()
        s = self.scratch
        budget = ((self.doc.get("b_generator") or {}).get("engine_budget") or [max(8192, self.max_model_len)])[0]
        r = run_cmd([str(s / "bin" / "python-llm"), str(s / "llm_prefill.py"), str(SCRIPT), str(s / "model"),
                     str(s / "dataset.jsonl"), str(self.max_model_len), str(budget), "0.8", str(s / "c.json")],
                    timeout=self.timeout(240), env=HOST_ENV | {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"})
        got = json.loads((s / "c.json").read_text()) if (s / "c.json").exists() else {}
        self.doc["c_vllm_prefill"] = {"rc": r["rc"], "wall_s": r["seconds"], **got,
                                      "stderr_tail": r["stderr"][-1500:] if r["rc"] or not got else ""}

    def part_c_best(self):
        """(c_best): one engine a (graphs, chunked) pair, each in its own process, every budget a point;
        then, when the best was a lowered budget and time allows, one engine started at it."""
        s = self.scratch
        budgets = sorted({int(x) for x in self.args.c_best_tokens.split(",") if x.strip()}, reverse=True)
        sweep = self.doc["c_best"] = {"budgets": budgets, "engines": [], "points": [],
                                      "how": "LLM.generate(max_tokens=1), the same prompts as (c), prefix caching "
                                             "off, gpu_memory_utilization 0.8; one engine a (graphs, chunked) pair "
                                             "at its largest accepted budget, smaller budgets by lowering the "
                                             "running scheduler's token budget a step"}
        env = HOST_ENV | {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        (s / "llm_sweep.py").write_text(LLM_SWEEP)

        def engine(eager, chunked, wanted, name):
            self.wait_gpu_free()
            out = s / f"{name}.json"
            out.unlink(missing_ok=True)
            r = run_cmd([str(s / "bin" / "python-llm"), str(s / "llm_sweep.py"), str(SCRIPT), str(s / "model"),
                         str(s / "dataset.jsonl"), str(self.max_model_len), "0.8", str(out), str(int(eager)),
                         str(int(chunked)), ",".join(map(str, wanted)), str(self.args.c_best_warmup)],
                        timeout=self.timeout(self.args.c_best_engine_s), env=env)
            got = json.loads(out.read_text()) if out.exists() else {}
            info = {"enforce_eager": eager, "enable_chunked_prefill": chunked, "rc": r["rc"], "wall_s": r["seconds"],
                    **{k: v for k, v in got.items() if k not in ("points", "enforce_eager", "enable_chunked_prefill")},
                    "stderr_tail": r["stderr"][-1500:] if r["rc"] else ""}
            return info, sweep_points((eager, chunked), wanted, got, r["rc"], r["stderr"])

        for eager, chunked in C_BEST_PAIRS:
            if self.left() < self.args.c_best_engine_min_s:
                sweep["engines"].append({"enforce_eager": eager, "enable_chunked_prefill": chunked,
                                         "skipped": f"time budget: {self.left():.0f}s left"})
                continue
            info, pts = engine(eager, chunked, budgets, f"c_best_{'eager' if eager else 'graphs'}_"
                                                        f"{'chunked' if chunked else 'whole'}")
            sweep["engines"].append(info)
            sweep["points"] += pts
            sweep.update(best_point(sweep))
            self.save()
        best = sweep.get("best") or {}
        if best and best.get("how") != "the engine's own":
            if self.left() < self.args.c_best_engine_min_s:
                sweep["confirm"] = {"skipped": f"time budget: {self.left():.0f}s left"}
            else:
                info, pts = engine(best["enforce_eager"], best["enable_chunked_prefill"],
                                   [best["max_num_batched_tokens"]], "c_best_confirm")
                p = pts[0] if pts else {}
                sweep["confirm"] = {**info, **{k: p.get(k) for k in ("max_num_batched_tokens", "tokens", "seconds",
                                                                     "tokens_per_s", "refused")}}
        sweep.update(best_point(sweep))

    def finish(self):
        for which in A_HOSTS.values():   # leave disk and RAM
            for d in self.out_dirs(which):
                shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(self.scratch / "srv-data" / "hidden_states", ignore_errors=True)
        shutil.rmtree(self.server_data("a_server_tmpfs"), ignore_errors=True)
        self.doc["disk_use"] = disk_use(self.doc)
        self.save()


def disk_use(doc: dict) -> dict:
    """What the disk part says of AFTER on the disk: the fraction of dd it wrote, the disk's bound in
    tokens/s (dd over as many bytes as the job writes where measured, else the --dd-mib burst) and issue
    35's disk goal, (a) over the lesser of vLLM's prefill and that bound. From the parts alone, so that
    benchmarks/render/gpu_results.py computes it for a run that ended before finish()."""
    a, a0, disk = doc.get("a_after") or {}, doc.get("a_before") or {}, doc.get("disk") or {}
    dd = (disk.get("dd_direct") or {}).get("bytes_per_s")
    sus = (disk.get("dd_direct_sustained") or {}).get("bytes_per_s")
    bound, per_token = sus or dd, a.get("bytes_per_token")
    use = {"a_after_bytes_per_s": a.get("bytes_per_s"), "a_before_bytes_per_s": a0.get("bytes_per_s"),
           "dd_direct_bytes_per_s": dd, "fraction_of_dd": ratio(a.get("bytes_per_s"), dd),
           "dd_direct_sustained_bytes_per_s": sus, "fraction_of_sustained_dd": ratio(a.get("bytes_per_s"), sus),
           "bytes_per_token": per_token,
           # the most any extraction can write: the disk's speed over a token's bytes
           "disk_bound_from": "dd_direct_sustained" if sus else "dd_direct",
           "disk_bound_tokens_per_s": round(bound / per_token, 1) if bound and per_token else None,
           "burst_bound_tokens_per_s": round(dd / per_token, 1) if dd and per_token else None}
    use["a_after/disk_bound"] = ratio(a.get("tokens_per_s"), use["disk_bound_tokens_per_s"])
    use["a_after/burst_bound"] = ratio(a.get("tokens_per_s"), use["burst_bound_tokens_per_s"])
    c = (doc.get("c_vllm_prefill") or {}).get("tokens_per_s")
    bounds = [x for x in (c, use["disk_bound_tokens_per_s"]) if x]
    use["a_after/min(c,disk_bound)"] = ratio(a.get("tokens_per_s"), min(bounds)) if bounds else None
    return use


def run_parts(b: "Bench", parts: list, plan: dict, standin: bool) -> None:
    """The parts in order, each on the install its side's playbook patched: BEFORE's for the BEFORE
    parts, AFTER's for the others (patched once, before the first part that needs it); a part whose
    patch was not made is skipped, never measured on the other side's code."""
    patched = []
    for p in parts:
        # the install is patched by BEFORE's playbook for a_before, by AFTER's for everything else
        git = b.doc["before_source"]["source"] == "git"
        if p == "b_before" and not git:   # the flags stand-in is the old loop of the script: not a generator
            b.doc["b_generator_before"] = {"skipped": "no BEFORE playbook: " + b.doc["before_source"].get("why", "")}
            continue
        want = None if p in UNPATCHED_PARTS or standin else ("before" if p in BEFORE_PARTS and git else "after")
        key = "patch" if want == "after" else "patch_before"
        if want and want not in patched:
            patched.append(want)
            b.part(key, lambda w=want: b.part_patch(w), 20)
        done = b.doc.get(key) or {}
        if want and done.get("rc") != 0:   # failed or skipped: the part would measure the other side's code
            b.doc[PARTS[p]] = {"skipped": f"{want.upper()}'s patch was not made "
                                          f"({done.get('error') or done.get('skipped')}): not run"}
            continue
        fn, need = plan[p]
        b.part(PARTS[p], fn, need)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.prepare_before:
        got = prepare_before(args.before_rev, Path(args.before_dir))
        print(f"{args.before_dir}: {got}" if got else f"cannot git show {args.before_rev}", file=sys.stderr)
        return 0 if got else 1
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if args.c_best_from:          # a file that cannot give c_best stops the run before anything is built
        try:
            c_best_source(Path(args.c_best_from))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
    b = Bench(args)
    b.setup()
    b.build()
    b.inventory()
    if args.c_best_from:
        try:
            b.doc.update(copied_c_best(Path(args.c_best_from), b.doc))
        except ValueError as exc:
            print(exc, file=sys.stderr)
            return 2
        b.save()
    if args.standin:
        parts = [p for p in parts if p == "disk" or p in A_HOSTS or p in SERVER_PARTS]
    plan = {"disk": (b.part_disk, 15), "a_after": (lambda: b.part_a("a_after"), 75),
            "a_before": (lambda: b.part_a("a_before"), 90), "a_tmpfs": (lambda: b.part_a("a_tmpfs"), 70),
            "a_before_tmpfs": (lambda: b.part_a("a_before_tmpfs"), 90), "a_2dirs": (lambda: b.part_a("a_2dirs"), 75),
            **{part: (lambda part=part: b.part_a(part), 70) for part in TMPFS_VARIANTS},
            **{part: (lambda part=part: b.part_a(part), 75) for part in DISK_VARIANTS},
            "a_server": (b.part_a_server, 150),
            **{part: (lambda part=part: b.part_a_server(part), 150) for part in SERVER_VARIANTS},
            "b_before": (lambda: b.part_b("before"), 75), "b": (b.part_b, 75), "c": (b.part_c, 50),
            "c_best": (b.part_c_best, args.c_best_engine_min_s)}
    run_parts(b, parts, plan, args.standin)
    b.finish()
    tps = {k: (b.doc.get(k) or {}).get("tokens_per_s") for k in ("a_before", "a_before_tmpfs", "a_after", "a_tmpfs",
                                                                  *TMPFS_VARIANTS, *DISK_VARIANTS, "a_2dirs", *SERVER_PARTS,
                                                                  "b_generator_before", "b_generator",
                                                                  "c_vllm_prefill", "c_best", "d_roofline")}
    print(json.dumps({"tokens_per_s": tps, "ratios": b.doc["ratios"], "disk_use": b.doc["disk_use"],
                      "elapsed_s": b.doc["elapsed_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
