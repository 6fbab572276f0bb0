"""Kept connections (--persist, remote_ops/connect/mux.py + muxserver.py) over a real sshd: reuse, isolation,
refusals, and recovery. Nothing is timed: tests wait for a state (a socket, a process gone) with a
generous bound, and every mux process a test started is killed by pid at its end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from remote_ops.connect import mux
from remote_ops.errors import Exit, UnreachableError
from remote_ops.sshd import SshdServer
from tests.conftest import SshdFixture, write_inventory

PY = sys.executable
pytestmark = pytest.mark.timeout(300)


# ------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def sshd_log(tmp_path_factory):
    """A private sshd logging every accepted login (a new SSH connection is one 'Accepted' line)."""
    server = SshdServer(tmp_path_factory.mktemp("persist-sshd"), log_level="INFO").start()
    yield SshdFixture(server)
    server.stop()


def mux_pids(d: str) -> list[int]:
    """Mux processes serving directory ``d`` (started by this test: the dir is the test's own)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if any(a.endswith(b"/remote_ops/connect/muxserver.py") for a in argv[1:2]) and d.encode() in argv \
                    and ") Z " not in stat:
                out.append(int(entry.name))
    return out


@pytest.fixture
def muxdir(monkeypatch, tmp_path):
    """Kept connections on (30 s), in a short private dir; kills what the test started."""
    d = tempfile.mkdtemp(prefix="ro-mux-", dir="/tmp")
    monkeypatch.setenv("REMOTE_OPS_MUX_DIR", d)
    monkeypatch.setenv("REMOTE_OPS_PERSIST", "30")
    monkeypatch.setenv("REMOTE_OPS_STATS_FILE", str(tmp_path / "stats.jsonl"))
    yield d

    def kill_all() -> bool:   # again and again: a mux spawned at the test's last command may be starting
        pids = mux_pids(d)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return not pids
    time.sleep(0.3)
    assert wait_until(kill_all, 20), "a mux process outlived its test"
    log = Path(d) / "mux.log"          # shown by pytest with a failed test's output (what the mux said)
    if log.is_file():
        print(f"--- {log}\n{log.read_text(errors='replace')[-4000:]}")
    shutil.rmtree(d, ignore_errors=True)


def wait_until(pred, bound: float = 30.0):
    end = time.monotonic() + bound
    while True:
        v = pred()
        if v or time.monotonic() > end:
            return v
        time.sleep(0.05)


def live_sockets(d: str) -> list[str]:
    out = []
    for p in Path(d).glob("*.sock"):
        s = mux._connect(str(p))
        if s is not None:
            s.close()
            out.append(str(p))
    return out


def last_stats(tmp_path) -> dict:
    return json.loads((tmp_path / "stats.jsonl").read_text().splitlines()[-1])


def accepted(server: SshdServer) -> int:
    return server.log_file.read_text().count("Accepted publickey")


def inv_for(tmp_path, fx: SshdFixture, name="h", **over) -> Path:
    return write_inventory(tmp_path / f"inv-{name}.yaml", {name: fx.host_entry(PY, **over)})


def facts(cli, inv, *args, host="h"):
    status, out, err = cli("facts", host, "--json", "-i", str(inv), *args)
    return status, out, err


# ------------------------------------------------------------------------------------ reuse
def test_second_command_reuses_the_kept_connection(sshd_log, muxdir, tmp_path, cli):
    inv = inv_for(tmp_path, sshd_log)
    before = accepted(sshd_log.server)
    status, out, err = facts(cli, inv)
    assert status == 0, err
    assert last_stats(tmp_path)["h"]["connects"] == 1
    assert wait_until(lambda: live_sockets(muxdir)), (Path(muxdir) / "mux.log").read_text()
    assert accepted(sshd_log.server) == before + 2          # the command's own login, then the mux's
    status, out2, err = facts(cli, inv, "-v")
    assert status == 0, err
    st = last_stats(tmp_path)["h"]
    assert st["connects"] == 0 and st["execs"] == 1 and st["mux_execs"] == 1
    assert "using the kept connection" in err and "0 connection(s), 1 exec round trip(s)" in err
    assert accepted(sshd_log.server) == before + 2          # sshd saw no new login
    assert json.loads(out2)["python"] == json.loads(out)["python"]
    assert len(mux_pids(muxdir)) == 1


def test_proxyjump_chain_is_kept_too(sshd_log, muxdir, tmp_path, cli):
    """Through a jump host (verified against known_hosts like the target): the mux keeps the chain."""
    hop = f"{sshd_log.user}@127.0.0.1:{sshd_log.port}"
    inv = inv_for(tmp_path, sshd_log, proxy_jump=[hop])
    before = accepted(sshd_log.server)
    assert facts(cli, inv)[0] == 0
    assert last_stats(tmp_path)["h"]["connects"] == 1
    assert wait_until(lambda: live_sockets(muxdir))
    assert accepted(sshd_log.server) == before + 4          # hop + target, for the command and for the mux
    status, _, err = facts(cli, inv)
    assert status == 0, err
    assert last_stats(tmp_path)["h"]["connects"] == 0 and accepted(sshd_log.server) == before + 4


def test_results_and_counters_are_the_same_over_the_mux(sshd_log, muxdir, tmp_path):
    """A ~300 KB request and reply, and a stream: identical bytes and counters either way."""
    from remote_ops.connect.transport import ConnectOptions, Session
    host = sshd_log.host(python=PY)
    echo = os.urandom(150_000).hex()
    direct = Session(host, ConnectOptions(persist=30))
    with direct:
        a = direct.call("ping.ping", {"echo": echo})
        events_a = [m for m in direct.stream("ping.ticks", {"n": 3, "every": 0.01})]
    assert direct.stats.connects == 1 and direct.stats.mux_execs == 0
    assert mux.keep([direct]) == 1
    assert wait_until(lambda: live_sockets(muxdir))
    kept = Session(host, ConnectOptions(persist=30))
    with kept:
        b = kept.call("ping.ping", {"echo": echo})
        events_b = [m for m in kept.stream("ping.ticks", {"n": 3, "every": 0.01})]
    assert kept.stats.connects == 0 and kept.stats.mux_execs == 2 and kept.stats.execs == 2
    assert b["echo"] == a["echo"] == echo and b["python"] == a["python"]
    assert [e.get("event", {}).get("i") for e in events_b] == [e.get("event", {}).get("i") for e in events_a]
    assert kept.stats.bytes_sent == direct.stats.bytes_sent
    assert kept.stats.bytes_received - direct.stats.bytes_received in range(-64, 65)   # pid, timestamps differ


def test_bundle_probe_answered_through_the_mux(sshd_log, muxdir, tmp_path, cli):
    """The host's agent cache is empty for the second command: an exec the resident agent may not
    answer (imports.probe is not ``resident``) asks for the bundle on the channel ({"bundle": "need"})
    and gets it through the mux, in the same exec; facts, which it may answer, is served by a
    resident agent that the kept connection started and gave the bundle itself."""
    from remote_ops.connect.transport import ConnectOptions, Session

    import dataclasses

    host = dataclasses.replace(_kept_host(sshd_log, muxdir), env={"REMOTE_OPS_AGENT_CACHE": str(tmp_path / "cache-b")})
    with Session(host, ConnectOptions(persist=30)) as sess:
        (res,) = sess.call_many([("imports.probe", {"python": PY, "modules": ["json"]})])
        assert res["ok"], res
        st = sess.stats
        assert st.connects == 0 and st.mux_execs == 1 and st.execs == 1
        assert st.bundles_sent == 1 and st.agent_cache == ["filled"]
    assert (tmp_path / "cache-b").is_dir()
    host = dataclasses.replace(host, env={"REMOTE_OPS_AGENT_CACHE": str(tmp_path / "cache-c")})
    with Session(host, ConnectOptions(persist=30)) as sess:
        sess.call("facts.gather", {})
        st = sess.stats
        assert st.connects == 0 and st.mux_execs == 1 and st.execs == 1
        assert st.bundles_sent == 0 and st.agent_cache == ["resident"], (Path(muxdir) / "mux.log").read_text()
    assert (tmp_path / "cache-c").is_dir()                  # the resident agent filled it from the mux


def test_api_persist_parameter(sshd_log, muxdir, tmp_path, monkeypatch):
    import remote_ops.api as ro
    monkeypatch.delenv("REMOTE_OPS_PERSIST")
    inv = inv_for(tmp_path, sshd_log)
    with ro.open_inventory(str(inv), persist=0) as api:
        assert api.facts("h").ok
    assert not os.listdir(muxdir)                             # off: nothing kept
    with ro.open_inventory(str(inv), persist=30) as api:
        assert api.facts("h").ok
    assert wait_until(lambda: live_sockets(muxdir))
    with ro.open_inventory(str(inv), persist=30) as api:
        assert api.facts("h").ok
        (sess,) = api.sessions
        assert sess.stats.connects == 0 and sess.stats.mux_execs == 1
    with pytest.raises(Exception, match="persist must be"):
        ro.open_inventory(str(inv), persist=-1)


def test_local_connection_never_keeps_anything(muxdir, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"here": {"connection": "local", "python": PY}})
    for _ in range(2):
        status, out, err = cli("facts", "here", "--json", "-i", str(inv))
        assert status == 0, err
    assert os.listdir(muxdir) == [] and mux_pids(muxdir) == []


