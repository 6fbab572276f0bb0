"""extract / status / logs / stop / verify over a real sshd, with a stand-in job that runs real torch.

The "host" is this machine reached through the test sshd; its python is this venv's (torch + tqdm).
Each test isolates the host-side state with $REMOTE_OPS_STATE_DIR (set in the inventory's env).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from remote_ops.connect.transport import ConnectOptions, Session
from tests.conftest import FIXTURES, REPO, standin_extract, write_playbook

MARKER = "REMOTE_OPS_JOB_ID"

pytestmark = pytest.mark.timeout(180)


# ------------------------------------------------------------------ helpers
class Env:
    def __init__(self, tmp_path, sshd, extra_args=(), extract=None, host_env=None, host_vars=None):
        self.tmp = tmp_path
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.out = tmp_path / "out"
        self.sshd = sshd
        env = {"REMOTE_OPS_STATE_DIR": str(self.state)}
        env.update(host_env or {})
        entry = sshd.host_entry(sys.executable, env=env, vars={"data": str(tmp_path), **(host_vars or {})})
        self.inventory = tmp_path / "inventory.yaml"
        self.inventory.write_text(yaml.safe_dump({"hosts": {"testhost": entry}}))
        ex = standin_extract("--batch-size", "2", *extra_args, workdir=tmp_path, output_dir="{vars.data}/out")
        ex.update(extract or {})
        self.playbook = write_playbook(tmp_path / "pb.yaml", "standin", ex)

    def argv(self, *args):
        return ["-i", str(self.inventory)] + list(args) + ["--playbook", str(self.playbook)]

    def subprocess(self, *args, **kw):
        return subprocess.Popen([sys.executable, "-m", "remote_ops"] + self.argv(*args), cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

    def session(self):
        from remote_ops.connect import inventory
        host = inventory.load(str(self.inventory)).hosts["testhost"]
        return Session(host, ConnectOptions()).open()

    def jobdirs(self):
        root = self.state / "jobs"
        return sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []

    def job(self):
        (d,) = self.jobdirs()
        return d

    def wait_log(self, text, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            for d in self.jobdirs():
                log = d / "log"      # the job dir exists a moment before its supervisor opens the log
                if log.exists() and text in log.read_text(errors="replace"):
                    return d
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in the log")

    def wait_progress(self, at_least, timeout=60):
        """Until an extract-progress line counts ``at_least`` samples done. Not one exact count: with
        several writer threads files finish together, so the count can step over any given number."""
        import re
        deadline = time.time() + timeout
        while time.time() < deadline:
            for d in self.jobdirs():
                log = d / "log"
                if log.exists() and any(int(n) >= at_least for n in
                                        re.findall(r'"samples_done":(\d+),', log.read_text(errors="replace"))):
                    return d
            time.sleep(0.05)
        raise AssertionError(f"no progress line with samples_done >= {at_least} in the log")


def marker_pids(value=None):
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
        for e in env:
            if e.startswith(MARKER.encode() + b"=") and (value is None or e == f"{MARKER}={value}".encode()):
                found.append(int(name))
    return found


def cli_json(cli, env: Env, *args):
    status, out, err = cli(*env.argv(*args, "--json"))
    return status, json.loads(out) if out.strip() else None, err


def _state_dir_of(pid: int) -> str | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for e in env:
        if e.startswith(b"REMOTE_OPS_STATE_DIR="):
            return e.split(b"=", 1)[1].decode(errors="replace")
    return None


@pytest.fixture(autouse=True)
def _no_job_left_behind(tmp_path):
    """A failed test must not leak stubborn workers; only this test's jobs (state dir under its
    tmp_path) are touched, never a job of the user's or of a suite running beside this one."""
    before = set(marker_pids())
    yield
    mine = [pid for pid in set(marker_pids()) - before
            if (_state_dir_of(pid) or "").startswith(str(tmp_path))]
    for pid in mine:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ------------------------------------------------------------------ tests
