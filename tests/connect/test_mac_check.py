"""paramiko's packet MAC check goes through hmac.compare_digest (C, constant time) and still refuses
a tampered packet, on a real sshd connection."""

from __future__ import annotations

import hmac
import inspect
import logging
import sys

import pytest

from remote_ops.connect.sshconn import _import_paramiko
from remote_ops.errors import RemoteOpsError


def test_replacement_is_installed_where_paramiko_checks_packets():
    paramiko = _import_paramiko()
    import paramiko.packet
    import paramiko.util

    assert paramiko.util.constant_time_bytes_eq is hmac.compare_digest
    # paramiko.packet looks the function up on paramiko.util at each packet (both MAC modes), so
    # the replacement is what it calls; a paramiko that imports its own reference would fail here
    assert paramiko.packet.util is paramiko.util
    src = inspect.getsource(paramiko.packet.Packetizer.read_message)
    assert src.count("util.constant_time_bytes_eq(my_mac, mac)") == 2
    eq = paramiko.util.constant_time_bytes_eq
    mac = bytes(range(32))
    assert eq(mac, bytes(mac)) is True
    assert eq(mac, mac[:-1] + b"\x00") is False          # last byte differs
    assert eq(mac, b"\xff" + mac[1:]) is False           # first byte differs
    assert eq(mac, mac[:16]) is False                    # length differs
    assert eq(b"", b"") is True
    _import_paramiko()                                   # installing twice changes nothing
    assert paramiko.util.constant_time_bytes_eq is hmac.compare_digest


def _tamper_next_packet(transport) -> dict:
    """Flip the last byte read for the next incoming packet's body (its MAC, or the MAC-covered
    ciphertext in encrypt-then-MAC mode), as a corrupting link would."""
    pk = transport.packetizer
    real = pk.read_all
    state = {"armed": True, "flipped": 0}

    def read_all(n, check_rekey=False):
        data = real(n, check_rekey)
        if state["armed"] and not check_rekey and len(data) >= 1:   # not the first block of a packet
            state["armed"] = False
            state["flipped"] += 1
            data = data[:-1] + bytes([data[-1] ^ 0x01])
        return data
    pk.read_all = read_all
    return state


def test_tampered_packet_mac_is_refused_on_a_real_connection(sshd, caplog):
    caplog.set_level(logging.ERROR, logger="paramiko")
    sess = sshd.session(python=sys.executable)
    try:
        assert sess.call("ping.ping", {"echo": "before"})["echo"] == "before"
        transport = sess._conn.transport
        assert "gcm" not in transport.remote_cipher and transport.remote_mac.startswith("hmac-")
        state = _tamper_next_packet(transport)
        with pytest.raises(RemoteOpsError):
            sess.call("ping.ping", {"echo": "after"}, timeout=20)
        assert state["flipped"] == 1
        assert not transport.is_active()
        # refused by the MAC check itself (paramiko's reading thread logs why it dropped the link)
        assert any("Mismatched MAC" in r.getMessage() for r in caplog.records)
    finally:
        sess.close()
