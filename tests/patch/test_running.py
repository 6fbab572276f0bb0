"""patch and rollback under a running job, over the real sshd: a job of the host's
interpreter imports the files a patch swaps, so both are refused, nothing written, unless
``--while-running``, which says what it risks; ``rollback --force`` keeps its own meaning (a file changed
since the patch) and does not pass a running job; a job of another interpreter does not count."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from remote_ops.agent.patch.running import prefix_of
from remote_ops.errors import Exit
from tests.patch.test_over_ssh import GEN, SHIPPED, journal, site_file

pytestmark = pytest.mark.timeout(300)


def _launch(sess, python, workdir):
    """A stand-in job of ``python`` that sleeps (no output dir): its id."""
    res = sess.call("jobs.launch", {"key": "sleeper", "command": [str(python), "-c", "import time; time.sleep(240)"],
                                    "workdir": str(workdir)})
    assert res["job"]["state"] in ("starting", "running"), res
    return res["job"]["job_id"]


@pytest.mark.long
def test_patch_and_rollback_refuse_a_running_job_of_the_interpreter(sshd, fresh_env017, state_dir, inventory_file,
                                                                    cli, tmp_path):
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    env = {"REMOTE_OPS_STATE_DIR": str(state_dir)}
    inv = inventory_file(python=str(fresh_env017), env=env, playbook=str(SHIPPED))
    sess = sshd.session(python=str(fresh_env017), env=env)
    job = _launch(sess, fresh_env017, tmp_path)
    other = None
    try:
        status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes")
        assert status == Exit.REFUSED, out + err
        assert f"testhost: job {job} (playbook sleeper, pid " in err, err
        assert re.search(r"is (starting|running) with this interpreter", err), err
        assert "would change; nothing was changed" in err and "--while-running, which risks one run mixing" in err
        assert target.read_bytes() == original and journal(state_dir) == []

        status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes", "--while-running", "--json")
        assert status == 0, err
        res = json.loads(out)
        assert res["changed"] and [j["job_id"] for j in res["while_running"]] == [job], res["while_running"]
        patched = target.read_bytes()
        assert patched != original

        # --force is about a file changed since the patch, not about a running job
        for extra in ((), ("--force",)):
            status, out, err = cli("-i", str(inv), "rollback", "testhost", *extra)
            assert status == Exit.REFUSED and f"job {job} " in err and "this rollback would change" in err, err
            assert target.read_bytes() == patched

        # the fix printed, run as printed (its -i added: remote_ops/again.py)
        printed = re.search(r"stop it first: (remote-ops .*?); or rerun", err).group(1)
        words = shlex.split(printed)
        assert words[:3] == ["remote-ops", "-i", str(inv)] and words[3:] == ["stop", "testhost", "--job", job], printed
        status, out, err = cli(*words[1:])
        assert status == 0, err

        # a job of another interpreter (the suite's) imports none of these files
        other = _launch(sess, sys.executable, tmp_path)
        status, out, err = cli("-i", str(inv), "rollback", "testhost", "--json")
        assert status == 0, err
        assert json.loads(out)["while_running"] == [] and target.read_bytes() == original
    finally:
        for j in (job, other):
            if j:
                sess.call("jobs.stop", {"key": "sleeper", "job_id": j, "grace": 1})


def test_the_interpreter_of_a_job_is_its_installation(tmp_path, fresh_env017):
    venv_root = Path(fresh_env017).parent.parent
    assert prefix_of(str(fresh_env017)) == os.path.realpath(venv_root)
    entry = venv_root / "bin" / "some-tool"            # an entry point of the venv runs the venv's Python
    entry.write_text("#!/bin/sh\n")
    assert prefix_of(str(entry)) == os.path.realpath(venv_root)
    assert prefix_of("bin/python", str(venv_root)) == os.path.realpath(venv_root)   # relative to the workdir
    assert prefix_of("/bin/sh") is None                 # not a Python
    assert prefix_of(str(tmp_path / "no-such-python")) is None
    assert prefix_of(str(fresh_env017)) != prefix_of(sys.executable)
