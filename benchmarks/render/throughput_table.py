"""README's extraction throughput table, rendered from the GPU result JSONs (not by hand).

Each row is one part of one run of benchmarks/gpu/throughput.py (benchmarks/results/gpu_throughput_h200_*.json),
named in ROWS below: which file gives which row. A row gives the part's tokens/s, its ratio to vLLM at its
best ((c_best): that run's, or the run the row names when c_best was measured in another run of the same
lease, model and prompts, or the one the run copied with --c-best-from), its ratio to that run's (c) (vLLM's
prefill at the generator's settings), the model's shape and the remote-ops commit the run measured.

    python benchmarks/render/throughput_table.py            # print the table
    python benchmarks/render/throughput_table.py --write    # replace the table in README.md (between its markers)

tests/benchmarks/test_throughput_table.py checks that README.md holds exactly what this renders.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.render import readme_section  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
README = REPO / "README.md"
START = "<!-- throughput-table: start (benchmarks/render/throughput_table.py --write) -->"
END = "<!-- throughput-table: end -->"
CBEST = "gpu_throughput_h200_cbest.json"

# (result file, part (a dotted path into the doc), what the row is, the file whose c_best and (c) it is
# measured against when not its own: only a run of the same lease, model and prompts)
ROWS = [
    (CBEST, "c_best", "vLLM at its best (c_best): the fastest point of its sweep", None),
    (CBEST, "c_vllm_prefill", "vLLM's prefill at the generator's settings (c)", None),
    (CBEST, "b_generator", "0.3.0 flow: the generator alone, no writes (b)", None),
    (CBEST, "a_tmpfs", "0.3.0 flow: the whole job, outputs on a tmpfs", None),
    ("gpu_throughput_h200_cbest_server.json", "a_server",
     "server flow (0.9.0): the whole job, outputs on the disk, from the server's health check", CBEST),
    ("gpu_throughput_h200_cbest_server.json", "a_server.from_first_file",
     "server flow (0.9.0): the same, from its first file on", CBEST),
    ("gpu_throughput_h200_srv_tmpfs.json", "a_server_tmpfs",
     "server flow (0.9.0) on vLLM 0.20.0 as shipped for it (no chunked prefill), outputs on a tmpfs, "
     "from the health check", None),
    ("gpu_throughput_h200_srv_tmpfs.json", "a_server_tmpfs.from_first_file", "the same, from its first file on", None),
    ("gpu_throughput_h200_srv_tmpfs.json", "a_server_tmpfs_async_b64k",
     "server flow, vLLM 0.22's write path (hs_async_connector.py), 65,536-token steps, 64 in flight, tmpfs", None),
    ("gpu_throughput_h200_srv_tmpfs.json", "a_server_tmpfs_async_b64k.from_first_file",
     "the same, from its first file on", None),
    ("gpu_throughput_h200_srv_tmpfs_x4.json", "a_server_tmpfs_async_b64k_x4",
     "server flow, the same with 4 clients (--world-size 4), 32 in flight each, tmpfs", None),
    ("gpu_throughput_h200_srv_tmpfs_x4.json", "a_server_tmpfs_async_b64k_x4.from_first_file",
     "the same, from its first file on", None),
    ("gpu_throughput_h200_final2.json", "a_tmpfs", "0.3.0 flow, final code: outputs on a tmpfs", None),
    ("gpu_throughput_h200_final2_repeat.json", "a_tmpfs", "0.3.0 flow, final code: outputs on a tmpfs, a repeat",
     None),
    ("gpu_throughput_h200_final2.json", "a_before_tmpfs", "0.3.0 flow, BEFORE (7a3c5d8): outputs on a tmpfs", None),
    ("gpu_throughput_h200_final2.json", "b_generator", "0.3.0 flow, final code: the generator alone", None),
    ("gpu_throughput_h200_final2.json", "b_generator_before", "0.3.0 flow, BEFORE: the generator alone", None),
    ("gpu_throughput_h200_final2.json", "a_after", "0.3.0 flow, final code: outputs on the disk", None),
    ("gpu_throughput_h200_disk.json", "a_after", "0.3.0 flow on the disk, 4 writer threads", None),
    ("gpu_throughput_h200_disk.json", "a_after_w8", "0.3.0 flow on the disk, 8 writer threads (the default)", None),
    ("gpu_throughput_h200_flows.json", "a_after", "0.3.0 flow on the disk, beside the server flow", None),
    ("gpu_throughput_h200_flows.json", "a_server", "server flow (0.9.0) on the disk, beside the 0.3.0 flow", None),
    ("gpu_throughput_h200_8b.json", "b_generator", "0.3.0 flow: the generator alone, 8B shape", None),
    ("gpu_throughput_h200_8b.json", "c_vllm_prefill", "vLLM's prefill at the generator's settings (c), 8B shape",
     None),
]


def ratio(a, b):
    return round(a / b, 4) if a and b else None


def _rate(x) -> str:
    return f"{x / 1000:.1f}k" if x else "-"


def part(doc: dict, path: str) -> dict:
    """The part a row names: ``a_server`` or ``a_server.from_first_file``."""
    got = doc
    for key in path.split("."):
        got = (got or {}).get(key) or {}
    return got


def shape_text(model: dict) -> str:
    """The model's shape in a few words: model.shape where the run recorded it, else the model's own keys."""
    s = model.get("shape") or {}
    layers, hidden = s.get("layers", model.get("layers")), s.get("hidden", model.get("hidden"))
    params = f"{model['params'] / 1e9:.1f}B, " if model.get("params") else ""
    kind = (f"MoE, {s.get('experts')} experts" if s.get("moe") else "dense")
    return f"random Llama {params}{layers} layers, hidden {hidden}, {kind}"


def cells(name: str, path: str, label: str, ref: str | None, docs: dict) -> list[str]:
    d = docs[name]
    against = docs[ref] if ref else d
    cb_from = "" if ref else (d.get("c_best_from") or {}).get("path", "")
    tps = part(d, path).get("tokens_per_s")
    cb = (against.get("c_best") or {}).get("tokens_per_s")
    c = (against.get("c_vllm_prefill") or {}).get("tokens_per_s")
    whose = f" (of {ref})" if ref and cb else (f" (copied from {Path(cb_from).name})" if cb_from and cb else "")
    return [label, _rate(tps), f"{ratio(tps, cb) if cb else '-'}{whose}",
            f"{ratio(tps, c) if c else '-'}" + (f" (of {ref})" if ref and c else ""),
            shape_text(d.get("model") or {}), str(d.get("code_rev")), name]


def load(names=None) -> dict:
    names = names or sorted({r[0] for r in ROWS} | {r[3] for r in ROWS if r[3]})
    return {n: json.loads((RESULTS / n).read_text()) for n in names}


def render(docs: dict, rows=ROWS) -> str:
    lines = ["| run and part | tokens/s | / c_best | / (c) | model | remote-ops commit | result |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append("| " + " | ".join(cells(*row, docs)) + " |")
    gpus = sorted({g.split(",")[0] for d in docs.values() for g in d.get("gpus") or []})
    vllm = sorted({str((d.get("versions") or {}).get("vllm")) for d in docs.values()})
    lines += ["", f"Rendered by `python benchmarks/render/throughput_table.py` from benchmarks/results/ "
              f"({', '.join(gpus)}; vLLM {', '.join(vllm)}; the files named in its ROWS). Tokens/s once the engine "
              "(or the server) is up, over the same seeded prompts within a run; `/ c_best` and `/ (c)` are against "
              "that run's vLLM, or the run named beside the ratio (same lease, model and prompts). Every part, "
              "its settings and where its time went: benchmarks/GPU_RESULTS.md "
              "(`python benchmarks/render/gpu_results.py`)."]
    return "\n".join(lines)


def readme_table(text: str) -> str | None:
    return readme_section.read(text, START, END)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="replace the table in README.md")
    args = ap.parse_args(argv)
    table = render(load())
    if not args.write:
        print(table)
        return 0
    text = readme_section.replace(README.read_text(), START, END, table)
    if text is None:
        sys.stderr.write(f"README.md has no {START} ... {END} markers: add them where the table goes\n")
        return 1
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
