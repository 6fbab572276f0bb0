"""The launch plan's inputs measured on a GPU host: the disk write test (agent/job/diskspeed.py) next to dd on
the same directory, and nvidia-smi's GPU name against the peak table (extract/gpu_peaks.json).

    python benchmarks/gpu/plan_check.py [DIR] [--runs N] [--code-rev REV] > plan_check.json

For each run: diskspeed.measure (its default size and blocks, no cache), then dd of the same size with
oflag=direct and buffered with conv=fsync (the figures benchmarks/gpu/throughput.py's disk part reports).
Prints one JSON document; stdlib only (python3 on a bare host).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from benchmarks import provenance  # noqa: E402
from remote_ops.agent.job import diskspeed  # noqa: E402
from remote_ops.extract import plan  # noqa: E402

DD_RE = re.compile(r"(\d+) bytes .* copied, ([\d.]+) s")


def dd(directory: str, size: int, flags: list[str]) -> dict | None:
    fd, target = tempfile.mkstemp(prefix=".plan-check-dd-", dir=directory)
    os.close(fd)
    try:
        r = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=8M", f"count={size // (8 * 2**20)}", *flags],
                           capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(target)
    m = DD_RE.search(r.stderr)
    return {"flags": flags, "bytes": int(m.group(1)), "seconds": float(m.group(2)),
            "bytes_per_s": round(int(m.group(1)) / float(m.group(2)))} if m else {"flags": flags, "error": r.stderr[-300:]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=".")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--code-rev", help="the commit of this checkout (a GPU machine's copy has no .git)")
    a = ap.parse_args()
    d = os.path.abspath(a.dir)
    runs = []
    for _ in range(a.runs):
        m = diskspeed.measure(d)
        runs.append({"write_test": m, "dd_direct": dd(d, m["bytes"], ["oflag=direct"]),
                     "dd_fsync": dd(d, m["bytes"], ["conv=fsync"])})
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=60).stdout.split("\n")
    except OSError as exc:
        names = [f"no nvidia-smi: {exc}"]
    gpus = [{"name": n.strip(), "table": plan.gpu_peak(n.strip())} for n in names if n.strip()]
    leftovers = [n for n in os.listdir(d) if n.startswith(diskspeed.PREFIX) or n.startswith(".plan-check-dd-")]
    print(json.dumps({"written_by": provenance.written_by(__file__, a.code_rev), "dir": d, "fs": diskspeed.fs_key(d),
                      "runs": runs, "gpus": gpus, "leftovers": leftovers,
                      "efficiency_points": plan.peaks()["efficiency"]["points"]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
