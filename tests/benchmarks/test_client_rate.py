"""benchmarks/controller/client_rate.py's pure parts (/proc parsing, the window's figures, the bound rule,
the client's Timing lines, the report) and benchmarks/gpu/server_check.py's reading of several clients'
shares in a job's log; none needs the rehearsal's cached wheels."""

from __future__ import annotations

import math
import struct

import pytest

from benchmarks.controller import client_rate as cr
from benchmarks.gpu import server_check as sc


def test_proc_stat_fields_count_after_the_last_parenthesis():
    # a command name with spaces and parentheses; ppid is field 4, utime 14, stime 15
    line = "4242 (python (x) y) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 31 7 9 20 0 3 0 1000 0 0\n"
    assert cr.proc_stat_fields(line) == (17, 281)


def test_cpu_busy_total_leaves_idle_and_iowait_out():
    text = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1\n"
    assert cr.cpu_busy_total(text) == (160, 1000)
    with pytest.raises(ValueError):
        cr.cpu_busy_total("intr 1\n")


def test_descendants_follow_the_tree_only():
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 21: 20}
    assert cr.descendants(parents, 10) == {10, 11, 12, 13}
    assert cr.descendants(parents, 21) == {21}


def _samples():
    # 100 rows: 10 files at t=1, 90 at t=5; client 2 cores' worth over 4 s = 800 ticks at 100 Hz
    s = []
    for t, files, client, server, busy in ((0.0, 0, 0, 0, 0), (1.0, 10, 100, 40, 150), (3.0, 50, 500, 140, 550),
                                           (5.0, 90, 900, 240, 950), (6.0, 100, 1000, 260, 1050)):
        s.append({"t": t, "files": files, "tokens": files * 500, "client_ticks": client, "server_ticks": server,
                  "busy_ticks": busy, "total_ticks": int(t * 200)})
    return s


def test_window_figures_from_the_10_and_90_percent_marks():
    w = cr.window_figures(_samples(), 100, clk=100, cpus=2)
    assert w["seconds"] == 4.0 and w["requests"] == 80 and w["requests_per_s"] == 20.0
    assert w["tokens_per_s"] == 10000
    assert w["client_cpu_cores"] == 2.0 and w["client_cpu_s_per_request"] == 0.1
    assert w["server_cpu_cores"] == 0.5
    assert w["machine_busy_cores"] == 2.0 and w["other_cpu_cores"] == -0.5


def test_no_window_when_the_run_never_reaches_both_marks():
    assert cr.window_figures(_samples()[:3], 100, clk=100, cpus=2) is None
    assert cr.window_figures([], 100, clk=100, cpus=2) is None


@pytest.mark.parametrize("client,clients,busy,word", [
    (0.95, 1, 1.5, "client CPU (0.95 of a core per client process)"),
    (1.2, 2, 1.9, "the machine's 2 cores (1.90 busy)"),
    (0.5, 1, 1.0, "neither client nor cores saturated"),
])
def test_bound_rule(client, clients, busy, word):
    assert cr.bound({"client_cpu_cores": client, "machine_busy_cores": busy}, clients, 2) == word


def test_client_timings_reads_each_process_line():
    text = ("[00:22:34] INFO     Timing: 4.0s elapsed, 14.9 samples/s, avg vLLM request 345 ms, avg file write "
            "12 ms     generate_offline_data.py:356\nnoise\n"
            "[00:22:35] INFO     Timing: 12.5s elapsed, 30.0 samples/s, avg vLLM request 1000 ms, avg file write 3 ms\n")
    assert cr.client_timings(text) == [
        {"elapsed_s": 4.0, "samples_per_s": 14.9, "avg_request_ms": 345, "avg_write_ms": 12},
        {"elapsed_s": 12.5, "samples_per_s": 30.0, "avg_request_ms": 1000, "avg_write_ms": 3}]
    assert cr.client_timings("Timing: 4.0s elapsed, 14.9\n samples/s") == []   # a wrapped line is not read


