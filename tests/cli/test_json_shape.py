"""One JSON shape for every command: a dead host and a live one, named alone and as a group.

Every command goes through the same fleet (``remote_ops.fleet``) and the same output path
(``Context.show``), so the shape cannot depend on the command:
- a target naming one host prints that host's record (an object whose ``host`` is the name) or, when
  the host failed, the error object every error prints (``error``, ``message``, ``hint``,
  ``exit_status``, ``host``), and the process exits with that ``exit_status``;
- a group or comma list prints ``{"hosts": [{"host", "ok", "result" | "error"}], "failed": [...]}``
  in target order, exiting with the first failed host's status, plus ``"group"`` where the operation
  computes a record over the hosts (status: totals, rate, ETA; verify of shards: their union).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remote_ops.sshd import free_port
from tests.conftest import REPO, write_inventory

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
ERROR_KEYS = {"error", "message", "hint", "exit_status", "host"}

pytestmark = pytest.mark.timeout(600)

# every command, with what it needs to run (the target is inserted after the command)
COMMANDS = [
    ("facts",), ("inspect", "vllm.v1.request:Request"), ("check",), ("check", "--candidates"), ("patch", "--yes"),
    ("history",),
    ("rollback",), ("extract", "--dry-run"), ("status",), ("status", "--all"), ("logs",),
    ("stop", "--grace", "0"), ("verify", "--output-dir", "/nonexistent-output"),
]


@pytest.fixture
def inv(tmp_path, sshd, fresh_env017, state_dir) -> Path:
    live = sshd.host_entry(str(fresh_env017), playbook=str(SHIPPED), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    dead = dict(live, port=free_port(), connect_timeout=5)     # nothing listens there
    return write_inventory(tmp_path / "inventory.yaml", {"live": live, "dead": dead},
                           groups={"both": ["live", "dead"]})


def _run(cli, inv, command, target):
    status, out, err = cli("-i", str(inv), command[0], target, *command[1:], "--json")
    return status, json.loads(out), err


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_one_json_shape(cli, inv, command):
    # a dead host alone: the error object, exit 3 (unreachable)
    status, doc, err = _run(cli, inv, command, "dead")
    assert set(doc) == ERROR_KEYS and doc["error"] == "UnreachableError", doc
    assert doc["host"] == "dead" and doc["exit_status"] == status == 3
    assert err.strip().splitlines()[-1].startswith("remote-ops: dead: ")

    # the live host alone: its record, or (status with no job, verify of a missing dir ...) its error
    status, live, _ = _run(cli, inv, command, "live")
    assert live["host"] == "live", live
    if "error" in live and set(live) >= ERROR_KEYS:
        assert live["exit_status"] == status != 0
    else:
        assert "hosts" not in live and "failed" not in live

    # both as a group, and as a comma list: the envelope, dead host reported, live host's entry the
    # same object as alone (a record under "result", an error under "error")
    for target in ("both", "live,dead"):
        status, doc, err = _run(cli, inv, command, target)
        assert set(doc) - {"group"} == {"hosts", "failed"}, doc
        # "group": a record over the hosts, from the operations that compute one (status: totals)
        assert ("group" in doc) == (command == ("status",)), doc
        assert [h["host"] for h in doc["hosts"]] == ["live", "dead"]
        entry, dead = doc["hosts"]
        assert dead["ok"] is False and dead["error"]["error"] == "UnreachableError" and "dead" in doc["failed"]
        assert set(entry) == {"host", "ok", "result" if entry["ok"] else "error"}
        if entry["ok"]:
            assert set(entry["result"]) == set(live) and entry["result"]["host"] == "live"
        else:
            assert set(entry["error"]) == set(live) and entry["error"]["exit_status"] == live["exit_status"]
        assert status == (live["exit_status"] if not entry["ok"] else 3)
        assert "remote-ops: dead: " in err


def _stdout_of(args: list[str], *, tty: bool) -> str:
    """The CLI in a child process whose stdout is a pipe, or a pseudo-terminal like a person's."""
    import os
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "remote_ops", *args]
    env = dict(os.environ, COLUMNS="200")
    if not tty:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO, timeout=120)
        assert p.returncode == 0, p.stderr
        return p.stdout.decode()
    master, slave = os.openpty()
    try:
        p = subprocess.Popen(cmd, stdout=slave, stderr=subprocess.PIPE, env=env, cwd=REPO)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:     # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        assert p.wait(timeout=120) == 0, p.stderr.read()
    finally:
        os.close(master)
    return b"".join(chunks).decode().replace("\r\n", "\n")


def test_json_is_indented_at_a_terminal_and_one_line_when_piped(tmp_path, sshd):
    inv = write_inventory(tmp_path / "inventory.yaml", {"a": sshd.host_entry(), "b": sshd.host_entry()},
                          groups={"both": ["a", "b"]})
    args = ["-i", str(inv), "hosts", "--json"]
    piped, shown = _stdout_of(args, tty=False), _stdout_of(args, tty=True)
    assert json.loads(piped) == json.loads(shown) and len(json.loads(piped)["hosts"]) == 2
    assert piped.count("\n") == 1 and piped.endswith("}\n")      # one line: the C encoder's form
    assert shown.startswith("{\n  \"") and shown.count("\n") > 10  # indented for a person
