"""What a person copies or reads from the output: commands shown for copying are shell-quoted (an
empty or spaced argument survives a paste), and in-place progress redraws (``\\r``) go only to a
terminal, never into a log or a pipe. Over the real sshd with the stand-in job."""

from __future__ import annotations

import json
import os
import pty
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.extract.test_jobs import Env, _no_job_left_behind  # noqa: F401  (its autouse fixture)

pytestmark = pytest.mark.timeout(240)


def test_would_run_and_starting_lines_paste_back_to_the_same_argv(tmp_path, sshd, cli):
    """An empty argument (an unset --layer-ids) and one with spaces: `extract --dry-run`'s
    "would run:" and the job log's "starting:" line split back (shlex.split) to the exact command."""
    env = Env(tmp_path, sshd, ["--max-samples", "2", "--layer-ids", "", "--target-model-path", "tiny stand in"])
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run", "--json"))
    assert status == 0, err
    command = json.loads(out)["spec"]["command"]
    assert "" in command and "tiny stand in" in command
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 0, err
    shown = re.search(r"would run: (.*)", out).group(1)
    assert shlex.split(shown) == command
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    log = (env.job() / "log").read_text()
    started = re.search(r"starting: (.*)", log).group(1)
    assert shlex.split(started) == command


def _standin_outputs(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "3"], {"expected_samples": 3})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    return env


def test_gather_and_verify_redraw_only_on_a_terminal(tmp_path, sshd, cli):
    env = _standin_outputs(tmp_path, sshd, cli)
    # not a terminal (captured): no \r at all, the summary lines only
    status, out, err = cli(*env.argv("gather", "testhost", "--to", str(tmp_path / "g1")))
    assert status == 0, err
    assert "\r" not in err + out and "3 copied" in out
    status, out, err = cli(*env.argv("verify", "testhost", "--all"))
    assert status == 0, err
    assert "\r" not in err + out
    # a terminal on stderr: the file being copied is redrawn in place
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "remote_ops"] + env.argv("gather", "testhost", "--to",
                                                                          str(tmp_path / "g2")),
                           cwd=REPO, stdout=subprocess.PIPE, stderr=slave, timeout=120,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0, seen
    assert b"\r  testhost: data_" in seen
