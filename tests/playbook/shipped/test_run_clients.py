"""The shipped client launcher (remote_ops/playbook/shipped/scripts/run_clients.py), run here as the job runs
it on the host: a tiny fake client module, a tiny local HTTP server for the health wait. One client runs in
the launcher's own process; N run as children with --world-size N --rank r; exit statuses, signals and
argument errors."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from remote_ops.sandbox_assets.client_standin import indices_to_process
from tests.conftest import REPO

LAUNCHER = REPO / "remote_ops" / "playbook" / "shipped" / "scripts" / "run_clients.py"

pytestmark = pytest.mark.timeout(120)

# the fake client: records what it ran with into out/<rank or "solo">.json, then sleeps or exits as asked
FAKE = '''
import json, os, sys, time
argv = sys.argv[1:]
rank = argv[argv.index("--rank") + 1] if "--rank" in argv else "solo"
events = os.environ.get("FAKE_EVENTS")
if events:
    with open(events, "a") as fh:
        fh.write("run %s\\n" % rank)
with open(os.path.join(os.environ["FAKE_OUT"], rank + ".json"), "w") as fh:
    json.dump({"argv": sys.argv, "pid": os.getpid(), "pgid": os.getpgid(0), "name": __name__,
               "preloaded": "fakepre" in sys.modules}, fh)
print("fake client rank %s says hello" % rank, flush=True)
print("fake client stderr %s" % rank, file=sys.stderr, flush=True)
if os.environ.get("FAKE_SLEEP"):
    time.sleep(float(os.environ["FAKE_SLEEP"]))
fail = os.environ.get("FAKE_FAIL_RANK")
if fail is not None and rank == fail:
    sys.exit(int(os.environ.get("FAKE_FAIL_CODE", "5")))
if os.environ.get("FAKE_EXIT_MESSAGE"):
    sys.exit(os.environ["FAKE_EXIT_MESSAGE"])
'''

PRELOAD = '''
import os
events = os.environ.get("FAKE_EVENTS")
if events:
    with open(events, "a") as fh:
        fh.write("preload\\n")
'''


@pytest.fixture()
def work(tmp_path):
    (tmp_path / "fakeclient.py").write_text(FAKE)
    (tmp_path / "fakepre.py").write_text(PRELOAD)
    (tmp_path / "out").mkdir()
    return tmp_path


def run(work, *args, env=None, timeout=60):
    e = {**os.environ, "FAKE_OUT": str(work / "out"), **(env or {})}
    return subprocess.run([sys.executable, str(LAUNCHER), *args], cwd=work, env=e, capture_output=True, text=True,
                          timeout=timeout)


def recorded(work, name):
    return json.loads((work / "out" / f"{name}.json").read_text())


def test_one_client_runs_in_the_launchers_process_exactly_as_python_m_would(work):
    direct = subprocess.run([sys.executable, "-m", "fakeclient", "--x", "1"], cwd=work, capture_output=True,
                            text=True, env={**os.environ, "FAKE_OUT": str(work / "out")})
    want = recorded(work, "solo")
    r = run(work, "--clients", "1", "--preload", "fakepre", "--", "-m", "fakeclient", "--x", "1")
    assert r.returncode == direct.returncode == 0, r.stderr
    assert (r.stdout, r.stderr) == (direct.stdout, direct.stderr)     # no line of the launcher's own
    got = recorded(work, "solo")
    assert got["argv"] == want["argv"] == [str(work / "fakeclient.py"), "--x", "1"]   # nothing appended
    assert got["name"] == "__main__" and got["preloaded"] and not want["preloaded"]
    # one process: the launcher is the client (its pid is the one subprocess.run started)
    p = subprocess.Popen([sys.executable, str(LAUNCHER), "--clients", "1", "--", "-m", "fakeclient"], cwd=work,
                         env={**os.environ, "FAKE_OUT": str(work / "out")}, stdout=subprocess.DEVNULL)
    assert p.wait(60) == 0 and recorded(work, "solo")["pid"] == p.pid


@pytest.mark.parametrize("env, code, tail", [
    ({"FAKE_FAIL_RANK": "solo", "FAKE_FAIL_CODE": "7"}, 7, "fake client stderr solo\n"),
    ({"FAKE_EXIT_MESSAGE": "it broke"}, 1, "it broke\n"),
])
def test_one_client_keeps_the_clients_exit_status(work, env, code, tail):
    r = run(work, "--clients", "1", "--", "-m", "fakeclient", env=env)
    assert r.returncode == code and r.stderr.endswith(tail)


def test_a_script_path_target_runs_as_python_script_would(work):
    r = run(work, "--clients", "1", "--", "fakeclient.py", "a", "b")
    assert r.returncode == 0, r.stderr
    assert recorded(work, "solo")["argv"] == ["fakeclient.py", "a", "b"]


def test_three_clients_each_get_their_rank_in_the_launchers_group(work):
    p = subprocess.Popen([sys.executable, str(LAUNCHER), "--clients", "3", "--preload", "fakepre", "--",
                          "-m", "fakeclient", "--max-samples", "10"], cwd=work,
                         env={**os.environ, "FAKE_OUT": str(work / "out")}, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    pids = set()
    for r in range(3):
        rec = recorded(work, str(r))
        assert rec["argv"][1:] == ["--max-samples", "10", "--world-size", "3", "--rank", str(r)]
        assert rec["pgid"] == os.getpgid(0) and rec["pid"] != p.pid and rec["preloaded"]   # no new session
        pids.add(rec["pid"])
        assert f"fake client rank {r} says hello" in out                                     # stdout inherited
        assert f"[run_clients] rank {r}/3: imports " in err and "no health check" in err
    assert len(pids) == 3 and not (work / "out" / "solo.json").exists()


def test_custom_shard_args(work):
    r = run(work, "--clients", "2", "--shard-args", "--shard {r}/{n}", "--", "-m", "fakeclient")
    assert r.returncode == 0, r.stderr
    assert recorded(work, "solo")["argv"][1:] in (["--shard", "0/2"], ["--shard", "1/2"])


def test_a_failing_client_gives_its_status_and_the_others_finish(work):
    r = run(work, "--clients", "3", "--", "-m", "fakeclient", env={"FAKE_FAIL_RANK": "1", "FAKE_FAIL_CODE": "5",
                                                                   "FAKE_SLEEP": "0.3"})
    assert r.returncode == 5, r.stderr
    assert {p.name for p in (work / "out").iterdir()} == {"0.json", "1.json", "2.json"}
    assert r.stdout.count("says hello") == 3


def test_a_client_killed_by_a_signal_is_128_plus_it(work):
    script = work / "killself.py"
    script.write_text("import os, signal, sys\nif sys.argv[-1] == '1':\n    os.kill(os.getpid(), signal.SIGKILL)\n")
    r = run(work, "--clients", "2", "--", str(script))
    assert r.returncode == 128 + signal.SIGKILL


def _alive(pid):
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_the_launcher_alone_reaches_every_client(work, sig):
    p = subprocess.Popen([sys.executable, str(LAUNCHER), "--clients", "3", "--", "-m", "fakeclient"], cwd=work,
                         env={**os.environ, "FAKE_OUT": str(work / "out"), "FAKE_SLEEP": "600"},
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while len(list((work / "out").iterdir())) < 3 and time.time() < deadline:
        time.sleep(0.05)
    pids = [recorded(work, str(r))["pid"] for r in range(3)]
    assert all(_alive(pid) for pid in pids)
    os.kill(p.pid, sig)                            # the launcher only, not its group
    _out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig, err          # each client ended by it (SIGINT: KeyboardInterrupt, then the signal)
    deadline = time.time() + 10
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


class _Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []
    events: Path | None = None

    def do_GET(self):   # noqa: N802 (http.server's name)
        code = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        with open(self.events, "a") as fh:
            fh.write(f"health {code}\n")
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_clients_preload_then_wait_for_200_from_health(work):
    events = work / "events"
    _Health.answers, _Health.events = [503, 503, 503, 200], events
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/health"
        # a proxy in the environment (one that answers nothing) is not used for the loopback check
        r = run(work, "--clients", "1", "--health", url, "--preload", "fakepre", "--", "-m", "fakeclient",
                env={"FAKE_EVENTS": str(events), "http_proxy": "http://127.0.0.1:9", "no_proxy": ""})
        assert r.returncode == 0, r.stderr
        lines = events.read_text().splitlines()
        assert lines == ["preload", "health 503", "health 503", "health 503", "health 200", "run solo"]
        # two clients: each waits for its own 200; one line each saying when the server was ready
        events.unlink()
        _Health.answers = [503, 503, 200]
        r = run(work, "--clients", "2", "--health", url, "--preload", "fakepre", "--", "-m", "fakeclient",
                env={"FAKE_EVENTS": str(events)})
        assert r.returncode == 0, r.stderr
        lines = events.read_text().splitlines()
        assert lines.count("preload") == 2 and sorted(x for x in lines if x.startswith("run")) == ["run 0", "run 1"]
        first_run = min(i for i, x in enumerate(lines) if x.startswith("run"))
        assert "health 200" in lines[:first_run] and lines[:first_run].count("health 503") == 2
        for rank in (0, 1):
            assert f"[run_clients] rank {rank}/2: imports " in r.stderr and "s, server ready after " in r.stderr
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_no_server_yet_keeps_the_client_waiting(work):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                       # nothing listens: connection refused, again and again
    p = subprocess.Popen([sys.executable, str(LAUNCHER), "--clients", "1", "--health",
                          f"http://127.0.0.1:{port}/health", "--", "-m", "fakeclient"], cwd=work,
                         env={**os.environ, "FAKE_OUT": str(work / "out")}, stdout=subprocess.DEVNULL)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            p.wait(2)
        assert not (work / "out" / "solo.json").exists()
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("args, message", [
    (["--clients", "2", "-m", "fakeclient"], "no '--' before the client's command"),
    (["--", "-m", "fakeclient"], "--clients N is required"),
    (["--clients", "0", "--", "-m", "fakeclient"], "--clients must be an integer >= 1, got '0'"),
    (["--clients", "two", "--", "-m", "fakeclient"], "--clients must be an integer >= 1, got 'two'"),
    (["--clients=-1", "--", "-m", "fakeclient"], "--clients must be an integer >= 1, got '-1'"),
    (["--clients", "2", "--wat", "--", "-m", "fakeclient"], "unknown option '--wat'"),
    (["--clients", "2", "--health"], "no '--'"),
    (["--clients", "2", "--health", "--"], "--health needs a value"),
    (["--clients", "2", "--preload", "--", "-m", "fakeclient"], "--preload needs a value"),
    (["--clients", "2", "--"], "nothing to run after '--'"),
    (["--clients", "2", "--", "-m"], "nothing to run after '--'"),
    (["--clients", "2", "--", "-c", "print(1)"], "after '--': -m MODULE or a script path, got '-c'"),
    (["--clients", "2", "--health", "127.0.0.1:8000/health", "--", "-m", "x"], "--health must be an http:// URL"),
    (["--clients", "2", "--shard-args", "--rank {rank}", "--", "-m", "x"], "--shard-args '--rank {rank}'"),
])
def test_argument_errors_are_one_line_and_exit_2(work, args, message):
    r = run(work, *args)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("run_clients.py: ") and message in r.stderr, \
        r.stderr
    assert not list((work / "out").iterdir())


@pytest.mark.parametrize("target, n", [(0, 3), (1, 3), (10, 3), (12, 3), (5000, 4), (7, 8), (12, 1)])
def test_the_standin_splits_rows_as_speculators_does(target, n):
    """speculators 0.9.0's get_indices_to_process: contiguous chunks, the first target % n one row longer."""
    shares = [indices_to_process(target + 5, target, [], n, r) for r in range(n)]
    assert [i for s in shares for i in s] == list(range(target))
    assert [len(s) for s in shares] == [target // n + (1 if r < target % n else 0) for r in range(n)]
    assert indices_to_process(target + 5, target, [0, 1], n, 0) == [i for i in shares[0] if i > 1]
