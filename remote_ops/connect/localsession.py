"""``connection: local``: the agent run by a subprocess of the controller, no SSH (transport.Session's twin)."""

from __future__ import annotations

import os
import threading
import time
from typing import Iterator

from remote_ops.connect import bundle
from remote_ops.errors import AgentError, TimeoutError_
from remote_ops.connect.transport import Session


class LocalSession(Session):
    """``connection: local``: the same agent and request, run by a subprocess of the controller.

    For people who run remote-ops on the GPU host itself (e.g. inside tmux after ``ssh``) and for
    machines without sshd. The command line is byte for byte what an SSH exec gets and stdin the
    same request in its self-contained form (bundle.encode_request, no host cache); the
    environment is the controller's own (an SSH exec gets sshd's login environment).
    """

    bundle_probe = False   # stdin is written in one go: the self-contained form

    def open(self) -> "LocalSession":
        return self

    def close(self) -> None:
        pass

    def open_sample(self, path: str, slot: int = 0):
        """A sample file on this machine (the host is the controller): gather reads it directly. Only
        a regular file, opened without following a link (OSError otherwise); ``slot`` (an SFTP
        channel's, over SSH) changes nothing here."""
        import stat
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NOFOLLOW)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OSError(f"{path} is not a regular file (never followed)")
        return os.fdopen(fd, "rb")

    @property
    def transport(self):
        raise AgentError("a local connection has no SSH transport", host=self.label)

    def _run_agent(self, payload: bytes, timeout: float | None, what: str, end: dict,
                   resident: dict | None = None) -> Iterator[bytes]:
        import selectors
        import subprocess

        proc = subprocess.Popen(["/bin/sh", "-c", bundle.agent_command(self._python())],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                # a terminal's Ctrl-C reaches the controller only (as over SSH): the
                                # agent finishes the change it has begun, and the controller says what it was
                                start_new_session=True)
        stderr_chunks: list[bytes] = []

        def feed() -> None:
            try:
                proc.stdin.write(payload)
                proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass   # the agent ended early; its exit status says why

        writer = threading.Thread(target=feed, daemon=True)
        writer.start()
        self.stats.bytes_sent += len(payload)
        deadline = None if not timeout else time.monotonic() + timeout
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        sel.register(proc.stderr, selectors.EVENT_READ)
        open_streams = 2
        try:
            while open_streams:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready = sel.select(wait)
                if not ready:
                    raise TimeoutError_(f"local operation {what} timed out after {timeout:g}s", host=self.label)
                for key, _ in ready:
                    data = os.read(key.fileobj.fileno(), 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    elif key.fileobj is proc.stderr:
                        stderr_chunks.append(data)
                    else:
                        yield data
            status = proc.wait()
        finally:
            sel.close()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            for f in (proc.stdout, proc.stderr):
                f.close()
            writer.join(timeout=1)
        end["stderr"] = b"".join(stderr_chunks).decode(errors="replace").strip()
        if status < 0:
            end["stderr"] = (end["stderr"] + f"\nkilled by signal {-status}").strip()
            status = 128 - status
        end["status"] = status
