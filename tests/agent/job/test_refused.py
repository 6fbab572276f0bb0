"""agent/job/refused.py: the requests a server-flow job's client skipped, read from its log. With several
clients (run_clients.py --clients N) the log holds one ``Skipped K samples`` summary per client: they add up."""

from __future__ import annotations

from remote_ops.agent.job import refused


def _log(tmp_path, text):
    p = tmp_path / "log"
    p.write_text(text)
    return str(p)


def test_one_client_summary_and_its_lines(tmp_path):
    rec = refused.scan(_log(tmp_path, "WARNING Skipping sample 3 due to error: too long\n"
                                      "WARNING Skipped 2 samples due to errors: [3, 5]\n"))
    assert rec == {"count": 2, "indexes": [3, 5], "reasons": ["too long"], "server_refusals": 0}


def test_several_clients_summaries_add_up(tmp_path):
    text = ("[run_clients] rank 0/3: imports 0.1 s, server ready after 2.0 s\n"
            "WARNING Skipping sample 1 due to error: Error code: 400 - too long\n"
            "WARNING Skipped 1 samples due to errors: [1]\n"          # rank 0
            "WARNING Skipped 1 samples due to errors: [9]\n"          # rank 2 (its line cut off)
            "WARNING Skipped 3 samples due to errors: [4, 5, 6]\n"    # rank 1 (its per-sample lines cut off)
            "Data generation complete!\n")
    rec = refused.scan(_log(tmp_path, text))
    assert rec["count"] == 5 and rec["indexes"] == [1, 4, 5, 6, 9]
    assert rec["reasons"] == ["Error code: 400 - too long"]
    assert refused.reason(rec).startswith("5 sample(s) refused and skipped (rows 1, 4, 5, 6, 9): Error code: 400")


def test_summaries_without_their_lists_count_and_lines_beyond_them_still_count(tmp_path):
    rec = refused.scan(_log(tmp_path, "Skipped 4 samples due to errors\nSkipped 2 samples due to errors\n"))
    assert rec["count"] == 6 and rec["indexes"] == []
    # more rows named than the summaries count (a summary lost with its client): the rows win
    rec = refused.scan(_log(tmp_path, "Skipping sample 7 due to error: x\nSkipping sample 8 due to error: x\n"
                                      "Skipping sample 2 due to error: x\nSkipped 1 samples due to errors: [2]\n"))
    assert rec["count"] == 3 and rec["indexes"] == [2, 7, 8]


def test_nothing_refused_is_none(tmp_path):
    assert refused.scan(_log(tmp_path, "Saved 12 new data points\nData generation complete!\n")) is None
    assert refused.scan(str(tmp_path / "missing")) is None
