"""Every command remote-ops prints for pasting runs as printed and acts on the host it is about, over the real sshd with the STAND-IN job.

The inventory is not ./inventory.yaml and its default host is ``other``, which holds a complete run of
its own: a printed command that lost its target or its inventory would act there. Each printed command
is run through a shell exactly as printed, from another directory and without $REMOTE_OPS_INVENTORY,
and ``other`` is checked untouched afterwards (its files, its jobs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.agent.outputs.test_run_identity import ids_of, lines, rows
from tests.conftest import REPO, standin_extract, write_playbook

pytestmark = pytest.mark.timeout(240)


class Hosts:
    """Hosts of one inventory on the test sshd, each with its own state and data directories; the
    stand-in playbook outside the inventory (given with --playbook)."""

    def __init__(self, tmp_path, sshd, names, default, groups=None):
        self.tmp = tmp_path
        self.inventory = tmp_path / "inv" / "hosts.yaml"
        self.inventory.parent.mkdir()
        self.ds = {n: rows(tmp_path / f"{n}.jsonl", 4, base=10 * i) for i, n in enumerate(names)}
        hosts = {}
        for n in names:
            (tmp_path / n / "state").mkdir(parents=True)
            hosts[n] = sshd.host_entry(sys.executable, env={"REMOTE_OPS_STATE_DIR": str(tmp_path / n / "state")},
                                       vars={"data": str(tmp_path / n), "ds": str(self.ds[n])})
        self.inventory.write_text(yaml.safe_dump({"hosts": hosts, "default": default, "groups": groups or {}}))
        self.playbook = write_playbook(tmp_path / "pb.yaml", "standin", standin_extract(
            "--batch-size", "2", "--dataset", "{vars.ds}", "--layer-ids", "2,4,5,7", "--max-model-len", "64",
            workdir=tmp_path, output_dir="{vars.data}/out"))
        self.elsewhere = tmp_path / "elsewhere"
        self.elsewhere.mkdir()
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        shim = bin_dir / "remote-ops"        # the remote-ops of this tree, as a user's PATH finds it
        shim.write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m remote_ops \"$@\"\n")
        shim.chmod(0o755)
        self.path = f"{bin_dir}:{os.environ['PATH']}"

    def out(self, name):
        return self.tmp / name / "out"

    def jobs(self, name):
        root = self.tmp / name / "state" / "jobs"
        return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.exists() else []

    def snapshot(self, name):
        """What a command acting on ``name`` by mistake would change: its files and its jobs."""
        out = self.out(name)
        files = {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*")} if out.exists() else {}
        return files, self.jobs(name)

    def paste(self, printed, timeout=120):
        """``printed`` through a shell, as a user pastes it: from another directory, no $REMOTE_OPS_INVENTORY."""
        env = {k: v for k, v in os.environ.items() if k != "REMOTE_OPS_INVENTORY"}
        env["PATH"] = self.path
        return subprocess.run(printed, shell=True, cwd=self.elsewhere, env=env, capture_output=True, text=True,
                              timeout=timeout)


def printed(pattern, text):
    m = re.search(pattern, text)
    assert m, text
    return m.group(1)


@pytest.mark.long
def test_the_overwrite_fix_of_a_refusal_acts_on_the_refused_host_of_the_environments_inventory(tmp_path, sshd, cli):
    h = Hosts(tmp_path, sshd, ["other", "target"], default="other")
    env = {"REMOTE_OPS_INVENTORY": str(h.inventory)}
    pb = ["--playbook", str(h.playbook)]
    for n in ("other", "target"):
        status, out, err = cli("extract", n, "--tail", *pb, env=env)
        assert status == 0, err
    h.ds["target"] = rows(tmp_path / "target.jsonl", 5, base=100)      # target's dataset changed in place
    before = h.snapshot("other")
    status, out, err = cli("extract", "target", *pb, env=env)
    assert status != 0 and "another run: dataset.lines_sha256" in err, err
    fix = printed(r"start over with: (remote-ops .+? --overwrite)", err)
    assert fix == (f"remote-ops -i {h.inventory} extract target --playbook {h.playbook} --overwrite"), fix
    p = h.paste(fix)
    assert p.returncode == 0, p.stderr
    # target started over from its new lines (its old files moved aside), other untouched
    (old,) = h.out("target").glob(".replaced-*")
    assert sorted(q.name for q in old.glob("data_*.pt")) == [f"data_{i}.pt" for i in range(4)]
    cli("logs", "target", "--follow", "-i", str(h.inventory), *pb)
    assert [ids_of(h.out("target"), i) for i in range(5)] == lines(h.ds["target"])
    assert h.snapshot("other") == before
    assert not list(h.out("other").glob(".replaced-*"))


@pytest.mark.long
def test_the_follow_line_of_a_launch_follows_that_job(tmp_path, sshd, cli):
    h = Hosts(tmp_path, sshd, ["other", "target"], default="other")
    status, out, err = cli("extract", "other", "--tail", "-i", str(h.inventory), "--playbook", str(h.playbook))
    assert status == 0, err
    before = h.snapshot("other")
    status, out, err = cli("extract", "target", "-i", str(h.inventory), "--playbook", str(h.playbook))
    assert status == 0, err
    (job,) = h.jobs("target")
    follow = printed(r"follow: (remote-ops .+? --follow)", out)
    assert follow == f"remote-ops -i {h.inventory} logs target --job {job} --follow", follow
    p = h.paste(follow)
    assert p.returncode == 0 and "succeeded" in p.stdout + p.stderr, p.stdout + p.stderr
    assert [ids_of(h.out("target"), i) for i in range(4)] == lines(h.ds["target"])
    assert h.snapshot("other") == before


@pytest.mark.long
def test_the_commands_of_a_groups_tail_refusal_keep_the_shard_and_the_inventory(tmp_path, sshd, cli):
    h = Hosts(tmp_path, sshd, ["other", "a", "b"], default="other", groups={"pair": ["a", "b"]})
    status, out, err = cli("extract", "other", "--tail", "-i", str(h.inventory), "--playbook", str(h.playbook))
    assert status == 0, err
    before = h.snapshot("other")
    status, out, err = cli("extract", "pair", "--shard", "--tail", "-i", str(h.inventory),
                           "--playbook", str(h.playbook))
    assert status == 2 and not h.jobs("a") and not h.jobs("b"), err
    inv, book = f"-i {h.inventory}", f"--playbook {h.playbook}"
    start = printed(r"start them with: (remote-ops .+?); follow", err)
    assert start == f"remote-ops {inv} extract pair --shard {book}", start
    one = printed(r"follow one with: (remote-ops .+?) \(or b\)", err)
    assert one == f"remote-ops {inv} logs a --follow {book}", one
    watch = printed(r"watch all with: (remote-ops .+?)\)?$", err.strip())
    assert watch == f"remote-ops {inv} status pair {book}", watch
    p = h.paste(start)                         # the launch as printed starts both shares
    assert p.returncode == 0, p.stderr
    assert len(h.jobs("a")) == len(h.jobs("b")) == 1
    for cmd in (one, f"{watch} --json"):
        p = h.paste(cmd)
        assert p.returncode == 0, p.stdout + p.stderr
    group = json.loads(p.stdout)
    assert [r["host"] for r in group["hosts"]] == ["a", "b"]
    assert h.snapshot("other") == before


def test_the_command_words_filled_are_the_clis_commands_and_fill_quotes_what_it_adds():
    from remote_ops import again, cli
    assert set(again.COMMANDS) == set(cli.COMMANDS)
    flags = again.global_flags("/a dir/inv.yaml")
    assert flags == ("-i", "/a dir/inv.yaml")
    line = again.fill("stop it (remote-ops stop HOST --job j1); see remote-ops' own files", flags, "h 1")
    assert line == "stop it (remote-ops -i '/a dir/inv.yaml' stop 'h 1' --job j1); see remote-ops' own files"
    assert again.fill(line, flags, "h 1") == line            # filled once, never twice