def test_launch_tail_success_then_status_logs_verify(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "10", "--sleep", "0.05"], {"expected_samples": 10})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    assert "Generating hidden states" in out and "STAND-IN: torch-CPU stand-in" in out
    assert "succeeded" in out and "10/10 samples" in out
    # tqdm's \r updates are not dumped as one endless line
    assert "\r" not in out
    assert len(list((tmp_path / "out").glob("data_*.pt"))) == 10
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert s == 0 and rec["job"]["state"] == "succeeded" and rec["job"]["exit_code"] == 0
    assert rec["job"]["samples"]["done"] == 10 and rec["job"]["elapsed_s"] is not None
    stats = tmp_path / "stats.jsonl"
    s, out, _ = cli(*env.argv("logs", "testhost", "-n", "5"), env={"REMOTE_OPS_STATS_FILE": str(stats)})
    assert s == 0 and "ended: exit code 0" in out
    # the agent resolves the playbook's job itself: one exec, no status call before the log
    assert [v["ops"] for v in json.loads(stats.read_text().splitlines()[-1]).values()] == [[["jobs.logs"]]]
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 10 and rec["checked"] == 10
    # private job directory
    d = env.job()
    assert (d.stat().st_mode & 0o777) == 0o700
    assert all((f.stat().st_mode & 0o077) == 0 for f in d.iterdir())
    assert ((env.state / "jobs").stat().st_mode & 0o777) == 0o700


def test_crash_reports_exit_code_and_reason(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "10", "--crash-at", "5"])
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 1
    assert "failed" in out and "exit code 1" in out
    assert "RuntimeError: simulated failure while generating sample 5" in out
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert s == 1 and rec["job"]["state"] == "failed" and rec["job"]["exit_code"] == 1
    assert "RuntimeError" in rec["job"]["reason"]


def test_ctrl_c_detaches_and_kill_mid_tail_reattaches(tmp_path, sshd, cli, sigint_default):
    env = Env(tmp_path, sshd, ["--max-samples", "40", "--sleep", "0.3"])
    p = env.subprocess("extract", "testhost", "--tail")
    env.wait_log("Generating hidden states")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    (jid,) = [d.name for d in env.jobdirs()]
    assert f"still running; reattach with: remote-ops -i {env.inventory} logs testhost --job {jid} --follow" in err
    # a second follower is SIGKILLed (laptop closed): the job is untouched
    p = env.subprocess("extract", "testhost", "--tail")
    time.sleep(1.5)
    p.kill()
    p.wait()
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["state"] == "running"
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    assert "attached to running job" in err and "succeeded" in out
    assert len(env.jobdirs()) == 1
    assert len(list((tmp_path / "out").glob("data_*.pt"))) == 40


def _kill_ssh_connections(sshd):
    """Drop every live SSH connection: kill sshd's per-connection children (not the listener)."""
    master = sshd.server.proc.pid
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == master:
                os.kill(int(name), signal.SIGKILL)


def test_dropped_connection_resumes_from_last_byte(tmp_path, sshd):
    from remote_ops.extract import jobs
    from remote_ops.playbook.loader import load
    from remote_ops.extract.tail import Follower

    env = Env(tmp_path, sshd, ["--max-samples", "30", "--sleep", "0.1", "--ticks"])
    sess = env.session()
    pb = load(env.playbook)
    spec = jobs.parse_spec(pb, sess.host)
    job = jobs.launch(sess, spec)["job"]
    got, events = [], []
    holder = {"s": sess}

    def open_session():
        if holder["s"] is None:
            holder["s"] = env.session()
        return holder["s"]

    def drop():
        s, holder["s"] = holder["s"], None
        if s:
            s.close()

    def on_event(kind, payload):
        events.append(kind)
        if kind == "log":
            got.append(payload)

    killer = threading.Timer(1.5, _kill_ssh_connections, args=(sshd,))
    killer.start()
    f = Follower(open_session, drop, {"job_id": job["job_id"]}, on_event=on_event, budget=20,
                 read_timeout=10, sleep=lambda s: time.sleep(min(s, 0.2)))
    final = f.run()
    killer.join()
    assert final["state"] == "succeeded"
    assert f.reconnects >= 1 and "reconnecting" in events
    log = (Path(job["log"])).read_bytes().decode()
    assert "".join(got) == log          # every byte exactly once, nothing lost, nothing repeated
    assert log.count("tick ") == 15
    drop()


