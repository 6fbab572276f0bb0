"""paramiko's Transport as connect/quiet.py gives it to SSHClient: the same connection, waits that
end on events instead of 0.1 s wake-ups, and the handshake timeout as a deadline (no Timer thread).

Real sshd for the connection; a socketpair for the packetizer's deadline; a port that accepts TCP
and never speaks SSH for a wait that another thread ends. No timing assertions: joins are bounded
only so that a hang fails the test instead of stalling the run.
"""

from __future__ import annotations

import socket
import threading


def test_a_session_connects_through_the_quiet_transport_without_a_timer_thread(sshd, monkeypatch):
    import paramiko.packet

    from remote_ops.connect.quiet import CHECK_S

    timers = []
    real_timer = threading.Timer
    monkeypatch.setattr(paramiko.packet.threading, "Timer",
                        lambda *a, **k: timers.append(a) or real_timer(*a, **k))
    sess = sshd.session()
    try:
        t = sess.transport
        assert type(t).__name__ == "QuietTransport" and type(t.packetizer).__name__ == "DeadlinePacketizer"
        assert t.is_authenticated() and t.get_remote_server_key().get_name() == "ssh-ed25519"
        assert sess.call("ping.ping", {"echo": "q"})["echo"] == "q"
        assert t._active_check_timeout == CHECK_S and t.packetizer.handshake_timed_out() is False
    finally:
        sess.close()
    assert timers == []   # paramiko's handshake timer thread was never started


def test_the_handshake_deadline_replaces_the_timer():
    from remote_ops.connect.quiet import packetizer_class

    a, b = socket.socketpair()
    try:
        p = packetizer_class()(a)
        assert p.handshake_timed_out() is False            # not started: never timed out
        p.start_handshake(0)
        assert p.handshake_timed_out() is True             # past its deadline
        p.complete_handshake()
        assert p.handshake_timed_out() is False            # done in time is never timed out
        p2 = packetizer_class()(b)
        p2.start_handshake(3600)
        assert p2.handshake_timed_out() is False
        p2.start_handshake(0)                              # a second start keeps the first deadline
        assert p2.handshake_timed_out() is False
    finally:
        a.close()
        b.close()


def test_a_transport_closed_while_it_negotiates_ends_the_wait(tmp_path):
    """start_client waits on an event; a close from another thread sets none, and the wait still
    ends (it looks at the transport every CHECK_S) with an error (paramiko's, or the one its
    thread saved), never as if negotiated."""
    import paramiko

    from remote_ops.connect.quiet import transport_class
    from tests.conftest import silent_port

    with silent_port() as port:
        sock = socket.create_connection(("127.0.0.1", port))
        t = transport_class()(sock)
        outcome = []

        def negotiate():
            try:
                t.start_client(timeout=600)
                outcome.append("returned")
            except (paramiko.SSHException, EOFError, OSError) as exc:   # what the dead transport saved
                outcome.append(exc)

        waiter = threading.Thread(target=negotiate, daemon=True)
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive()            # no greeting yet: still waiting
        t.close()
        waiter.join(timeout=60)
        assert not waiter.is_alive() and len(outcome) == 1 and outcome[0] != "returned"
