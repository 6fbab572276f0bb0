"""paramiko's client Transport without its 0.1 s polling: the class ``SSHClient.connect`` is given
as its ``transport_factory`` (sshconn._Conn.open).

A paramiko client connection wakes up ten times a second while it waits, in three places: its
reading thread (socket timeout ``_active_check_timeout``, only to notice that it should stop or
that the handshake took too long), ``start_client`` and ``auth_publickey`` (``Event.wait(0.1)`` in
a loop, to notice a transport that died). It also starts a ``threading.Timer`` thread per
connection for the handshake timeout. On a fleet every host pays each of these: a few dozen
wake-ups and thread switches per host at 100 ms RTT, for nothing.

Here the same waits end on events instead of a clock:
- ``start_client`` and ``auth_publickey`` use paramiko's own asynchronous forms (an ``event``
  argument: documented API) and wait on that event, which paramiko sets on success, on failure,
  and when its thread ends for any reason (``Transport.run``'s exit path sets the completion and
  auth events). They still look at ``active`` every ``CHECK_S`` (a transport closed by another
  thread sets no event) and keep paramiko's timeouts, errors and return values.
- The reading thread's socket timeout is ``CHECK_S`` from the start, as it already was after the
  handshake (``sshconn.IDLE_POLL_S``); closing a connection shuts its socket down, which ends a
  pending read at once.
- The handshake timeout is a deadline checked at each read (``Packetizer``'s public
  ``start_handshake`` / ``handshake_timed_out`` / ``complete_handshake``), not a timer thread.
  Where paramiko's timer would fire, the next read (at most ``CHECK_S`` later) sees it.

Nothing about the protocol, the algorithms, host-key checking or authentication changes.
"""

from __future__ import annotations

import threading
import time

CHECK_S = 1.0   # how often a waiting thread looks at the transport anyway (paramiko: 0.1 s)

_classes: dict = {}
_lock = threading.Lock()


def transport_class():
    """The Transport subclass (built on first use: paramiko is imported lazily)."""
    return _built()[0]


def packetizer_class():
    """The Packetizer subclass the transport uses (its handshake timeout is a deadline)."""
    return _built()[1]


def _built() -> tuple:
    with _lock:
        if "transport" not in _classes:
            _classes["transport"], _classes["packetizer"] = _build()
        return _classes["transport"], _classes["packetizer"]


def _build():
    import paramiko
    from paramiko.packet import Packetizer
    from paramiko.ssh_exception import AuthenticationException, SSHException

    class DeadlinePacketizer(Packetizer):
        """The handshake timeout as a deadline, not a ``threading.Timer`` thread per connection."""

        _deadline: float | None = None
        _handshake_done = False

        def start_handshake(self, timeout):
            if self._deadline is None:
                self._deadline = time.monotonic() + float(timeout)

        def handshake_timed_out(self):
            return (self._deadline is not None and not self._handshake_done
                    and time.monotonic() >= self._deadline)

        def complete_handshake(self):
            if self._deadline is not None:
                self._handshake_done = True

    class QuietTransport(paramiko.Transport):
        _active_check_timeout = CHECK_S

        def __init__(self, sock, *args, **kwargs):
            kwargs.setdefault("packetizer_class", DeadlinePacketizer)
            super().__init__(sock, *args, **kwargs)

        def _wait(self, event: threading.Event, deadline: float | None) -> bool:
            """Until ``event`` is set (True), the transport is no longer active, or ``deadline``
            (time.time(), as paramiko counts) passes (False)."""
            while not event.is_set():
                if not self.active:
                    return event.is_set()
                left = CHECK_S if deadline is None else min(CHECK_S, deadline - time.time())
                if left <= 0:
                    return False
                event.wait(left)
            return True

        def start_client(self, event=None, timeout=None):
            if event is not None:
                return super().start_client(event=event, timeout=timeout)
            done = threading.Event()
            super().start_client(event=done)   # starts the thread, returns at once
            self._wait(done, time.time() + timeout if timeout is not None else None)
            if not self.active:   # as paramiko's synchronous form: its error, else this one
                e = self.get_exception()
                if e is not None:
                    raise e
                raise SSHException("Negotiation failed.")
            # negotiated, or the timeout passed (paramiko returns then too: the caller's next
            # step finds no session)

        def auth_publickey(self, username, key, event=None):
            if event is not None:
                return super().auth_publickey(username, key, event)
            done = threading.Event()
            super().auth_publickey(username, key, done)   # sends the request, returns at once
            deadline = time.time() + self.auth_timeout if self.auth_timeout is not None else None
            if not self._wait(done, deadline) and self.active:
                raise AuthenticationException("Authentication timeout.")
            # set, or the transport ended: paramiko's own check of the outcome (it returns at
            # once for a set event) raises what it raises, or returns the allowed types
            return self.auth_handler.wait_for_response(done)

    return QuietTransport, DeadlinePacketizer