def test_tail_latency_line_written_to_printed(tmp_path, sshd):
    """Measures the delay from a line written on the host to the follower receiving it."""
    from remote_ops.extract import jobs
    from remote_ops.playbook.loader import load
    from remote_ops.extract.tail import Follower, LineSplitter

    env = Env(tmp_path, sshd, ["--max-samples", "60", "--sleep", "0.1", "--ticks"])
    sess = env.session()
    spec = jobs.parse_spec(load(env.playbook), sess.host)
    job = jobs.launch(sess, spec)["job"]
    split = LineSplitter()
    delays = []

    def on_event(kind, payload):
        if kind == "log":
            now = time.time()
            for k, v in split.feed(payload):
                if k == "line" and v.startswith("tick "):
                    delays.append(now - float(v.split()[1]))

    f = Follower(lambda: sess, lambda: None, {"job_id": job["job_id"]}, on_event=on_event)
    assert f.run()["state"] == "succeeded"
    delays.sort()
    med, p95, worst = delays[len(delays) // 2], delays[int(len(delays) * 0.95)], delays[-1]
    print(f"\ntail latency over {len(delays)} lines: median {med * 1000:.1f} ms, "
          f"p95 {p95 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    (tmp_path / "latency.json").write_text(json.dumps({"median": med, "p95": p95, "max": worst}))
    assert len(delays) == 30 and med < 0.5 and worst < 2.0
    sess.close()


def test_stop_with_stubborn_children_leaves_nothing(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "1", "--spawn-workers", "2", "--stubborn"])
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 0, err
    d = env.wait_log("started 2 worker(s)")
    job_id = d.name
    time.sleep(0.3)
    assert len(marker_pids(job_id)) >= 3          # the job and its two workers in their own sessions
    s, rep, err = cli_json(cli, env, "stop", "testhost", "--grace", "1")
    assert s == 0, err
    assert rep["clean"] and rep["remaining"] == []
    assert len(rep["killed"]) >= 2                # the stubborn workers needed SIGKILL
    assert marker_pids(job_id) == []
    assert rep["job"]["state"] == "stopped"
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert rec["job"]["state"] == "stopped" and s == 1


def test_job_exit_cleans_up_leftover_workers(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "4", "--spawn-workers", "1", "--stubborn"],
              {"stop_grace_seconds": 1})
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err
    deadline = time.time() + 10
    while marker_pids(env.job().name) and time.time() < deadline:
        time.sleep(0.1)
    assert marker_pids(env.job().name) == []
    assert json.loads((env.job() / "exit.json").read_text())["cleanup"]


def test_lost_job_detected(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "0.5"])
    assert cli(*env.argv("extract", "testhost"))[0] == 0
    d = env.job()
    run = json.loads((d / "run.json").read_text())
    os.kill(run["supervisor_pid"], signal.SIGKILL)      # like an OOM kill or a reboot:
    os.killpg(run["pgid"], signal.SIGKILL)              # nothing gets to record an exit
    time.sleep(0.5)
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert s == 1 and rec["job"]["state"] == "lost"
    assert "no exit status was recorded" in rec["job"]["reason"]
    # a lost job does not block a new launch
    s, rec, err = cli_json(cli, env, "extract", "testhost")
    assert s == 0 and not rec["attached"] and rec["job"]["job_id"] != d.name
    cli(*env.argv("stop", "testhost", "--grace", "1"))


