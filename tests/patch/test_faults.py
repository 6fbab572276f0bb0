"""Faults: concurrent controllers, crashes at every step of a multi-file transaction, a SIGKILLed
controller, a full disk. The target is always the original or the fully patched bytes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from remote_ops.patch import patching
from remote_ops.playbook import loader as playbook
from remote_ops.errors import RefusedError, RemoteOpsError
from remote_ops.connect.transport import ConnectOptions, Session
from tests.conftest import REPO

ORIG_A = "def f(**kw):\n    return kw\n\n\nA = f(a=1, b=2)\n"
ORIG_B = "N = 1\nM = 2\n"
BOOK = """\
patches:
  - path: a.py
    edits:
      - id: drop-b
        call: f
        drop: [b]
  - path: b.py
    edits:
      - id: n2
        replace: {old: "N = 1\\n", new: "N = 2\\n"}
"""
NEW_A = "def f(**kw):\n    return kw\n\n\nA = f(a=1)\n"
NEW_B = "N = 2\nM = 2\n"


@pytest.fixture
def two_files(sshd, tmp_path, state_dir):
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.py").write_text(ORIG_A)
    (work / "b.py").write_text(ORIG_B)
    pbp = tmp_path / "two.yaml"
    pbp.write_text(BOOK)

    def host(**env):
        return sshd.host(python=sys.executable, workdir=str(work),
                         env={"REMOTE_OPS_STATE_DIR": str(state_dir), **env})
    return work, playbook.load(pbp), host, pbp


def journal(state: Path) -> list[dict]:
    p = state / "journal" / "journal.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def contents(work):
    return (work / "a.py").read_text(), (work / "b.py").read_text()


@pytest.mark.parametrize("n", [2, 8])
def test_concurrent_controllers(two_files, state_dir, n):
    work, pb, host, _ = two_files
    h = host()
    barrier = threading.Barrier(n)
    outcomes, errors = [], []

    def controller():
        try:
            with Session(h, ConnectOptions()).open() as sess:
                raw = patching.read(sess, pb, h)
                plan = patching.compute(pb, raw, h.name)
                barrier.wait()          # everyone has read the original before anyone writes
                outcomes.append(patching.apply(sess, plan, h))
        except Exception as exc:        # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=controller) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert contents(work) == (NEW_A, NEW_B)
    assert sum(1 for o in outcomes if o["changed"]) == 1
    assert [e["action"] for e in journal(state_dir)] == ["patch"]
    assert not list(work.glob(".*.tmp"))


FAULTS = ["after-intent", "after-rename-0", "after-rename-1", "before-journal", "after-journal"]


@pytest.mark.parametrize("fault", FAULTS)
def test_agent_killed_mid_transaction(two_files, state_dir, fault):
    work, pb, host, _ = two_files
    h = host(REMOTE_OPS_FAULT=fault)
    with Session(h, ConnectOptions()).open() as sess:
        with pytest.raises(RemoteOpsError):
            patching.run_host(sess, h, pb)
    # whatever instant it died at, each file is either original or patched
    a, b = contents(work)
    assert a in (ORIG_A, NEW_A) and b in (ORIG_B, NEW_B)
    # the next run recovers (undoes a half transaction, or finishes a committed one) and completes
    h2 = host()
    with Session(h2, ConnectOptions()).open() as sess:
        out = patching.run_host(sess, h2, pb)
        assert sess.stats.execs <= 2
    assert contents(work) == (NEW_A, NEW_B)
    actions = [e["action"] for e in journal(state_dir)]
    assert actions.count("patch") == 1
    assert not list(work.glob(".*.tmp"))
    assert not list((state_dir / "journal").glob("*/intent.json"))
    if fault != "after-journal":
        assert "recovered" in actions and (out["changed"] or out["recovered"])


def contents_when_no_transaction(work, state_dir, timeout=60):
    """The two files read while holding the agent's transaction lock (the state dir's ``lock``, flock'ed
    by an agent for its whole transaction): no transaction is in flight while they are read."""
    import fcntl
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(state_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.monotonic() < deadline, "an agent held the transaction lock for %s s" % timeout
                time.sleep(0.02)
        return contents(work)
    finally:
        os.close(fd)      # releases the lock


def test_controller_sigkilled_at_random_points(two_files, state_dir, inventory_file, sshd, tmp_path):
    work, pb, host, pbp = two_files
    inv = inventory_file(python=sys.executable, workdir=str(work), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    cmd = [sys.executable, "-m", "remote_ops", "-i", str(inv), "patch", "testhost", "--playbook", str(pbp), "--yes"]
    delays = [0.2, 0.4, 0.55, 0.7, 0.85, 1.0]
    for d in delays:
        (work / "a.py").write_text(ORIG_A)
        (work / "b.py").write_text(ORIG_B)
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(d)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # an orphaned agent may still be finishing its transaction (sshd does not signal it): read the
        # files under the state dir's lock, as the next command would (a fixed sleep was too short on a
        # loaded machine: one file renamed, the other not yet)
        a, b = contents_when_no_transaction(work, state_dir)
        assert (a, b) in ((ORIG_A, ORIG_B), (NEW_A, NEW_B))
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert contents(work) == (NEW_A, NEW_B)
        # undo for the next round: rollback must find consistent state as well, and restore the bytes
        undo = subprocess.run(cmd[:5] + ["rollback", "testhost", "--json"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
        assert undo.returncode == 0, undo.stderr
        assert json.loads(undo.stdout)["changed"] and contents(work) == (ORIG_A, ORIG_B)


def test_disk_full_leaves_original(two_files, state_dir, tmp_path):
    """RLIMIT_FSIZE makes the staging write fail like a full disk; nothing may change."""
    work, pb, host, _ = two_files
    big = "# pad\n" * 2000
    (work / "b.py").write_text(ORIG_B)
    code = f"""
