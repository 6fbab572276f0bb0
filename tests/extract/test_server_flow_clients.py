"""Several clients in a two-process job over a real sshd: the shipped launcher (run_clients.py, uploaded by
``extract.files`` as the speculators 0.9.0 playbooks ship it) runs the sandbox's STAND-IN client as N
processes, each its contiguous share of the rows (speculators' --world-size N --rank r); one that fails
gives the job its exit status while the others' files are written, a rerun writes only the missing ones,
and stop leaves no process of the job. With extract.server.client_start: launch the clients start beside the
server and wait for its health check themselves."""

from __future__ import annotations

import pytest
import yaml

from remote_ops.agent.jobs import port_free
from tests.conftest import REPO
from tests.extract.test_server_flow import CLIENT, Env, _nothing_left, cli_json, marker_pids  # noqa: F401

LAUNCHER = REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "run_clients.py"

pytestmark = pytest.mark.timeout(180)


def with_clients(env: Env, n: int, *client_args: str) -> Env:
    """The env's playbook with its client run through the shipped launcher as ``n`` clients."""
    pb = yaml.safe_load(env.playbook.read_text())
    ex = pb["extract"]
    client = ex["command"][1:] + list(client_args)
    assert client[0] == str(CLIENT)
    ex["command"] = ["{python}", "run_clients.py", "--clients", str(n),
                     "--health", "http://127.0.0.1:{port}/health", "--preload", "json", "--", *client]
    ex["files"] = {str(LAUNCHER): "run_clients.py"}
    env.playbook.write_text(yaml.safe_dump(pb, sort_keys=False))
    return env


def test_three_clients_write_every_file_each_its_share_then_verify(tmp_path, sshd, cli):
    env = with_clients(Env(tmp_path, sshd), 3)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert (tmp_path / "run_clients.py").read_bytes() == LAUNCHER.read_bytes()      # uploaded into the workdir
    for r in range(3):
        assert f"[run_clients] rank {r}/3: imports " in out and "server ready after" in out
    assert out.count("Processing 4 samples") == 3 and out.count("Saved 4 new data points") == 3
    assert "succeeded" in out and "12/12 samples" in out and len(env.files()) == 12
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["state"] == "succeeded" and rec["job"]["label"].startswith("STAND-IN")
    assert rec["job"]["exit_code"] == 0
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12 and rec["checked"] == 12
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_a_failing_client_fails_the_job_with_its_status_and_the_others_files_stay(tmp_path, sshd, cli):
    env = with_clients(Env(tmp_path, sshd), 3, "--fail-rank", "1")
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1
    assert "STAND-IN: rank 1 died (--fail-rank)" in out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["state"] == "failed" and rec["job"]["exit_code"] == 3
    # rank 1's share of 12 rows over 3 clients is rows 4-7: exactly those are missing
    assert sorted(int(p.name[3:-len(".safetensors")]) for p in env.files()) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    # again without the failure: ranks 0 and 2 have nothing left, rank 1 writes its 4
    with_clients_again = yaml.safe_load(env.playbook.read_text())
    cmd = with_clients_again["extract"]["command"]
    i = cmd.index("--fail-rank")
    del cmd[i:i + 2]
    env.playbook.write_text(yaml.safe_dump(with_clients_again, sort_keys=False))
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert out.count("All samples for this rank already processed!") == 2 and "Saved 4 new data points" in out
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12


def test_stop_mid_run_leaves_no_client_and_no_server(tmp_path, sshd, cli):
    env = with_clients(Env(tmp_path, sshd, client_args=["--concurrency", "1", "--sample-delay", "2"]), 3)
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status == 0, err
    env.wait_files(3)
    s, st, _ = cli_json(cli, env, "status", "testhost")
    assert st["job"]["state"] == "running"
    assert len(marker_pids(tmp_path)) >= 5          # the supervisor's children: launcher, 3 clients, server
    status, rep, err = cli_json(cli, env, "stop", "testhost")
    assert status == 0, err
    assert rep["clean"] and rep["remaining"] == [] and rep["job"]["state"] == "stopped"
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    assert 3 <= len(env.files()) < 12


def test_clients_started_beside_the_server_wait_for_its_health_then_write_every_file(tmp_path, sshd, cli):
    """extract.server.client_start: launch starts the client right after the server: the launcher's clients
    import, then wait for /health themselves (the server takes 3 s here), then send their rows."""
    env = with_clients(Env(tmp_path, sshd, server_args=["--startup-seconds", "3"],
                           server={"client_start": "launch"}), 3)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    ready = [float(out.split(f"[run_clients] rank {r}/3: imports ")[1].split("server ready after ")[1].split(" s")[0])
             for r in range(3)]
    assert all(t >= 2.0 for t in ready), ready           # each waited for the server, none failed on it
    assert out.count("Saved 4 new data points") == 3 and len(env.files()) == 12
    assert "Request timed out" not in out and "Skipping sample" not in out
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
