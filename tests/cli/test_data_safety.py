"""Data safety, over the real sshd: a corrupt patch journal is reported and stops
rollback/patch (only a torn last line, from a crash mid-append, is tolerated); a corrupt or missing
secrets file stops the job with its reason; bytecode notes and the skipped undefined-name check reach
people, not only --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import write_inventory

BOOK = {"name": "safety", "patches": [{"path": "mod.py", "edits": [
    {"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = 2\n"}}]}]}


def _setup(sshd, tmp_path, book=BOOK, text="X = 1\n"):
    wd, state = tmp_path / "wd", tmp_path / "state"
    wd.mkdir()
    (wd / "mod.py").write_text(text)
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump(book, sort_keys=False))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        sys.executable, workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(state)})})
    return wd, state, pb, inv


def test_corrupt_journal_line_is_reported_and_rollback_refuses(sshd, tmp_path, cli):
    wd, state, pb, inv = _setup(sshd, tmp_path)
    status, out, err = cli("-i", str(inv), "patch", "h", "-p", str(pb), "--yes")
    assert status == 0, err
    journal = state / "journal" / "journal.jsonl"
    good = journal.read_bytes()
    # a line in the middle that is not an entry (disk error, a hand edit): the history is partial
    journal.write_bytes(b'{"txid": "half-writ\n' + good)
    status, out, err = cli("-i", str(inv), "rollback", "h")
    assert status == 8, (out, err)
    assert "journal" in err and "is corrupt: line 1" in err and "refusing to act on a partial history" in err
    assert (wd / "mod.py").read_text() == "X = 2\n"          # nothing was rolled back
    status, out, err = cli("-i", str(inv), "history", "h")
    assert "is corrupt: line(s) 1 are not journal entries" in out, out
    status, out, err = cli("-i", str(inv), "history", "h", "--json")
    rec = json.loads(out)
    assert rec["corrupt"] == [{"line": 1, "text": '{"txid": "half-writ'}] and len(rec["entries"]) == 1

    # a torn LAST line (crash mid-append: no newline after it) is tolerated, and cut off by the
    # next append so that it never ends up in the middle
    journal.write_bytes(good + b'{"txid": "torn')
    status, out, err = cli("-i", str(inv), "rollback", "h", "--json")
    assert status == 0, err
    assert (wd / "mod.py").read_text() == "X = 1\n"
    lines = journal.read_bytes().splitlines()
    assert len(lines) == 2 and all(isinstance(json.loads(x), dict) for x in lines)


def _supervise(tmp_path, secrets: bytes | None, names):
    """The real supervisor on a job dir laid out as jobs.launch writes it."""
    from remote_ops.agent import jobs

    jobdir = tmp_path / "job"
    jobdir.mkdir()
    marker = tmp_path / "ran"
    (jobdir / "job.json").write_text(json.dumps({
        "job_id": "j1", "command": [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"],
        "workdir": str(tmp_path), "env": {}, "secret_names": names, "log": str(jobdir / "log")}))
    if secrets is not None:
        (jobdir / "secrets.json").write_bytes(secrets)
    script = jobs.write_job_scripts(str(jobdir))
    subprocess.run([sys.executable, str(script), str(jobdir)], timeout=60, check=True)
    return json.loads((jobdir / "exit.json").read_text()), marker.exists(), jobdir


def test_corrupt_or_missing_secrets_stop_the_job_with_the_reason(tmp_path):
    cases = [(b'{"HF_TOKEN": "hf_', ["HF_TOKEN"], "is corrupt"),
             (None, ["HF_TOKEN"], "is missing (expected HF_TOKEN)"),
             (b'["hf_x"]', ["HF_TOKEN"], "is not a mapping of names to strings"),
             (b'{"OTHER": "x"}', ["HF_TOKEN"], "lacks HF_TOKEN")]
    for i, (secrets, names, reason) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        ext, ran, jobdir = _supervise(tmp_path / str(i), secrets, names)
        assert not ran, f"the job started without its secrets ({reason})"
        assert ext["exit_code"] is None and reason in ext["start_error"], ext
        assert ext["start_error"].startswith("cannot start the job: its secrets file")
        assert not (jobdir / "secrets.json").exists()
        assert reason in (jobdir / "log").read_text()
    # and the good case starts the job (the check above is not refusing everything)
    (tmp_path / "ok").mkdir()
    ext, ran, _ = _supervise(tmp_path / "ok", b'{"HF_TOKEN": "hf_x"}', ["HF_TOKEN"])
    assert ran and ext["exit_code"] == 0 and not ext.get("start_error")


def test_bytecode_notes_and_skipped_name_check_reach_people(sshd, tmp_path, cli):
    book = {"name": "star", "patches": [{"path": "mod.py", "edits": [
        {"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = BLOCK\n"}}]}]}
    wd, state, pb, inv = _setup(sshd, tmp_path, book, text="from os.path import *\nX = 1\n")
    (wd / "__pycache__").write_text("a file where the bytecode folder should be\n")
    status, out, err = cli("-i", str(inv), "patch", "h", "-p", str(pb), "--yes")
    assert status == 0, err
    assert (wd / "mod.py").read_text().endswith("X = BLOCK\n")
    assert "note: " in out and "undefined-name check skipped: the module has a star import" in out, out
    assert "not checked: BLOCK" in out, out
    assert f"note: cannot list {wd / '__pycache__'}" in out, out
    assert "note: bytecode not rewritten" in out, out
    status, out, err = cli("-i", str(inv), "rollback", "h")
    assert status == 0, err
    assert f"note: cannot list {wd / '__pycache__'}" in out, out
