"""Bounded fault-injection suite (CI): a patch, a rollback or an extract launch dies at chosen and at
random points, and what is on disk afterwards is checked (see tests/faults/harness.py).

The long form with figures is ``python benchmarks/faults/suites.py --trials 100``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import write_inventory
from tests.faults.cutproxy import CutProxy
from tests.faults.harness import AGENT_POINTS, Rig

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = Rig(tmp_path_factory.mktemp("faultrig"), seed=20261130)
    r.calibrate()
    yield r
    r.close()


def _check(out):
    assert out.state in ("original", "patched"), f"target left {out.state}"
    assert not out.stuck_lock, "the transaction lock stayed held"
    assert out.rerun_ok, out.stderr
    assert not out.leftovers, out.leftovers
    assert not out.journal_problems, out.journal_problems
    if out.job_copies is not None:
        assert out.job_copies == 1, out.stderr


@pytest.mark.parametrize("point", AGENT_POINTS)
def test_patch_agent_dies_at_each_commit_point(rig, point):
    _check(rig.trial("patch", f"agent-kill@{point}"))


@pytest.mark.parametrize("point", ["after-intent", "before-journal"])
def test_rollback_agent_dies_at_commit_points(rig, point):
    _check(rig.trial("rollback", f"agent-kill@{point}"))


@pytest.mark.parametrize("action,fault", [
    ("patch", "sshd-kill"), ("patch", "cut-up"), ("patch", "cut-down"), ("patch", "controller-kill"),
    ("rollback", "sshd-kill"), ("rollback", "cut-up"), ("rollback", "controller-kill"),
    ("launch", "controller-kill"), ("launch", "cut-down"),
])
def test_random_point_faults(rig, action, fault):
    _check(rig.trial(action, fault))


def test_a_fault_is_counted_only_when_it_hit_something_in_flight(rig):
    """A kill 10 ms after the controller starts lands in its Python start-up: no SSH session, no host
    agent yet. It is reported as not fired (with the reason), not as an injected fault; an agent kill
    at a commit point every transaction reaches is counted."""
    for fault, why in (("controller-kill", "killed before it opened a connection"),
                       ("sshd-kill", "no live SSH session")):
        before = dict(rig.counts)
        out = rig.trial("patch", fault, delay=0.01)
        _check(out)
        assert not out.hit and why in out.miss, out
        assert dict(rig.counts) == before
        assert any(k == fault and why in w for k, w in rig.missed)
    out = rig.trial("patch", "agent-kill@after-journal")
    _check(out)
    assert out.hit and out.miss is None


def test_eight_controllers_patch_at_once(rig):
    out = rig.concurrent(8)
    _check(out)


def test_cut_proxy_cuts_exactly_after_n_bytes():
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got = bytearray()

    def serve():
        c, _ = srv.accept()
        while True:
            try:
                d = c.recv(4096)
            except OSError:
                break
            if not d:
                break
            got.extend(d)
        c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    with CutProxy("127.0.0.1", srv.getsockname()[1]) as proxy:
        proxy.arm(up=1000)
        s = socket.create_connection(("127.0.0.1", proxy.port))
        try:
            for _ in range(10):
                s.sendall(b"x" * 500)
        except OSError:
            pass
        th.join(5)
        s.close()
    srv.close()
    assert len(got) == 1000
    assert proxy.stats.cuts == 1


# ------------------------------------------------------------------------------ disk full
@pytest.fixture
def tiny_fs(tmp_path):
    """A 256 KiB tmpfs the test mounts (root only); skipped with the reason when mounting is refused."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path, leave: int) -> Path:
    filler = mnt / "filler"
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    with open(filler, "ab") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return filler


SRC = "X = 1\n" + "# filler line to make the module a realistic size\n" * 400


def _playbook(tmp_path: Path) -> Path:
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "diskfull", "patches": [
        {"path": "mod.py", "edits": [{"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = 2\n"}}]}]}))
    return pb


def _one_line(err: str) -> None:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("remote-ops: "), err
    assert "Traceback" not in err and "internal error" not in err, err


def test_disk_full_in_target_dir_fails_cleanly(sshd, env_vllm017, tmp_path, tiny_fs, cli):
    wd = tiny_fs / "wd"
    wd.mkdir()
    (wd / "mod.py").write_text(SRC)
    state = tmp_path / "state"
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        str(env_vllm017), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(state)})})
    filler = _fill(tiny_fs, 4096)               # less room than the new file needs
    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(_playbook(tmp_path)), "--yes")
    assert status != 0
    _one_line(err)
    assert "space" in err.lower() or "disk" in err.lower(), err
    assert (wd / "mod.py").read_text() == SRC, "original damaged"
    assert [p.name for p in wd.iterdir()] == ["mod.py"], "temporary file left beside the target"
    assert not list(state.glob("journal/*/intent.json"))
    filler.unlink()
    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(_playbook(tmp_path)), "--yes")
    assert status == 0, err
    assert (wd / "mod.py").read_text() == SRC.replace("X = 1", "X = 2", 1)


def test_disk_full_in_state_dir_keeps_earlier_backup(sshd, env_vllm017, tmp_path, tiny_fs, cli):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "mod.py").write_text(SRC)
    state = tiny_fs / "state"
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        str(env_vllm017), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(state)})})
    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(_playbook(tmp_path)), "--yes")
    assert status == 0, err
    backups = sorted(state.glob("journal/*/*.orig"))
    assert len(backups) == 1 and backups[0].read_text() == SRC
    patched = (wd / "mod.py").read_text()
    filler = _fill(tiny_fs, 0)                  # the state dir's filesystem is now full
    status, out, err = cli("rollback", "h", "-i", str(inv))
    assert status != 0
    _one_line(err)
    assert (wd / "mod.py").read_text() == patched, "target changed by a failed rollback"
    assert backups[0].exists() and backups[0].read_text() == SRC, "the earlier backup was lost"
    assert not list(state.glob("journal/*/intent.json"))
    assert not [p for p in wd.iterdir() if p.name not in ("mod.py", "__pycache__")]
    filler.unlink()
    status, out, err = cli("rollback", "h", "-i", str(inv))
    assert status == 0, err
    assert (wd / "mod.py").read_text() == SRC