import resource, signal, json, base64, hashlib, os, sys
sys.path.insert(0, {str(REPO)!r})
os.environ["REMOTE_OPS_STATE_DIR"] = {str(state_dir)!r}
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from remote_ops.agent import patching
from remote_ops.agent.protocol import AgentFailure
target = {str(work / "b.py")!r}
old = open(target, "rb").read()
new = old + {big!r}.encode()
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    patching.op_apply({{"targets": [{{"real": target, "expected": hashlib.sha256(old).hexdigest(),
                        "spec": {{"path": "b.py"}}, "data": base64.b64encode(new).decode()}}],
                        "workdir": {str(work)!r}}})
except AgentFailure as exc:
    print(exc.kind, exc.message)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("disk-full could not stage the new files"), out.stdout + out.stderr
    assert (work / "b.py").read_text() == ORIG_B
    assert not list(work.glob(".*.tmp")) and journal(state_dir) == []
    assert list((state_dir / "journal").iterdir()) == []


NONROOT_USER = "remote-ops-test"


def _as_non_root(base: Path) -> tuple[str, int, int]:
    """As root (CI runs as root, and root ignores directory modes): a system user made for the test
    and an interpreter wrapper that runs the host agent as that user (setpriv), so the refusal is
    exercised for real. Not root: the current user and interpreter."""
    import pwd
    import shutil

    if os.geteuid() != 0:
        return sys.executable, os.geteuid(), os.getegid()
    try:
        pw = pwd.getpwnam(NONROOT_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        NONROOT_USER], check=True, capture_output=True)
        pw = pwd.getpwnam(NONROOT_USER)
    python = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), None)
    assert python and shutil.which("setpriv"), "needs /usr/bin/python3 and setpriv (util-linux) to run as non-root"
    wrapper = base / "python-as-nonroot"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid={pw.pw_uid} --regid={pw.pw_gid} --clear-groups "
                       f"{python} \"$@\"\n")
    wrapper.chmod(0o755)
    return str(wrapper), pw.pw_uid, pw.pw_gid


def test_read_only_directory_refused(sshd):
    """A directory the agent's user cannot write in: refused before anything changes (an atomic
    replace needs a temporary file beside the target). Runs as a non-root user even under root."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ro-dir-", dir="/tmp"))     # not under root's 0700 pytest dir
    work, state = base / "work", base / "state"
    try:
        base.chmod(0o755)
        python, uid, gid = _as_non_root(base)
        work.mkdir()
        state.mkdir()
        (work / "a.py").write_text(ORIG_A)
        (work / "b.py").write_text(ORIG_B)
        for p in (work, state, work / "a.py", work / "b.py"):
            os.chown(p, uid, gid)
        (base / "two.yaml").write_text(BOOK)
        pb = playbook.load(base / "two.yaml")
        h = sshd.host(python=python, workdir=str(work), env={"REMOTE_OPS_STATE_DIR": str(state)})
        with Session(h, ConnectOptions()).open() as sess:
            work.chmod(0o555)
            with pytest.raises(RefusedError, match="cannot write in"):
                patching.run_host(sess, h, pb)
            assert contents(work) == (ORIG_A, ORIG_B)
            work.chmod(0o755)          # the same host, writable: the patch goes through (the refusal was the mode)
            assert patching.run_host(sess, h, pb)["changed"]
            assert contents(work) == (NEW_A, NEW_B)
        assert (state / "journal").stat().st_uid == uid       # the agent really ran as that user
    finally:
        if work.exists():
            work.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)