# ------------------------------------------------------------------------------------ isolation
def test_another_user_port_or_identity_does_not_reuse_the_socket(sshd_log, muxdir, tmp_path, cli):
    inv = inv_for(tmp_path, sshd_log)
    assert facts(cli, inv)[0] == 0
    assert wait_until(lambda: live_sockets(muxdir))
    # the same key under another path is another identity: a connection of its own, and its own mux
    key2 = tmp_path / "copy_of_key"
    shutil.copy(sshd_log.identity_file, key2)
    os.chmod(key2, 0o600)
    status, _, err = facts(cli, inv_for(tmp_path, sshd_log, name="k", identity_file=str(key2)), host="k")
    assert status == 0, err
    assert last_stats(tmp_path)["k"]["connects"] == 1
    # a user sshd refuses: with reuse it would have worked
    status, _, err = facts(cli, inv_for(tmp_path, sshd_log, name="u", user="nobody"), host="u")
    assert status == Exit.AUTH, err
    # a port nothing listens on
    from remote_ops.sshd import free_port
    status, _, err = facts(cli, inv_for(tmp_path, sshd_log, name="p", port=free_port()), host="p")
    assert status == Exit.UNREACHABLE, err
    # and the names differ for every such change (also known_hosts, jump chain, ssh_config)
    from remote_ops.connect.transport import ConnectOptions
    import dataclasses
    base = sshd_log.host(python=PY)
    opts = ConnectOptions(persist=30)
    keys = {mux.identity(h, opts, {}) for h in (
        base, dataclasses.replace(base, user="other"), dataclasses.replace(base, port=base.port + 1),
        dataclasses.replace(base, identity_file=(str(key2),)), dataclasses.replace(base, known_hosts=str(key2)),
        dataclasses.replace(base, proxy_jump=("jump@127.0.0.1",)))}
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host x\n  User y\n")
    keys.add(mux.identity(base, ConnectOptions(persist=30, ssh_config_path=str(cfg)), {}))
    assert len(keys) == 7 and None not in keys


