"""The extraction job's memory before its engine starts, by dataset size (issue 49 item 2): the shipped
script's run() on a JSONL dataset of N lines of T token ids, stopped where it would load the model,
fresh and on a resume with all but 10 samples present. Each run is its own process; the figure is
its peak RSS (getrusage) less the RSS it had once torch was imported (the job imports torch anyway).
The same runs of the script at a baseline revision (default 9c1644b, before the dataset streamed)
are the floor this is compared with, in the same invocation.

    python benchmarks/controller/dataset_memory.py                       # 100k lines x 2,000 tokens (1.2 GB), both revisions
    python benchmarks/controller/dataset_memory.py --lines 10000 --tokens 500 --no-write

Writes benchmarks/DATASET_MEMORY.md (the table it prints) unless --no-write.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from benchmarks.render import readme_section  # noqa: E402
SCRIPT = "remote_ops/playbook/shipped/scripts/extract_hidden_states.py"
OLD_SCRIPT = "playbooks/scripts/extract_hidden_states.py"
SIBLINGS = ("remote_ops/agent/outputs/run_identity.py", "remote_ops/agent/outputs/layout.py")

def _probe(script: Path, argv: list[str]) -> dict:
    code = f'''
import json, os, resource, sys, time, importlib.util
import torch
def rss_kb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
base = rss_kb()
spec = importlib.util.spec_from_file_location("ehs_probe", {str(script)!r})
ehs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ehs)
class Stop(Exception):
    pass
seen = {{}}
def make_generator(*a, **k):
    seen["rss_at_engine"] = rss_kb()
    raise Stop()
args = ehs.parse_args({argv!r})
t = time.time()
try:
    ehs.run(args, make_generator=make_generator, load_tokenizer=lambda p: None, hidden_size_of=lambda p: 16,
            out=open(os.devnull, "w"))
    seen["stopped"] = False
except Stop:
    seen["stopped"] = True
seen["seconds"] = time.time() - t
seen["base_kb"] = base
seen["peak_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(seen))
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=script.parent)
    if r.returncode != 0:
        raise SystemExit(f"probe of {script} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _materialize(rev: str | None, where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    if rev is None:
        for rel in (SCRIPT, *SIBLINGS):
            (where / Path(rel).name).write_bytes((REPO / rel).read_bytes())
        return where / "extract_hidden_states.py"
    for rels in ((SCRIPT, OLD_SCRIPT), *((s,) for s in SIBLINGS)):
        for rel in rels:
            got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{rel}"], capture_output=True)
            if got.returncode == 0:
                (where / Path(rel).name).write_bytes(got.stdout)
                break
    return where / "extract_hidden_states.py"


def _dataset(path: Path, lines: int, tokens: int, seed: int = 20261204) -> None:
    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(lines):
            ids = [rng.randrange(1000, 150000) for _ in range(tokens)]
            fh.write(json.dumps({"input_ids": ids}) + "\n")


def _resume_dir(out: Path, lines: int, missing: int) -> None:
    """``out`` holding whole (empty-zip) data_<N>.pt files for all but the last ``missing`` samples."""
    import zipfile
    out.mkdir(parents=True, exist_ok=True)
    blob = out / ".blob"
    with zipfile.ZipFile(blob, "w") as z:
        z.writestr("x/data.pkl", b"")
    data = blob.read_bytes()
    blob.unlink()
    for i in range(lines - missing):
        (out / f"data_{i}.pt").write_bytes(data)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--tokens", type=int, default=2_000)
    ap.add_argument("--baseline", default="9c1644b", help="revision to compare with ('' for none)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--readme", action="store_true", help="only write README's paragraph from DATASET_MEMORY.md")
    args = ap.parse_args()
    if args.readme:
        return write_readme()
    with tempfile.TemporaryDirectory(prefix="dsmem-") as tmp:
        tmp = Path(tmp)
        ds = tmp / "data.jsonl"
        t = time.time()
        _dataset(ds, args.lines, args.tokens)
        made = time.time() - t
        revs = [("this checkout", None)] + ([(args.baseline, args.baseline)] if args.baseline else [])
        rows = []
        for label, rev in revs:
            script = _materialize(rev, tmp / f"script-{rev or 'here'}")
            out = tmp / f"out-{rev or 'here'}"
            for case in ("fresh", "resume"):
                if case == "resume":      # the fresh run recorded run.json before it stopped
                    _resume_dir(out, args.lines, 10)
                argv = ["--target-model-path", "m", "--dataset", str(ds), "--output-dir", str(out),
                        "--max-model-len", str(args.tokens + 8)]
                got = _probe(script, argv)
                if not got.get("stopped"):
                    raise SystemExit(f"{label} {case}: the run did not reach the engine: {got}")
                rows.append((label, case, got))
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip()
        mb = ds.stat().st_size / 1e6
        lines = [f"# The job's memory before its engine starts, by dataset size",
                 "",
                 f"Generated by `python benchmarks/controller/dataset_memory.py --lines {args.lines} --tokens {args.tokens}` on "
                 f"{commit}, {time.strftime('%Y-%m-%d', time.gmtime())}: a JSONL dataset of {args.lines:,} lines of "
                 f"{args.tokens:,} token ids ({mb:,.0f} MB, made in {made:.0f} s); the shipped script's run() stopped "
                 "where it loads the model; resume: all but 10 samples present as whole files. Above start: peak RSS "
                 "less the RSS once torch was imported.",
                 "",
                 "| script | case | above start (MB) | peak RSS (MB) | seconds to the engine |",
                 "|---|---|---|---|---|"]
        for label, case, g in rows:
            lines.append(f"| {label} | {case} | {(g['peak_kb'] - g['base_kb']) / 1024:,.0f} | {g['peak_kb'] / 1024:,.0f} "
                         f"| {g['seconds']:.1f} |")
        if len(rows) == 4:
            for case in ("fresh", "resume"):
                a = next(g for lab, c, g in rows if c == case and lab == "this checkout")
                b = next(g for lab, c, g in rows if c == case and lab != "this checkout")
                lines.append("")
                lines.append(f"{case}: {(a['peak_kb'] - a['base_kb']) / max(1, b['peak_kb'] - b['base_kb']):.3f} of the "
                             f"baseline's memory above start, {a['seconds'] / max(1e-9, b['seconds']):.2f} of its time.")
        text = "\n".join(lines) + "\n"
        print(text)
        if not args.no_write:
            (REPO / "benchmarks" / "DATASET_MEMORY.md").write_text(text)
            write_readme()
    return 0


README_START = "<!-- dataset-memory: start (python benchmarks/controller/dataset_memory.py writes this paragraph) -->"
README_END = "<!-- dataset-memory: end -->"


def readme_paragraph(report: str) -> str:
    """README's paragraph on the job's memory, from DATASET_MEMORY.md's table (this checkout's fresh and resume
    rows, and the baseline's fresh row when the report has one)."""
    cells = {}
    for line in report.splitlines():
        parts = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(parts) == 5 and parts[1] in ("fresh", "resume") and parts[2].replace(",", "").isdigit():
            cells[(parts[0], parts[1])] = int(parts[2].replace(",", ""))
    m = re.search(r"a JSONL dataset of ([\d,]+) lines of ([\d,]+) token ids \(([\d,]+) MB", report)
    if not m or ("this checkout", "fresh") not in cells or ("this checkout", "resume") not in cells:
        raise SystemExit("benchmarks/DATASET_MEMORY.md has no dataset line or no rows for this checkout")
    base = next((v for (label, case), v in cells.items() if label != "this checkout" and case == "fresh"), None)
    base_label = next((label for (label, case) in cells if label != "this checkout"), None)
    text = (f"On {m.group(1)} lines of {m.group(2)} tokens ({int(m.group(3).replace(',', '')) / 1000:.1f} GB) the job "
            f"held {cells[('this checkout', 'fresh')]:,} MB above its start-up before the engine loaded "
            f"({cells[('this checkout', 'resume')]:,} MB on a resume)"
            + (f", where the job at {base_label}, before the dataset streamed, held {base / 1024:.1f} GB"
               if base is not None else "")
            + ": [benchmarks/DATASET_MEMORY.md](benchmarks/DATASET_MEMORY.md) "
              "(`python benchmarks/controller/dataset_memory.py`).")
    return text


def write_readme() -> int:
    readme = REPO / "README.md"
    para = readme_paragraph((REPO / "benchmarks" / "DATASET_MEMORY.md").read_text())
    text = readme_section.replace(readme.read_text(), README_START, README_END, para)
    if text is None:
        raise SystemExit(f"README.md has no {README_START} ... {README_END} section")
    readme.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
