"""An ended job tells its own past, over the real sshd with the sandbox's stand-in:
what it had written by its end (its supervisor's exit record) and its own elapsed time, however the
directory grew after it; a sharded group's expected count is the dataset's, and a share no host runs
is named."""

from __future__ import annotations

import json
import sys
import time

from tests.conftest import standin_playbook, write_inventory


def _inventory(sshd, tmp_path, hosts, *, n, sleep, shard="false"):
    pb = tmp_path / "pb.yaml"
    pb.write_text(standin_playbook("past-extract", f"shard: {shard}"))
    entries = {name: sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                                     env={"REMOTE_OPS_STATE_DIR": str(tmp_path / f"state-{name}")},
                                     vars={"n": n, "sleep": sleep, "out": str(tmp_path / f"out-{name}")},
                                     playbook=str(pb))
               for name in hosts}
    return write_inventory(tmp_path / "inv.yaml", entries, groups={"gpus": list(hosts)})


def _job(cli, inv, *extra):
    status, out, err = cli("status", "node-a", *extra, "--json", "-i", str(inv))
    assert status in (0, 1), err
    return json.loads(out)["job"]


def _run_until(cli, inv, at_least, timeout=90):
    """Start (resume) the job, let it write at least ``at_least`` samples in all, stop it: its record."""
    status, out, err = cli("extract", "node-a", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job_id = json.loads(out)["job"]["job_id"]
    deadline = time.time() + timeout
    while _job(cli, inv)["samples"]["done"] < at_least:
        assert time.time() < deadline, _job(cli, inv)
        time.sleep(0.2)
    status, out, err = cli("stop", "node-a", "--json", "-i", str(inv))
    assert status == 0, err
    return _job(cli, inv, "--job", job_id)


def test_stopped_jobs_keep_what_they_wrote_and_their_time_after_the_directory_grew(sshd, tmp_path, cli):
    """Three jobs stopped at successive counts, then a fourth completes the run: each stopped job's
    status still says what it had written by its end, its own elapsed time and the rate of what it
    wrote, not today's 20/20."""
    inv = _inventory(sshd, tmp_path, ["node-a"], n=20, sleep=1.0)    # slack between a count and its stop
    stopped = [_run_until(cli, inv, k) for k in (3, 8, 13)]
    for st in stopped:
        assert st["state"] == "stopped" and st["samples"]["counted"] == "at its end", st
    counts = [st["samples"]["done"] for st in stopped]
    assert counts == sorted(counts) and counts[0] < counts[1] < counts[2] < 20, counts
    status, out, err = cli("extract", "node-a", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    deadline = time.time() + 120
    while _job(cli, inv)["state"] != "succeeded":
        assert time.time() < deadline, _job(cli, inv)
        time.sleep(0.3)
    assert _job(cli, inv)["samples"]["done"] == 20
    time.sleep(1)
    for st in stopped:
        now = _job(cli, inv, "--job", st["job_id"])
        assert now["samples"]["done"] == st["samples"]["done"] and now["samples"]["expected"] == 20, now
        assert now["elapsed_s"] == st["elapsed_s"], (now, st)
        wrote = st["samples"]["done"] - (st["samples"]["at_start"] or 0)
        # the rate of what it wrote over its own time (elapsed_s is rounded to 0.1 s: up to 0.05 s off)
        assert abs(now["rate_per_s"] - wrote / st["elapsed_s"]) <= wrote / st["elapsed_s"] * 0.06 / st["elapsed_s"] + 0.002, now
        status, out, err = cli("status", "node-a", "--job", st["job_id"], "-i", str(inv))
        assert f"{st['samples']['done']}/20 samples" in out and "20/20" not in out, out


def test_the_group_expects_the_dataset_and_names_a_share_no_host_runs(sshd, tmp_path, cli):
    """A 3-way sharded run of 30 samples whose third host left the inventory: the group line counts
    against the dataset's 30 (not the 20 of the two answering shares) and names shard 2/3."""
    inv = _inventory(sshd, tmp_path, ["node-a", "node-b", "node-c"], n=30, sleep=0, shard="true")
    status, out, err = cli("extract", "gpus", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    deadline = time.time() + 120
    while True:
        doc = json.loads(cli("status", "gpus", "--json", "-i", str(inv))[1])
        if all(h["result"]["job"]["state"] == "succeeded" for h in doc["hosts"]):
            break
        assert time.time() < deadline, doc
        time.sleep(0.5)
    assert doc["group"]["expected"] == 30 and doc["group"]["done"] == 30
    # node-c leaves the inventory: its share (10 samples) is run by no host here
    two = _inventory(sshd, tmp_path, ["node-a", "node-b"], n=30, sleep=0, shard="true")
    status, out, err = cli("status", "gpus", "--json", "-i", str(two))
    g = json.loads(out)["group"]
    assert g["expected"] == 30 and g["done"] == 20, g
    assert g["unowned"] == [{"shard": "2/3", "samples": 10}], g
    status, out, err = cli("status", "gpus", "-i", str(two))
    line = " ".join(out.split())
    assert "group: 20/30 samples over 2/2 host(s)" in line, out
    assert "shard 2/3 (10 sample(s)) is run by no host that answered" in line, out


def test_verify_of_a_running_job_says_that_it_runs(sshd, tmp_path, cli):
    """verify while the job writes: its missing samples are the ones not written yet, and verify says
    the job is running (a note line, and ``running`` in --json); once it ended, no such note."""
    inv = _inventory(sshd, tmp_path, ["node-a"], n=40, sleep=0.5)
    status, out, err = cli("extract", "node-a", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job_id = json.loads(out)["job"]["job_id"]
    deadline = time.time() + 60
    while _job(cli, inv)["samples"]["done"] < 2:
        assert time.time() < deadline
        time.sleep(0.2)
    status, out, err = cli("verify", "node-a", "--json", "-i", str(inv))
    doc = json.loads(out)
    assert doc["running"]["job_id"] == job_id and doc["running"]["state"] == "running", doc
    status, out, err = cli("verify", "node-a", "-i", str(inv))
    assert f"node-a: note: job {job_id} is running (" in out and "verify again once it ended" in out, out
    # gather too says the job still runs, on the missing samples' line
    status, out, err = cli("gather", "node-a", "--to", str(tmp_path / "to"), "--json", "-i", str(inv))
    g = json.loads(out)["gathered"]
    assert g["running"][0]["job_id"] == job_id and g["running"][0]["host"] == "node-a", g
    assert any(f"job {job_id} on node-a is still running" in p for p in g["problems"]), g["problems"]
    status, out, err = cli("gather", "node-a", "--to", str(tmp_path / "to"), "-i", str(inv))
    assert f"note: job {job_id} on node-a is running (" in out and "gather again once it ended" in out, out
    cli("stop", "node-a", "-i", str(inv))
    status, out, err = cli("verify", "node-a", "--json", "-i", str(inv))
    assert "running" not in json.loads(out), out