def test_second_extract_attaches_instead_of_launching(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "0.5"])
    s1, r1, _ = cli_json(cli, env, "extract", "testhost")
    s2, r2, _ = cli_json(cli, env, "extract", "testhost")
    assert s1 == s2 == 0
    assert r1["attached"] is False and r2["attached"] is True
    assert r1["job"]["job_id"] == r2["job"]["job_id"] and len(env.jobdirs()) == 1
    status, out, _ = cli(*env.argv("extract", "testhost"))
    assert "already running, not started again" in out
    assert cli(*env.argv("stop", "testhost", "--grace", "1"))[0] == 0


def test_controller_killed_at_random_points_never_two_jobs(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "0.5"])
    rng = random.Random(7)
    for _ in range(6):
        p = env.subprocess("extract", "testhost")
        time.sleep(rng.uniform(0.05, 1.5))
        p.kill()
        p.wait()
        running = [d for d in env.jobdirs() if (d / "run.json").exists() and not (d / "exit.json").exists()]
        alive = {d.name for d in running if marker_pids(d.name)}
        assert len(alive) <= 1
    s, rec, _ = cli_json(cli, env, "extract", "testhost")
    assert s == 0
    live = {d.name for d in env.jobdirs() if marker_pids(d.name)}
    assert live <= {rec["job"]["job_id"]} and len(live) == 1
    assert cli(*env.argv("stop", "testhost", "--grace", "1"))[0] == 0


def test_secrets_never_visible(tmp_path, sshd, cli, monkeypatch):
    token = "hf_SeCrEt_" + "%08x" % random.getrandbits(32)
    monkeypatch.setenv("RO_TEST_TOKEN", token)
    token_file = tmp_path / "wandb_key"
    token_file.write_text("wb_" + token + "\n")
    env = Env(tmp_path, sshd, ["--max-samples", "8", "--sleep", "0.4", "--require-env", "HF_TOKEN",
                               "--require-env", "WANDB_API_KEY"],
              {"secrets": {"HF_TOKEN": {"from_env": "RO_TEST_TOKEN"},
                           "WANDB_API_KEY": {"from_file": str(token_file)}}})
    s, rec, err = cli_json(cli, env, "extract", "testhost")
    assert s == 0, err
    d = env.wait_log("HF_TOKEN is set")
    assert token not in json.dumps(rec) and token not in err
    # never on a command line (ps)
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                assert token.encode() not in Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                pass
    assert not (d / "secrets.json").exists()            # deleted before the job started
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0
    assert token not in out and token not in err
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    assert token not in json.dumps(rec) and rec["job"]["secret_names"] == ["HF_TOKEN", "WANDB_API_KEY"]
    for f in [*d.iterdir(), *(env.state / "jobs").iterdir()]:
        if f.is_file():
            assert token.encode() not in f.read_bytes(), f


def test_missing_secret_refused_before_launch(tmp_path, sshd, cli, monkeypatch):
    monkeypatch.delenv("RO_MISSING_TOKEN", raising=False)
    env = Env(tmp_path, sshd, ["--max-samples", "2"], {"secrets": {"HF_TOKEN": {"from_env": "RO_MISSING_TOKEN"}}})
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 2 and "RO_MISSING_TOKEN is not set" in err and "pb.yaml:" in err
    assert env.jobdirs() == []


def test_verify_catches_truncated_file_and_gap(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "12"], {"expected_samples": 12})
    assert cli(*env.argv("extract", "testhost", "--tail"))[0] == 0
    out_dir = tmp_path / "out"
    with open(out_dir / "data_3.pt", "r+b") as fh:
        fh.truncate(100)
    (out_dir / "data_7.pt").unlink()
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and not rec["ok"]
    assert rec["gaps"] == [7] and [u["index"] for u in rec["unloadable"]] == [3]
    status, out, _ = cli(*env.argv("verify", "testhost"))   # sampled mode still looks around gaps
    assert status == 1 and "gaps: 1" in out and "does not load: data_3.pt" in out


