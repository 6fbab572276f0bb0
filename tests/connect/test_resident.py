"""Resident agents (``--persist``): the kept connection answers an agent exec whose ops the contract
declares ``resident`` from one long-lived agent process per host (muxserver.Resident on the controller
side, protocol.resident on the host). Real sshd; nothing is timed: the tests assert which process
answered (ping's pid, the agent's own ``cache`` state) and that the answers are those of a fresh
process: the environment, the working directory, per-request caches and changed files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from remote_ops.connect import transport
from remote_ops.connect.transport import ConnectOptions, Session
from remote_ops.errors import UnreachableError
from tests.connect.test_persist import _kept_host, live_sockets, mux_pids, muxdir, sshd_log, wait_until  # noqa: F401

PY = sys.executable
pytestmark = pytest.mark.timeout(300)


def kept(host, **env) -> Session:
    return Session(dataclasses.replace(host, env=dict(host.env, **env)) if env else host,
                   ConnectOptions(persist=30)).open()


def mid_stream(sess: Session):
    """(the resident agent's pid, a ticks stream it is serving, one event read)."""
    pid = sess.call("ping.ping", {})["pid"]
    stream = sess.stream("ping.ticks", {"n": 500, "every": 0.05})
    assert next(stream)["event"]["i"] == 0
    return pid, stream


def alive(pid: int) -> bool:
    try:
        return ") Z " not in Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False


def test_repeated_calls_are_answered_by_one_resident_agent(sshd_log, muxdir):
    host = _kept_host(sshd_log, muxdir)
    pids = []
    for i in range(3):
        with kept(host) as sess:
            res = sess.call("ping.ping", {"echo": i})
            assert res["echo"] == i
            assert sess.stats.agent_cache == ["resident"] and sess.stats.connects == 0
            pids.append(res["pid"])
    assert len(set(pids)) == 1 and alive(pids[0])
    # without the kept connection every exec is a new interpreter
    with Session(host, ConnectOptions()) as direct:
        direct_pids = {direct.call("ping.ping", {})["pid"] for _ in range(2)}
        assert len(direct_pids) == 2 and pids[0] not in direct_pids
        assert "resident" not in direct.stats.agent_cache


def test_the_environment_does_not_leak_between_requests(sshd_log, muxdir, tmp_path):
    """A request's env (host env + the call's) is the agent's environment for that request only:
    nvidia-smi found through one request's PATH is not found by the next request's."""
    host = _kept_host(sshd_log, muxdir)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    with kept(host) as sess:
        with_fake = sess.call("gpu.query", {}, env={"PATH": f"{bin_dir}:{path}"})
        without = sess.call("gpu.query", {})
        assert sess.stats.agent_cache == ["resident", "resident"]
    with Session(host, ConnectOptions()) as direct:
        fresh = direct.call("gpu.query", {})
    assert without == fresh                                  # as a new process sees it
    assert with_fake["present"] is True and without["present"] is False   # found through that request's PATH


def test_a_new_distribution_is_seen_by_the_next_request(sshd_log, muxdir, tmp_path):
    """facts lists path entries' *.dist-info once per process (a per_request cache): a resident agent
    lists them again for every request, so a package installed between two commands is seen."""
    import site
    host = _kept_host(sshd_log, muxdir)
    site_dir = Path(next(p for p in site.getsitepackages() if Path(p).is_dir() and os.access(p, os.W_OK)))
    name = f"ro_resident_probe_{os.getpid()}"
    dist = site_dir / f"{name}-1.2.3.dist-info"
    try:
        with kept(host) as sess:
            pid = sess.call("ping.ping", {})["pid"]
            before = sess.call("facts.gather", {"packages": [name], "gpus": False, "jobs": False})
            assert before["packages"][name]["present"] is False
            dist.mkdir()
            (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.2.3\n")
            after = sess.call("facts.gather", {"packages": [name], "gpus": False, "jobs": False})
            # the same agent (no .pth changed, so no restart): its per-request cache was emptied
            assert sess.call("ping.ping", {})["pid"] == pid
            assert sess.stats.agent_cache == ["resident"] * 4
        assert after["packages"][name]["present"] is True and after["packages"][name]["version"] == "1.2.3"
    finally:
        if dist.exists():
            for p in dist.iterdir():
                p.unlink()
            dist.rmdir()


def test_a_client_gone_mid_request_ends_that_agent_and_the_next_call_gets_a_new_one(sshd_log, muxdir):
    host = _kept_host(sshd_log, muxdir)
    with kept(host) as sess:
        first, stream = mid_stream(sess)
        stream.close()                                       # the client hangs up mid-stream
    assert wait_until(lambda: not alive(first), 30), "the resident agent outlived its client's request"
    with kept(host) as sess:
        res = sess.call("ping.ping", {"echo": "again"})
        assert res["echo"] == "again" and res["pid"] != first and sess.stats.agent_cache == ["resident"]


def test_a_busy_resident_agent_sends_the_next_request_to_a_fresh_process(sshd_log, muxdir):
    host = _kept_host(sshd_log, muxdir)
    with kept(host) as sess:
        resident_pid = sess.call("ping.ping", {})["pid"]
    started, release = threading.Event(), threading.Event()
    states: list = []

    def hold() -> None:
        with kept(host) as s:
            for ev in s.stream("ping.ticks", {"n": 100, "every": 0.05}):
                started.set()
                if release.is_set():
                    break
            states.extend(s.stats.agent_cache)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert started.wait(60)
        with kept(host) as other:
            res = other.call("ping.ping", {})
            assert res["pid"] != resident_pid and other.stats.agent_cache != ["resident"]
            assert other.stats.mux_execs == 1 and other.stats.connects == 0
    finally:
        release.set()
        t.join(60)


def test_an_agent_killed_mid_request_is_a_lost_connection_then_the_next_call_works(sshd_log, muxdir):
    host = _kept_host(sshd_log, muxdir)
    with kept(host) as sess:
        pid, stream = mid_stream(sess)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(UnreachableError):
            list(stream)
        res = sess.call("ping.ping", {"echo": 1})
        assert res["echo"] == 1 and res["pid"] != pid and sess.stats.agent_cache[-1] == "resident"


def test_only_resident_ops_go_to_the_resident_agent(sshd_log, muxdir, tmp_path):
    assert transport.resident_ok([{"op": "facts.gather", "args": {}}, {"op": "patching.read", "args": {}}])
    assert not transport.resident_ok([{"op": "facts.gather", "args": {}}, {"op": "jobs.launch", "args": {}}])
    assert not transport.resident_ok([{"op": "compat.check", "args": {"mode": "runtime"}}])
    assert transport.resident_ok([{"op": "compat.check", "args": {"mode": "static"}}])
    assert not transport.resident_ok([{"op": "no.such", "args": {}}])
    host = _kept_host(sshd_log, muxdir)
    with kept(host) as sess:
        resident_pid = sess.call("ping.ping", {})["pid"]
        (res,) = sess.call_many([("imports.probe", {"python": PY, "modules": ["json"]})])
        assert res["ok"], res
        assert sess.stats.agent_cache[0] == "resident" and sess.stats.agent_cache[1] != "resident"
    assert alive(resident_pid)


def test_patch_check_rollback_through_the_resident_agent(sshd_log, muxdir, fresh_env017, tmp_path):
    """The whole patch cycle on real speculators/vLLM sources with every exec answered by one resident
    agent: the findings follow the file as it changes (parsed trees are keyed by the text itself)."""
    from remote_ops.patch import patching
    from remote_ops.playbook import loader as playbook
    from tests.patch.test_over_ssh import GEN, SHIPPED, site_file

    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    host = dataclasses.replace(_kept_host(sshd_log, muxdir), python=str(fresh_env017),
                               env={"REMOTE_OPS_STATE_DIR": str(state)})
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    pb = playbook.load(str(SHIPPED))

    def findings(sess):
        return sess.call("compat.check", {"against": ["vllm"]})["findings"]

    with Session(host, ConnectOptions()) as direct:
        direct_before = findings(direct)
    with Session(host, ConnectOptions(persist=30)) as sess:
        before = findings(sess)
        pid = sess.call("ping.ping", {})["pid"]
        res = patching.patch(sess, pb, dry_run=False, import_check=False, allow_findings=False,
                              while_running=False)
        assert res.changed and res.verification["verified"], res.verification
        after = findings(sess)
        assert sess.call("ping.ping", {})["pid"] == pid
        rolled = patching.rollback(sess, to=None, force=False, while_running=False)
        assert rolled.changed and target.read_bytes() == original
        again = findings(sess)
        assert set(sess.stats.agent_cache) == {"resident"}
    assert before == direct_before and len(before) >= 4
    assert not [f for f in after if f["kind"] in ("unexpected-keyword", "missing-argument")]
    assert again == before
    lines = (state / "journal" / "journal.jsonl").read_text().splitlines()
    assert [json.loads(x)["action"] for x in lines] == ["patch", "rollback"]


def test_python_found_through_a_login_shell_is_reported_by_the_resident_agent(sshd_log, muxdir, tmp_path, cli):
    """No interpreter configured: the first exec of every command runs python3 from a login shell's
    PATH and reports what it found; a resident agent started that way reports it on every request."""
    from tests.conftest import write_inventory
    from tests.connect.test_persist import facts, last_stats

    entry = sshd_log.host_entry()
    del entry["python"]
    inv = write_inventory(tmp_path / "inv-login.yaml", {"h": entry})
    status, out1, err = facts(cli, inv)
    assert status == 0, err
    assert wait_until(lambda: live_sockets(muxdir))
    runs = []
    for _ in range(2):
        status, out, err = facts(cli, inv)
        assert status == 0, err
        runs.append((json.loads(out)["python"], last_stats(tmp_path)["h"]))
    for py, st in runs:
        assert py["executable"] == json.loads(out1)["python"]["executable"]
        assert py["found_by"] == "login shell PATH"
        assert st["agent_cache"] == ["resident"] and st["connects"] == 0


def test_a_changed_interpreter_path_gets_a_new_resident_agent(sshd_log, muxdir, tmp_path):
    """A .pth file added after the resident agent started (``pip install -e``, a conda change) gives a
    new interpreter another sys.path: the resident agent declines the request unanswered and the kept
    connection sends it to a new one, which sees the package there."""
    import site
    host = _kept_host(sshd_log, muxdir)
    site_dir = Path(next(p for p in site.getsitepackages() if Path(p).is_dir() and os.access(p, os.W_OK)))
    name = f"ro_resident_pth_{os.getpid()}"
    extra = tmp_path / "extra"
    (extra / f"{name}-4.5.6.dist-info").mkdir(parents=True)
    (extra / f"{name}-4.5.6.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 4.5.6\n")
    pth = site_dir / f"{name}.pth"
    try:
        with kept(host) as sess:
            first = sess.call("ping.ping", {})["pid"]
            assert sess.call("facts.gather", {"packages": [name], "gpus": False, "jobs": False}
                             )["packages"][name]["present"] is False
            pth.write_text(str(extra) + "\n")
            after = sess.call("facts.gather", {"packages": [name], "gpus": False, "jobs": False})
            second = sess.call("ping.ping", {})["pid"]
            assert set(sess.stats.agent_cache) == {"resident"}
        assert after["packages"][name]["present"] is True and after["packages"][name]["version"] == "4.5.6"
        assert second != first and alive(second) and wait_until(lambda: not alive(first), 30)
    finally:
        pth.unlink(missing_ok=True)


def test_the_kept_connection_starts_the_resident_agent_before_the_next_command(sshd_log, muxdir, tmp_path, cli):
    """The background process starts the host's resident agent while it waits (for the interpreter
    and agent cache in the inventory): the next command's first request finds it running."""
    from tests.connect.test_persist import facts, inv_for, last_stats

    cache = tmp_path / "agent-cache"
    inv = inv_for(tmp_path, sshd_log, env={"REMOTE_OPS_AGENT_CACHE": str(cache)})
    assert facts(cli, inv)[0] == 0
    assert wait_until(lambda: live_sockets(muxdir))
    log = Path(muxdir) / "mux.log"
    assert wait_until(lambda: list(cache.glob("*")) != [], 30)   # its agent cache is used (filled or hit)
    pids = mux_pids(muxdir)
    listener = sshd_log.server.proc.pid      # this worker's sshd: not a resident agent of a test beside this one
    agents = lambda: [p for p in Path("/proc").iterdir()  # noqa: E731
                      if p.name.isdigit() and _is_resident(p) and _descends_from(p, listener)]
    assert wait_until(agents, 30), log.read_text()
    before = {p.name for p in agents()}
    status, out, err = facts(cli, inv)
    assert status == 0, err
    st = last_stats(tmp_path)["h"]
    assert st["agent_cache"] == ["resident"] and st["connects"] == 0
    assert {p.name for p in agents()} == before and mux_pids(muxdir) == pids   # the one started ahead


def _descends_from(proc: Path, ancestor: int) -> bool:
    pid = int(proc.name)
    for _ in range(16):
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
    return False


def _is_resident(proc: Path) -> bool:
    """A host-side agent process started in serve mode by a kept connection (its stdin header said so:
    not visible in argv, so recognise it by its parent being an sshd session and its bootstrap argv)."""
    try:
        argv = (proc / "cmdline").read_bytes().split(b"\0")
        status = (proc / "stat").read_text()
    except OSError:
        return False
    return ") Z " not in status and len(argv) > 2 and argv[1] == b"-c" and b"protocol.resident" in argv[2]


def test_a_resident_agent_that_cannot_start_is_said_in_the_mux_log(monkeypatch, capsys):
    """A resident agent whose channel closes before it says it is ready leaves the request to a fresh
    exec, which the client cannot tell apart from the resident's answer: mux.log says why (its exit
    status and last error line), as it does for an exception (test_persist read only the counters)."""
    import types

    from remote_ops.connect import muxserver, sshconn

    class Closed:                                      # an agent that died before its first line
        closed = False
        _err = [b"Traceback (most recent call last):\nOSError: [Errno 24] Too many open files\n"]

        def sendall(self, _data): pass
        def settimeout(self, _t): pass
        def recv(self, _n): return b""
        def recv_stderr_ready(self): return bool(self._err)
        def recv_stderr(self, _n): return self._err.pop()
        def exit_status_ready(self): return True
        def recv_exit_status(self): return 1
        def close(self): self.closed = True

    keeper = types.SimpleNamespace(session=types.SimpleNamespace(host=types.SimpleNamespace(name="h")),
                                   _channel=lambda _timeout: Closed())
    monkeypatch.setattr(sshconn, "_exec_pipelined", lambda chan, command: None)
    res = muxserver.Resident(keeper, "exec python3 -c ...", None)
    assert res.start(30) is False and res.dead and not res.ready
    err = capsys.readouterr().err
    assert ("h: no resident agent: its channel closed before it was ready (exit status 1; "
            "OSError: [Errno 24] Too many open files)") in err
