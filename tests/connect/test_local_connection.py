"""``connection: local``: the same agent and request, run by a subprocess of the controller.

Compared against the same commands over the real sshd: the JSON is the same whichever way the
host was reached (only the connection counters differ).
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_inventory
from remote_ops.errors import Exit


def _both(tmp_path, sshd, python: str, **extra) -> str:
    ssh = sshd.host_entry(python, **extra)
    local = {"connection": "local", "python": python, **extra}
    return str(write_inventory(tmp_path / "inv.yaml", {"viassh": ssh, "here": local}))


def _drop_volatile(facts: dict) -> dict:
    facts = dict(facts)
    facts.pop("disk", None)            # free bytes move between two calls
    facts.pop("host", None)            # the inventory name differs by construction
    facts.pop("memory", None)
    facts.pop("load", None)            # the load average moves every 5 s (and with other tests)
    return facts


def test_facts_same_over_local_and_ssh(tmp_path, sshd, env_vllm017, cli):
    inv = _both(tmp_path, sshd, str(env_vllm017))
    s1, out_ssh, err1 = cli("facts", "viassh", "--json", "-i", inv)
    s2, out_local, err2 = cli("facts", "here", "--json", "-i", inv)
    assert (s1, s2) == (0, 0), (err1, err2)
    a, b = json.loads(out_ssh), json.loads(out_local)
    assert _drop_volatile(a) == _drop_volatile(b)
    assert b["packages"]["vllm"]["version"] == "0.17.0"


def test_check_same_over_local_and_ssh(tmp_path, sshd, env_vllm017, cli):
    inv = _both(tmp_path, sshd, str(env_vllm017))
    s1, out_ssh, _ = cli("check", "viassh", "--json", "-i", inv)
    s2, out_local, _ = cli("check", "here", "--json", "-i", inv)
    assert s1 == s2 == Exit.FINDINGS
    a, b = json.loads(out_ssh), json.loads(out_local)
    a.pop("host", None), b.pop("host", None)
    assert a["findings"] == b["findings"] and len(b["findings"]) >= 4


def test_local_round_trips_and_streams(env_vllm017):
    from remote_ops.connect.inventory import Host
    from remote_ops.connect.localsession import LocalSession
    from remote_ops.connect.sessions import session_for

    sess = session_for(Host(name="here", hostname="localhost", python=str(env_vllm017), connection="local"))
    assert isinstance(sess, LocalSession)
    with sess:
        res = sess.call_many([("ping.ping", {"echo": "a"}), ("ping.ping", {"echo": "b"})])
        assert [r["result"]["echo"] for r in res] == ["a", "b"]
        assert sess.stats.execs == 1 and sess.stats.connects == 0
        events = list(sess.stream("ping.ticks", {"n": 3, "every": 0.01}))
        assert len([e for e in events if "event" in e]) == 3 and "result" in events[-1]


def test_local_missing_interpreter_is_one_line(tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"here": {"connection": "local", "python": str(tmp_path / "nope")}})
    status, out, err = cli("facts", "here", "-i", str(inv))
    assert status == Exit.REMOTE
    assert "remote interpreter" in err and "not found" in err and "Traceback" not in err


def test_local_timeout_kills_the_agent(tmp_path, env_vllm017):
    from remote_ops.errors import TimeoutError_
    from remote_ops.connect.inventory import Host
    from remote_ops.connect.sessions import session_for

    sess = session_for(Host(name="here", hostname="localhost", python=str(env_vllm017), connection="local"))
    with pytest.raises(TimeoutError_):
        list(sess.stream("ping.ticks", {"n": 50, "every": 0.2}, timeout=0.5))


def test_unknown_connection_kind_is_a_file_line_error(tmp_path, cli):
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  here:\n    connection: lcal\n")
    status, _, err = cli("facts", "here", "-i", str(inv))
    assert status == Exit.USAGE
    assert f"{inv}:3:" in err and "ssh, local" in err
