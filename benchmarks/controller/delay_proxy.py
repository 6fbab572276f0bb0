"""A TCP proxy on loopback that delays each direction by RTT/2 (this kernel has no netem).

Every chunk read from one side is stamped ``due = arrival + rtt/2`` and queued; one writer per
direction waits until the head chunk is due and writes it. Chunks therefore keep their order and
overlap in flight (a stream of chunks is delayed once, not once per chunk), so throughput is that of
loopback while every byte arrives rtt/2 late. A new connection also waits one RTT before the proxy
connects upstream, standing in for the TCP handshake a real far-away host costs.

Use as a library (``ProxyServer`` in a thread of its own) or, as the benchmark does, as a separate
process so the proxy never competes with the measured client for the GIL::

    python benchmarks/controller/delay_proxy.py --rtt-ms 20 UPSTREAM_HOST:PORT[@LISTEN_PORT] ...

It prints one JSON line ``{"listen": [[host, port], ...]}`` when ready, then reads commands on stdin:
``rtt MS`` (change the delay for data arriving from now on; answers ``ok``) and ``quit``.
Only loopback addresses are accepted, for both listening and upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import sys
import threading
import time

CHUNK = 256 * 1024


def _loopback(host: str) -> str:
    if not ipaddress.ip_address(host).is_loopback:
        raise ValueError(f"{host} is not a loopback address (the proxy only works on 127.0.0.0/8)")
    return host


class ProxyServer:
    """Listeners on 127.0.0.x, each forwarding to one upstream with a shared, changeable RTT."""

    def __init__(self, routes: list[tuple[tuple[str, int], tuple[str, int]]], rtt_ms: float = 0.0):
        # routes: [((listen_host, listen_port or 0), (upstream_host, upstream_port)), ...]
        self.routes = [((_loopback(lh), lp), (_loopback(uh), up)) for (lh, lp), (uh, up) in routes]
        self.rtt = rtt_ms / 1000.0
        self.listening: list[tuple[str, int]] = []
        self._servers: list[asyncio.base_events.Server] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.connections = 0

    # --------------------------------------------------------------- data path
    async def _pump(self, reader: asyncio.StreamReader, writer_ready: asyncio.Future,
                    one_way: float | None) -> None:
        """Read chunks as they come and hand them to the writer with their due time."""
        queue: asyncio.Queue = asyncio.Queue()
        writer_task = asyncio.ensure_future(self._deliver(queue, writer_ready))
        try:
            while True:
                data = await reader.read(CHUNK)
                due = time.monotonic() + (self.rtt / 2 if one_way is None else one_way)
                queue.put_nowait((due, data))
                if not data:
                    break
        except (ConnectionError, OSError):
            queue.put_nowait((time.monotonic(), b""))
        await writer_task

    @staticmethod
    async def _deliver(queue: asyncio.Queue, writer_ready: asyncio.Future) -> None:
        writer: asyncio.StreamWriter = await writer_ready
        try:
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the peer went away; the other direction notices on its own

    async def _handle(self, upstream: tuple[str, int], c_reader, c_writer) -> None:
        self.connections += 1
        _nodelay(c_writer)
        accepted = time.monotonic()
        up_ready: asyncio.Future = asyncio.get_running_loop().create_future()
        down_ready: asyncio.Future = asyncio.get_running_loop().create_future()
        down_ready.set_result(c_writer)
        # client -> server: start reading at once (bytes queue up while we "connect")
        to_server = asyncio.ensure_future(self._pump(c_reader, up_ready, None))
        try:
            handshake = self.rtt - (time.monotonic() - accepted)
            if handshake > 0:
                await asyncio.sleep(handshake)
            u_reader, u_writer = await asyncio.open_connection(*upstream)
        except OSError:
            c_writer.close()
            to_server.cancel()
            return
        _nodelay(u_writer)
        up_ready.set_result(u_writer)
        to_client = asyncio.ensure_future(self._pump(u_reader, down_ready, None))
        await asyncio.gather(to_server, to_client, return_exceptions=True)
        for w in (u_writer, c_writer):
            try:
                w.close()
            except Exception:  # closing a socket the peer already reset
                pass

    # --------------------------------------------------------------- lifecycle
    async def _start(self) -> None:
        for (lh, lp), upstream in self.routes:
            srv = await asyncio.start_server(
                lambda r, w, u=upstream: self._handle(u, r, w), lh, lp, reuse_address=True)
            self._servers.append(srv)
            self.listening.append(srv.sockets[0].getsockname()[:2])

    def start(self) -> "ProxyServer":
        """Run in a daemon thread of this process (library use, tests)."""
        ready = threading.Event()
        errors: list[BaseException] = []

        def main():
            self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start())
            except BaseException as exc:  # reported to the caller of start()
                errors.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=main, name="delay-proxy", daemon=True)
        self._thread.start()
        ready.wait()
        if errors:
            raise errors[0]
        return self

    def set_rtt(self, rtt_ms: float) -> None:
        self.rtt = rtt_ms / 1000.0

    def stop(self) -> None:
        if self._loop is None:
            return

        async def close():
            for s in self._servers:
                s.close()
        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread:
            self._thread.join(5)


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _parse_route(spec: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``UPHOST:UPPORT[@[LISTENHOST:]LISTENPORT]``; the listener defaults to the upstream's address."""
    up, _, listen = spec.partition("@")
    uh, _, up_port = up.rpartition(":")
    if listen:
        lh, _, lp = listen.rpartition(":")
        return (lh or uh, int(lp)), (uh, int(up_port))
    return (uh, 0), (uh, int(up_port))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("routes", nargs="+", metavar="UPHOST:PORT[@[LISTENHOST:]PORT]")
    a = ap.parse_args(argv)
    proxy = ProxyServer([_parse_route(r) for r in a.routes], a.rtt_ms).start()
    print(json.dumps({"listen": proxy.listening}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "rtt":
            proxy.set_rtt(float(cmd[1]))
            print("ok", flush=True)
        elif cmd[0] == "stats":
            print(json.dumps({"connections": proxy.connections}), flush=True)
        elif cmd[0] == "quit":
            break
    # open connections die with the process; nothing to drain
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
