"""The loopback sshd used by the tests, the sandbox and the benchmarks (remote_ops/sshd.py)."""

from __future__ import annotations

import socket

import pytest

from remote_ops.errors import RemoteOpsError
from remote_ops.sshd import SshdServer


def test_a_picked_port_taken_before_sshd_binds_it_moves_to_a_free_one(tmp_path):
    """Parallel test workers each start an sshd on a port picked free: when another process binds
    it first, sshd exits at start and the server takes the next free port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = SshdServer(tmp_path / "sshd")
        server.port = taken.getsockname()[1]          # as if another worker got there first
        server.start()
        try:
            assert server.port != taken.getsockname()[1] and server.running()
            assert f"[127.0.0.1]:{server.port} " in server.known_hosts.read_text()
            with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
                assert s.recv(4) == b"SSH-"
        finally:
            server.stop()


def test_a_port_given_is_kept_and_a_taken_one_is_one_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(RemoteOpsError, match=f"port {port} .*Address already in use") as exc:
            SshdServer(tmp_path / "sshd", port=port).start()
        assert exc.value.one_line().endswith(f"(port {port} may be in use)")