def test_bad_dir_or_socket_is_refused_with_a_note(sshd_log, muxdir, tmp_path, cli):
    inv = inv_for(tmp_path, sshd_log)
    os.chmod(muxdir, 0o755)
    status, _, err = facts(cli, inv, "-v")
    assert status == 0, err
    assert "group/other" in err and "not keeping connections" in err
    assert not list(Path(muxdir).glob("*.sock"))              # nothing started in an open dir
    os.chmod(muxdir, 0o700)
    assert facts(cli, inv)[0] == 0
    (sock,) = wait_until(lambda: live_sockets(muxdir))
    os.chmod(sock, 0o666)
    status, _, err = facts(cli, inv, "-v")
    assert status == 0 and "not using the kept connection" in err and "0666" in err
    assert last_stats(tmp_path)["h"]["connects"] == 1
    os.chmod(sock, 0o600)
    if os.getuid() != 0:
        return                                                  # the owner cases need chown
    os.chown(sock, 65534, 65534)
    status, _, err = facts(cli, inv, "-v")
    assert status == 0 and "owned by uid 65534" in err
    assert last_stats(tmp_path)["h"]["connects"] == 1
    os.chown(sock, 0, 0)
    os.chown(muxdir, 65534, 65534)
    status, _, err = facts(cli, inv, "-v")
    assert status == 0 and "owned by uid 65534" in err
    assert last_stats(tmp_path)["h"]["connects"] == 1
    os.chown(muxdir, 0, 0)


