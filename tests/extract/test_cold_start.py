"""A job's cold start over the real sshd: seconds from launch to the engine's readiness
and to the first file, in status (text and --json) and in the next launch's plan. The 0.3.0 flow's stand-in
drives the shipped script (its data_config.json marks the generator ready); the server flow's stand-in
server answers its health check only after --startup-seconds. What the sandbox cannot show (vLLM's real
start) is measured on a GPU by benchmarks/gpu/throughput.py."""

from __future__ import annotations

import json

import pytest

from tests.extract import test_server_flow as srvflow
from tests.extract.test_jobs import _no_job_left_behind, cli_json  # noqa: F401  (its autouse fixture)
from tests.extract.test_launch_plan_ssh import _env

pytestmark = pytest.mark.timeout(180)


def test_the_030_flows_cold_start_in_status_and_the_next_plan(tmp_path, sshd, cli):
    env = _env(tmp_path, sshd, samples=8, extra=["--sleep", "0.4"])   # each batch of 2 takes 0.4 s before its files
    s, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert s == 0, err + out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job, cs = rec["job"], rec["job"]["cold_start"]
    assert job["state"] == "succeeded" and cs["ready_from"] == "data_config.json, written once the generator is up"
    cfg = (env.out / "data_config.json").stat().st_mtime
    jobrec = json.loads((env.job() / "job.json").read_text())
    assert cs["ready_after_s"] == pytest.approx(cfg - jobrec["created_at"], abs=0.11)
    first = min(f.stat().st_mtime for f in env.out.glob("data_*.pt"))
    assert cs["first_file_after_s"] == pytest.approx(first - jobrec["created_at"], abs=0.11)
    assert cs["first_file_after_ready_s"] >= 0.3          # the first batch's sleep lies between them
    assert json.loads((env.job() / "coldstart.json").read_text())["cold_start"] == cs   # kept once known
    s, text, _ = cli(*env.argv("status", "testhost"))
    assert "cold start: engine ready " in text and "after launch (data_config.json, written once the generator is up)" \
        in text and "; first file " in text
    # the next launch's plan carries what this job took to start
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run", "--overwrite")
    assert s == 0, err
    assert rec["preflight"]["plan"]["cold_start"] == {**cs, "job_id": job["job_id"]}
    s, text, err = cli(*env.argv("extract", "testhost", "--dry-run", "--overwrite"))
    assert f"cold start of job {job['job_id']} here: engine ready" in text + err


def test_a_host_without_an_earlier_job_plans_no_cold_start(tmp_path, sshd, cli):
    env = _env(tmp_path, sshd, samples=4)
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, err
    assert rec["preflight"]["plan"]["cold_start"] is None


def test_the_server_flows_cold_start_is_its_health_check_then_its_first_file(tmp_path, sshd, cli):
    env = srvflow.Env(tmp_path, sshd, server_args=["--startup-seconds", "1.5"])
    s, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert s == 0, err + out
    s, rec, _ = srvflow.cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    cs = job["cold_start"]
    (jobdir,) = env.jobdirs()
    srv = json.loads((jobdir / "server.json").read_text())
    created = json.loads((jobdir / "job.json").read_text())["created_at"]
    assert cs["ready_from"] == "the server's health check"
    assert cs["ready_after_s"] == pytest.approx(srv["healthy_at"] - created, abs=0.11)
    assert cs["ready_after_s"] >= job["server"]["ready_after_s"] >= 1.4     # the stand-in's own start, and more
    first = min(f.stat().st_mtime for f in env.files())
    assert cs["first_file_after_s"] == pytest.approx(first - created, abs=0.11) and cs["first_file_after_ready_s"] >= 0
    s, text, _ = cli(*env.argv("status", "testhost"))
    assert "cold start: engine ready " in text and "(the server's health check); first file " in text
