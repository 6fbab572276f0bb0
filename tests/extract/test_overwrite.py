"""``extract --overwrite`` means "another run is here", over the real sshd with the
STAND-IN job: on this run's own directory it says there is nothing to overwrite and resumes (nothing
moved); with this run's job running it refuses, naming the job, and moves nothing; when it moves, every
directory moved is named with where its files went, also under --tail."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from tests.conftest import standin_playbook, write_inventory

pytestmark = pytest.mark.timeout(240)


def _inventory(sshd, tmp_path, outs, *, n=4, sleep=0.0):
    pb = tmp_path / "pb.yaml"
    pb.write_text(standin_playbook("over"))
    entry = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                            env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")},
                            vars={"n": n, "sleep": sleep, "out": [str(tmp_path / o) for o in outs]
                                  if len(outs) > 1 else str(tmp_path / outs[0])}, playbook=str(pb))
    return write_inventory(tmp_path / "inv.yaml", {"node": entry})


def _files(*dirs):
    return {str(p): p.stat().st_mtime_ns for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


def _status(cli, inv):
    return json.loads(cli("status", "node", "--json", "-i", str(inv))[1])


def test_overwrite_on_this_runs_own_directory_moves_nothing_and_resumes(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, ["out"], n=4)
    status, out, err = cli("extract", "node", "--tail", "-i", str(inv))
    assert status == 0, err
    out_dir = tmp_path / "out"
    (out_dir / "data_3.pt").unlink()               # one sample to redo: a resume, not a fresh run
    before = _files(out_dir)
    status, out, err = cli("extract", "node", "--overwrite", "--tail", "-i", str(inv))
    assert status == 0, err
    assert "holds this run (run.json " in err and "nothing to overwrite; resuming its 3 sample file(s)" in err, err
    assert "moved" not in err
    assert not list(out_dir.glob(".replaced-*"))
    after = _files(out_dir)
    assert {k: v for k, v in after.items() if k in before and k.endswith(".pt")} == \
        {k: v for k, v in before.items() if k.endswith(".pt")}      # the 3 kept untouched
    assert (out_dir / "data_3.pt").exists()


def test_overwrite_with_the_runs_job_running_is_refused_naming_it(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, ["out"], n=40, sleep=0.3)
    status, out, err = cli("extract", "node", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]["job_id"]
    try:
        status, out, err = cli("extract", "node", "--overwrite", "-i", str(inv))
        assert status == 8, out + err
        assert f"--overwrite: job {job} is running and writing {tmp_path / 'out'} (this run)" in err, err
        assert f"remote-ops -i {inv} stop node --job {job}" in err
        assert not list((tmp_path / "out").glob(".replaced-*"))
        assert _status(cli, inv)["job"]["state"] == "running"
    finally:
        cli("stop", "node", "--job", job, "-i", str(inv))


def test_overwrite_names_every_directory_moved_under_tail(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, ["d0", "d1"], n=4)
    status, out, err = cli("extract", "node", "--tail", "-i", str(inv))
    assert status == 0, err
    inv = _inventory(sshd, tmp_path, ["d1", "d0"], n=4)          # another run: the list in another order
    status, out, err = cli("extract", "node", "--tail", "-i", str(inv))
    assert status != 0 and "another run" in err
    status, out, err = cli("extract", "node", "--overwrite", "--tail", "-i", str(inv))
    assert status == 0, err
    for d in ("d0", "d1"):
        (aside,) = (tmp_path / d).glob(".replaced-*")
        assert re.search(rf"--overwrite: moved \d+ file\(s\) of the earlier run out of {tmp_path / d} into {aside}\n",
                         err), err
    assert "succeeded" in out + err
