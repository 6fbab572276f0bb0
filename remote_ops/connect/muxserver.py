"""The background process that keeps hosts' connections (``--persist``); see ``mux.py``.

    python .../remote_ops/connect/muxserver.py DIR   < JSON list of host specs (written by mux.spawn)

For each host: take ``DIR/<key>.lock`` (flock; another controller's mux holding it while its
socket answers means this host is served, so it is skipped: two controllers racing leave one mux;
one holding it without an answering socket is starting or exiting, and is waited for), connect with
``transport.Session`` (strict host-key checking against the known_hosts file, ssh_config,
ProxyJump hops), bind ``<key>.sock`` (0600, under a temporary name, then renamed in place) and
serve exec requests until no client has come for ``persist`` seconds, the SSH connection dies, or
a client sends ``Q``. Then the socket is removed. The process ends when its last host is done.
Each exec gets a session channel opened ahead of time when one is ready (the channel-open round
trip is paid while idle, not by the next command).

Resident agents: an agent exec whose client marks it ``resident`` (every op of it declared
``resident`` in the contract, the client's agent bundle the same as this process's) is answered by
one long-lived agent process per host instead of a new interpreter (``Resident``; ``protocol.resident``
on the host): no interpreter start, no bootstrap, modules and parsed sources kept between requests.
It serves one request at a time (a request arriving while it is busy gets a fresh exec, as before);
a client that goes away mid-request, or an agent that dies, ends it (the next request starts a new
one); it ends with the kept connection.
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and not __package__:
    # run by path (mux.spawn): the same remote_ops as the controller that started it, and the
    # script's own folder (remote_ops/) first on sys.path must not shadow anything
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    del sys.path[0]
    if _root not in sys.path:
        sys.path.insert(0, _root)

import fcntl  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from remote_ops.connect import mux  # noqa: E402

LOCK_WAIT_S = 60.0   # how long a new mux waits for one that holds the host's lock without serving


def log(msg: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} mux[{os.getpid()}] {msg}\n")
    sys.stderr.flush()


class Keeper:
    """One host's kept connection and its socket."""

    def __init__(self, d: str, spec: dict):
        from remote_ops.connect.inventory import Host
        from remote_ops.connect.transport import ConnectOptions, Session

        def host(h: dict) -> Host:
            h = dict(h)
            h["identity_file"] = tuple(h.get("identity_file") or ())
            if h.get("proxy_jump") is not None:
                h["proxy_jump"] = tuple(h["proxy_jump"])
            return Host(**h)

        self.dir = d
        self.key = spec["key"]
        self.idle = float(spec["persist"])
        cache = spec.get("agent_cache")
        self.agent_cache = None if cache is None else str(cache)
        self.session = Session(host(spec["host"]),
                               ConnectOptions(connect_timeout=spec.get("connect_timeout"),
                                              ssh_config_path=spec.get("ssh_config_path")),
                               {n: host(h) for n, h in (spec.get("hops") or {}).items()})
        self.path = mux.socket_path(d, self.key)
        self.clients = 0
        self.last = time.monotonic()
        self.stopping = False
        self.lock = threading.Lock()
        self._spare = None
        self._spare_lock = threading.Lock()
        self._residents: dict = {}
        self._residents_lock = threading.Lock()
        self._ino = None

    def run(self) -> None:
        name = self.session.host.name
        lock_fd = os.open(os.path.join(self.dir, self.key + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if not self._take_lock(lock_fd):
                return                                    # another mux serves this host
            os.ftruncate(lock_fd, 0)
            os.write(lock_fd, f"{os.getpid()}\n".encode())
            if mux.identity(self.session.host, self.session.options, self.session.inventory_hosts) != self.key:
                log(f"{name}: its files changed since the command ended; not kept")
                return
            try:
                self.session.open()
            except Exception as exc:  # the command that spawned us connected fine: log and give up
                log(f"{name}: cannot connect: {exc}")
                return
            try:
                self.serve()
            finally:
                self.session.close()
        finally:
            os.close(lock_fd)                             # releases the flock

    def _take_lock(self, lock_fd: int, bound: float = LOCK_WAIT_S) -> bool:
        """The host's lock, or False when another mux serves the host. A mux that holds the lock
        without a socket that answers is starting (then its socket answers soon) or exiting (its
        socket is gone, it still closes its SSH connection or waits for calls in flight): waited
        for, not taken as serving, or a command that found no kept connection would start a mux
        that gives up at once and nothing would be kept."""
        deadline = time.monotonic() + bound
        while True:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                pass
            live = mux._connect(self.path)
            if live is not None:
                live.close()
                return False
            if time.monotonic() > deadline:
                log(f"{self.session.host.name}: another mux held {self.key}.lock without serving for "
                    f"{bound:g}s; not kept")
                return False
            time.sleep(0.05)

    def serve(self) -> None:
        name = self.session.host.name
        tmp = f"{self.path}.{os.getpid()}"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(tmp)
        finally:
            os.umask(old)
        os.chmod(tmp, 0o600)
        srv.listen(64)
        os.replace(tmp, self.path)                       # a stale socket of a killed mux is replaced
        ino = self._ino = os.lstat(self.path).st_ino
        srv.settimeout(0.25)
        log(f"{name}: keeping the connection ({self.path}, {self.idle:g}s idle)")
        threading.Thread(target=self._prestart, daemon=True).start()
        reason = "stopped"
        try:
            while True:
                if not self.session.transport.is_active():
                    reason = "SSH connection lost"
                    break
                with self.lock:
                    if self.stopping:
                        break
                    if self.clients == 0 and time.monotonic() - self.last >= self.idle:
                        reason = f"idle for {self.idle:g}s"
                        break
                try:
                    conn, _ = srv.accept()
                except socket.timeout:
                    continue
                with self.lock:
                    self.clients += 1
                threading.Thread(target=self._client, args=(conn,), daemon=True).start()
        finally:
            try:
                if os.lstat(self.path).st_ino == ino:
                    os.unlink(self.path)
            except OSError:
                pass
            srv.close()
            deadline = time.monotonic() + 30               # let calls in flight end (a stop, not a lost link)
            while reason == "stopped" and self.clients and time.monotonic() < deadline:
                time.sleep(0.05)
            log(f"{name}: exiting ({reason})")

    def _retire(self) -> None:
        """The SSH link is gone: remove the socket now (before the client that found out is told),
        so that the command which then connects itself finds no kept connection when it ends and
        starts a new mux (which waits for this one's lock, _take_lock); the serve loop then exits."""
        try:
            if os.lstat(self.path).st_ino == self._ino:
                os.unlink(self.path)
        except OSError:
            pass

    # ---------------------------------------------------------------- channels
    def _prestart(self) -> None:
        """While no command is waiting: start the host's resident agent for the command line and agent
        cache the next command will most likely use (this host's interpreter), so that its first request
        pays no interpreter start, bootstrap or handshake; then open the spare session channel."""
        from remote_ops.connect import bundle

        res, new = self._resident(bundle.agent_command(self.session.host.python), self.agent_cache)
        if new and res.busy.acquire(blocking=False):
            try:
                res.start(30)                              # a failure is logged; requests start one on demand
            finally:
                res.busy.release()
        with self._spare_lock:
            spare = self._spare
        if spare is None:
            self._refill()

    def _refill(self) -> None:
        """Open the next exec's session channel ahead of time (one at a time)."""
        try:
            chan = self.session.transport.open_session(timeout=30)
        except Exception:  # the link is going: the serve loop notices
            return
        with self._spare_lock:
            if self._spare is None:
                self._spare, chan = chan, None
        if chan is not None:
            chan.close()

    def _channel(self, timeout):
        with self._spare_lock:
            chan, self._spare = self._spare, None
        if chan is not None and not chan.closed and chan.active:
            threading.Thread(target=self._refill, daemon=True).start()
            return chan
        chan = self.session.transport.open_session(timeout=timeout or 30)
        threading.Thread(target=self._refill, daemon=True).start()
        return chan

    # ---------------------------------------------------------------- one client
    def _client(self, conn: socket.socket) -> None:
        try:
            uid = mux.peer_uid(conn)
            if uid is not None and uid != os.getuid():
                log(f"refused a client of uid {uid}")
                return
            conn.settimeout(None)
            kind, body = mux.recv_frame(conn)
            if kind == b"Q":
                with self.lock:
                    self.stopping = True
                return
            if kind == b"X":
                self._exec(conn, json.loads(body))
        except (OSError, EOFError, ValueError):
            pass                                           # the client went away
        finally:
            conn.close()
            with self.lock:
                self.clients -= 1
                self.last = time.monotonic()

    def _exec(self, conn: socket.socket, req: dict) -> None:
        from remote_ops.connect.sshconn import _exec_pipelined

        if isinstance(req.get("persist"), (int, float)) and req["persist"] > 0:
            self.idle = float(req["persist"])              # the latest command's --persist counts
        if req.get("resident") and self._resident_exec(conn, req):
            return
        chan = None
        try:
            chan = self._channel(req.get("timeout"))
            _exec_pipelined(chan, req["command"])
        except Exception as exc:  # nothing ran: the client connects itself
            if chan is not None:
                chan.close()
            if not self.session.transport.is_active():
                self._retire()
            mux.send_frame(conn, b"N", str(exc or type(exc).__name__).encode())
            return
        mux.send_frame(conn, b"A")

        def pump() -> None:                                 # client -> channel: stdin, EOF
            try:
                while True:
                    kind, data = mux.recv_frame(conn)
                    if kind == b"I":
                        chan.sendall(data)
                    elif kind == b"E":
                        chan.shutdown_write()
            except Exception:  # client gone (timeout, killed): end the channel as a direct client would
                chan.close()

        threading.Thread(target=pump, daemon=True).start()
        try:
            while True:
                data = chan.recv(65536)
                while chan.recv_stderr_ready():
                    mux.send_frame(conn, b"R", chan.recv_stderr(65536))
                if not data:
                    break
                mux.send_frame(conn, b"O", data)
            status = chan.recv_exit_status()
            while chan.recv_stderr_ready():
                mux.send_frame(conn, b"R", chan.recv_stderr(65536))
            mux.send_frame(conn, b"S", json.dumps({"status": status}).encode())
        except Exception as exc:  # the link died mid-call: the client reports a lost connection
            try:
                mux.send_frame(conn, b"F", str(exc or type(exc).__name__).encode())
            except OSError:
                pass
        finally:
            chan.close()


    # ---------------------------------------------------------------- resident agents
    def _resident(self, command: str, cache, replace: bool = False) -> tuple["Resident", bool]:
        """The host's resident agent for this command line and agent cache: the registered one unless it
        is dead (or ``replace``), else a new one, not started, registered in its place. (agent, new)."""
        key = (command, cache)
        with self._residents_lock:
            res = self._residents.get(key)
            if res is not None and not res.dead and not replace:
                return res, False
            res = self._residents[key] = Resident(self, command, cache)
            return res, True

    def _resident_exec(self, conn: socket.socket, req: dict) -> bool:
        """Answer one agent exec from the host's resident agent; False (nothing sent to the client)
        when it cannot be used now: another bundle, busy, or it cannot start. Then a fresh exec."""
        from remote_ops.connect import bundle

        want = req["resident"]
        if not isinstance(want, dict) or want.get("agent") != bundle.agent_sha256():
            return False                                   # another remote-ops version: not ours to start
        res, _ = self._resident(req["command"], want.get("cache"))
        if not res.busy.acquire(blocking=False):
            # serving another client: a fresh exec; still starting (ahead of this command): wait for it
            if res.ready:
                return False
            if not res.busy.acquire(timeout=15):
                log(f"{self.session.host.name}: the resident agent still starting after 15 s; a fresh exec answers")
                return False
            if res.dead:                                   # it could not start: a fresh exec
                res.busy.release()
                return False
        # once: before the answer's end is sent, so the client's next request finds it free
        release = _release_once(res.busy)
        try:
            if not res.ready and not res.start(req.get("timeout")):
                return False
            mux.send_frame(conn, b"A")
            request = res.read_request(conn)
            done, current = threading.Event(), [res]

            def watch() -> None:                           # a client gone before the answer: end the agent
                try:
                    while True:
                        mux.recv_frame(conn)               # E (stdin closed) and nothing else is expected
                except Exception:  # EOF or error: the client is gone
                    if not done.is_set():
                        current[0].kill()

            threading.Thread(target=watch, daemon=True).start()
            if res.serve(conn, request, release, done) == "restart":
                # its interpreter's path changed (a package installed): a new agent answers instead
                fresh, _ = self._resident(req["command"], want.get("cache"), replace=True)
                current[0] = fresh
                fresh.busy.acquire()
                release_fresh = _release_once(fresh.busy)  # as release(): or the next request takes a fresh exec
                try:
                    if not fresh.start(req.get("timeout")):
                        done.set()
                        mux.send_frame(conn, b"F", b"the host's resident agent could not be restarted")
                        return True
                    fresh.serve(conn, request, release_fresh, done)
                finally:
                    release_fresh()
            return True
        finally:
            release()


def _release_once(lock):
    """A function that releases ``lock`` the first time it is called and does nothing after."""
    done = []

    def release() -> None:
        if not done:
            done.append(1)
            lock.release()
    return release


class Resident:
    """One long-lived agent on the host (``protocol.resident``) on its own session channel."""

    def __init__(self, keeper: Keeper, command: str, cache):
        self.keeper = keeper
        self.command = command
        self.cache = cache
        self.chan = None
        self.buf = b""
        self.ready = False
        self.dead = False
        self.busy = threading.Lock()

    def kill(self) -> None:
        self.dead = True
        if self.chan is not None:
            self.chan.close()                              # the agent reads EOF (or EPIPE) and exits

    def _line(self) -> bytes | None:
        while b"\n" not in self.buf:
            data = self.chan.recv(65536)
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def start(self, timeout) -> bool:
        from remote_ops.connect import bundle
        from remote_ops.connect.sshconn import _exec_pipelined

        line, why = None, None
        try:
            self.chan = self.keeper._channel(timeout)
            _exec_pipelined(self.chan, self.command)
            self.chan.sendall(bundle.encode_serve(self.cache))
            self.chan.settimeout(60)
            line = self._line()
            if line is not None and line.strip() == bundle.NEED_BUNDLE:
                self.chan.sendall(bundle.agent_payload())
                line = self._line()
            ok = line is not None and json.loads(line).get("resident") is not None
        except Exception as exc:  # the host cannot run one (old bundle, a dead link): fresh execs as before
            why, ok = str(exc) or type(exc).__name__, False
        if not ok:
            # said in mux.log: the request then gets a fresh exec, which the client cannot tell apart
            log(f"{self.keeper.session.host.name}: no resident agent: {why or self._why_not(line)}")
            self.kill()
            return False
        self.chan.settimeout(None)
        self.ready = True
        return True

    def _why_not(self, line) -> str:
        """Why a started agent did not say it was ready: its first line, else how its channel ended."""
        if line is not None:
            return f"it answered {line[:200]!r}"
        err = b""
        try:
            while self.chan.recv_stderr_ready():
                err += self.chan.recv_stderr(65536)
            status = self.chan.recv_exit_status() if self.chan.exit_status_ready() else None
        except Exception:  # the link itself is gone
            status = None
        last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no error output"]
        return f"its channel closed before it was ready (exit status {status}; {last[0][:300]})"

    @staticmethod
    def read_request(conn: socket.socket) -> bytes:
        """The client's stdin (the probe form it sends to any agent): the request it carries."""
        from remote_ops.connect import bundle

        got = b""
        parsed = None
        while parsed is None:                              # header line + request
            kind, data = mux.recv_frame(conn)
            if kind != b"I":                               # nothing was sent to the agent yet
                raise EOFError("the client ended its request early")
            got += data
            parsed = bundle.split_probe(got)
        return parsed[1]

    def serve(self, conn: socket.socket, request: bytes, release, done: threading.Event) -> str | None:
        """Relay one request and the agent's lines (``done`` set once the answer is complete); "restart"
        when the agent declined it unanswered (its sys.path may be stale: ``protocol.RESTART``), the
        client having been sent nothing."""
        from remote_ops.connect import bundle
        from remote_ops.agent.protocol import RESTART, SERVED

        status = None
        try:
            self.chan.sendall(bundle.frame_request(request))
            while status is None:
                line = self._line()
                while self.chan.recv_stderr_ready():
                    mux.send_frame(conn, b"R", self.chan.recv_stderr(65536))
                if line is None:                           # the agent died (a fault, a kill): its exit status
                    self.dead = True
                    status = self.chan.recv_exit_status() if not self.chan.closed else -1
                    break
                if line.startswith(SERVED):
                    status = int(json.loads(line)["served"])
                elif line.startswith(RESTART):
                    self.kill()
                    return "restart"
                else:
                    mux.send_frame(conn, b"O", line + b"\n")
            done.set()
            release()
            mux.send_frame(conn, b"S", json.dumps({"status": status}).encode())
        except Exception as exc:  # the link died mid-request, or the client went away
            self.kill()
            try:
                mux.send_frame(conn, b"F", str(exc or type(exc).__name__).encode())
            except OSError:
                pass


def main(argv: list[str]) -> int:
    d = argv[0]
    if mux.unsafe(d, want_dir=True):
        log(f"refusing {d}: {mux.unsafe(d, want_dir=True)}")
        return 1
    try:
        specs = json.loads(sys.stdin.read() or "[]")
    except ValueError:
        return 1
    sys.stdin.close()
    threads = [threading.Thread(target=Keeper(d, spec).run) for spec in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