def test_watchdog_flags_hung_job(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--max-samples", "20", "--hang-at", "4"], {"watchdog_seconds": 1})
    assert cli(*env.argv("extract", "testhost"))[0] == 0
    env.wait_log("Generating hidden states", timeout=30)   # past the (slow) torch import
    deadline = time.time() + 30
    while time.time() < deadline:
        s, rec, _ = cli_json(cli, env, "status", "testhost")
        if (rec["job"]["watchdog"] or {}).get("stalled"):
            break
        time.sleep(0.3)
    assert rec["job"]["state"] == "running" and rec["job"]["watchdog"]["stalled"]
    assert any("no progress" in w for w in rec["job"]["warnings"])
    assert cli(*env.argv("stop", "testhost", "--grace", "1"))[0] == 0


def _fake_nvidia_smi(tmp_path, foreign_pid):
    fix = FIXTURES / "nvidia-smi"
    exe = tmp_path / "nvidia-smi"
    apps = (fix / "query-apps_busy.csv").read_text().replace("429,", f"{foreign_pid},")
    exe.write_text(f"""#!{sys.executable}
import sys
a = " ".join(sys.argv[1:])
if "--query-gpu=" in a: sys.stdout.write(open({str(fix / 'query-gpu_busy.csv')!r}).read())
elif "--query-compute-apps=" in a: sys.stdout.write({apps!r})
""")
    exe.chmod(0o755)
    return exe


def test_preflight_refuses_busy_gpus_and_too_few(tmp_path, sshd, cli):
    exe = _fake_nvidia_smi(tmp_path, 4242)
    env = Env(tmp_path, sshd, ["--max-samples", "2"], {"gpus": {"count": 1}},
              host_env={"REMOTE_OPS_NVIDIA_SMI": str(exe)})
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 8
    assert "foreign compute process pid 4242 (python3) holds 1386 MiB" in err
    assert env.jobdirs() == []
    env2 = Env(tmp_path / "b", sshd, ["--max-samples", "2"], {"gpus": {"count": 8, "free": False}},
               host_env={"REMOTE_OPS_NVIDIA_SMI": str(exe)}) if (tmp_path / "b").mkdir() is None else None
    status, out, err = cli(*env2.argv("extract", "testhost"))
    assert status == 8 and "needs 8 GPU(s), the host has 1" in err


def test_preflight_refuses_too_little_disk(tmp_path, sshd, cli):
    """From real sizes (extract.disk): the checkpoint's config.json on the host x the dataset's tokens,
    against the free space of the output's filesystem; refused in one line before anything starts."""
    import shutil
    model = tmp_path / "model"
    model.mkdir()
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": [1] * 3000}) + "\n" for _ in range(1000)))
    free = shutil.disk_usage(tmp_path).free
    # 4 captured layers x 2 bytes x 1000 x 2047 tokens: a hidden size that needs about twice the free space
    hidden = int(free * 2 / (4 * 2 * 1000 * 2047)) + 1
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
                                                   "num_hidden_layers": 8}))
    disk = {"dataset": str(ds), "max_model_len": 2048, "model": str(model)}
    env = Env(tmp_path, sshd, ["--max-samples", "2"], {"expected_samples": 1000, "disk": disk})
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 8 and "not enough disk at " in err, err
    assert "1000 more samples (2047000 tokens x 4 layers x %d hidden x 2 bytes)" % hidden in err
    assert not env.jobdirs()                        # nothing launched
    (model / "config.json").write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 8}))
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, err
    assert any(n.startswith("disk: 1000 more samples (2047000 tokens x 4 layers x 64 hidden") for n in
               rec["preflight"]["notes"])
    assert rec["preflight"]["disk"]["need"]["counts"]["exact"]


