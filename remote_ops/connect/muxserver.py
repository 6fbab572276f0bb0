"""The background process that keeps hosts' connections (``--persist``); see ``mux.py``.

    python .../remote_ops/connect/muxserver.py DIR   < JSON list of host specs (written by mux.spawn)

For each host: take ``DIR/<key>.lock`` (flock; another controller's mux already holding it means
this host is served, so it is skipped: two controllers racing leave one mux), connect with
``transport.Session`` (strict host-key checking against the known_hosts file, ssh_config,
ProxyJump hops), bind ``<key>.sock`` (0600, under a temporary name, then renamed in place) and
serve exec requests until no client has come for ``persist`` seconds, the SSH connection dies, or
a client sends ``Q``. Then the socket is removed. The process ends when its last host is done.
Each exec gets a session channel opened ahead of time when one is ready (the channel-open round
trip is paid while idle, not by the next command).
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

    def run(self) -> None:
        name = self.session.host.name
        lock_fd = os.open(os.path.join(self.dir, self.key + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return                                    # another mux serves (or is starting for) this host
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
        ino = os.lstat(self.path).st_ino
        srv.settimeout(0.25)
        log(f"{name}: keeping the connection ({self.path}, {self.idle:g}s idle)")
        threading.Thread(target=self._refill, daemon=True).start()
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

    # ---------------------------------------------------------------- channels
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
        chan = None
        try:
            chan = self._channel(req.get("timeout"))
            _exec_pipelined(chan, req["command"])
        except Exception as exc:  # nothing ran: the client connects itself
            if chan is not None:
                chan.close()
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
