"""agent/core/statedir.py and agent/core/atomic.py: the one state-directory helper and the one atomic replace
the agent's jobs, files and patch code share; and the controller's one byte formatter."""

from __future__ import annotations

import os
import stat

import pytest

from remote_ops.agent.core import atomic
from remote_ops.agent.core import statedir
from remote_ops.units import human_bytes


def test_state_dir_is_private_and_tightened(tmp_path, monkeypatch):
    root = tmp_path / "state"
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(root))
    assert statedir.root() == str(root)
    jobs = statedir.private_dir("jobs")
    assert jobs == str(root / "jobs")
    for p in (root, root / "jobs"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    os.chmod(root / "jobs", 0o755)           # loosened by hand: the next use tightens it
    statedir.private_dir("jobs")
    assert stat.S_IMODE((root / "jobs").stat().st_mode) == 0o700
    monkeypatch.delenv("REMOTE_OPS_STATE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert statedir.root() == str(tmp_path / "home" / ".remote-ops")


def test_atomic_replace_installs_or_leaves_the_destination_untouched(tmp_path):
    dest, tmp = tmp_path / "f.txt", tmp_path / ".f.tmp"
    dest.write_text("old")

    def fail(path):
        open(path, "w").write("half")
        raise OSError("disk full")
    with pytest.raises(OSError, match="disk full"):
        atomic.replace(str(tmp), str(dest), fail)
    assert dest.read_text() == "old" and not tmp.exists()

    def write(path):
        open(path, "w").write("new")
        os.chmod(path, 0o640)
    atomic.replace(str(tmp), str(dest), write)
    assert dest.read_text() == "new" and stat.S_IMODE(dest.stat().st_mode) == 0o640 and not tmp.exists()


@pytest.mark.parametrize("n,text", [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                    (5 * 1024 ** 3, "5.0 GiB"), (3 * 1024 ** 5, "3072.0 TiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_facts_lists_the_hosts_running_jobs_read_only(tmp_path, monkeypatch):
    """facts.gather's jobs: [] on a host that never ran one (and no state dir made), else the jobs
    starting or running (a finished one is left to jobs.list)."""
    import fcntl
    import json

    from remote_ops.agent import facts
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(tmp_path / "state"))
    args = {"gpus": False, "packages": []}
    assert facts.op_gather(args)["jobs"] == []
    assert not (tmp_path / "state").exists()
    jobs = tmp_path / "state" / "jobs"
    done, live = jobs / "demo-20260101-000000-aaaaaa", jobs / "demo-20260102-000000-bbbbbb"
    for d, created in ((done, 1.0), (live, 2.0)):
        d.mkdir(parents=True)
        (d / "job.json").write_text(json.dumps({"key": "demo", "created_at": created, "expected_samples": 4}))
    (done / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": 2.0}))
    (live / "run.json").write_text(json.dumps({"pid": os.getpid()}))
    with open(live / "run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)       # what a live supervisor holds
        (rec,) = facts.op_gather(args)["jobs"]
    assert rec["job_id"] == live.name and rec["key"] == "demo" and rec["state"] == "running"
    assert rec["samples"]["expected"] == 4 and rec["pid"] == os.getpid()