def test_extract_schema_errors_name_file_and_line(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, extract={"output_dir": "{vars.nope}/out"})
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 2 and "pb.yaml:" in err and "{vars.nope}" in err and "known vars: data" in err
    env2 = Env(tmp_path / "x" if (tmp_path / "x").mkdir() is None else None, sshd,
               extract={"secrets": {"HF_TOKEN": "hf_plain_value"}})
    status, out, err = cli(*env2.argv("extract", "testhost"))
    assert status == 2 and "from_env" in err


def test_preflight_refuses_when_check_finds_incompatible_calls(tmp_path, sshd, cli, env_vllm017):
    """speculators 0.3.0 against vLLM 0.17 unpatched: the job would die with a TypeError after
    loading the model, so extract must refuse before starting it (check batched into preflight)."""
    env = Env(tmp_path, sshd, ["--max-samples", "2"])
    data = yaml.safe_load(env.playbook.read_text())
    data["check"] = {"targets": ["speculators.data_generation.vllm_hidden_states_generator"],
                     "against": ["vllm"]}
    env.playbook.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = yaml.safe_load(env.inventory.read_text())
    inv["hosts"]["testhost"]["python"] = str(env_vllm017)
    env.inventory.write_text(yaml.safe_dump(inv))
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == 8, err
    assert "check: " in err and "eos_token_id" in err and f"fix them with remote-ops -i {env.inventory} patch testhost" in err
    assert env.jobdirs() == []
    s, rec, _ = cli_json(cli, env, "extract", "testhost")
    assert s == 8 and rec["preflight"]["check"]["findings"] >= 1 and rec["error"] == "RefusedError" and rec["host"] == "testhost"


def test_preflight_shows_drift_and_refuses_it_under_strict(tmp_path, sshd, cli, fresh_env017):
    """After the shipped playbook the calls bind and the four measured drift items are fixed; the drift
    that remains is shown in preflight, and refuses the job only with --strict."""
    env = Env(tmp_path, sshd, ["--max-samples", "2"])
    data = yaml.safe_load(env.playbook.read_text())
    data["check"] = {"targets": ["speculators.data_generation.vllm_hidden_states_generator",
                                "speculators.data_generation.custom_worker"], "against": ["vllm"]}
    env.playbook.write_text(yaml.safe_dump(data, sort_keys=False))
    inv = yaml.safe_load(env.inventory.read_text())
    inv["hosts"]["testhost"]["python"] = str(fresh_env017)
    env.inventory.write_text(yaml.safe_dump(inv))
    s, out, err = cli("-i", str(env.inventory), "patch", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--yes")
    assert s == 0, err
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run")
    assert s == 0, err
    check = rec["preflight"]["check"]
    assert check["findings"] == 0 and check["drift"] >= 1 and check["baseline"]["version"] == "0.11.0"
    assert any(n.startswith("drift: ") and "default-changed" in n for n in rec["preflight"]["notes"])
    s, rec, err = cli_json(cli, env, "extract", "testhost", "--dry-run", "--strict")
    assert s == 8 and rec["error"] == "RefusedError" and rec["host"] == "testhost"
    assert any("--strict refuses" in p for p in rec["preflight"]["problems"])
    assert env.jobdirs() == []


def test_stop_finds_workers_without_marker_and_reports_gpu_holders(tmp_path, sshd, cli):
    """Workers in new sessions whose environment lost the marker (setproctitle overwrites it) are
    still found (process tree recorded by the supervisor, matched with the GPU list); a foreign
    GPU process is reported, never killed."""
    exe = tmp_path / "nvidia-smi"
    foreign = subprocess.Popen(["sleep", "60"])
    exe.write_text(f"""#!{sys.executable}
import os, sys
a = " ".join(sys.argv[1:])
if "--query-gpu=" in a:
    print("0, GPU-aaaa, NVIDIA H200, 2000, 143771, 50, 40, 300.0")
elif "--query-compute-apps=" in a:
    for pid in os.listdir("/proc"):
        try:
            cmd = open("/proc/" + pid + "/cmdline", "rb").read()
            cwd = os.readlink("/proc/" + pid + "/cwd")
        except OSError:
            continue
        # this test's workers (their cwd is its workdir), not those of a test running beside it
        if b"extract_standin.py\\0--worker" in cmd and cwd.startswith({str(tmp_path)!r}):
            print(pid + ", VLLM::Worker_TP0, 1000, GPU-aaaa")
    print("{foreign.pid}, python3, 1386, GPU-aaaa")
""")
    exe.chmod(0o755)
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "1", "--spawn-workers", "2",
                               "--stubborn", "--clean-env"],
              {"gpus": {"count": 1, "free": False}}, host_env={"REMOTE_OPS_NVIDIA_SMI": str(exe)})
    try:
        assert cli(*env.argv("extract", "testhost"))[0] == 0
        d = env.wait_log("started 2 worker(s)")
        workers = [int(x) for x in (d / "log").read_text().split("started 2 worker(s): ")[1].split("\n")[0].split(", ")]
        deadline = time.time() + 10
        while time.time() < deadline and not (d / "pids.json").exists():
            time.sleep(0.1)
        time.sleep(1.5)
        assert not any(w in marker_pids() for w in workers)   # invisible to the marker scan
        s, rep, err = cli_json(cli, env, "stop", "testhost", "--grace", "1")
        assert s == 0, err
        assert {w for w in workers} <= {p["pid"] for p in rep["killed"]}
        assert all(not Path(f"/proc/{w}").exists() or b"Z" in Path(f"/proc/{w}/stat").read_bytes().split(b")")[1][:3]
                   for w in workers)
        holders = {h["pid"]: h for h in rep["gpu_holders"]}
        assert set(holders) == {foreign.pid} and holders[foreign.pid]["job"] is False
        assert foreign.poll() is None                     # not ours: reported, left alone
        status, out, _ = cli(*env.argv("stop", "testhost"))
        assert "not of this job" in out
    finally:
        foreign.kill()
        foreign.wait()


