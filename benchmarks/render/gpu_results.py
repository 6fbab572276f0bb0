"""Summarise the committed GPU results as markdown: benchmarks/results/gpu_extract_*.json (the shipped
playbook end to end, benchmarks/gpu/extract_check.py), gpu_models_*.json (the model families,
benchmarks/gpu/model_check.py), gpu_throughput*.json (benchmarks/gpu/throughput.py), gpu_flows_*.json
(benchmarks/gpu/flows_check.py), plan_check_*.json (the launch plan's measures, benchmarks/gpu/plan_check.py) and
gpu_server_*.json (the server flow, benchmarks/gpu/server_check.py, rendered by benchmarks/render/gpu_server_results.py).

    python benchmarks/render/gpu_results.py > benchmarks/GPU_RESULTS.md

Every figure below is read from the result files those scripts wrote on the lent H200 machines; nothing
is typed by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import provenance  # noqa: E402
from benchmarks.gpu.lib.harness import compare_detail, verify_detail  # noqa: E402  (shared with benchmarks/render/gpu_server_results.py)

RESULTS = Path(__file__).resolve().parents[1] / "results"

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
        return verify_detail(step)
    if name == "e_compare_with_transformers":
        return compare_detail(step)
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


def _gb(x) -> str:
    return "-" if not x else f"{x / 1e9:.1f} GB"


# benchmarks/gpu/throughput.py's TMPFS_VARIANTS: each one's row label
TMPFS_VARIANT_LABELS = {"a_tmpfs_gil5": "Python's own 5 ms thread switch interval (gil_switch_ms 0)",
                        "a_tmpfs_w8": "8 writer threads (writer_threads 8)",
                        "a_tmpfs_k1": "one engine step a generate() call, in order (batch_steps 1, pack_window 0)",
                        "a_tmpfs_w0": "steps filled in order (pack_window 0)",
                        "a_tmpfs_w4": "4 writer threads (writer_threads 4)"}
DISK_VARIANT_LABELS = {"a_after_w8": "8 writer threads (writer_threads 8)",
                       "a_after_w4": "4 writer threads (writer_threads 4)"}


# the server flow on a tmpfs and its variants (benchmarks/gpu/throughput.py SERVER_VARIANTS): part -> label
SERVER_VARIANT_LABELS = {"a_server_tmpfs": "on a tmpfs (dataset, staging and outputs in RAM)",
                         "a_server_tmpfs_c64": "on a tmpfs, concurrency 64",
                         "a_server_tmpfs_b64k": "on a tmpfs, max_num_batched_tokens 65536, concurrency 64",
                         "a_server_tmpfs_async": "on a tmpfs, vLLM 0.22's write path (hs_async_connector.py), "
                                                 "chunked prefill on",
                         "a_server_tmpfs_async_b64k": "on a tmpfs, vLLM 0.22's write path, chunked prefill on, "
                                                      "max_num_batched_tokens 65536, concurrency 64",
                         "a_server_tmpfs_async_b64k_x4": "on a tmpfs, vLLM 0.22's write path, chunked prefill on, "
                                                         "max_num_batched_tokens 65536, 4 clients of 32 in flight",
                         "a_server_tmpfs_x4": "on a tmpfs, 4 clients of 32 in flight (the playbook var clients)",
                         "a_server_tmpfs_x8": "on a tmpfs, 8 clients of 32 in flight (the playbook var clients)",
                         "a_server_tmpfs_x8_api4": "on a tmpfs, 8 clients of 32 in flight, 4 API-server processes "
                                                   "(the playbook var api_server_count)",
                         "a_server_tmpfs_async_b64k_x8": "on a tmpfs, vLLM 0.22's write path, chunked prefill on, "
                                                         "max_num_batched_tokens 65536, 8 clients of 32 in flight"}


def job_profile_table(parts: list[tuple[str, dict]]) -> list[str]:
    """Where each (a) part's job spent its time, from the script's extract-profile line (parts whose
    script prints none, BEFORE's, are left out)."""
    rows = [(label, x["profile"]) for label, x in parts if isinstance(x.get("profile"), dict)]
    if not rows:
        return []
    out = ["Where the job's time went (the script's `extract-profile` line; seconds of the main thread unless "
           "said; the writer's saves are summed over its threads):\n",
           "| (a) part | run, s | generate(), s | result checks, s | hand-over to the writer, s (waiting for room) "
           "| drain at the end, s | files | saves, s (threads) | one save, ms: median / p90 | hand-off slots "
           "(files mapped; batches with every slot held) | switch interval, ms |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, p in rows:
        w, s = p.get("writer") or {}, p.get("slots") or {}
        out.append(f"| {label} | {p.get('seconds')} | {p.get('generate_s')} | {p.get('build_s')} | "
                   f"{p.get('hand_over_s')} ({w.get('put_wait_s')}) | {p.get('drain_s')} | {w.get('files')} | "
                   f"{w.get('save_s')} ({w.get('threads')}) | {w.get('save_ms_median')} / {w.get('save_ms_p90')} | "
                   + (f"{s.get('slots')} ({s.get('files')}; {s.get('all_held')})" if s else "-")
                   + f" | {p.get('gil_switch_ms') if p.get('gil_switch_ms') is not None else '-'} |")
    out.append("")
    return out


def c_best_table(sweep: dict) -> list[str]:
    """(c_best)'s sweep: every point, run or refused (with the engine's words), one engine a row group."""
    out = [f"(c_best)'s sweep ({sweep.get('how')}):\n",
           "| engine | max_num_batched_tokens | tokens/s | how | engine start, s |", "|---|---|---|---|---|"]
    ready = {(e.get("enforce_eager"), e.get("enable_chunked_prefill")): e for e in sweep.get("engines") or []}
    for p in sweep.get("points") or []:
        key = (p.get("enforce_eager"), p.get("enable_chunked_prefill"))
        e = ready.get(key) or {}
        label = f"{'enforce_eager' if key[0] else 'CUDA graphs'}, chunked prefill {'on' if key[1] else 'off'}"
        got = _rate(p.get("tokens_per_s")) if p.get("tokens_per_s") else f"refused: {(p.get('refused') or '')[:160]}"
        out.append(f"| {label} | {p.get('max_num_batched_tokens')} | {got} | {p.get('how') or '-'} | "
                   f"{e.get('engine_ready_s', '-')} |")
    for e in sweep.get("engines") or []:
        if e.get("skipped"):
            out.append(f"| {'enforce_eager' if e.get('enforce_eager') else 'CUDA graphs'}, chunked prefill "
                       f"{'on' if e.get('enable_chunked_prefill') else 'off'} | - | not run: {e['skipped']} | - | - |")
    c = sweep.get("confirm") or {}
    if c:
        out.append(f"| confirming engine started at the best budget | {c.get('max_num_batched_tokens', '-')} | "
                   f"{_rate(c.get('tokens_per_s')) if c.get('tokens_per_s') else c.get('skipped') or c.get('refused')}"
                   f" | the engine's own | {c.get('engine_ready_s', '-')} |")
    if any("schedulers' budgets, not" in (p.get("refused") or "") for p in sweep.get("points") or []):
        out.append("\nThe budgets below each engine's own were not measured in this run: the harness looked for the "
                   "engine core's scheduler with gc.get_objects(), which does not list it (vLLM 0.20's engine core "
                   "freezes its heap after its start, vllm/v1/engine/core.py freeze_gc_heap); fixed after this run "
                   "(the scheduler is found on the collective_rpc call's stack). The budgets after that refusal "
                   "were not reached for that reason, not refused by vLLM.")
    comp = next((e.get("compilation") for e in sweep.get("engines") or [] if not e.get("enforce_eager")
                 and e.get("compilation")), None)
    if comp:
        out.append(f"\nCUDA graphs engines: compilation mode {comp.get('mode')}, cudagraph mode "
                   f"{comp.get('cudagraph_mode')}, largest captured batch {comp.get('max_cudagraph_capture_size')} "
                   f"tokens (larger steps run the compiled model without a graph).")
    out.append("")
    return out


def throughput_section(name: str, d: dict) -> list[str]:
    """The markdown of one benchmarks/gpu/throughput.py result (every figure read from ``d``)."""
    out = [f"## Extraction throughput: {name}\n"]
    if d.get("standin"):
        out.append(f"**{d['standin']}**\n")
    v, m, ds = d.get("versions") or {}, d.get("model") or {}, d.get("dataset") or {}
    out.append(f"- written by {provenance.shown(d, 'benchmarks/gpu_throughput.py')}")
    out.append(f"- GPUs: {', '.join(d.get('gpus') or ['-'])}; remote-ops commit {d.get('code_rev')}; "
               f"vllm {v.get('vllm')}, speculators {v.get('speculators')}, torch {v.get('torch')}")
    out.append(f"- model: random Llama, {m.get('params')} parameters ({m.get('decoder_params')} in the decoder "
               f"layers), {m.get('layers')} layers, hidden {m.get('hidden')}, bf16"
               + (f"; model.shape: {', '.join(f'{k} {v}' for k, v in m['shape'].items() if v is not None)}"
                  if m.get("shape") else ""))
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
    patch = d.get("patch") or {}
    if patch.get("rc"):
        after_parts = [k for k in ("a_after", "a_tmpfs", *TMPFS_VARIANT_LABELS, "a_2dirs", "b_generator")
                       if (d.get(k) or {}).get("tokens_per_s")]
        out.append(f"**AFTER's patch failed in this run** (exit {patch['rc']}: "
                   f"{(patch.get('stderr') or patch.get('error') or '').strip()[:400]})"
                   + (f". The parts after it ({', '.join(after_parts)}) ran on the generator as BEFORE's playbook "
                      f"patched it, with AFTER's script: their rows below are not AFTER's figures (the harness then "
                      f"ran them anyway; it now rolls BEFORE's patch back first, and skips a part whose patch was "
                      f"not made)" if after_parts else "") + ".\n")
    out.append("| part | tokens/s | how measured |\n|---|---|---|")
    out.append(f"| (a) AFTER: remote-ops extract, shipped script | {_rate(a.get('tokens_per_s'))} | "
               f"{a.get('files')} files, {a.get('tokens')} tokens in {a.get('seconds')} s after the engine was up; "
               f"{_mb(a.get('bytes_per_s'))} written {why(a)} |")
    def a_row(label, x, files_note=""):      # one (a) part's row, from its files' rate
        out.append(f"| {label} | {_rate(x.get('tokens_per_s'))} | {x.get('files')} files{files_note}, "
                   f"{x.get('tokens')} tokens in {x.get('seconds')} s; {_mb(x.get('bytes_per_s'))} written {why(x)} |")
    t, t0, two = d.get("a_tmpfs") or {}, d.get("a_before_tmpfs") or {}, d.get("a_2dirs") or {}
    variants = [(label, part, d.get(part) or {}) for part, label in TMPFS_VARIANT_LABELS.items() if d.get(part)]
    if t:
        a_row("(a) AFTER, files on a tmpfs (no disk)", t)
    for label, _part, x in variants:
        a_row(f"(a) AFTER, files on a tmpfs, {label}", x)
    dvariants = [(label, part, d.get(part) or {}) for part, label in DISK_VARIANT_LABELS.items() if d.get(part)]
    for label, _part, x in dvariants:
        a_row(f"(a) AFTER on the disk, {label}", x)
    if t0:
        a_row("(a) BEFORE, files on a tmpfs", t0)
    if two:
        a_row("(a) AFTER, files spread over two directories of the same disk", two,
              f" ({' + '.join(str(n) for n in two.get('per_directory') or [])})")
    srv = d.get("a_server") or {}
    if srv:
        ff = srv.get("from_first_file") or {}
        out.append(f"| (a) server flow: remote-ops extract, eagle3-speculators-0.9.0 (vLLM server + speculators "
                   f"0.9.0 client) | {_rate(srv.get('tokens_per_s'))} | {srv.get('files')} files, {srv.get('tokens')} "
                   f"tokens in {srv.get('seconds')} s after the server answered its health check; "
                   f"{_mb(srv.get('bytes_per_s'))} written; from the first file on {_rate(ff.get('tokens_per_s'))}; "
                   f"layer ids {srv.get('layer_ids')}; the server was ready after {srv.get('server_ready_after_s')} s, "
                   f"the whole job {srv.get('wall_s')} s {why(srv)} |")
    svariants = [(label, part, d.get(part) or {}) for part, label in SERVER_VARIANT_LABELS.items() if d.get(part)]
    for label, _part, x in svariants:
        ff = x.get("from_first_file") or {}
        out.append(f"| (a) server flow {label} | {_rate(x.get('tokens_per_s'))} | {x.get('files')} files, "
                   f"{x.get('tokens')} tokens in {x.get('seconds')} s after the health check; from the first file on "
                   f"{_rate(ff.get('tokens_per_s'))}; vars {json.dumps(x.get('vars') or {}, sort_keys=True)}; the "
                   f"whole job {x.get('wall_s')} s {why(x)} |")
    if a0 or not srv:
        out.append(f"| (a) BEFORE: the same, main's script | {_rate(a0.get('tokens_per_s'))} | "
                   f"{a0.get('files')} files, {a0.get('tokens')} tokens in {a0.get('seconds')} s; "
                   f"{_mb(a0.get('bytes_per_s'))} written {why(a0)} |")
    fewest = (-(-(b.get("tokens") or 0) // b["engine_budget"][0]) if b.get("engine_budget") and b.get("tokens")
              else None)
    steps = (f"; {b['steps']} engine steps as packed ({b.get('steps_in_order')} packed in order, at least {fewest}: "
             f"the tokens over the step budget), "
             f"{b['steps_a_call_and_window'][0]} a call, filled from the next {b['steps_a_call_and_window'][1]}"
             if b.get("steps_a_call_and_window") else "")
    out.append(f"| (b) the generator alone, no writes | {_rate(b.get('tokens_per_s'))} | {b.get('batches')} "
               f"generate() calls of {b.get('mean_tokens_per_batch')} tokens on average (AFTER's batches{steps})"
               + (f", {b.get('tokens')} tokens in {b['seconds']} s" if b.get("seconds") else "") + f" {why(b)} |")
    b0 = d.get("b_generator_before") or {}
    if b0:
        out.append(f"| (b) BEFORE: the generator alone with BEFORE's playbook | {_rate(b0.get('tokens_per_s'))} | "
                   f"{b0.get('batches')} generate() calls of {b0.get('mean_tokens_per_batch')} tokens on average "
                   f"(AFTER's batches) {why(b0)} |")
    cb = b.get("count_batches") or {}
    if cb.get("tokens_per_s"):
        out.append(f"| (b) the same, BEFORE's batches | {_rate(cb.get('tokens_per_s'))} | {cb.get('batches')} "
                   f"generate() calls of {cb.get('mean_tokens_per_batch')} tokens on average |")
    sc = c.get("scheduler") or {}
    out.append(f"| (c) vLLM LLM.generate, max_tokens=1 | {_rate(c.get('tokens_per_s'))} | "
               f"max_num_batched_tokens {sc.get('max_num_batched_tokens')}, chunked prefill "
               f"{sc.get('enable_chunked_prefill')}, enforce_eager, no prefix caching {why(c)} |")
    cb_ = d.get("c_best") or {}
    if cb_:
        bp = cb_.get("best") or {}
        out.append(f"| (c_best) vLLM at its best: the sweep's fastest point | {_rate(cb_.get('tokens_per_s'))} | "
                   + (f"{'enforce_eager' if bp.get('enforce_eager') else 'CUDA graphs'}, chunked prefill "
                      f"{'on' if bp.get('enable_chunked_prefill') else 'off'}, max_num_batched_tokens "
                      f"{bp.get('max_num_batched_tokens')} ({bp.get('how')}); {cb_.get('points_run')} points run, "
                      f"{cb_.get('points_refused')} refused (the sweep below)" if bp else "no point ran")
                   + f" {why(cb_)} |")
    out.append(f"| (d) bf16 roofline, 2 x params x tokens / peak | {_rate(r.get('tokens_per_s'))} | "
               f"{_rate(r.get('tokens_per_s_with_attention'))} with causal attention; {r.get('peak_source')} |\n")
    if cb_:
        out += c_best_table(cb_)
    cf = d.get("c_best_from") or {}
    if cf:
        out.append(f"(c_best) was not measured in this run: copied from {Path(cf.get('path') or '?').name} "
                   f"(remote-ops commit {cf.get('code_rev')}, same model shape; "
                   f"{'the same' if cf.get('same_dataset') else 'another'} dataset).\n")
    q = d.get("ratios") or {}
    out.append(f"Ratios: (a)/(b) {q.get('a/b')}, (b)/(c) {q.get('b/c')}, (c)/(d) {q.get('c/d')}; "
               f"(a)/(c) {q.get('a/c')} (goal 0.9); AFTER/BEFORE {q.get('a_after/a_before')}"
               + (f"; on a tmpfs (a)/(b) {q.get('a_tmpfs/b')}, (a)/(c) {q.get('a_tmpfs/c')}" if t else "")
               + (f"; BEFORE (b)/(c) {q.get('b_before/c')}, (b) AFTER/BEFORE {q.get('b/b_before')}" if b0 else "")
               + (f"; BEFORE on a tmpfs (a)/(c) {q.get('a_before_tmpfs/c')}, AFTER/BEFORE on a tmpfs "
                  f"{q.get('a_tmpfs/a_before_tmpfs')}" if t0 else "")
               + (f"; two directories / one {q.get('a_2dirs/a_after')}" if two else "")
               + "".join(f"; on a tmpfs with {label}: (a)/(c) {q.get(part + '/c')}, against the playbook's "
                         f"settings {q.get(part + '/a_tmpfs')}" for label, part, _x in variants)
               + "".join(f"; on the disk with {label}: against the playbook's settings {q.get(part + '/a_after')}"
                         for label, part, _x in dvariants)
               + (f"; server flow (a)/(c) {q.get('a_server/c')}, server flow / 0.3.0 flow "
                  f"{q.get('a_server/a_after')}" if srv else "")
               + ".\n")
    if cb_.get("tokens_per_s"):
        named = (("(c)", "c"), ("(b)", "b"), ("(a) on a tmpfs", "a_tmpfs"), ("(a) on the disk", "a"),
                 ("(a) server flow", "a_server"),
                 *((f"(a) server flow {label}", part) for label, part, _x in svariants))
        out.append("Against vLLM at its best (c_best): " + ", ".join(
            f"{label}/c_best {q.get(key + '/c_best')}" for label, key in named if q.get(key + "/c_best"))
            + f"; c_best/(d) {q.get('c_best/d')}.\n")
    # BEFORE_REV precedes the zero-copy slots: a BEFORE job whose states came through a slot file ran over
    # AFTER's edits (an install an earlier run had patched), so it was not BEFORE
    over_after = [label for label, x in (("(a) BEFORE on a tmpfs", t0), ("(a) BEFORE", a0))
                  if "/slot-" in (x.get("handoff_line") or "")]
    if over_after:
        out.append(f"**Not BEFORE:** {' and '.join(over_after)} took its states through a zero-copy slot file "
                   f"(its hand-off line below), which only AFTER's playbook makes: BEFORE's playbook went onto an "
                   f"install an earlier run had patched with AFTER's, found its own edits there and left AFTER's "
                   f"in place. So AFTER/BEFORE in this section compares BEFORE's script with AFTER's over the same "
                   f"patched generator, not BEFORE with AFTER (a harness bug, fixed after this run: each run now "
                   f"patches its own copy of speculators as installed).\n")
    copy = d.get("speculators_copy") or {}
    if copy.get("restored_from_bundle"):
        out.append(f"The run's copy of speculators: {', '.join(copy['restored_from_bundle'])} restored from the "
                   f"bundle (the machine's install had been patched in place before this run).\n")
    if copy and not copy.get("as_installed"):
        out.append(f"**The run's copy of speculators was NOT as installed** (differing from its RECORD: "
                   f"{', '.join(copy.get('differ_from_record') or []) or copy.get('error')}).\n")
    if srv.get("tokens_per_s") and a.get("tokens_per_s"):
        fast, slow = ("the server flow", "the 0.3.0 flow") if srv["tokens_per_s"] > a["tokens_per_s"] else \
            ("the 0.3.0 flow", "the server flow")
        s1, a1 = (srv.get("from_first_file") or {}).get("tokens_per_s"), (a.get("from_first_file") or {}).get("tokens_per_s")
        out.append(f"Faster once the engine is up: {fast} ({_rate(max(srv['tokens_per_s'], a['tokens_per_s']))} "
                   f"against {_rate(min(srv['tokens_per_s'], a['tokens_per_s']))} tokens/s for {slow}); from each "
                   f"flow's first file on: 0.3.0 flow {_rate(a1)}, server flow {_rate(s1)} tokens/s; whole jobs "
                   f"with the engine's start: 0.3.0 flow {a.get('wall_s')} s, server flow {srv.get('wall_s')} s.\n")
    hand = [f"{k}: {x.get('handoff_line')}" for k, x in (("AFTER", a), ("tmpfs", t), ("BEFORE on a tmpfs", t0),
                                                         *[(f"tmpfs, {p[8:]}", x) for _l, p, x in variants],
                                                         ("two directories", two))
            if x.get("handoff_line")]
    for label, x in (("(b)", b), ("(b) BEFORE", b0)):
        if x.get("handoff"):
            hand.append(f"{label}: {x['handoff']}" + (
                f" ({x['slots']} zero-copy slot(s); {x['slots_full']} batch(es) copied for want of a free one)"
                if x.get("slots") else ""))
    if hand:
        out.append("Captured states' hand-off, as the runs said: " + "; ".join(hand) + ".\n")
    disk, use = d.get("disk") or {}, d.get("disk_use") or {}
    if not use and disk:   # the run ended before finish(): the same figures from its parts
        from benchmarks.gpu.throughput import disk_use
        use = disk_use(d)
        out.append("(The run ended before its last part: the disk figures below are computed from its parts by "
                   "benchmarks/gpu/throughput.py's disk_use.)\n")
    sus = disk.get("dd_direct_sustained") or {}
    out.append(f"Disk: dd oflag=direct {_mb((disk.get('dd_direct') or {}).get('bytes_per_s'))}"
               f" ({_gb((disk.get('dd_direct') or {}).get('bytes'))})"
               + (f", the same over {_gb(sus.get('bytes'))} (as many bytes as a job writes) "
                  f"{_mb(sus.get('bytes_per_s'))}" if sus.get("bytes_per_s") else "")
               + f", buffered + fsync {_mb((disk.get('buffered_fsync') or {}).get('bytes_per_s'))}; AFTER wrote "
               f"{_mb(use.get('a_after_bytes_per_s'))} ({use.get('fraction_of_dd')} of dd"
               + (f", {use.get('fraction_of_sustained_dd')} of the long dd" if sus.get("bytes_per_s") else "")
               + f"), {use.get('bytes_per_token')} bytes per token, so the disk alone bounds any extraction at "
               f"{_rate(use.get('disk_bound_tokens_per_s'))} tokens/s"
               + (" (the long dd)" if use.get("disk_bound_from") == "dd_direct_sustained" else "")
               + (f"; AFTER reached {use['a_after/disk_bound']} of that" if use.get("a_after/disk_bound") else "")
               + (f", {use['a_after/burst_bound']} of the short dd's bound" if use.get("a_after/burst_bound")
                  and use.get("disk_bound_from") == "dd_direct_sustained" else "")
               + (f"; (a)/min((c), disk bound) {use['a_after/min(c,disk_bound)']} (goal 0.9)"
                  if use.get("a_after/min(c,disk_bound)") else "")
               + ".\n")
    out += job_profile_table([("AFTER on the disk", a), *[(f"AFTER on the disk, {label}", x) for label, _p, x in dvariants],
                              ("AFTER on a tmpfs", t),
                              *[(f"AFTER on a tmpfs, {label}", x) for label, _p, x in variants],
                              ("AFTER over two directories", two), ("BEFORE on a tmpfs", t0), ("BEFORE", a0)])
    for label, x, second in (("(b)", b, cb), ("(b) BEFORE", b0, {})):
        prof = x.get("profile_s") or {}
        if not (prof and x.get("seconds")):
            continue
        total = sum(prof.values())
        # before the harness copied the first pass's profile, a second pass (BEFORE's batches) added
        # its RPC times into the recorded dict: then the profile covers both passes, its "other" the
        # first only, and the shares below are of the profile's own sum
        both = second.get("tokens_per_s") and total > 1.01 * x["seconds"]
        out.append(f"Where the generator's time goes {label}" + (
            " - this run's profile covers both of (b)'s passes (a harness bug, fixed after it: the second "
            "pass added to the first pass's dict), and \"other\" the first pass only; shares are of the "
            "profile's sum" if both else "") + ":\n\n| in generate() | seconds | share | calls |\n|---|---|---|---|")
        calls = x.get("profile_calls") or {}
        for k, secs in sorted(prof.items(), key=lambda kv: -kv[1]):
            out.append(f"| {k} | {round(secs, 3)} | {secs / (total if both else x['seconds']):.0%} | {calls.get(k, '')} |")
        out.append("")
    return out


def paired_section(name0: str, d0: dict, name1: str, d1: dict) -> list[str]:
    """``X_after.json`` beside ``X.json``: a second harness run on the same machine lease that measured
    AFTER's parts the first could not (its AFTER patch failed). The pair's ratios, if both runs had the
    same GPU, versions, model shape and dataset; else why they are not paired."""
    tps = lambda d, k: (d.get(k) or {}).get("tokens_per_s")   # noqa: E731
    same = {what: (f(d0), f(d1)) for what, f in (
        ("GPUs", lambda d: d.get("gpus")), ("versions", lambda d: d.get("versions")),
        ("model", lambda d: {k: (d.get("model") or {}).get(k) for k in ("params", "layers", "hidden")}),
        ("dataset", lambda d: {k: (d.get("dataset") or {}).get(k) for k in ("samples", "tokens", "max_model_len")}),
        ("settings", lambda d: d.get("settings")))}
    differ = [what for what, (x, y) in same.items() if x != y]
    out = [f"## {name1} with {name0}: AFTER beside (c) and BEFORE of the run before it\n"]
    if differ:
        return out + [f"Not paired: the runs differ in {', '.join(differ)}.\n"]
    c, t0, b0 = tps(d0, "c_vllm_prefill"), tps(d0, "a_before_tmpfs"), tps(d0, "b_generator_before")
    t, b = tps(d1, "a_tmpfs"), tps(d1, "b_generator")
    r = lambda x, y: round(x / y, 4) if x and y else None   # noqa: E731
    ds = d0.get("dataset") or {}
    out.append(f"- the same GPU ({', '.join(d0.get('gpus') or [])}), versions, model shape ({(d0.get('model') or {}).get('params')} "
               f"parameters; each run builds it anew from torch.manual_seed(1234): the weights' hashes are not recorded, so "
               f"that they are the same tensors is not checked - it matters little for a speed) and "
               f"dataset ({ds.get('samples')} samples, {ds.get('tokens')} tokens); runs started {d0.get('started_at')} "
               f"and {d1.get('started_at')}, remote-ops commits {d0.get('code_rev')} and {d1.get('code_rev')}")
    out.append(f"- (c) {_rate(c)}, BEFORE on a tmpfs {_rate(t0)}, BEFORE's generator alone {_rate(b0)} tokens/s "
               f"(from {name0}); AFTER on a tmpfs {_rate(t)}, AFTER's generator alone {_rate(b)} tokens/s (from {name1})\n")
    out.append("| ratio | value |\n|---|---|")
    out.append(f"| (a) AFTER on a tmpfs / (c) (goal 0.8) | {r(t, c)} |")
    out.append(f"| (b) AFTER / (c) | {r(b, c)} |")
    out.append(f"| (a) on a tmpfs AFTER / BEFORE | {r(t, t0)} |")
    out.append(f"| (b) AFTER / BEFORE | {r(b, b0)} |")
    p0 = d0.get("patch") or {}
    b_mixed = tps(d0, "b_generator")
    if p0.get("rc") and b_mixed:
        out.append(f"| (b) AFTER / AFTER's batches over BEFORE's generator ({name0}'s (b), run after its AFTER patch "
                   f"failed): what the playbook's generator edits since BEFORE add at the same batches | {r(b, b_mixed)} |")
    out.append("")
    return out


def server_pair_section(name0: str, d0: dict, name1: str, d1: dict) -> list[str]:
    """``X_server.json`` beside ``X.json``: the server flow measured in a second harness run of the same
    machine lease, against the first run's (c), (c_best) and 0.3.0 flow on a tmpfs; only when both runs
    had the same GPU, versions, model shape and dataset."""
    tps = lambda d, k: (d.get(k) or {}).get("tokens_per_s")   # noqa: E731
    same = {what: (f(d0), f(d1)) for what, f in (
        ("GPUs", lambda d: d.get("gpus")), ("versions", lambda d: d.get("versions")),
        ("model", lambda d: {k: (d.get("model") or {}).get(k) for k in ("params", "layers", "hidden")}),
        ("dataset", lambda d: {k: (d.get("dataset") or {}).get(k) for k in ("samples", "tokens", "max_model_len")}))}
    differ = [what for what, (x, y) in same.items() if x != y]
    out = [f"## {name1} with {name0}: the server flow against vLLM at its best\n"]
    if differ:
        return out + [f"Not paired: the runs differ in {', '.join(differ)}.\n"]
    srv = d1.get("a_server") or {}
    ff = (srv.get("from_first_file") or {}).get("tokens_per_s")
    c, cb, t = tps(d0, "c_vllm_prefill"), tps(d0, "c_best"), tps(d0, "a_tmpfs")
    r = lambda x, y: round(x / y, 4) if x and y else None   # noqa: E731
    first_after = (round(srv["seconds"] - srv["from_first_file"]["seconds"], 1)
                   if srv.get("seconds") and (srv.get("from_first_file") or {}).get("seconds") else None)
    out.append(f"- the same GPU, versions, model shape and dataset ({(d0.get('dataset') or {}).get('tokens')} tokens); "
               f"runs started {d0.get('started_at')} and {d1.get('started_at')}, remote-ops commits "
               f"{d0.get('code_rev')} and {d1.get('code_rev')}")
    out.append(f"- server flow {_rate(tps(d1, 'a_server'))} tokens/s once the server answered its health check, "
               f"{_rate(ff)} from its first file on; the server healthy {srv.get('server_ready_after_s')} s after "
               f"launch, its first file {first_after} s after that; the whole job {srv.get('wall_s')} s\n")
    ph = srv.get("phases") or {}
    if ph:
        cl = ph.get("client") or {}
        out.append(f"- where its time went: launch to health check {ph.get('launch_to_healthy_s')} s, health check to "
                   f"first file {ph.get('healthy_to_first_file_s')} s, first to last file {ph.get('first_to_last_file_s')} s"
                   + (f"; the client ({cl.get('from')}): {cl.get('requests_per_s')} requests/s, a request "
                      f"{cl.get('mean_request_ms')} ms in the server on average, a move {cl.get('mean_move_ms')} ms"
                      if cl else "")
                   + (f"; {ph['clients'].get('n')} clients ({ph['clients'].get('from')}): imports at most "
                      f"{ph['clients'].get('imports_s_max')} s, the server ready for them at most "
                      f"{ph['clients'].get('ready_after_s_max')} s after their start" if ph.get("clients") else "")
                   + "\n")
    out.append("| ratio | value |\n|---|---|")
    out.append(f"| server flow / (c_best) (goal 0.8) | {r(tps(d1, 'a_server'), cb)} |")
    out.append(f"| server flow from its first file on / (c_best) | {r(ff, cb)} |")
    out.append(f"| server flow / (c) | {r(tps(d1, 'a_server'), c)} |")
    out.append(f"| server flow / 0.3.0 flow on a tmpfs | {r(tps(d1, 'a_server'), t)} |")
    out.append("")
    return out


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def _num(v) -> str:
    return "-" if v is None else str(v)


def _check_line(c: dict | None) -> str:
    if not c:
        return "not run"
    model = c.get("model")
    if isinstance(model, dict):
        found = model.get("findings") or []
        text = (f"{model.get('architecture') or model.get('architectures')}: {len(found)} model findings"
                + (f" ({'; '.join(str(f.get('kind')) + ' ' + str(f.get('name')) for f in found)})" if found else "")
                + f", text model {(model.get('text_model') or {}).get('path') or '-'}"
                + f", layer ids {model.get('layer_ids')} ({model.get('layer_ids_source')})"
                + f", unknown {len(model.get('unknown') or [])}, checked {model.get('checked')}")
    else:
        text = json.dumps(model, default=str) if model is not None else "no model object in its JSON"
        if len(text) > 300:
            text = text[:300] + " ..."
    opt = f"; {c['model_option']}" if c.get("model_option") else ""
    return (f"`{' '.join(c.get('argv') or [])}`: exit {c.get('rc')}, {len(c.get('findings') or [])} findings"
            f"{opt}; model: {text}")


def render_models(files: list[Path]) -> list[str]:
    """The model-family section: one table per result file of benchmarks/gpu/model_check.py."""
    out = ["# Model families on the GPU (routing-aware comparison)\n",
           "Generated by `python benchmarks/render/gpu_results.py` from the JSON files of the GPU model check "
           "(each names the script and commit that wrote it). Each model is a tiny random checkpoint built on the spot; the job is remote-ops' own `patch`, "
           "`check --model`, `extract --tail` and `verify` with the shipped playbook; its hidden states are "
           "compared with transformers forwards of the same weights (float32 with router-margin hooks, and "
           "bfloat16). A token is *routing-clear* at a layer when its own router margin (noaux_tc: sigmoid score "
           "plus correction bias; the largest score change that cannot change the experts) exceeds the threshold "
           "at every MoE layer up to that layer, and a float32 forward in which every near-tied router of its "
           "sample takes its other choice moves it by less than cosine 0.9999 (an earlier token's flip reaches it "
           "through attention); the tolerance is cosine >= 0.999 against float32. The negative control is the same measure on a "
           "copy of the output with one sample's rows shuffled and two samples' files swapped: it must fail.\n"]
    docs = [(f, json.loads(f.read_text())) for f in files]
    out.append("| model family | tensor parallel size | vLLM | outcome | result file |\n|---|---|---|---|---|")
    for f, d in docs:
        for name, m in (d.get("models") or {}).items():
            vllm = (d.get("versions") or {}).get("vllm") if not d.get("dry") else "none (CPU rehearsal)"
            out.append(f"| {m.get('family', name)} | {d.get('tensor_parallel_size')} | {vllm} | "
                       f"{m.get('outcome', '?')} | {f.name} |")
    out.append("")
    for f, d in docs:
        v = d.get("versions") or {}
        steps = d.get("steps") or {}
        build = steps.get("build") or {}
        inv = (steps.get("inventory") or {}).get("vars") or {}
        ds = build.get("dataset") or {}
        out.append(f"## {f.name}\n")
        if d.get("dry"):
            out.append("- **CPU rehearsal (--dry): no vLLM; the engine output is a stand-in made from the bf16 "
                       "reference**")
        out.append(f"- written by {provenance.shown(d, 'benchmarks/gpu_model_check.py')}")
        out.append(f"- tensor parallel size {d.get('tensor_parallel_size')}; GPUs: {', '.join(d.get('gpus') or []) or 'none'}")
        out.append(f"- remote-ops commit {d.get('code_rev')}; vllm {v.get('vllm')}, speculators {v.get('speculators')}, "
                   f"torch {v.get('torch')}, transformers {v.get('transformers')}")
        if ds:
            out.append(f"- dataset: {ds.get('samples')} samples, {ds.get('tokens')} tokens ({ds.get('min_tokens')}-"
                       f"{ds.get('max_tokens')} per sample); batch size {inv.get('batch_size')}, max_model_len "
                       f"{inv.get('max_model_len')}, layer ids {build.get('layer_ids')}")
        out.append(f"- wall time on the machine: {d.get('elapsed_s')} s (budget {d.get('budget_s')} s)\n")
        out.append("| model family | architecture | outcome | extract | verify | token vectors | within tolerance "
                   "(all) | min cosine (all) | routing-clear share of MoE-layer vectors | within tolerance (routing-clear) | min cosine "
                   "(routing-clear) | min cosine (dense layers) | bf16 reference routes differently | negative "
                   "control |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, m in (d.get("models") or {}).items():
            res = (m.get("compare") or {}).get("result") or {}
            o = res.get("output") or {}
            neg = res.get("negative_control") or {}
            b16 = res.get("bf16_reference_vs_float32") or {}
            ex = m.get("extract") or {}
            arch = ", ".join((m.get("checkpoint") or {}).get("architectures") or []) or name
            extract = ("-" if not ex else f"exit {ex.get('rc')}, {ex.get('files')}/{ex.get('expected')} files, "
                       f"{ex.get('seconds')} s" + (", states through shared memory"
                                                   if (ex.get("handoff_line") or "").startswith(
                                                       "captured states came through shared memory") else ""))
            ver = m.get("verify") or {}
            verify = "-" if not ver else f"exit {ver.get('rc')}"
            negc = ("-" if not neg else ("fails" if not neg.get("ok") else "PASSES (bad)")
                    + f" on {', '.join(neg.get('fails_on') or []) or 'nothing'}")
            moe = bool(res.get("moe_layers"))
            out.append(f"| {m.get('family', name)} | {arch} | {m.get('outcome', '?')} | {extract} | {verify} | "
                       f"{_num(o.get('tokens_compared'))} | {_pct(o.get('within_tolerance_share'))} | "
                       f"{_num(o.get('min_cosine'))} | {_pct(o.get('moe_layer_routing_clear_share')) if moe else ('dense' if res else '-')} | "
                       f"{_pct(o.get('routing_clear_within_tolerance_share')) if moe else '-'} | "
                       f"{_num(o.get('min_cosine_routing_clear')) if moe else '-'} | "
                       f"{_num(o.get('min_cosine_dense_layers'))} | "
                       f"{_pct(b16.get('share_routed_differently')) if moe else '-'} | {negc} |")
        out.append("")
        for name, m in (d.get("models") or {}).items():
            res = (m.get("compare") or {}).get("result") or {}
            lines = []
            if res.get("margin_threshold") is not None and res.get("moe_layers"):
                b16 = res.get("bf16_reference_vs_float32") or {}
                o = res.get("output") or {}
                per = o.get("per_layer") or {}
                lines.append(f"MoE layers {res['moe_layers']}, router {res.get('router')}; routing margin "
                             f"threshold {res['margin_threshold']} ({res.get('margin_threshold_source')}, safety "
                             f"{res.get('margin_safety')})")
                lines.append("routing-clear / within tolerance / min cosine per compared layer: " + ", ".join(
                    f"{k}: {v.get('clear')}/{v.get('clear_within')}/{v.get('min_clear')} of {v.get('tokens')}"
                    for k, v in per.items()))
                lines.append(f"own routers clear (without the sensitivity probe): {_pct(o.get('own_clear_share'))} "
                             f"of vectors, {_pct(o.get('own_clear_within_tolerance_share'))} within tolerance, min "
                             f"cosine {o.get('min_cosine_own_clear')}")
                lines.append(f"bf16 transformers reference vs float32: {b16.get('tokens_routed_differently')} of "
                             f"{b16.get('router_tokens')} router decisions differ; largest score change per router "
                             f"{b16.get('max_score_change')}; the engine vs the bf16 reference: "
                             f"{(o.get('vs_bf16_reference') or {})}")
                cal = res.get("margin_calibration") or []
                if cal:
                    lines.append("calibration (margin: bf16 score change on clear routers, MoE-layer routing-clear "
                                 "share, within tolerance): " + "; ".join(
                                     f"{c['margin']}: {c['bf16_reference_max_score_change_on_clear_routers']}, "
                                     f"{_pct(c.get('moe_layer_routing_clear_share'))}, "
                                     f"{_pct(c.get('routing_clear_within_tolerance_share'))}" for c in cal))
            if res.get("negative_control_corruption"):
                lines.append(f"negative control corruption: {res['negative_control_corruption']}")
            if "check_before_patch" in m:
                copy = ((d.get("steps") or {}).get("setup") or {}).get("speculators_copy") or {}
                lines.append("check before patch: " + _check_line(m.get("check_before_patch")) + (
                    " (NOT a before: the bundle's speculators was already patched in place when this run copied it, "
                    f"{', '.join(copy.get('differ_from_record') or [])} differing from its RECORD)"
                    if copy.get("as_installed") is False else ""))
            if "check" in m:
                lines.append("check after patch: " + _check_line(m.get("check")))
            ex = m.get("extract") or {}
            if ex.get("error"):
                problems = (ex.get("preflight") or {}).get("problems") or []
                lines.append(f"extract refused or failed: {ex['error']}: {str(ex.get('message'))[:300]}"
                             + (f" (preflight: {'; '.join(p[:200] for p in problems)})" if problems else ""))
            err = (m.get("job_log") or {}).get("error_lines") or []
            if err:   # the first "...Error: ..." line names the cause; the last may be pydantic's link
                named = [l for l in err if "Error: " in l]
                lines.append(f"job log: {(named or err)[0 if named else -1][:300]}")
            if m.get("skipped") or m.get("crashed"):
                lines.append(f"{m.get('skipped') or m.get('crashed')}")
            if lines:
                out.append(f"- **{name}**: " + "; ".join(lines[:1]))
                out.extend(f"  - {x}" for x in lines[1:])
        out.append("")
    return out


def _cos(v) -> str:
    return "-" if v is None else f"{v:.6f}"


def render_flows(files: list[Path]) -> list[str]:
    """benchmarks/gpu/flows_check.py results (issue 34 item 6 and issue 32's resume): every figure read from
    the files."""
    out = []
    for f in files:
        d = json.loads(f.read_text())
        st = d.get("steps") or {}
        v = (d.get("versions") or {})
        out.append(f"## Both flows, every token vector: {f.name}\n")
        out.append(f"- written by {provenance.shown(d, 'benchmarks/gpu_flows_check.py')} (compare: the "
                   f"flows_compare.py beside it); GPUs: {', '.join(d.get('gpus') or ['-'])}; wall time "
                   f"{d.get('elapsed_s')} s")
        if d.get("flows") and len(d["flows"]) == 1:
            out.append(f"- flows run: {'the 0.3.0 flow' if d['flows'] == ['030'] else 'the server flow'} only "
                       f"(`--flows {d['flows'][0]}`)")
        inv = st.get("inventory") or {}
        if inv.get("server_connector"):   # flows_check --server-connector / --server-vars / --models
            out.append(f"- server-flow playbook: `--server-connector {inv['server_connector']}` "
                       f"(benchmarks/gpu/lib/connector.py); server vars {json.dumps(inv.get('server_vars') or {})}; "
                       f"models {', '.join(inv.get('models') or [])}")
        for k in ("models", "server", "client"):
            x = v.get(k) or {}
            if x:
                out.append(f"- {k} interpreter: vllm {x.get('vllm')}, speculators {x.get('speculators')}, torch "
                           f"{x.get('torch')}, transformers {x.get('transformers')}")
        b = st.get("build") or {}
        sh = b.get("shared_tensors") or {}
        r0 = (b.get("routing") or [{}])[0]
        if b:
            out.append(f"- fixtures (`benchmarks/gpu/lib/models.py --unambiguous-routing`): every router weight x{r0.get('gate_scale')}, "
                       f"correction biases {r0.get('bias_spacing')} apart ({r0.get('gate_weights_scaled')} routers per "
                       f"checkpoint); text tensors of the DeepSeek-V3 checkpoint and the Kimi-K2.5-shaped wrapper by "
                       f"hash: {sh.get('equal')}/{sh.get('tensors')} equal ({sh.get('router_tensors')} router tensors), "
                       f"{'ok' if sh.get('ok') else 'DIFFER: ' + str(sh.get('differ'))}")
        ds = b.get("dataset") or {}
        px = d.get("dataset") or {}
        if px.get("kind") == "prefix":   # --dataset prefix (issue 50 item 1): the flows ran on these rows
            out.append(f"- dataset (`--dataset prefix`, issue 50 item 1): {px.get('rows')} rows, {px.get('tokens')} tokens "
                       f"({px.get('shortest')}-{px.get('longest')} per row, none cut), {px.get('distinct_rows')} distinct: "
                       f"{px.get('exact_duplicate_rows')} exact duplicate rows ({px.get('duplicates_adjacent')} next to "
                       f"their original, {px.get('duplicates_at_end')} at the end); {px.get('rows_with_prefix_a_640')} rows "
                       f"start with one 640-token prefix ({px.get('row_equal_to_prefix_a')} is that prefix alone), "
                       f"{px.get('rows_with_prefix_b_400')} with another of 400 tokens, "
                       f"{px.get('rows_sharing_first_320_of_a')} share the first prefix's first 320 tokens")
            for k, x in st.items():
                if k.startswith("extract_srv") and x.get("server_command"):
                    out.append(f"- {k[8:]}: the server command the job ran (its job.json), prefix-caching flag "
                               f"{'present' if x.get('no_enable_prefix_caching') else 'ABSENT'}: "
                               f"`{' '.join(x['server_command'])}`")
        elif ds:
            out.append(f"- dataset: {ds.get('samples')} rows, {ds.get('tokens')} tokens ({ds.get('min_tokens')}-"
                       f"{ds.get('max_tokens')} per row)")
        inv = st.get("inventory") or {}
        if inv:
            out.append(f"- layer ids: {inv.get('layer_ids')} (the same decoder layers), max_model_len "
                       f"{inv.get('max_model_len')}")
        out.append("")
        runs = [(k, x) for k, x in st.items() if k.startswith("extract_")]
        if runs:
            out.append("| run | flow | ok | exit | files | seconds | server ready after | verify |\n"
                       "|---|---|---|---|---|---|---|---|")
            for k, x in runs:
                if x.get("skipped"):
                    out.append(f"| {k[8:]} | | NO | | | | | skipped: {x['skipped']} |")
                    continue
                srv = x.get("server") or {}
                out.append(f"| {k[8:]} | {x.get('flow')} | {'yes' if x.get('ok') else 'NO'} | {x.get('rc')} | "
                           f"{x.get('files')}/{x.get('expected')} | {x.get('seconds')} | "
                           f"{srv.get('ready_after_s', '-') if srv else '-'} | exit {(x.get('verify') or {}).get('rc')} |")
                if x.get("rc"):
                    err = x.get("error_lines") or x.get("log_tail") or []
                    out.append(f"| | | | | | | | {(err[-1] if err else x.get('stderr_tail', ''))[:200]} |")
            out.append("")
        c = st.get("compare") or {}
        res = c.get("result") or {}
        if "all_ok" not in d:    # the record was taken while the check still ran (see its elapsed time)
            if any(k.startswith("extract_") for k in st):
                hosts = {"extract_%s-%s" % (f, m) for f in (d.get("flows") or ("030", "srv"))
                         for m in ("deepseek_v3", "kimi_k25")}
                left = sorted(hosts - set(st)) + ([] if "compare" in st else ["compare"])
                out.append(f"**Incomplete record**: taken before the check ended; not in it: {', '.join(left) or '-'}. "
                           + ("No token vector was compared in this record: the runs above only show that the jobs "
                              "ended and `verify` passed (token ids, shapes, finite values).\n"
                              if "compare" not in st else "\n"))
            else:
                out.append(f"**Incomplete record**: taken before the check ended (after step {list(st)[-1]}).\n")
        if res:
            out.append(f"Against ONE float32 transformers forward of the DeepSeek-V3 checkpoint (every token vector of "
                       f"every layer id; the wrapper's outputs against the same weights):\n")
            out.append("| output | layout | layer ids | samples | n_total | n >= 0.999 | min cosine | mean cosine | ok |\n"
                       "|---|---|---|---|---|---|---|---|---|")
            for n, o in (res.get("outputs") or {}).items():
                out.append(f"| {n} | {o.get('layout')} | {o.get('layer_ids')} | {o.get('samples')}/{o.get('expected_samples')} | "
                           f"{o.get('n_total')} | {o.get('n_within_0_999')} | {_cos(o.get('min_cosine'))} | "
                           f"{o.get('mean_cosine')} | {'yes' if o.get('ok') else 'NO'} |")
            out.append("")
            if res.get("pairs"):
                out.append("Outputs against each other (same decoder layers):\n")
                out.append("| pair | n_total | n >= 0.999 | n >= 0.9999 | bitwise equal | min cosine | ok |\n"
                           "|---|---|---|---|---|---|---|")
                for n, q in res["pairs"].items():
                    out.append(f"| {n} | {q.get('n_total')} | {q.get('n_within_0_999')} | {q.get('n_within_0_9999')} | "
                               f"{q.get('n_bitwise_equal')} | {_cos(q.get('min_cosine'))} | {'yes' if q.get('ok') else 'NO'} |")
                out.append("")
            neg = res.get("negative_control") or {}
            if neg:
                out.append(f"Negative control ({neg.get('what')}): {neg.get('n_below_0_999')} of {neg.get('n_total')} "
                           f"vectors below 0.999, min cosine {_cos(neg.get('min_cosine'))}: the measure "
                           f"{'fails, as it must' if neg.get('fails') else 'DID NOT FAIL'}.\n")
            rt = res.get("routing") or {}
            if rt:
                mins = rt.get("float32_margin_per_layer") or {}
                low = min((m.get("min_margin") for m in mins.values() if m.get("min_margin") is not None), default=None)
                per = ", ".join(f"{k}: {m.get('min_margin')}" for k, m in mins.items())
                out.append(f"Routing (MoE layers {rt.get('moe_layers')}): smallest float32 router margin {low} "
                           f"(per layer: {per}); "
                           f"a bf16 transformers forward chose the same experts as float32 for "
                           f"{rt.get('bf16_same_choice_as_float32')} of {rt.get('router_tokens')} router decisions.\n")
            out.append(f"Verdict of the comparison: {'all ok' if res.get('ok') else 'NOT ok'} "
                       f"({res.get('seconds')} s).\n")
        r = st.get("resume_after_stop") or {}
        if r.get("launch_rc"):
            out.append(f"Resume after a stop: the first launch was refused (exit {r['launch_rc']}): "
                       f"{((r.get('launch') or {}).get('message') or r.get('stderr_tail') or '')[:300]}\n")
        elif r:
            s0 = r.get("stopped") or {}
            rl = r.get("relaunch") or {}
            out.append(f"Resume after a stop (0.3.0 flow, DeepSeek-V3, one sample per generate() call): "
                       f"{'ok' if r.get('ok') else 'NOT ok'}. Stopped with {s0.get('files_at_stop')} files written "
                       f"(GPU processes while running {len(s0.get('gpu_processes_while_running') or [])}, after the stop "
                       f"{len(s0.get('gpu_processes_after') or [])}); the same command again ({r.get('max_samples')} samples): "
                       f"exit {rl.get('rc')}, {r.get('files_after')} files, {r.get('untouched_of_before')} of the "
                       f"{s0.get('files_at_stop')} earlier files untouched, indexes 0..{r.get('max_samples', 0) - 1} "
                       f"{'all present' if r.get('indexes_contiguous') else 'NOT contiguous'}; verify exit "
                       f"{(r.get('verify') or {}).get('rc')}; the job said: {'; '.join(l.split('] ', 1)[-1] for l in r.get('resume_lines') or [] if 'starting:' not in l) or '-'}.\n")
        lc = st.get("resume_layer_change_refused") or {}
        if lc:
            out.append("Resume with other layer ids: " + (lc["skipped"] if lc.get("skipped") else (
                f"{'refused before the engine started' if lc.get('ok') else 'NOT refused as required'}: exit "
                f"{lc.get('rc')} in {lc.get('seconds')} s, files changed or added {lc.get('files_changed_or_added')}; "
                f"said: {(lc.get('message') or lc.get('stderr_tail') or '')[:300]}")) + "\n")
        if lc and "n_probe_server_default_ids" not in st and "probe_kimi_shipped_server_command" not in st:
            out.append("The probes (server flow with the id n on DeepSeek-V3; the shipped server command on Kimi) did not "
                       "finish before the session's device time ran out: not recorded.\n")
        p = st.get("n_probe_server_default_ids") or {}
        if p:
            err = p.get("error_lines") or p.get("log_tail") or []
            out.append(f"Server flow on DeepSeek-V3 with ids {p.get('layer_ids')} (the last id = the number of layers, "
                       f"launch_vllm.py's form): exit {p.get('rc')}, {p.get('files')}/{p.get('expected')} files, state "
                       f"{p.get('state')}" + (f"; log: {err[-1][:300]}" if err and p.get('rc') else "") + ".\n")
        q = st.get("probe_kimi_shipped_server_command") or {}
        if q and not q.get("skipped"):
            err = q.get("error_lines") or q.get("log_tail") or []
            out.append(f"The shipped server command (no --trust-remote-code) on the Kimi-K2.5-shaped checkpoint: exit "
                       f"{q.get('rc')}, {q.get('files')}/{q.get('expected')} files, state {q.get('state')}"
                       + (f"; log: {err[-1][:300]}" if err and q.get('rc') else "") + ".\n")
        for k, x in st.items():
            if k in ("crashed", "stopped"):
                out.append(f"**{k}**: {x.get('error')}\n")
    return out


def render_plan_check(name: str, d: dict) -> list[str]:
    """benchmarks/gpu/plan_check.py on the GPU machine: the launch plan's disk write test beside dd on the same
    disk, each run in turn, and the GPU peak the plan's compute hours use."""
    peaks = []
    for g in d.get("gpus") or []:
        table = g.get("table") or {}
        peaks.append(f"{g.get('name')} -> {table.get('model')}, {table.get('bf16_dense_tflops')} TFLOP/s bf16 dense")
    out = [f"## Launch plan's measures on the GPU machine: {name}\n",
           f"- written by {provenance.shown(d, 'benchmarks/plan_check.py')}; directory {d.get('dir')} (filesystem "
           f"{(d.get('fs') or {}).get('key')}); temporaries left behind: {len(d.get('leftovers') or [])}",
           f"- GPU peak: {'; '.join(peaks) or '-'}; efficiency (c)/(d) " + (
               str(d.get("efficiency")) if "efficiency" in d else "by model size: " + ", ".join(
                   f"{p.get('factor')} at {p.get('active_params', 0) / 1e9:.2f}B" for p in d.get("efficiency_points") or []))
           + "\n",
           "| run | plan's write test | dd oflag=direct | dd conv=fsync | write test / dd direct |",
           "|---|---|---|---|---|"]
    for i, r in enumerate(d.get("runs") or [], 1):
        w = (r.get("write_test") or {}).get("bytes_per_s")
        dd = (r.get("dd_direct") or {}).get("bytes_per_s")
        fs = (r.get("dd_fsync") or {}).get("bytes_per_s")
        out.append(f"| {i} | {_mb(w)} | {_mb(dd)} | {_mb(fs)} | "
                   f"{round(w / dd, 4) if w and dd else '-'} |")
    return out + [""]


def main() -> int:
    throughput = [(f.name, json.loads(f.read_text())) for f in sorted(RESULTS.glob("gpu_throughput*.json"))]
    files = sorted(RESULTS.glob("gpu_extract_*.json"))
    model_files = sorted(RESULTS.glob("gpu_models_*.json"))
    if not files and not model_files:
        print("no results in benchmarks/results/", file=sys.stderr)
        return 1
    print("# GPU end-to-end results\n")
    print("Generated by `python benchmarks/render/gpu_results.py` from the JSON files that the GPU harnesses wrote "
          "on the lent H200 machines (benchmarks/results/; each section names the script and commit that wrote its "
          "file).\n")
    for f in files:
        d = json.loads(f.read_text())
        v = d.get("versions") or {}
        ds = ((d.get("steps") or {}).get("model_and_data") or {}).get("dataset") or {}
        print(f"## {f.name}\n")
        print(f"- tensor parallel size {d.get('tensor_parallel_size')}; GPUs: {', '.join(d.get('gpus') or [])}")
        print(f"- written by {provenance.shown(d, 'benchmarks/gpu_extract_check.py')}; connection: {d.get('connection')}")
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
    docs = dict(throughput)
    for name, d in throughput:
        first = name.replace("_after.json", ".json")
        if name.endswith("_after.json") and first in docs:
            print("\n".join(paired_section(first, docs[first], name, d)))
        first = name.replace("_server.json", ".json")
        if name.endswith("_server.json") and first in docs:
            print("\n".join(server_pair_section(first, docs[first], name, d)))
    if model_files:
        print("\n".join(render_models(model_files)))
    flows_files = sorted(RESULTS.glob("gpu_flows_*.json"))
    if flows_files:
        print("\n".join(render_flows(flows_files)))
    for f in sorted(RESULTS.glob("plan_check_*.json")):
        print("\n".join(render_plan_check(f.name, json.loads(f.read_text()))))
    for f in sorted(RESULTS.glob("gpu_logits_*.json")):     # verify --logits (issue 50): benchmarks/gpu/logits_check.py
        from benchmarks.render import gpu_logits_results
        print(gpu_logits_results.render(f) + "\n")
    server_files = sorted(RESULTS.glob("gpu_server_*.json"))
    if server_files:      # the server flow (speculators >= 0.5): benchmarks/gpu/server_check.py
        from benchmarks.render import gpu_server_results
        for f in server_files:
            print(gpu_server_results.render(f) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
