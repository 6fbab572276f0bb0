"""Every command in README.md, exercised: the quick start runs as written, line by line,
on a sandbox under tmp (real sshd, real packages, the stand-in job); the "Your own host" commands
run as written against a host named `gpu-host` that is that sandbox reached through its own
known_hosts file (so `--accept-new` really records a key); every other `remote-ops ...` the README
shows in code is parsed by the CLI's own parser (a renamed command or flag fails here). The set-up
block's `bootstrap.sh` is run by scripts/demo.sh (tests/sandbox/test_sandbox.py), the Python API example
by tests/cli/test_api.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

README = REPO / "README.md"


def blocks(text: str, lang: str) -> list[tuple[str, str]]:
    """(the heading above, the block's body) of every fenced block of ``lang``."""
    out = []
    heading = ""
    for m in re.finditer(rf"^(#+ [^\n]+)$|^```{lang}\n(.*?)^```", text, re.M | re.S):
        if m.group(1):
            heading = m.group(1)
        else:
            out.append((heading, m.group(2)))
    return out


def commands(body: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in body.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def section(heading: str) -> list[str]:
    (body,) = [b for h, b in blocks(README.read_text(), "bash") if h == heading]
    return commands(body)


def test_the_set_up_block_is_the_two_commands():
    assert section("## Set up") == ["bash scripts/bootstrap.sh", 'export PATH="$PWD/.venv/bin:$PATH"']


def test_every_remote_ops_command_in_the_readme_parses():
    from remote_ops.cli import build_parser

    text = README.read_text()
    shown = [c for _h, b in blocks(text, "bash") for c in commands(b) if c.startswith("remote-ops ")]
    shown += [s for s in re.findall(r"`(remote-ops [^`]+)`", text)]
    assert len(shown) > 20
    for cmd in shown:
        words = shlex.split(cmd.replace("HOST", "somehost").replace("'[host]:port'", "x"))[1:]
        build_parser().parse_args(words)      # raises UsageError for an unknown command or flag


def _ok(cmd: str) -> tuple:
    """check exits 1 while it finds calls that do not bind (the README says so); the rest 0."""
    return (0, 1) if cmd.startswith("remote-ops check ") else (0,)


def _run(cmd: str, env: dict, cwd: Path, ok=(0,)) -> str:
    p = subprocess.run(cmd, shell=True, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert p.returncode in ok, f"{cmd} -> {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout + p.stderr


def test_quick_start_and_your_own_host_run_as_written(tmp_path):
    from remote_ops import sandbox

    quick = section("## Quick start (a local sandbox host)")
    own = section("## Your own host")
    assert quick[0] == "remote-ops sandbox up" and quick[-1] == "remote-ops sandbox down"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_bytes((REPO / "inventory.yaml").read_bytes())     # a fresh clone's
    env = dict(os.environ, PATH=f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
               REMOTE_OPS_INVENTORY=str(inventory), REMOTE_OPS_SANDBOX_DIR=str(tmp_path / "sandbox"))
    try:
        outs = {}
        for cmd in quick[:-1]:
            outs[cmd] = _run(cmd, env, tmp_path, ok=_ok(cmd))
        assert "verified: 4 targeted findings gone" in outs["remote-ops patch sandbox --yes"]
        assert "succeeded" in outs["remote-ops extract sandbox --tail"]
        rows = len(sandbox.prepared_rows())          # the server-flow host: every row, every file's ids
        assert "succeeded after" in outs["remote-ops extract sandbox-server --tail"]
        assert f"{rows}/{rows} samples" in outs["remote-ops extract sandbox-server --tail"]
        assert f"token ids of {rows} file(s) compared" in outs["remote-ops verify sandbox-server --all"]

        # "Your own host": the README's entry, filled with the sandbox's address, and a known_hosts
        # of its own (empty): the first command must record the key
        local = yaml.safe_load((tmp_path / "inventory.local.yaml").read_text())["hosts"]["sandbox"]
        shown = yaml.safe_load([b for h, b in blocks(README.read_text(), "yaml") if h == "## Your own host"][0])
        data = yaml.safe_load(inventory.read_text())
        data["hosts"]["gpu-host"] = dict(local, playbook=shown["hosts"]["gpu-host"]["playbook"],
                                         known_hosts=str(tmp_path / "gpu_known_hosts"))
        inventory.write_text(yaml.safe_dump(data, sort_keys=False))
        assert data["include"] == ["inventory.local.yaml"]
        for cmd in own:
            out = _run(cmd, env, tmp_path, ok=_ok(cmd))
            if "--accept-new" in cmd:
                assert (tmp_path / "gpu_known_hosts").read_text().startswith(f"[127.0.0.1]:{local['port']} ")
            if cmd.endswith("--dry-run") and "extract" in cmd:
                assert "dataset: 24 samples" in out, out
        _run(quick[-1], env, tmp_path)
    finally:
        sandbox.down(str(inventory), purge=True)
