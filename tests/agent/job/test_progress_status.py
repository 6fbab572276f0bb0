"""Tokens/s and ETA in status and --tail: agent/job/status.py reads the extraction script's own
``extract-progress {json}`` lines from the job's log; the controller renders them. The lines are
the ones the REAL shipped script prints (written here by its own Progress class)."""

from __future__ import annotations

import io
import json

from remote_ops.agent.job import status as jobstatus
from remote_ops.extract import jobs, tail
from tests.conftest import EXTRACT_SCRIPT, load_extract_script

SCRIPT = EXTRACT_SCRIPT


def script():
    return load_extract_script("ehs_progress")


def test_the_last_progress_line_is_found_among_tqdm_rewrites_and_other_output(tmp_path):
    ehs = script()
    now = [100.0]
    buf = io.StringIO()
    p = ehs.Progress(buf, [1000, 3000, 2000], [0], every=0, clock=lambda: now[0])
    p.start()                              # t=100: 1 of 3 samples, 1000 of 6000 tokens, no rate yet
    now[0] = 110.0
    p.written(1)                           # t=110: 4000 tokens, 3000 in 10 s (the writer thread counts)
    assert len(buf.getvalue().splitlines()) == 1      # ... and prints nothing: the main thread does
    p.poll()
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2 and all(l.startswith("extract-progress {") for l in lines)
    log = tmp_path / "log"
    # as the job's log has them: stderr's tqdm \r rewrites and stdout's lines interleaved
    log.write_text("generator ready in 20.0s: ...\n"
                   "\rGenerating hidden states:  33%|###   | 1/3 [00:01<00:02, 1.0sample/s]" + lines[0] + "\n"
                   "\rGenerating hidden states:  67%|######| 2/3 [00:02<00:01, 1.0sample/s]" + lines[1] + "\n"
                   "\rGenerating hidden states:  67%|######| 2/3 [00:03<00:01, 1.0sample/s]"
                   "extract-progress {\"tokens_done\": 99")          # cut mid-write: not taken
    rec = jobstatus.last_progress(str(log))
    assert rec["tokens_done"] == 4000 and rec["tokens_total"] == 6000 and rec["samples_done"] == 2
    assert rec["tokens_per_s"] == 300.0 and rec["eta_s"] == round(2000 / 300.0, 1) and rec["t"] == 110.0
    fields = jobstatus._tokens(rec, "running", now=113.0)             # counted down since the line
    assert fields == {"tokens": {"done": 4000, "total": 6000, "at": 110.0}, "tokens_per_s": 300.0,
                      "eta_s": round(6.7 - 3.0, 1)}
    assert jobstatus._tokens(rec, "succeeded", now=113.0)["eta_s"] is None
    assert jobstatus._tokens(None, "running", now=1.0) == {"tokens": None, "tokens_per_s": None, "eta_s": None}
    (tmp_path / "plain").write_text("no progress lines here\n" * 100)
    assert jobstatus.last_progress(str(tmp_path / "plain")) is None
    assert jobstatus.last_progress(str(tmp_path / "missing")) is None


def test_status_line_and_tail_snapshot_show_tokens_per_s_and_eta():
    st = {"job_id": "j", "state": "running", "elapsed_s": 65, "samples": {"done": 10, "expected": 300},
          "rate_per_s": 2.0, "tokens": {"done": 16000, "total": 480000}, "tokens_per_s": 14230.5, "eta_s": 3725}
    line = jobs.summary_line(st)
    assert line == "j: running after 1m05s, 10/300 samples, 2.00 samples/s, 14.2k tok/s, ETA 1h02m05s"
    snap = tail.snapshot_text(st)
    assert "tokens 16000/480000" in snap and "14.2k tok/s, ETA 1h02m05s" in snap
    done = dict(st, state="succeeded", eta_s=None)
    assert jobs.summary_line(done).endswith("2.00 samples/s, 14.2k tok/s")
    assert tail.token_text({"tokens_per_s": 850.0}) == "850 tok/s"
    assert tail.token_text({"job_id": "x"}) == ""
    json.dumps(st)


def test_the_live_renderer_keeps_progress_lines_out_of_the_scrolling_log():
    from rich.console import Console

    from remote_ops.commands.follow import LivePrinter, PlainPrinter
    from remote_ops.extract.follow import Line, Snapshot
    buf = io.StringIO()
    r = LivePrinter(Console(file=buf, force_terminal=True, width=120))
    for text in ("generator ready in 1.0s", 'extract-progress {"tokens_done": 5}', "wrote 3 sample(s)"):
        r(Line(text))
    r(Snapshot({"state": "running", "tokens": {"done": 5, "total": 9}, "tokens_per_s": 2.5, "eta_s": 2}))
    r.close()
    text = buf.getvalue()
    assert "generator ready in 1.0s" in text and "wrote 3 sample(s)" in text
    assert "extract-progress" not in text and "tokens 5/9" in text and "ETA 2s" in text
    plain = io.StringIO()
    p = PlainPrinter(out=plain)
    p(Line('extract-progress {"tokens_done": 5}'))
    assert plain.getvalue() == 'extract-progress {"tokens_done": 5}\n'      # logs keep the record
