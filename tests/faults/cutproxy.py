"""A TCP proxy on 127.0.0.1 in front of sshd that cuts connections (fault injection).

    proxy = CutProxy("127.0.0.1", sshd_port).start()
    proxy.arm(up=20_000)        # the next connection dies after 20,000 bytes client -> server
    proxy.arm(down=5_000)       # ... or after 5,000 bytes server -> client
    proxy.cut_all()             # every live connection dies now
    proxy.stop()

A cut forwards exactly the bytes up to the limit, then resets both sockets (SO_LINGER 0: an RST,
like a dead link or a killed peer), so neither end sees a clean SSH disconnect.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from dataclasses import dataclass, field


@dataclass
class ProxyStats:
    connections: int = 0
    cuts: int = 0
    bytes_up: int = 0        # client -> server, all connections
    bytes_down: int = 0      # server -> client
    per_connection: list = field(default_factory=list)   # [(up, down, cut_reason|None)]


def _reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


class _Pipe:
    def __init__(self, proxy: "CutProxy", client: socket.socket, up: int | None, down: int | None):
        self.proxy = proxy
        self.client = client
        self.server: socket.socket | None = None
        self.limit = {"up": up, "down": down}
        self.count = {"up": 0, "down": 0}
        self.cut_now = threading.Event()
        self.reason: str | None = None

    def run(self) -> None:
        try:
            self.server = socket.create_connection((self.proxy.target_host, self.proxy.target_port), timeout=10)
            self.server.settimeout(None)
        except OSError:
            _reset(self.client)
            return
        for s in (self.client, self.server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ends = {self.client: ("up", self.server), self.server: ("down", self.client)}
        try:
            while not self.cut_now.is_set() and not self.proxy.stopping.is_set():
                ready, _, _ = select.select(list(ends), [], [], 0.05)
                for src in ready:
                    direction, dst = ends[src]
                    data = src.recv(65536)
                    if not data:           # a clean close on one side: pass it on and finish
                        try:
                            dst.shutdown(socket.SHUT_WR)
                        except OSError:
                            pass
                        ends.pop(src)
                        if not ends:
                            return
                        continue
                    limit = self.limit[direction]
                    if limit is not None and self.count[direction] + len(data) >= limit:
                        keep = max(0, limit - self.count[direction])
                        if keep:
                            dst.sendall(data[:keep])
                        self._account(direction, keep)
                        self.reason = f"{direction}@{limit}"
                        return
                    dst.sendall(data)
                    self._account(direction, len(data))
                if not ends:
                    return
            if self.cut_now.is_set():
                self.reason = "command"
        except OSError:
            pass
        finally:
            self._finish()

    def _account(self, direction: str, n: int) -> None:
        self.count[direction] += n
        with self.proxy.lock:
            if direction == "up":
                self.proxy.stats.bytes_up += n
            else:
                self.proxy.stats.bytes_down += n

    def _finish(self) -> None:
        if self.reason:
            _reset(self.client)
            if self.server is not None:
                _reset(self.server)
        else:
            for s in (self.client, self.server):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
        with self.proxy.lock:
            if self.reason:
                self.proxy.stats.cuts += 1
            self.proxy.stats.per_connection.append((self.count["up"], self.count["down"], self.reason))
            self.proxy.pipes.discard(self)


class CutProxy:
    """Forwards 127.0.0.1:<port> to ``target``; cuts after N bytes per direction or on command."""

    def __init__(self, target_host: str, target_port: int, address: str = "127.0.0.1"):
        if not target_host.startswith("127.") or not address.startswith("127."):
            raise ValueError("the cut proxy only works on loopback")
        self.target_host = target_host
        self.target_port = target_port
        self.address = address
        self.port = 0
        self.stats = ProxyStats()
        self.lock = threading.Lock()
        self.pipes: set[_Pipe] = set()
        self.stopping = threading.Event()
        self._armed: tuple[int | None, int | None] = (None, None)
        self._sticky = False
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> "CutProxy":
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((self.address, 0))
        self._listener.listen(64)
        self._listener.settimeout(0.1)
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="cutproxy")
        self._thread.start()
        return self

    def arm(self, up: int | None = None, down: int | None = None, sticky: bool = False) -> None:
        """Limits for the next connection (every later one too with ``sticky``)."""
        with self.lock:
            self._armed = (up, down)
            self._sticky = sticky

    def disarm(self) -> None:
        self.arm(None, None, False)

    def cut_all(self) -> int:
        with self.lock:
            pipes = list(self.pipes)
        for p in pipes:
            p.cut_now.set()
        return len(pipes)

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self.lock:
                up, down = self._armed
                if not self._sticky:
                    self._armed = (None, None)
                self.stats.connections += 1
                pipe = _Pipe(self, client, up, down)
                self.pipes.add(pipe)
            threading.Thread(target=pipe.run, daemon=True, name="cutproxy-pipe").start()

    def stop(self) -> None:
        self.stopping.set()
        if self._listener is not None:
            self._listener.close()
        if self._thread is not None:
            self._thread.join(2)

    def __enter__(self) -> "CutProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