def test_status_and_tail_show_tokens_per_s_and_eta_from_the_jobs_progress_lines(tmp_path, sshd, cli):
    """The shipped script (driven by the stand-in) prints extract-progress lines; `status` (JSON and
    text) and the --tail snapshot carry the job's own tokens/s and an ETA while it runs."""
    env = Env(tmp_path, sshd, ["--max-samples", "30", "--seq-len", "40", "--sleep", "0.2",
                               "--progress-seconds", "0"], {"expected_samples": 30})
    s, rec, err = cli_json(cli, env, "extract", "testhost")
    assert s == 0, err
    env.wait_progress(4)
    s, rec, _ = cli_json(cli, env, "status", "testhost")
    job = rec["job"]
    assert job["state"] == "running" and job["tokens"]["total"] == 30 * 40
    assert 4 * 40 <= job["tokens"]["done"] < 30 * 40
    assert job["tokens_per_s"] > 0 and job["eta_s"] > 0
    s, out, _ = cli(*env.argv("status", "testhost"))
    assert "tok/s" in out and "ETA " in out
    # follow THIS job to its end (`extract --tail` here could launch a second, empty resume if the job
    # ended first on a loaded machine; logs --follow follows the job that ran, running or ended)
    s, out, err = cli(*env.argv("logs", "testhost", "--follow", "--json"))
    assert s == 0, err
    events = [json.loads(l) for l in out.splitlines() if l.strip()]
    snaps = [e for e in events if e.get("event") == "snapshot" and e.get("tokens")]
    end = [e for e in events if e.get("event") == "end"][-1]["status"]
    assert end["state"] == "succeeded" and end["tokens"]["done"] == end["tokens"]["total"] == 1200
    assert end["eta_s"] is None and end["tokens_per_s"] > 0
    assert not snaps or all(e["tokens"]["total"] == 1200 for e in snaps)
