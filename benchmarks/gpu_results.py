"""Summarise the committed GPU results (benchmarks/results/gpu_extract_*.json, gpu_throughput*.json) as markdown.

    python benchmarks/gpu_results.py > benchmarks/GPU_RESULTS.md

Every figure below is read from the result files that benchmarks/gpu_extract_check.py wrote on the
lent H200 machines; nothing is typed by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

STEP_NAMES = {
    "a_original_files": "(a) original files: check finds, preflight refuses, the job fails",
    "b_patch_then_check": "(b) patch, then check: no findings, no drift; rerun changes nothing",
    "trap_transformers5": "(trap) transformers 5.x interpreter refused by the import probe",
    "c_extract_tail": "(c) extract --tail with the shipped script",
    "d_verify": "(d) verify",
    "e_compare_with_transformers": "(e) hidden states vs a plain transformers forward",
    "f_stop_leaves_no_gpu_process": "(f) stop during a run leaves no GPU process",
}


def _drift(check: dict) -> str:
    if "baseline" not in check:
        return "drift baseline not recorded in this result"
    base = check.get("baseline") or {}
    if "unavailable" in base or check.get("drift") is None:
        return f"drift not analysed (no baseline: {base.get('unavailable', 'not reported')})"
    acc = check.get("drift_accepted")
    return (f"{len(check['drift'])} drift against vllm {base.get('version')}"
            + (f" ({len(acc)} more accepted by the playbook)" if acc else ""))


def _detail(name: str, step: dict) -> str:
    if name == "a_original_files":
        job = step.get("job") or {}
        errs = job.get("error_lines") or []
        return (f"check exit {step['check']['rc']} with {len(step['check']['findings'])} findings, "
                f"{_drift(step['check'])}; preflight exit "
                f"{step['preflight_refused']['rc']}; job exit {job.get('rc')}: {errs[-1] if errs else '?'}")
    if name == "b_patch_then_check":
        c = step["check"]
        return (f"patch exit {step['patch']['rc']} ({len(step['patch']['edits'])} edits); check exit {c['rc']}, "
                f"{len(c.get('findings') or [])} findings, {_drift(c)}, "
                f"{c.get('unknown')} unknown, {c.get('calls_checked')} calls; rerun changed: {step['rerun']['changed']}")
    if name == "trap_transformers5":
        return f"exit {step['rc']}: {(step.get('problems') or ['?'])[-1][:160]}"
    if name == "c_extract_tail":
        return (f"exit {step['rc']}, {step['files']}/{step['expected']} files, "
                f"state {step['result'].get('state')}, {step['seconds']} s")
    if name == "d_verify":
        r = step.get("result") or {}
        return (f"exit {step['rc']}: {r.get('files')} files, {r.get('checked')} loaded, layers x hidden "
                f"{r.get('layers_hidden')}, non-finite {r.get('non_finite_count')}, gaps {r.get('gap_count')}")
    if name == "e_compare_with_transformers":
        r = step.get("result") or {}
        return (f"{r.get('samples')} samples x {len(r.get('layer_ids') or [])} layers, {r.get('tokens_compared')} "
                f"token vectors: min cosine {r.get('min_cosine')}, mean {r.get('mean_cosine')}, shape mismatches "
                f"{r.get('shape_mismatches_count')}, below 0.999: {r.get('below_0_999_count')}")
    if name == "f_stop_leaves_no_gpu_process":
        return (f"GPU processes while running {len(step.get('gpu_processes_while_running') or [])}, after stop "
                f"{len(step.get('gpu_processes_after') or [])}; marker processes after "
                f"{len(step.get('marker_processes_after') or [])}; {step.get('files_written_before_stop')} files "
                f"written before the stop")
    return ""


def _rate(x) -> str:
    return "-" if not x else (f"{x / 1e6:.2f}M" if x >= 1e6 else (f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"))


def _mb(x) -> str:
    return "-" if not x else f"{x / 1e6:.0f} MB/s"


def throughput_section(name: str, d: dict) -> list[str]:
    """The markdown of one benchmarks/gpu_throughput.py result (every figure read from ``d``)."""
    out = [f"## Extraction throughput: {name}\n"]
    if d.get("standin"):
        out.append(f"**{d['standin']}**\n")
    v, m, ds = d.get("versions") or {}, d.get("model") or {}, d.get("dataset") or {}
    out.append(f"- GPUs: {', '.join(d.get('gpus') or ['-'])}; remote-ops commit {d.get('code_rev')}; "
               f"vllm {v.get('vllm')}, speculators {v.get('speculators')}, torch {v.get('torch')}")
    out.append(f"- model: random Llama, {m.get('params')} parameters ({m.get('decoder_params')} in the decoder "
               f"layers), {m.get('layers')} layers, hidden {m.get('hidden')}, bf16")
    out.append(f"- dataset: {ds.get('samples')} samples, {ds.get('tokens')} tokens after the cut to max_model_len "
               f"{ds.get('max_model_len')} - 1 ({ds.get('cut')} samples cut); the playbook's default settings")
    src = d.get("before_source") or {}
    out.append(f"- BEFORE: {src.get('from') or src.get('flags')}; wall time of the run {d.get('elapsed_s')} s\n")
    a, a0 = d.get("a_after") or {}, d.get("a_before") or {}
    b, c, r = d.get("b_generator") or {}, d.get("c_vllm_prefill") or {}, d.get("d_roofline") or {}

    def why(x):
        if not x:
            return "(not run)"
        return x.get("skipped") or x.get("error") or (f"exit {x['rc']}" if x.get("rc") else "")
    out.append("| part | tokens/s | how measured |\n|---|---|---|")
    out.append(f"| (a) AFTER: remote-ops extract, shipped script | {_rate(a.get('tokens_per_s'))} | "
               f"{a.get('files')} files, {a.get('tokens')} tokens in {a.get('seconds')} s after the engine was up; "
               f"{_mb(a.get('bytes_per_s'))} written {why(a)} |")
    out.append(f"| (a) BEFORE: the same, main's script | {_rate(a0.get('tokens_per_s'))} | "
               f"{a0.get('files')} files, {a0.get('tokens')} tokens in {a0.get('seconds')} s; "
               f"{_mb(a0.get('bytes_per_s'))} written {why(a0)} |")
    out.append(f"| (b) the generator alone, no writes | {_rate(b.get('tokens_per_s'))} | {b.get('batches')} "
               f"generate() calls of {b.get('mean_tokens_per_batch')} tokens on average (AFTER's batches) {why(b)} |")
    cb = b.get("count_batches") or {}
    if cb.get("tokens_per_s"):
        out.append(f"| (b) the same, BEFORE's batches | {_rate(cb.get('tokens_per_s'))} | {cb.get('batches')} "
                   f"generate() calls of {cb.get('mean_tokens_per_batch')} tokens on average |")
    sc = c.get("scheduler") or {}
    out.append(f"| (c) vLLM LLM.generate, max_tokens=1 | {_rate(c.get('tokens_per_s'))} | "
               f"max_num_batched_tokens {sc.get('max_num_batched_tokens')}, chunked prefill "
               f"{sc.get('enable_chunked_prefill')}, enforce_eager, no prefix caching {why(c)} |")
    out.append(f"| (d) bf16 roofline, 2 x params x tokens / peak | {_rate(r.get('tokens_per_s'))} | "
               f"{_rate(r.get('tokens_per_s_with_attention'))} with causal attention; {r.get('peak_source')} |\n")
    q = d.get("ratios") or {}
    out.append(f"Ratios: (a)/(b) {q.get('a/b')}, (b)/(c) {q.get('b/c')}, (c)/(d) {q.get('c/d')}; "
               f"(a)/(c) {q.get('a/c')} (goal 0.9); AFTER/BEFORE {q.get('a_after/a_before')}.\n")
    disk, use = d.get("disk") or {}, d.get("disk_use") or {}
    out.append(f"Disk: dd oflag=direct {_mb((disk.get('dd_direct') or {}).get('bytes_per_s'))}, buffered + fsync "
               f"{_mb((disk.get('buffered_fsync') or {}).get('bytes_per_s'))}; AFTER wrote "
               f"{_mb(use.get('a_after_bytes_per_s'))} ({use.get('fraction_of_dd')} of dd), "
               f"{use.get('bytes_per_token')} bytes per token, so the disk alone bounds any extraction at "
               f"{_rate(use.get('disk_bound_tokens_per_s'))} tokens/s.\n")
    prof = b.get("profile_s") or {}
    if prof and b.get("seconds"):
        out.append("Where the generator's time goes (b):\n\n| in generate() | seconds | share | calls |\n|---|---|---|---|")
        calls = b.get("profile_calls") or {}
        for k, secs in sorted(prof.items(), key=lambda kv: -kv[1]):
            out.append(f"| {k} | {secs} | {secs / b['seconds']:.0%} | {calls.get(k, '')} |")
        out.append("")
    return out


def main() -> int:
    throughput = [(f.name, json.loads(f.read_text())) for f in sorted(RESULTS.glob("gpu_throughput*.json"))]
    files = sorted(RESULTS.glob("gpu_extract_*.json"))
    if not files:
        print("no results in benchmarks/results/", file=sys.stderr)
        return 1
    print("# GPU end-to-end results\n")
    print("Generated by `python benchmarks/gpu_results.py` from the JSON files that "
          "`benchmarks/gpu_extract_check.py` wrote on the lent H200 machines.\n")
    for f in files:
        d = json.loads(f.read_text())
        v = d.get("versions") or {}
        ds = ((d.get("steps") or {}).get("model_and_data") or {}).get("dataset") or {}
        print(f"## {f.name}\n")
        print(f"- tensor parallel size {d.get('tensor_parallel_size')}; GPUs: {', '.join(d.get('gpus') or [])}")
        print(f"- remote-ops commit {d.get('code_rev')}; connection: {d.get('connection')}")
        print(f"- vllm {v.get('vllm')}, speculators {v.get('speculators')}, torch {v.get('torch')}, "
              f"transformers {v.get('transformers')}")
        if ds:
            print(f"- dataset: {ds.get('samples')} samples, {ds.get('tokens')} tokens, batch size "
                  f"{ds.get('batch_size')}, tokens per generate() call {ds.get('tokens_per_batch')} (scheduler "
                  f"budget {ds.get('scheduler_token_budget')}), {ds.get('shared_prefix_tokens')}-token shared "
                  f"prefix, {ds.get('longer_than_max_model_len')} prompts longer than max_model_len")
        print(f"- wall time of the check on the GPU machine: {d.get('elapsed_s')} s\n")
        print("| step | ok | evidence |\n|---|---|---|")
        for name, step in (d.get("steps") or {}).items():
            if name in STEP_NAMES:
                print(f"| {STEP_NAMES[name]} | {'yes' if step.get('ok') else 'NO'} | {_detail(name, step)} |")
        print()
    for name, d in throughput:
        print("\n".join(throughput_section(name, d)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
