"""``extract.server.client_start: launch`` over a real sshd: the supervisor starts the client right after the
server, not once the server is healthy, so that the client's own start (on a GPU host: speculators' imports)
overlaps the server's. The client waits for the server itself: here a small inline stdlib wait in the client
command, then the sandbox's STAND-IN client (the shipped launcher, run_clients.py, does the same with its
``--health``). Shown: the client runs while the server is still starting and the job writes every file; a
server that dies before it is healthy, a health timeout and a stop during the server's start end the job as
they do without the key, with the client stopped and no process of the job left; a client that ends before
the server is healthy ends the job with its exit status.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from remote_ops.agent.jobs import port_free
from tests.extract.test_server_flow import CLIENT, SERVER, Env, _nothing_left, cli_json, marker_pids  # noqa: F401

pytestmark = pytest.mark.timeout(180)

# the client's own wait for the server: writes MARKER (the time it started) first, then polls URL until it
# answers 200 (at most LIMIT seconds: exit 1 after), then becomes the client (exec). No braces: the
# playbook's templates would read them.
WAIT_THEN_CLIENT = (
    "import os, sys, time, urllib.request\n"
    "marker, url, limit = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
    "open(marker + '.tmp', 'w').write(repr(time.time()))\n"
    "os.replace(marker + '.tmp', marker)\n"
    "deadline = time.time() + limit\n"
    "while True:\n"
    "    try:\n"
    "        if urllib.request.urlopen(url, timeout=2).status == 200:\n"
    "            break\n"
    "    except OSError:\n"
    "        pass\n"
    "    if time.time() > deadline:\n"
    "        sys.exit('STAND-IN client wait error: no answer from ' + url)\n"
    "    time.sleep(0.1)\n"
    "print('client wait: server ready', flush=True)\n"
    "os.execv(sys.executable, [sys.executable] + sys.argv[4:])\n")


def launch_env(tmp_path, sshd, *, wait_limit=120, server=None, **kw) -> Env:
    """An Env whose playbook has ``client_start: launch`` and a client that waits for the health URL itself."""
    env = Env(tmp_path, sshd, server={"client_start": "launch", **(server or {})}, **kw)
    pb = yaml.safe_load(env.playbook.read_text())
    ex = pb["extract"]
    assert ex["command"][1] == str(CLIENT)
    env.marker = tmp_path / "client_started"
    ex["command"] = ["{python}", "-c", WAIT_THEN_CLIENT, str(env.marker), "http://127.0.0.1:{port}/health",
                     str(wait_limit), *ex["command"][1:]]
    env.playbook.write_text(yaml.safe_dump(pb, sort_keys=False))
    return env


def wait_for(predicate, timeout=60, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} never happened")


def job_log(env) -> str:
    return (env.jobdirs()[0] / "log").read_text(errors="replace")


def test_the_client_runs_while_the_server_starts_then_every_file(tmp_path, sshd, cli):
    env = launch_env(tmp_path, sshd, server_args=["--startup-seconds", "8"])
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0 and rec["spec"]["server"]["client_start"] == "launch", err
    tail = env.subprocess("extract", "testhost", "--tail")     # launches and follows
    try:
        wait_for(env.marker.exists, what="the client's start")
        jobdir = env.jobdirs()[0]
        # while the server loads: the job is running (its client is), its server starting, no error
        s, st, err = cli_json(cli, env, "status", "testhost")
        job = st["job"]
        assert s == 0 and job["state"] == "running" and job["server"]["state"] == "starting", (err, job)
        assert job["pid"] and job["server"]["pid"] and job["pid"] != job["server"]["pid"]
        assert not json.loads((jobdir / "server.json").read_text()).get("healthy_at")
        s, text, err = cli(*env.argv("status", "testhost"))
        assert s == 0 and f"server: starting, port {env.port}" in text and "running" in text, err + text
        out, err = tail.communicate(timeout=150)
    finally:
        if tail.poll() is None:
            tail.kill()
    assert tail.returncode == 0, err + out
    assert "succeeded" in out and "12/12 samples" in out and len(env.files()) == 12
    started = float(env.marker.read_text())
    server = json.loads((jobdir / "server.json").read_text())
    run = json.loads((jobdir / "run.json").read_text())
    assert run["started_at"] < started < server["healthy_at"]            # the client's start overlapped the server's
    assert server["healthy_at"] - server["started_at"] >= 7.5
    log = job_log(env)
    # (the client's own wait may see the server ready before the supervisor's next health poll logs it)
    assert log.index(f"job {job['job_id']} starting: ") < log.index("server healthy after")
    assert "client wait: server ready" in log
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["server"]["state"] == "stopped"
    # the cold start: launch to the health check, then to the first file, which came after it
    cs = job["cold_start"]
    assert cs["ready_from"] == "the server's health check"
    assert cs["ready_after_s"] == round(server["healthy_at"] - job["created_at"], 1) >= 7.5
    # (the supervisor polls the health check every 0.5 s: the client, polling its own, may be a poll ahead)
    assert cs["first_file_after_s"] >= cs["ready_after_s"] - 1.0 and cs["first_file_after_ready_s"] is not None
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_a_server_that_dies_before_it_is_healthy_stops_the_client(tmp_path, sshd, cli):
    env = launch_env(tmp_path, sshd)
    pb = yaml.safe_load(env.playbook.read_text())
    # the server stand-in crashes at its start, 2 s late: the client is running by then
    late = "import os, sys, time; time.sleep(2); os.execv(sys.executable, [sys.executable] + sys.argv[1:])"
    srv = pb["extract"]["server"]
    srv["command"] = [srv["command"][0], "-c", late, *srv["command"][1:], "--crash-at-start"]
    env.playbook.write_text(yaml.safe_dump(pb, sort_keys=False))
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1, err + out
    assert env.marker.exists()
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "failed" and job["server"]["state"] == "failed"
    assert job["reason"] == (f"the server exited (exit code 3) before it answered http://127.0.0.1:{env.port}/health: "
                             "ValueError: STAND-IN: the model failed to load (--crash-at-start)")
    ext = json.loads((env.jobdirs()[0] / "exit.json").read_text())
    assert ext["failed_by"] == "server" and ext["exit_code"] is None
    log = job_log(env)
    assert "stopping the client (process group" in log and "client killed by SIGTERM" in log
    assert "EAGLE Offline Data Generation" not in log and not env.files()
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_health_timeout_stops_the_server_and_the_client(tmp_path, sshd, cli):
    env = launch_env(tmp_path, sshd, server_args=["--startup-seconds", "600"],
                     server={"health": {"path": "/health", "timeout_seconds": 3}})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1, err + out
    assert f"the server did not answer http://127.0.0.1:{env.port}/health with 200 within 3s" in out
    assert env.marker.exists() and "client killed by SIGTERM" in job_log(env)
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["state"] == "failed" and rec["job"]["reason"].startswith("the server did not answer")
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_stop_while_the_server_starts_stops_both(tmp_path, sshd, cli):
    env = launch_env(tmp_path, sshd, server_args=["--startup-seconds", "600"])
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status == 0, err
    wait_for(env.marker.exists, what="the client's start")
    s, st, _ = cli_json(cli, env, "status", "testhost")
    assert st["job"]["state"] == "running" and st["job"]["server"]["state"] == "starting"
    client_pid = st["job"]["pid"]
    status, rep, err = cli_json(cli, env, "stop", "testhost")
    assert status == 0 and rep["clean"], err
    assert rep["job"]["state"] == "stopped"
    assert rep["job"]["reason"] == "stopped by remote-ops' stop while the server was starting"
    assert client_pid in [p["pid"] for p in rep["terminated"]]
    ext = json.loads((env.jobdirs()[0] / "exit.json").read_text())
    assert ext["before_healthy"] is True and "before_client" not in ext
    assert "stopped while the server was starting" in job_log(env)
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_a_client_that_ends_before_the_server_is_healthy_ends_the_job_with_its_status(tmp_path, sshd, cli):
    # its own wait gives up after 1 s: the job ends as any client's end, the server stopped
    env = launch_env(tmp_path, sshd, wait_limit=1, server_args=["--startup-seconds", "600"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1, err + out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "failed" and job["exit_code"] == 1 and job["server"]["state"] == "stopped"
    assert job["reason"] == f"exit code 1: STAND-IN client wait error: no answer from http://127.0.0.1:{env.port}/health"
    log = job_log(env)
    assert "client exit code 1" in log and "stopping the server" in log and "server healthy" not in log
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