def test_finite_bf16_is_finite_and_sized():
    b = cr.finite_bf16(1 << 17)
    assert len(b) == 1 << 17 and cr.finite_bf16(10) == b[:10]
    vals = [struct.unpack("<f", b"\x00\x00" + b[i:i + 2])[0] for i in range(0, len(b), 2)]
    assert all(math.isfinite(v) for v in vals) and len(set(vals)) > 1000


def test_render_shows_every_run_and_says_what_it_is_not():
    w = cr.window_figures(_samples(), 100, clk=100, cpus=2)
    doc = {"command": "python benchmarks/controller/client_rate.py", "finished_at": "2026-12-05T00:00:00Z",
           "written_by": {"script": "benchmarks/controller/client_rate.py", "commit": "abc1234"},
           "machine": {"cpus": 2, "platform": "Linux", "python": "3.11.7"},
           "params": {"rows": 100, "min_tokens": 300, "max_tokens": 1500, "layers": 4, "hidden": 2048,
                      "concurrency": 32, "work": "/dev/shm/x", "interval": 0.1},
           "dataset": {"tokens": 50000, "mean_mib": 7.8},
           "runs": [{"clients": 1, "repeat": 1, "window": w, "bound": cr.bound(w, 1, 2), "exit": 0, "files": 100,
                     "client_timings": [{"samples_per_s": 19.5}]},
                    {"clients": 2, "repeat": 1, "window": None, "bound": None, "exit": 1, "files": 7,
                     "client_timings": []}]}
    md = cr.render(doc)
    assert "NOT a measurement of vLLM" in md and "2 CPUs" in md and "16 KiB a token" in md
    assert "| 1 | 1 | 20.0 | 10000 | 0.1 | 2.0 | 0.5 | -0.5 | client CPU (2.00 of a core per client process) | 10.0 " \
           "| 0 | 100/100 | 19.5 |" in md
    assert "| 2 | 1 | - | - | - | - | - | - | no window | - | 1 | 7 | - |" in md


def test_ceiling_is_clients_over_cpu_per_request():
    assert cr.ceiling({"client_cpu_s_per_request": 0.02}, 1) == 50.0
    assert cr.ceiling({"client_cpu_s_per_request": 0.02}, 2) == 100.0


# ------------------------------------------------------------------ server_check.py: several clients' shares
def test_shares_are_speculators_contiguous_split():
    assert sc.shares(60, 3) == [(0, 20), (20, 40), (40, 60)]
    assert sc.shares(152, 3) == [(0, 51), (51, 102), (102, 152)]
    assert sc.shares(5, 1) == [(0, 5)]


LOG3 = ("[run_clients] rank 1/3: imports 11.6 s, server ready after 11.6 s\n"
        "[00:24:01] INFO     Processing 51 samples\n"
        "[run_clients] rank 0/3: imports 12.9 s, server ready after 13.0 s\n"
        "[00:24:01] INFO     Found 31 existing samples for rank 0.\n"
        "[00:24:01] INFO     Processing 20 samples\n"
        "[run_clients] rank 2/3: imports 12.2 s, server ready after 12.2 s\n"
        "[00:24:01] INFO     Processing 50 samples\n")


def test_client_shares_of_three_ranks_with_files_already_written():
    done = set(range(31))
    r = sc.client_shares(LOG3, 3, 152, done)
    assert r["ok"] and r["processing"] == [20, 50, 51] and r["expected_processing"] == [20, 50, 51]
    assert r["existing_found"] == [(0, 31)] and len(r["rank_lines"]) == 3
    assert not sc.client_shares(LOG3, 3, 152)["ok"]                      # nothing written: 51, 51, 50 expected
    assert not sc.client_shares(LOG3.replace("rank 2/3", "rank 1/3"), 3, 152, done)["ok"]   # rank 2's line missing


def test_client_shares_of_one_client_has_no_rank_line():
    assert sc.client_shares("INFO Processing 60 samples\n", 1, 60)["ok"]
    assert not sc.client_shares("[run_clients] rank 0/1: imports 1.0 s\nProcessing 60 samples\n", 1, 60)["ok"]
    assert not sc.client_shares("INFO Processing 59 samples\n", 1, 60)["ok"]
    # a rank with nothing left logs no Processing line
    assert sc.client_shares("", 1, 60, set(range(60)))["ok"]
