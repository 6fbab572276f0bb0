"""Session.stream_result: the one reader of a generator op's stream (events to a callback, the result
returned, a stream that ends without a result an AgentError naming what ended), used by verify and by
the shard listing of verify GROUP / gather. Real agent processes: over the real sshd and a local one."""

from __future__ import annotations

import hashlib
import sys

import pytest

from remote_ops.connect.inventory import Host
from remote_ops.connect.localsession import LocalSession
from remote_ops.errors import AgentError
from remote_ops.extract import shard as shard_mod


def test_events_go_to_the_callback_and_the_result_is_returned(sshd):
    events = []
    with sshd.session(sys.executable) as sess:
        res = sess.stream_result("ping.ticks", {"n": 3, "every": 0.01}, timeout=60, on_event=events.append)
    assert res == {"done": True}
    assert [e["i"] for e in events] == [0, 1, 2]


def test_the_shard_listing_reads_through_it(sshd, tmp_path):
    for i, body in enumerate((b"a" * 10, b"b" * 20)):
        (tmp_path / f"data_{i}.pt").write_bytes(body)
    with sshd.session(sys.executable) as sess:
        listing = shard_mod._files(sess, str(tmp_path), digest=True, on_progress=lambda done, of: None)
    assert [(f["name"], f["sha256"]) for f in listing["files"]] == [
        ("data_0.pt", hashlib.sha256(b"a" * 10).hexdigest()), ("data_1.pt", hashlib.sha256(b"b" * 20).hexdigest())]


def test_a_stream_that_ends_without_a_result_names_what_ended(tmp_path):
    silent = tmp_path / "silent-python"          # an interpreter that reads the request and exits 0, saying nothing
    silent.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    silent.chmod(0o755)
    sess = LocalSession(Host(name="quiet", hostname="localhost", python=str(silent), proxy_jump=()))
    with pytest.raises(AgentError) as ei:
        shard_mod._files(sess, str(tmp_path))
    assert ei.value.one_line() == "quiet: listing the outputs ended without an answer (rerun it)"
    with pytest.raises(AgentError) as ei:
        sess.stream_result("ping.ticks", {"n": 1})
    assert "ping.ticks ended without an answer" in ei.value.one_line()
