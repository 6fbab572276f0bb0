"""Over the real sshd: the server of the server flow killed from outside while the
client runs (the sandbox's stand-in, SIGKILL: what an engine crash or the OOM killer does) is named by status as
the server's death, not the client's; extract again starts a new server and resumes, writing only the samples the
first job had not written (tests/extract/test_server_flow.py's Env and stand-ins)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from remote_ops.agent.jobs import port_free
from tests.extract.test_server_flow import Env, assert_sample_is_row, cli_json, marker_pids, rows

pytestmark = pytest.mark.timeout(180)


def test_server_killed_mid_job_is_named_and_extract_resumes(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, client_args=["--concurrency", "1", "--sample-delay", "0.4"])
    proc = env.subprocess("extract", "testhost", "--tail")
    try:
        jobdir = env.wait_log("[server]", timeout=60)
        deadline = time.time() + 60
        while time.time() < deadline and len(env.files()) < 3:
            time.sleep(0.05)
        assert 3 <= len(env.files()) < 12, "the client wrote too fast to be killed mid-job"
        server = json.loads((jobdir / "server.json").read_text())
        assert server["state"] == "healthy"
        os.kill(server["pid"], signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out + err
    assert "the server exited (killed by SIGKILL) while the client ran" in out, out + err
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert s == 1 and job["state"] == "failed" and job["server"]["state"] == "exited", job
    assert job["reason"].startswith("the server exited (killed by SIGKILL) while the client ran"), job["reason"]
    written = {p.name: p.stat().st_mtime_ns for p in env.files()}
    assert 3 <= len(written) < 12
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    # extract again: a new job, a new server, only the missing samples
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert f"Saved {12 - len(written)} new data points" in out
    assert len(env.jobdirs()) == 2
    assert all((env.out / n).stat().st_mtime_ns == t for n, t in written.items())
    for i in range(len(rows())):
        assert_sample_is_row(env.out / f"hs_{i}.safetensors", i)
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert s == 0 and rec["job"]["state"] == "succeeded" and rec["job"]["server"]["state"] == "stopped"
