"""Summarise the server-flow GPU results (benchmarks/results/gpu_server_*.json, written by
benchmarks/gpu_server_check.py) as markdown, for benchmarks/GPU_RESULTS.md.

    python benchmarks/gpu_server_results.py [FILE ...] >> benchmarks/GPU_RESULTS.md

Every figure is read from the result files; nothing is typed by hand.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_common import compare_detail, verify_detail  # noqa: E402  (shared with gpu_results.py)

RESULTS = Path(__file__).resolve().parent / "results"
STEPS = {
    "c_extract_tail": "(c) extract --tail: vLLM server (extract_hidden_states + ExampleHiddenStatesConnector), "
                      "health, speculators 0.9.0's generate-offline-data",
    "d_verify": "(d) verify --all (hs_<N>.safetensors)",
    "e_compare_with_transformers": "(e) hidden states vs a float32 transformers forward",
    "f_stop_leaves_no_gpu_process": "(f) stop during a run: no GPU process, no marker process, port free",
    "g_relaunch_resumes": "(g) relaunch over the stopped run's output: only the missing samples",
}


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
    return ""


def render(path: Path) -> str:
    doc = json.loads(path.read_text())
    v = doc.get("versions") or {}
    client, server = v.get("client") or {}, v.get("server") or {}
    title = f"## Server flow: {path.name}" + (" (CPU REHEARSAL, not a GPU result)" if doc.get("rehearsal") else "")
    lines = [title, "", *([f"- REHEARSAL: {doc['rehearsal']}"] if doc.get("rehearsal") else []),
             f"- code {doc.get('code_rev')}, started {doc.get('started_at')}, {doc.get('elapsed_s')} s on the machine; "
             f"GPUs: {', '.join(doc.get('gpus') or []) or 'none'}; tensor parallel {doc.get('tensor_parallel_size')}",
             f"- server: vllm {server.get('vllm')}, torch {server.get('torch')}, transformers {server.get('transformers')}, "
             f"fastapi {server.get('fastapi')}; client: speculators {client.get('speculators')}, hs-connectors "
             f"{client.get('hs-connectors')}, transformers {client.get('transformers')}, datasets {client.get('datasets')}",
             "", "| step | ok | evidence |", "|---|---|---|"]
    for name, s in (doc.get("steps") or {}).items():
        if name in ("setup", "model_and_data", "dry"):
            continue
        label = STEPS.get(name, name)
        lines.append(f"| {label} | {'yes' if s.get('ok') else 'no'} | {detail(name, s)} |")
    lines += ["", f"All steps ok: {'yes' if doc.get('all_ok') else 'no'}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    files = [Path(a) for a in (argv if argv is not None else sys.argv[1:])] or sorted(RESULTS.glob("gpu_server_*.json"))
    if not files:
        print("no benchmarks/results/gpu_server_*.json yet (benchmarks/gpu_server_check.py writes them on a GPU host)")
        return 0
    print("\n".join(render(f) for f in files))
    return 0


if __name__ == "__main__":
    sys.exit(main())
