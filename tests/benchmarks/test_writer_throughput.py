"""benchmarks/controller/writer_throughput.py on a tiny shape: it drives the shipped script's Writer (every file
written, read back) and save_atomic of this checkout and of a git revision, and renders what it measured."""

from __future__ import annotations

import importlib.util
import json
import subprocess

from tests.conftest import REPO



def test_writer_benchmark_runs_both_scripts_and_renders(tmp_path):
    spec = importlib.util.spec_from_file_location("writer_bench", REPO / "benchmarks" / "controller" / "writer_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=True).stdout.strip()
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    assert bench.main(["--dir", str(tmp_path), "--samples", "3", "--hidden", "64", "--max-model-len", "300",
                       "--threads", "1,2", "--reps", "1", "--saves", "2", "--before-rev", rev,
                       "--out", str(out), "--md", str(md)]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["median_mb_per_s"]) == {"dd", "raw/1", "raw/2", "before/1", "before/2", "after/1", "after/2"}
    assert all(v > 0 for v in doc["median_mb_per_s"].values())
    assert doc["tokens"] == sum(bench.lengths_of(3, 200, 4000, 299)) and doc["before_rev"] == rev
    assert {"before/alone", "before/python_thread", "after/alone", "after/python_thread"} <= set(doc["save_ms"])
    # the script's own switch interval beside the Python thread (both revisions here have one), and
    # Python's put back after
    assert {"after/python_thread_switch_0.5ms", "before/python_thread_switch_0.5ms"} <= set(doc["save_ms"])
    import sys
    assert sys.getswitchinterval() == doc["save_ms"]["python_switch_interval_ms"] / 1000
    text = md.read_text()
    assert "| after | 0.5 ms | " in text
    assert "| 2 | " in text and "| after | " in text and f"BEFORE: the script at {rev}" in text
    assert list(tmp_path.glob("writer-bench-*")) == []            # its scratch is removed
    again = tmp_path / "again.md"
    assert bench.main(["--from-json", str(out), "--md", str(again)]) == 0
    assert again.read_text().splitlines()[3:] == text.splitlines()[3:]   # the same figures, rendered again
