"""The small confusions a new user met, each over the real sshd where a host is
involved: a piped patch with nothing to change, stderr wrapped at 80 columns in a log, a job id
that does not exist, the accepted-drift lines, quoted integers in the inventory, and `sandbox up`
rewriting the tracked inventory."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from remote_ops.errors import Exit
from tests.conftest import REPO, write_inventory

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"


def journal(state: Path) -> list[dict]:
    p = state / "journal" / "journal.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines() if l.strip()] if p.exists() else []


def test_piped_patch_needs_yes_only_when_something_would_change(sshd, fresh_env017, state_dir, inventory_file, cli):
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    assert not sys.stdin.isatty()
    status, out, err = cli("-i", str(inv), "patch", "testhost")          # edits pending: no one to ask
    assert status == Exit.USAGE and journal(state_dir) == []
    assert "patch would change 2 file(s) on testhost and there is no terminal to ask; pass --yes" in err, err
    assert cli("-i", str(inv), "patch", "testhost", "--yes")[0] == 0
    status, out, err = cli("-i", str(inv), "patch", "testhost")          # nothing to change: no --yes needed
    assert status == 0, err
    assert "testhost: no changes" in out and len(journal(state_dir)) == 1


def test_redirected_stderr_is_not_wrapped(sshd, tmp_path):
    name = "a-host-with-a-rather-long-name-so-the-line-passes-eighty-columns"
    state = tmp_path / "state"
    inv = write_inventory(tmp_path / "inv.yaml", {name: sshd.host_entry(
        sys.executable, env={"REMOTE_OPS_STATE_DIR": str(state)}, workdir=str(tmp_path))})
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "hello", "extract": {
        "command": ["{python}", "-c", "print('hello')"], "output_dir": str(tmp_path / "out")}}))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    with open(tmp_path / "err.log", "w") as log:
        p = subprocess.run([sys.executable, "-m", "remote_ops", "-i", str(inv), "extract", name, "--tail",
                            "--playbook", str(pb)], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=log,
                           text=True, timeout=120)
    err = (tmp_path / "err.log").read_text()
    assert p.returncode == 0, err
    (job,) = [d.name for d in (state / "jobs").iterdir() if d.is_dir()]
    line = next(l for l in err.splitlines() if "started job" in l)
    assert line.startswith(f"{name}: started job {job} (pid ") and line.endswith("the job keeps running"), err


def test_unknown_job_points_to_the_list_of_jobs(sshd, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"testhost": sshd.host_entry(
        sys.executable, env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")})})
    for cmd in ("status", "logs", "stop"):
        status, out, err = cli("-i", str(inv), cmd, "testhost", "--job", "NOSUCH")
        assert status == Exit.USAGE, err
        assert "no job NOSUCH on this host" in err
        printed = re.search(r"list the jobs on testhost with: (remote-ops .+ status testhost --all)", err)
        assert printed and printed.group(1) == f"remote-ops -i {inv} status testhost --all", err
        # the printed command works as printed: it names the inventory itself
        words = shlex.split(printed.group(1))[1:]
        status, out, err = cli(*words)
        assert status == 0 and "no jobs" in out.lower(), (status, out, err)


def test_accepted_drift_lines_do_not_contradict_each_other():
    from rich.console import Console

    from remote_ops.check import drift
    from remote_ops.commands.check import render_drift

    items = [{"kind": "default-changed", "symbol": "vllm.config.A", "name": n, "path": "f.py", "line": 3,
              "message": "x"} for n in ("x", "y")]
    accepted = [{"kind": "default-changed", "symbol": "vllm.config.A", "name": n, "why": "reviewed"}
                for n in ("x", "y", "z", "w")]
    res = drift.apply_accepted({"drift": items, "baseline": {"library": "vllm", "version": "0.11.0",
                                                             "source": "pypi"}}, accepted)
    console = Console(record=True, width=300)
    render_drift(console, res)
    text = console.export_text()
    assert ("check.accepted_drift: 2 of 4 entries matched drift on this host; 2 drift item(s) accepted"
            in text), text
    assert ("the other 2 entries matched no drift on this host (written for another version, or stale): "
            "default-changed vllm.config.A.z, default-changed vllm.config.A.w") in text, text
    assert "matched no drift item" not in text


def test_quoted_integers_in_the_inventory(sshd, tmp_path, cli):
    entry = sshd.host_entry(port=str(sshd.port), connect_timeout="10", keepalive="30")
    inv = write_inventory(tmp_path / "inv.yaml", {"h": entry})
    status, out, err = cli("-i", str(inv), "facts", "h", "--json")
    assert status == 0, err
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(port="twenty-two")})
    status, out, err = cli("-i", str(inv), "hosts")
    assert status == Exit.USAGE
    assert "port of host 'h' must be an integer, got string 'twenty-two'" in err, err


def test_sandbox_up_leaves_the_tracked_inventory_as_committed(tmp_path, cli):
    from remote_ops import sandbox

    inv = tmp_path / "inventory.yaml"
    inv.write_bytes((REPO / "inventory.yaml").read_bytes())     # what a fresh clone has
    try:
        status, out, err = cli("-i", str(inv), "sandbox", "up", "--no-torch", "--json")
        assert status == 0, err
        assert inv.read_bytes() == (REPO / "inventory.yaml").read_bytes()
        local = tmp_path / "inventory.local.yaml"
        assert "sandbox:" in local.read_text() and f"port: {json.loads(out)['port']}" in local.read_text()
        # the default inventory names the sandbox through its include: the default host works
        status, out, err = cli("-i", str(inv), "facts", "--json")
        assert status == 0, err
        assert json.loads(out)["packages"]["vllm"]["version"] == "0.17.0"
        status, out, err = cli("-i", str(inv), "hosts")
        assert "gpu-host" in out and "sandbox" in out
        # a second up rewrites only the local file
        assert cli("-i", str(inv), "sandbox", "up", "--no-torch")[0] == 0
        assert inv.read_bytes() == (REPO / "inventory.yaml").read_bytes()
    finally:
        sandbox.down(str(inv), purge=True)
    assert "inventory.local.yaml" in (REPO / ".gitignore").read_text().split()
