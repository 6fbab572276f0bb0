"""The two-process job (extract.server + the client command: speculators >= 0.5's server flow) over a real
sshd: launch, health wait, client, status/logs/--tail of both, a server that dies, stop of both trees,
resume, the port and import preflight, and verify of the hs_<N>.safetensors layout.

The server and the client are the sandbox's STAND-INs (remote_ops/sandbox_assets/server_standin.py,
client_standin.py: stdlib HTTP + torch CPU; the host's interpreter here has neither vLLM nor speculators
nor openai). What they cannot show (vLLM itself, speculators' real client) is run on a GPU by
benchmarks/gpu/server_check.py.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from remote_ops.agent.jobs import port_free   # the preflight's own test of the port
from tests.conftest import REPO

ASSETS = REPO / "remote_ops" / "sandbox_assets"
SERVER = ASSETS / "server_standin.py"
CLIENT = ASSETS / "client_standin.py"
MARKER = "REMOTE_OPS_JOB_ID"
LAYERS, HIDDEN = 4, 16

pytestmark = pytest.mark.timeout(180)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rows(n: int = 12) -> list[list[int]]:
    return [[1] + [(i * 37 + k * 11) % 1000 + 4 for k in range(5 + (i % 7) * 3)] for i in range(n)]


class Env:
    def __init__(self, tmp_path, sshd, *, server_args=(), client_args=(), samples=12, extract=None, server=None,
                 top=None):
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.port = free_port()
        data = tmp_path / "data.jsonl"
        data.write_text("".join(json.dumps({"input_ids": r}) + "\n" for r in rows()))
        entry = sshd.host_entry(sys.executable, env={"REMOTE_OPS_STATE_DIR": str(self.state)},
                                vars={"data": str(tmp_path), "port": self.port})
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump({"hosts": {"testhost": entry}}))
        srv = {"command": ["{python}", str(SERVER), "standin-model", "--port", "{port}",
                           "--hidden-states-path", "{vars.data}/staging", "--layers", str(LAYERS),
                           "--hidden", str(HIDDEN), *server_args],
               "port": "{vars.port}", "health": {"path": "/health", "timeout_seconds": 60}}
        srv.update(server or {})
        ex = {"server": srv,
              "command": ["{python}", str(CLIENT), "--endpoint", "http://127.0.0.1:{port}/v1",
                          "--preprocessed-data", "{vars.data}/data.jsonl", "--output", "{output_dir}",
                          "--max-samples", str(samples), *client_args],
              "workdir": str(tmp_path), "output_dir": "{vars.data}/out", "expected_samples": samples,
              "output_layout": "hs_safetensors", "stop_grace_seconds": 2}
        ex.update(extract or {})
        self.playbook = tmp_path / "pb.yaml"
        self.playbook.write_text(yaml.safe_dump({"name": "serverflow", **(top or {}), "extract": ex}, sort_keys=False))
        self.out = tmp_path / "out"

    def argv(self, *args):
        return ["-i", str(self.inventory)] + list(args) + ["--playbook", str(self.playbook)]

    def subprocess(self, *args):
        return subprocess.Popen([sys.executable, "-m", "remote_ops"] + self.argv(*args), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def jobdirs(self):
        root = self.state / "jobs"
        return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []

    def wait_log(self, text, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for d in self.jobdirs():
                log = d / "log"
                if log.exists() and text in log.read_text(errors="replace"):
                    return d
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in the log")

    def wait_files(self, n, timeout=60):
        """Until the output directory holds at least ``n`` sample files, or ``timeout`` seconds pass (no
        error then: the caller's own checks judge what is there)."""
        deadline = time.time() + timeout
        while len(self.files()) < n and time.time() < deadline:
            time.sleep(0.1)

    def files(self):
        return sorted(self.out.glob("hs_*.safetensors"))


def marker_pids(tmp_path) -> list[int]:
    """Live processes with a job marker whose state dir is this test's."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        if stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3] == b"Z":
            continue
        if any(e.startswith(MARKER.encode() + b"=") for e in env) and \
                any(e.startswith(b"REMOTE_OPS_STATE_DIR=" + str(tmp_path).encode()) for e in env):
            found.append(int(name))
    return found


@pytest.fixture(autouse=True)
def _nothing_left(tmp_path):
    yield
    for pid in marker_pids(tmp_path):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def cli_json(cli, env, *args):
    status, out, err = cli(*env.argv(*args, "--json"))
    return status, json.loads(out) if out.strip() else None, err


def read_sample(path):
    import torch

    from remote_ops.agent.outputs import safetensors as verify_hs
    header, start, problem = verify_hs.read_header(str(path))
    assert problem is None, problem
    return verify_hs.load_tensors(torch, str(path), header, start, ["hidden_states", "token_ids"])


def assert_sample_is_row(path, i):
    import torch

    from remote_ops.sandbox_assets.server_standin import expected_hidden_states
    t = read_sample(path)
    assert t["token_ids"].tolist() == rows()[i]
    want = expected_hidden_states(torch, rows()[i], LAYERS, HIDDEN).to(torch.bfloat16)
    assert t["hidden_states"].shape == (len(rows()[i]), LAYERS, HIDDEN)
    assert torch.equal(t["hidden_states"], want)


# ------------------------------------------------------------------ tests
def test_server_then_client_tail_status_logs_verify_then_resume(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--startup-seconds", "1.5"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    # both processes in one followed log: the server's lines labelled, then the client's
    assert "[server] INFO:     Uvicorn running on" in out and "[server] STAND-IN: stdlib HTTP server" in out
    assert f"server healthy after" in out and f"http://127.0.0.1:{env.port}/health" in out
    assert out.index("server healthy after") < out.index("EAGLE Offline Data Generation")
    assert "Data generation complete!" in out and "succeeded" in out and "12/12 samples" in out
    assert "stopping the server" in out
    assert len(env.files()) == 12
    for i in (0, 5, 11):
        assert_sample_is_row(env.out / f"hs_{i}.safetensors", i)
    assert not list((tmp_path / "staging").glob("*.safetensors"))     # every file moved into place
    # status: the server's record, samples counted in the layout
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert s == 0 and job["state"] == "succeeded" and job["layout"] == "hs_safetensors"
    assert job["samples"]["done"] == 12 and job["label"].startswith("STAND-IN")
    assert job["server"]["state"] == "stopped" and job["server"]["port"] == env.port
    assert job["server"]["ready_after_s"] >= 1.0 and job["server"]["log"].endswith("server.log")
    s, text, _ = cli(*env.argv("status", "testhost"))
    assert f"server: stopped, port {env.port}, healthy after" in text
    s, text, _ = cli(*env.argv("logs", "testhost", "-n", "400"))
    assert "[server] INFO:     Started server process" in text and "Saved 12 new data points" in text
    # the server is gone: nothing of the job left, the port free again
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12 and rec["checked"] == 12
    assert rec["layout"] == "hs_safetensors" and rec["layers_hidden"] == [[LAYERS, HIDDEN]]
    # resume: a lost file and a truncated one (a cross-device move cut short) are written again,
    # the others are not touched
    (env.out / "hs_3.safetensors").unlink()
    data = (env.out / "hs_7.safetensors").read_bytes()
    (env.out / "hs_7.safetensors").write_bytes(data[: len(data) // 2])
    kept = (env.out / "hs_9.safetensors").stat().st_mtime_ns
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and rec["gaps"] == [3] and [u["index"] for u in rec["unloadable"]] == [7]
    assert "truncated" in rec["unloadable"][0]["error"]
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "unreadable and will be regenerated: hs_7.safetensors" in out and "Saved 2 new data points" in out
    assert len(env.jobdirs()) == 2
    assert_sample_is_row(env.out / "hs_3.safetensors", 3)
    assert_sample_is_row(env.out / "hs_7.safetensors", 7)
    assert (env.out / "hs_9.safetensors").stat().st_mtime_ns == kept
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"]


def test_a_server_command_with_api_server_count_runs_on_the_standin(tmp_path, sshd, cli):
    """The playbooks' var api_server_count puts vLLM's --api-server-count N on the server command: the STAND-IN takes
    it (and -asc), says it runs one process, and the job ends as without it."""
    env = Env(tmp_path, sshd, server_args=["--api-server-count", "4"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "[server] " in out and "STAND-IN: --api-server-count 4 taken, one API-server process runs" in out
    assert "succeeded" in out and len(env.files()) == 12
    assert_sample_is_row(env.out / "hs_11.safetensors", 11)
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    r = subprocess.run([sys.executable, str(SERVER), "m", "-asc", "2", "--crash-at-start"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3 and "--api-server-count 2" not in r.stdout       # parsed (argparse would exit 2)


def test_server_dying_under_the_client_fails_the_job_with_its_last_lines(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--exit-after", "5"], client_args=["--concurrency", "1",
                                                                             "--sample-delay", "0.3"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1
    assert "the server exited (exit code 1) while the client ran" in out
    assert "RuntimeError: STAND-IN engine died after 5 requests" in out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert s == 1 and job["state"] == "failed" and job["server"]["state"] == "exited"
    assert job["reason"].startswith("the server exited (exit code 1) while the client ran: ")
    assert job["error_lines"][-1] == "RuntimeError: STAND-IN engine died after 5 requests (--exit-after)"
    assert 4 <= len(env.files()) <= 6
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_server_that_cannot_start_fails_before_the_client(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--crash-at-start"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "failed" and job["server"]["state"] == "failed"
    assert job["reason"] == (f"the server exited (exit code 3) before it answered http://127.0.0.1:{env.port}/health: "
                             "ValueError: STAND-IN: the model failed to load (--crash-at-start)")
    log = (env.jobdirs()[0] / "log").read_text()
    assert "EAGLE Offline Data Generation" not in log and not env.files()


def test_health_timeout_kills_the_server(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--startup-seconds", "600"],
              server={"health": {"path": "/health", "timeout_seconds": 2}})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1
    assert f"the server did not answer http://127.0.0.1:{env.port}/health with 200 within 2s" in out
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_stop_mid_run_stops_both_trees_then_relaunch_resumes(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--ignore-term"], client_args=["--concurrency", "1",
                                                                          "--sample-delay", "0.4"])
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status == 0, err
    env.wait_files(2)
    s, st, _ = cli_json(cli, env, "status", "testhost")
    assert st["job"]["state"] == "running" and st["job"]["server"]["state"] == "healthy"
    server_pid = st["job"]["server"]["pid"]
    status, rep, err = cli_json(cli, env, "stop", "testhost")
    assert status == 0, err
    assert rep["clean"] and rep["remaining"] == [] and rep["job"]["state"] == "stopped"
    # it ignores SIGTERM: SIGKILLed after the grace (by stop, or by the supervisor's own server stop)
    assert server_pid in [p["pid"] for p in rep["terminated"]] and not Path(f"/proc/{server_pid}").exists()
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]
    done = len(env.files())
    assert 2 <= done < 12
    # relaunch: a new job, same output directory, only the rest is generated
    pb = yaml.safe_load(env.playbook.read_text())
    pb["extract"]["server"]["command"].remove("--ignore-term")
    pb["extract"]["command"][pb["extract"]["command"].index("--sample-delay") + 1] = "0"
    env.playbook.write_text(yaml.safe_dump(pb, sort_keys=False))
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert f"Saved {12 - done} new data points" in out and len(env.files()) == 12
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"]


def test_stop_while_the_server_starts(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, server_args=["--startup-seconds", "600"])
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status == 0 and rec["job"]["state"] == "starting", err
    env.wait_log("waiting for http://127.0.0.1")
    s, st, _ = cli_json(cli, env, "status", "testhost")
    assert st["job"]["state"] == "starting" and st["job"]["server"]["state"] == "starting"
    status, rep, err = cli_json(cli, env, "stop", "testhost")
    assert status == 0 and rep["clean"], err
    assert rep["job"]["state"] == "stopped"
    assert rep["job"]["reason"] == "stopped by remote-ops' stop while the server was starting"
    assert marker_pids(tmp_path) == [] and port_free(env.port)["free"]


def test_preflight_refuses_a_busy_port_and_a_server_that_cannot_import(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd)
    holder = socket.socket()
    holder.bind(("127.0.0.1", env.port))
    holder.listen()
    try:
        status, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    finally:
        holder.close()
    assert status == 8
    assert f"port {env.port} is not free on the host" in rec["message"]
    assert rec["preflight"]["server"]["port"]["free"] is False
    (tmp_path / "b").mkdir()
    env2 = Env(tmp_path / "b", sshd, server={"import_check": ["no_such_server_module_xyz"]})
    status, rec, err = cli_json(cli, env2, "extract", "testhost", "--dry-run")
    assert status == 9
    assert "server: import no_such_server_module_xyz failed" in rec["message"]
    assert not env2.jobdirs()


def test_requires_is_checked_against_the_interpreter_that_imports_each_package(tmp_path, sshd, cli):
    """A two-process job is not patched first: its playbook's requires is checked by the preflight, each
    package against the version the import probe of the interpreter that imports it reported."""
    import tqdm
    env = Env(tmp_path, sshd, top={"requires": {"tqdm": ">=999", "nosuchpkg": "==1.0"}},
              extract={"import_check": ["tqdm"]}, server={"import_check": ["json"]})
    status, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert status == 8, err
    assert f"requires: tqdm {tqdm.__version__} does not satisfy tqdm>=999" in rec["message"]
    notes = rec["preflight"]["notes"]
    assert "requires: nosuchpkg not checked (no import probe imports it)" in notes
    env.playbook.write_text(env.playbook.read_text().replace(">=999", f"=={tqdm.__version__}"))
    status, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert status == 0, err
    assert f"requires: tqdm {tqdm.__version__} (import probes)" in rec["preflight"]["notes"]


def _get(url, key=None):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key is not None else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_server_api_key_refuses_requests_without_it_and_never_shows(tmp_path, sshd, cli):
    """extract.server.api_key: a key made for the launch reaches the server as VLLM_API_KEY and the
    client as the named variable; another user's request without it (or with another) gets 401 while the
    job runs, the client's get through, and the key is in no argv, log, journal or JSON."""
    env = Env(tmp_path, sshd, server={"api_key": {"client_env": "OPENAI_API_KEY"}},
              client_args=["--concurrency", "1", "--sample-delay", "0.3"])
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 0, err
    assert "server API key: generated for this launch, given to the server as VLLM_API_KEY and to the " \
           "client as OPENAI_API_KEY" in " ".join(out.split())
    status, rec, err = cli_json(cli, env, "extract", "testhost")
    assert status == 0, err
    launched = json.dumps(rec)
    env.wait_files(2)
    s, st, _ = cli_json(cli, env, "status", "testhost")
    assert st["job"]["state"] == "running" and st["job"]["server"]["state"] == "healthy"
    server_pid = st["job"]["server"]["pid"]
    key = dict(e.split(b"=", 1) for e in Path(f"/proc/{server_pid}/environ").read_bytes().split(b"\0")
               if b"=" in e)[b"VLLM_API_KEY"].decode()
    assert len(key) >= 40
    base = f"http://127.0.0.1:{env.port}"
    assert _get(base + "/v1/models") == (401, {"error": "Unauthorized"})
    assert _get(base + "/v1/models", "EMPTY")[0] == 401           # what speculators 0.9.0's client sends
    assert _get(base + "/v1/models", key)[0] == 200
    assert _get(base + "/health")[0] == 200                         # the supervisor's health check: open
    argvs = [Path(f"/proc/{p}/cmdline").read_bytes() for p in marker_pids(tmp_path)]
    assert argvs and not [a for a in argvs if key.encode() in a]
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert len(env.files()) == 12 and "succeeded" in out
    s, text, _ = cli(*env.argv("logs", "testhost", "-n", "1000"))
    s, st, _ = cli_json(cli, env, "status", "testhost")
    shown = launched + out + err + text + json.dumps(st)
    on_disk = b"".join(p.read_bytes() for p in env.state.rglob("*") if p.is_file())
    assert key not in shown and key.encode() not in on_disk
    assert not list(env.state.rglob("secrets.json"))                # read once, removed


def test_server_api_key_schema(tmp_path, sshd, cli):
    def fresh(name, **kw):
        (tmp_path / name).mkdir()
        return Env(tmp_path / name, sshd, **kw)
    for i, bad in enumerate(({"client_env": "not a name"}, "OPENAI_API_KEY", {"client_env": "K", "x": 1})):
        env = fresh(f"bad{i}", server={"api_key": bad})
        status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
        assert status == 2 and "server.api_key must be a mapping" in err and "pb.yaml:" in err, err
    env = fresh("clash", server={"api_key": {"client_env": "K"}, "env": {"VLLM_API_KEY": "x"}})
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 2 and "server.env sets VLLM_API_KEY" in err, err
    env = fresh("argv", server_args=["--api-key", "abc"])
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 2 and "--api-key on the server command" in err and "server.api_key" in err, err
    env = fresh("nokey")
    status, out, err = cli(*env.argv("extract", "testhost", "--dry-run"))
    assert status == 0 and "has no API key: any user of this host can send it requests" in " ".join(out.split())
