"""Summarise the server-flow GPU results (benchmarks/results/gpu_server_*.json, written by
benchmarks/gpu/server_check.py) as markdown, for benchmarks/GPU_RESULTS.md.

    python benchmarks/render/gpu_server_results.py [FILE ...] >> benchmarks/GPU_RESULTS.md

Every figure is read from the result files; nothing is typed by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks import provenance  # noqa: E402
from benchmarks.gpu.lib.harness import compare_detail, verify_detail  # noqa: E402  (shared with benchmarks/render/gpu_results.py)

RESULTS = Path(__file__).resolve().parents[1] / "results"
STEPS = {
    "c_extract_tail": "(c) extract --tail: vLLM server (extract_hidden_states + ExampleHiddenStatesConnector), "
                      "health, speculators 0.9.0's generate-offline-data",
    "d_verify": "(d) verify --all (hs_<N>.safetensors)",
    "e_compare_with_transformers": "(e) hidden states vs a float32 transformers forward",
    "f_stop_leaves_no_gpu_process": "(f) stop during a run: no GPU process, no marker process, port free",
    "g_relaunch_resumes": "(g) relaunch over the stopped run's output: only the missing samples",
    "pa_rows_too_long_refused": "(a) prepared data with rows longer than max_model_len: extract --tail",
    "pb_complete_run_n_of_n": "(b) a complete run: extract --tail, then status",
    "pd_verify_all_every_file": "(d) verify --all after (b): every file's token_ids against its row",
    "pc_changed_data_refused": "(c) the prepared data changed in place: extract --tail (resume), then verify --all",
}


def prepared_line(s: dict) -> str:
    """The prepared data of issue 52's steps (prepare-data's output as the client reads it)."""
    ds = s.get("datasets") or {}
    def one(name: str) -> str:
        r = (ds.get(name) or {}).get("read") or {}
        return (f"{name}: {r.get('rows')} rows, {r.get('tokens')} tokens, longest {r.get('longest')}, "
                f"{r.get('rows_at_or_over_max_model_len')} at or over max_model_len")
    return (f"- prepared data: written by `speculators prepare-data` (--seq-length {s.get('seq_length')}, "
            f"pre-tokenized JSONL rows); {one('pd_data')}; {one('pd_long')}; server max_model_len "
            f"{s.get('max_model_len')}, the job's max_samples {s.get('max_samples')}")


def refusal_text(s: dict) -> str:
    r = s.get("refusal") or {}
    text = r.get("message") or r.get("line") or "?"
    return text.replace("|", "/") + (f" (hint: {r['hint']})" if r.get("hint") else "")


def detail(name: str, s: dict) -> str:
    if name.endswith(("_crashed", "_skipped")):
        return s.get("error") or s.get("reason") or "?"
    if name == "c_extract_tail":
        st = s.get("status") or {}
        srv = st.get("server") or {}
        return (f"exit {s.get('rc')}, {s.get('files')}/{s.get('expected')} files, state {st.get('state')}, "
                f"server healthy after {srv.get('ready_after_s')} s then {srv.get('exit')}, "
                f"{s.get('seconds')} s in all; GPU processes after the job: {len(s.get('gpu_processes_after_the_job') or [])}")
    if name == "d_verify":
        return verify_detail(s)
    if name == "e_compare_with_transformers":
        return compare_detail(s)
    if name == "f_stop_leaves_no_gpu_process":
        stop = s.get("stop") or {}
        return (f"{len(s.get('gpu_processes_while_running') or [])} GPU process(es) while running, "
                f"{s.get('files_at_stop')} files at stop; stop exit {stop.get('rc')} in {stop.get('seconds')} s, "
                f"clean {stop.get('clean')}; after: {len(s.get('gpu_processes_after') or [])} GPU processes, "
                f"{len(s.get('marker_processes_after') or [])} marker processes, port free {s.get('port_free_after')}, "
                f"state {(s.get('status_after') or {}).get('state')}")
    if name == "g_relaunch_resumes":
        return (f"exit {s.get('rc')}: {s.get('files_before')} files before, max_samples {s.get('max_samples')}, "
                f"{s.get('files_after')} after, {s.get('untouched')} untouched; verify ok "
                f"{(s.get('verify') or {}).get('ok')}")
    if name == "pa_rows_too_long_refused":
        st = s.get("status") or {}
        return (f"exit {s.get('rc')} in {s.get('seconds')} s: \"{refusal_text(s)}\"; after: {s.get('files')} files, "
                f"{len(s.get('job_dirs') or [])} job dirs, {len(s.get('gpu_processes_after') or [])} GPU processes, "
                f"{len(s.get('new_marker_processes') or [])} new job processes, port free {s.get('port_free_after')}, "
                f"status: {'no job' if st.get('job') is None else (st.get('job') or {}).get('state')}")
    if name == "pb_complete_run_n_of_n":
        st = s.get("status") or {}
        smp, tok, srv = st.get("samples") or {}, st.get("tokens") or {}, st.get("server") or {}
        return (f"exit {s.get('rc')}, {s.get('files')} files of {s.get('rows')} rows (max_samples "
                f"{s.get('max_samples')}); status {st.get('state')}, samples {smp.get('done')}/{smp.get('expected')}, "
                f"tokens {tok.get('done')} (rows hold {s.get('tokens')}; {tok.get('from')}); server healthy after "
                f"{srv.get('ready_after_s')} s; run.json dataset rows {(s.get('run_json_dataset') or {}).get('rows')}, "
                f"sha256 {((s.get('run_json_dataset') or {}).get('sha256') or '')[:12]}; {s.get('seconds')} s in all; "
                f"GPU processes after the job: {len(s.get('gpu_processes_after_the_job') or [])}")
    if name == "pd_verify_all_every_file":
        r, i = s.get("result") or {}, s.get("identity") or {}
        return (f"exit {s.get('rc')}: {r.get('files')} files of {r.get('expected')} expected ({s.get('files_on_disk')} "
                f"on disk), {r.get('checked')} loaded, token ids of {i.get('ids_compared')} file(s) compared with "
                f"their rows, {i.get('ids_differ')} differ; gaps {r.get('gap_count')}, non-finite "
                f"{r.get('non_finite_count')}, unloadable {r.get('unloadable_count')}")
    if name == "pc_changed_data_refused":
        o, v = s.get("overwrite_attempt") or {}, s.get("verify") or {}
        changed = [k for k in (s.get("data_files_after") or {})
                   if (s.get("data_files_after") or {}).get(k) != (s.get("data_files_before") or {}).get(k)]
        return (f"prepare-data --overwrite into the directory: exit {o.get('rc')} ({(o.get('error') or '').strip()}), "
                f"hidden states untouched {o.get('hidden_states_untouched')}; prepare-data's output of the changed "
                f"JSONL put in place ({', '.join(changed)} changed); extract: exit {s.get('rc')} in {s.get('seconds')} s: "
                f"\"{refusal_text(s)}\"; files {s.get('files_before')} before, {s.get('files_after')} after, "
                f"{len(s.get('files_changed_or_added') or [])} changed or added (size, mtime, sha256 of each), "
                f"run.json unchanged {s.get('run_json_unchanged')}, new job dirs "
                f"{len(set(s.get('job_dirs_after') or []) - set(s.get('job_dirs_before') or []))}, GPU processes "
                f"after {len(s.get('gpu_processes_after') or [])}; verify --all: exit {v.get('rc')}, ok {v.get('ok')}: "
                f"{'; '.join(v.get('problems') or [])}")
    return ""


def render(path: Path) -> str:
    doc = json.loads(path.read_text())
    v = doc.get("versions") or {}
    client, server = v.get("client") or {}, v.get("server") or {}
    title = f"## Server flow: {path.name}" + (" (CPU REHEARSAL, not a GPU result)" if doc.get("rehearsal") else "")
    lines = [title, "", *([f"- REHEARSAL: {doc['rehearsal']}"] if doc.get("rehearsal") else []),
             f"- written by {provenance.shown(doc, 'benchmarks/gpu_server_check.py')}, started {doc.get('started_at')}, {doc.get('elapsed_s')} s on the machine; "
             f"GPUs: {', '.join(doc.get('gpus') or []) or 'none'}; tensor parallel {doc.get('tensor_parallel_size')}",
             f"- server: vllm {server.get('vllm')}, torch {server.get('torch')}, transformers {server.get('transformers')}, "
             f"fastapi {server.get('fastapi')}; client: speculators {client.get('speculators')}, hs-connectors "
             f"{client.get('hs-connectors')}, transformers {client.get('transformers')}, datasets {client.get('datasets')}",
             *([prepared_line(doc["steps"]["prepared_data"])] if "prepared_data" in (doc.get("steps") or {}) else []),
             "", "| step | ok | evidence |", "|---|---|---|"]
    for name, s in (doc.get("steps") or {}).items():
        if name in ("setup", "model_and_data", "dry", "prepared_data"):
            continue
        label = STEPS.get(name, name)
        lines.append(f"| {label} | {'yes' if s.get('ok') else 'no'} | {detail(name, s)} |")
    lines += ["", f"All steps ok: {'yes' if doc.get('all_ok') else 'no'}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    files = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or sorted(RESULTS.glob("gpu_server_*.json"))
    if not files:
        print("no benchmarks/results/gpu_server_*.json yet (benchmarks/gpu/server_check.py writes them on a GPU host)")
        return 0
    print("\n".join(render(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