@pytest.mark.skipif(os.getuid() != 0 or not hasattr(socket, "SO_PEERCRED"), reason="needs root and SO_PEERCRED")
def test_peer_of_another_uid_is_refused_both_ways(sshd_log, muxdir, tmp_path, cli):
    """A socket that passes the file checks but is served by another uid is not used; and the
    mux serves nobody of another uid (its socket hard-linked into the open and opened to all)."""
    inv = inv_for(tmp_path, sshd_log)
    assert facts(cli, inv)[0] == 0
    (sock,) = wait_until(lambda: live_sockets(muxdir))
    # the mux refuses a client of uid 65534
    pub = tempfile.mkdtemp(prefix="ro-pub-", dir="/tmp")
    os.chmod(pub, 0o755)
    try:
        os.link(sock, f"{pub}/s")
        os.chmod(sock, 0o666)
        code = ("import os, socket, struct, sys\nos.setgid(65534); os.setuid(65534)\n"
                "s = socket.socket(socket.AF_UNIX); s.settimeout(10); s.connect(sys.argv[1])\n"
                "try:\n    s.sendall(b'X' + struct.pack('>I', 2) + b'{}')\n    print(repr(s.recv(100)))\n"
                "except (ConnectionResetError, BrokenPipeError):\n    print(repr(b''))\n")   # refused before or after
        p = subprocess.run([PY, "-c", code, f"{pub}/s"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        assert p.stdout.strip() == "b''"                        # closed without an answer
        # the mux logs the refusal after closing the socket: wait for the line, do not race it
        assert wait_until(lambda: "refused a client of uid 65534" in (Path(muxdir) / "mux.log").read_text())
    finally:
        os.chmod(sock, 0o600)
        shutil.rmtree(pub, ignore_errors=True)
    # a server of another uid behind a socket file that looks like ours
    key = Path(sock).name
    for pid in mux_pids(muxdir):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not mux_pids(muxdir))
    fake = ("import os, socket, sys\ns = socket.socket(socket.AF_UNIX); os.umask(0o177)\n"
            "os.unlink(sys.argv[1]) if os.path.exists(sys.argv[1]) else None\ns.bind(sys.argv[1])\n"
            "os.setgid(65534); os.setuid(65534); s.listen(5)\nprint('ready', flush=True)\n"
            "while True:\n    c, _ = s.accept()\n    try:\n        c.sendall(b'A' + bytes(4))\n    except OSError:\n        pass\n    c.close()\n")
    proc = subprocess.Popen([PY, "-c", fake, str(Path(muxdir) / key)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        status, _, err = facts(cli, inv)
        assert status == 0, err
        assert last_stats(tmp_path)["h"]["connects"] == 1     # not served by the impostor
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------------------------------------ recovery
def test_changed_host_key_is_refused_once_the_mux_is_gone(tmp_path, muxdir, cli):
    a = SshdServer(tmp_path / "a", log_level="INFO").start()
    try:
        fx = SshdFixture(a)
        inv = inv_for(tmp_path, fx)
        assert facts(cli, inv)[0] == 0
        assert wait_until(lambda: live_sockets(muxdir))
        for pid in mux_pids(muxdir):
            os.kill(pid, signal.SIGKILL)                      # its socket stays behind, stale
        assert wait_until(lambda: not mux_pids(muxdir))
        a.kill_sessions()
    finally:
        a.stop()
    # the same port now answers with another host key (the user's key is still authorized)
    (tmp_path / "b").mkdir(mode=0o700)
    for n in ("id_ed25519", "id_ed25519.pub"):
        shutil.copy(tmp_path / "a" / n, tmp_path / "b" / n)
    b = SshdServer(tmp_path / "b", port=a.port).start()
    try:
        status, _, err = facts(cli, inv)
        assert status == Exit.HOSTKEY and "HOST KEY CHANGED" in err
        assert err.count("\n") == 1
        time.sleep(0.5)
        assert live_sockets(muxdir) == [] and mux_pids(muxdir) == []   # nothing kept for a refused host
    finally:
        b.stop()


def test_dropped_connection_next_command_reconnects(tmp_path, muxdir, cli):
    server = SshdServer(tmp_path / "s", log_level="INFO").start()
    try:
        inv = inv_for(tmp_path, SshdFixture(server))
        assert facts(cli, inv)[0] == 0
        assert wait_until(lambda: live_sockets(muxdir))
        (old,) = mux_pids(muxdir)
        assert server.kill_sessions() >= 1                    # the mux's SSH connection dies
        status, out, err = facts(cli, inv)
        assert status == 0, err
        assert last_stats(tmp_path)["h"]["connects"] == 1
        # a new mux replaces the old one, and serves the next command
        assert wait_until(lambda: mux_pids(muxdir) and old not in mux_pids(muxdir) and live_sockets(muxdir))
        assert facts(cli, inv)[0] == 0
        assert last_stats(tmp_path)["h"]["connects"] == 0
        assert "SSH connection lost" in (Path(muxdir) / "mux.log").read_text()
    finally:
        server.stop()


def test_idle_mux_exits_and_removes_its_socket(sshd_log, muxdir, tmp_path, cli):
    inv = inv_for(tmp_path, sshd_log)
    assert facts(cli, inv, "--persist", "1")[0] == 0
    log = Path(muxdir) / "mux.log"
    assert wait_until(lambda: log.exists() and "exiting (idle for 1s)" in log.read_text()), log.read_text()
    assert wait_until(lambda: not mux_pids(muxdir))
    assert list(Path(muxdir).glob("*.sock")) == []


def test_no_persist_stops_the_kept_connection(sshd_log, muxdir, tmp_path, cli):
    inv = inv_for(tmp_path, sshd_log)
    assert facts(cli, inv)[0] == 0
    assert wait_until(lambda: live_sockets(muxdir))
    status, _, err = facts(cli, inv, "--no-persist", "-v")
    assert status == 0 and "told the kept connection to exit" in err
    assert last_stats(tmp_path)["h"]["connects"] == 1
    assert wait_until(lambda: not mux_pids(muxdir))
    assert list(Path(muxdir).glob("*.sock")) == []


def _kept_host(sshd_log, muxdir):
    """The sshd's host, with a mux keeping it (started from one direct session, as Fleet.close does)."""
    from remote_ops.connect.transport import ConnectOptions, Session
    host = sshd_log.host(python=PY)
    first = Session(host, ConnectOptions(persist=30))
    with first:
        first.call("ping.ping", {})
    mux.keep([first])
    assert wait_until(lambda: live_sockets(muxdir))
    return host


def test_not_asked_neither_uses_nor_stops_a_kept_connection(sshd_log, muxdir, tmp_path, cli, monkeypatch):
    """Without --persist/--no-persist and $REMOTE_OPS_PERSIST a command does no mux work: it
    connects itself (a kept connection is not used) and leaves the kept one running (only an
    explicit 0 tells it to exit)."""
    inv = inv_for(tmp_path, sshd_log)
    assert facts(cli, inv)[0] == 0
    assert wait_until(lambda: live_sockets(muxdir))
    pids = mux_pids(muxdir)
    monkeypatch.delenv("REMOTE_OPS_PERSIST")
    status, _, err = facts(cli, inv, "-v")
    assert status == 0, err
    stats = last_stats(tmp_path)["h"]
    assert stats["connects"] == 1 and stats["mux_execs"] == 0
    assert "kept connection" not in err
    assert mux_pids(muxdir) == pids and live_sockets(muxdir)


def test_killing_the_mux_mid_call_is_one_unreachable_error_then_next_call_works(sshd_log, muxdir, tmp_path):
    from remote_ops.connect.transport import ConnectOptions, Session
    host = _kept_host(sshd_log, muxdir)
    sess = Session(host, ConnectOptions(persist=30)).open()
    try:
        stream = sess.stream("ping.ticks", {"n": 200, "every": 0.05})
        assert next(stream)["event"]["i"] == 0
        for pid in mux_pids(muxdir):
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(UnreachableError) as ei:
            list(stream)
        assert "connection lost during ping.ticks" in ei.value.one_line()
        assert "\n" not in ei.value.one_line()
        # the same session carries on over a connection of its own
        assert sess.call("ping.ping", {"echo": "after"})["echo"] == "after"
        assert sess.stats.connects == 1 and sess.stats.mux_execs == 1
    finally:
        sess.close()


def test_timeout_over_the_mux_is_a_timeout_error(sshd_log, muxdir, tmp_path):
    from remote_ops.errors import TimeoutError_
    from remote_ops.connect.transport import ConnectOptions, Session
    host = _kept_host(sshd_log, muxdir)
    with Session(host, ConnectOptions(persist=30)) as sess:
        with pytest.raises(TimeoutError_):
            list(sess.stream("ping.ticks", {"n": 5, "every": 3}, timeout=0.5))
        assert sess.stats.mux_execs == 1
        assert sess.call("ping.ping", {"echo": 1})["echo"] == 1   # the mux is still fine
        assert sess.stats.connects == 0


def test_two_controllers_racing_leave_one_mux(sshd_log, muxdir, tmp_path):
    inv = inv_for(tmp_path, sshd_log)
    cmd = [PY, "-m", "remote_ops.cli", "facts", "h", "--json", "-i", str(inv)]
    env = dict(os.environ)
    results = []

    def run():
        results.append(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120))
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert wait_until(lambda: live_sockets(muxdir))
    # a loser (if both started one) exits at once: exactly one remains, and it serves
    assert wait_until(lambda: len(mux_pids(muxdir)) == 1)
    time.sleep(1)
    assert len(mux_pids(muxdir)) == 1 and len(live_sockets(muxdir)) == 1
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert last_stats(tmp_path)["h"]["connects"] == 0


def test_persist_flag_validation(cli, tmp_path):
    status, _, err = cli("facts", "h", "--persist", "-3")
    assert status == Exit.USAGE and "--persist must be" in err
    status, _, err = cli("facts", "h", env={"REMOTE_OPS_PERSIST": "soon"})
    assert status != 0 and "REMOTE_OPS_PERSIST must be a number" in err


def test_a_mux_started_while_the_old_one_exits_waits_for_it_and_serves(sshd_log, muxdir, tmp_path):
    """The old mux was told to stop while a call still runs through it: its socket is gone, but it
    holds the host's lock until that call ends. A command meanwhile finds no kept connection,
    connects itself and starts a new mux: that one waits for the lock (it used to take a held lock
    for "another mux serves" and give up at once, so nothing was kept) and then serves."""
    from remote_ops.connect.transport import ConnectOptions, Session
    host = _kept_host(sshd_log, muxdir)
    (old,) = mux_pids(muxdir)
    busy = Session(host, ConnectOptions(persist=30)).open()
    try:
        stream = busy.stream("ping.ticks", {"n": 120, "every": 0.05})
        assert next(stream)["event"]["i"] == 0                 # a call in flight through the old mux
        assert mux.stop(host, ConnectOptions(persist=30), {})
        assert wait_until(lambda: not list(Path(muxdir).glob("*.sock")))   # its socket is gone ...
        assert mux_pids(muxdir) == [old]                                 # ... it waits for the call
        direct = Session(host, ConnectOptions(persist=30))
        with direct:
            direct.call("ping.ping", {})
        assert direct.stats.connects == 1
        assert mux.keep([direct]) == 1                          # a new mux, started while the old holds the lock
        assert [e["event"]["i"] for e in stream if "event" in e][-1] == 119   # the call ends; the old mux exits
    finally:
        busy.close()
    log = Path(muxdir) / "mux.log"
    assert wait_until(lambda: live_sockets(muxdir) and old not in mux_pids(muxdir)), log.read_text()
    with Session(host, ConnectOptions(persist=30)) as sess:
        assert sess.call("ping.ping", {"echo": 2})["echo"] == 2
        assert sess.stats.connects == 0 and sess.stats.mux_execs == 1


def test_a_command_that_ends_before_reading_its_stdin_is_reported_by_its_exit_not_a_broken_pipe():
    """The mux relays the end of a command that exited before its stdin came (its stderr, its exit
    status) and closes the client's connection: the client's stdin then finds a broken pipe, and the
    status is still read (a mux that died instead is a lost link: EOF)."""
    import json as _json
    import socket
    client, keeper = socket.socketpair()
    mux.send_frame(keeper, b"R", b"bash: /nope/python3: No such file or directory\n")
    mux.send_frame(keeper, b"S", _json.dumps({"status": 127}).encode())
    keeper.close()
    chan = mux.MuxChannel(client)
    chan.sendall(b"x" * (1 << 20))          # more than the socket buffers: the peer is gone
    chan.shutdown_write()
    assert chan.recv(65536) == b"" and chan.recv_exit_status() == 127
    assert b"No such file" in chan.recv_stderr(65536)
    client, keeper = socket.socketpair()
    keeper.close()
    chan = mux.MuxChannel(client)
    chan.sendall(b"request")
    with pytest.raises(EOFError, match="went away"):
        chan.recv(65536)
