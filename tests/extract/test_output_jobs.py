"""One output directory holds one job, and counts are of files, over the real sshd
with the stand-in job. Every inventory name here is the one sshd: one machine.

- Two (three) inventory names of one machine sharing one state dir (the default, per user) each run
  their own share: jobs are recorded by playbook + output directory, not by inventory name.
- Two shards with one output directory (a shared file system without {host}): the second is
  refused with one line naming the running job, whichever state dir starts it.
- A marker left by a job that is gone is taken over; one of another machine is refused, naming it.
- status GROUP counts a directory reached under two names once.
- gather into a folder holding a stale data_99.pt is refused (exit 1); a host's file beyond the
  dataset is named, not copied, not counted.
- A host that comes back after its share was moved: verify names each duplicate with both places
  and which copy gather keeps; gather keeps the copy of the run (run.json) and names what it dropped;
  a directory of another run holding files no one else has refuses the gather.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

from remote_ops.agent.job import jobfiles, outputlock
from remote_ops.agent import shards as rule
from remote_ops.agent.outputs import layout
from remote_ops.extract import jobs as jobs_mod
from tests.conftest import standin_playbook, write_inventory

PLAYBOOK = standin_playbook("one-dir")


def _inventory(sshd, tmp_path, hosts: dict, *, n=10, sleep=0.0, groups=None):
    """``hosts``: name -> (output dir name, state dir name)."""
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    entries = {name: sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                                     env={"REMOTE_OPS_STATE_DIR": str(tmp_path / state)},
                                     vars={"n": n, "sleep": sleep, "out": str(tmp_path / out)},
                                     playbook=str(pb))
               for name, (out, state) in hosts.items()}
    return write_inventory(tmp_path / "inv.yaml", entries, groups=groups or {"gpus": list(hosts)})


def _indexes(path):
    return sorted(i for i in map(layout.index_of, os.listdir(path)) if i is not None)


def _wait(cli, inv, target, *extra, timeout=120):
    return jobs_mod.wait_ended(lambda: json.loads(cli("status", target, *extra, "--json", "-i", str(inv))[1]),
                               timeout=timeout)


def test_one_machine_under_three_names_runs_three_shares_with_one_state_dir(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, {"node-c": ("out-c", "state"), "node-a": ("out-a", "state"),
                                      "node-b": ("out-b", "state")})
    status, out, err = cli("extract", "gpus", "--shard", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    doc = json.loads(out)
    assert not any(h["result"]["attached"] for h in doc["hosts"])            # three jobs, none attached
    assert len({h["result"]["job"]["job_id"] for h in doc["hosts"]}) == 3
    doc = _wait(cli, inv, "gpus")
    assert doc["group"]["done"] == 10 and doc["group"]["expected"] == 10 and doc["group"]["states"] == {"succeeded": 3}
    for k, name in enumerate("abc"):
        assert _indexes(tmp_path / f"out-{name}") == list(range(k, 10, 3))
        # released at the end (wait_ended waits for the supervisors to let go, as --tail does: the exit is
        # recorded before the cleanup and the release of the directory)
        assert not (tmp_path / f"out-{name}" / outputlock.MARKER).exists()
    # each name's status is its own job (the one writing its output directory)
    for k, name in enumerate("abc"):
        st = json.loads(cli("status", f"node-{name}", "--json", "-i", str(inv))[1])["job"]
        assert st["output_dir"] == str(tmp_path / f"out-{name}") and st["shard"] == [k, 3]
    status, out, err = cli("status", "gpus", "-i", str(inv))
    assert status == 0 and "group: 10/10 samples over 3/3 host(s) (3 succeeded)" in out
    status, out, err = cli("verify", "gpus", "--all", "-i", str(inv))
    assert status == 0 and "complete and consistent" in out and "delete one copy" not in out


def test_two_shares_in_one_output_dir_the_second_is_refused(sshd, tmp_path, cli):
    # one state dir (two names of one machine): the slot's running job is another share
    inv = _inventory(sshd, tmp_path, {"node-a": ("out", "state"), "node-b": ("out", "state")}, n=12, sleep=0.5)
    status, out, err = cli("extract", "gpus", "--shard", "--skip-check", "--json", "-i", str(inv))
    assert status != 0
    doc = json.loads(out)
    started = [h for h in doc["hosts"] if h["ok"]]
    refused = [h for h in doc["hosts"] if not h["ok"]]
    assert len(started) == 1 and len(refused) == 1, doc
    job = started[0]["result"]["job"]
    msg = refused[0]["error"]["message"]
    assert f"{tmp_path / 'out'} is being written by job {job['job_id']}" in msg, msg
    assert "shard" in msg and "\n" not in msg
    assert "its own output_dir" in (refused[0]["error"].get("hint") or "")
    _wait(cli, inv, started[0]["host"])
    k = job["shard"][0]
    assert _indexes(tmp_path / "out") == list(range(k, 12, 2))              # one share only, never mixed

    # separate state dirs (two machines on one shared file system): the output dir's marker refuses
    inv = _inventory(sshd, tmp_path, {"node-a": ("out2", "state-a"), "node-b": ("out2", "state-b")}, n=12,
                     sleep=0.5)
    status, out, err = cli("extract", "node-a", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    first = json.loads(out)["job"]
    marker = json.loads((tmp_path / "out2" / outputlock.MARKER).read_text())
    assert marker["job_id"] == first["job_id"] and marker["jobdir"].startswith(str(tmp_path / "state-a"))
    status, out, err = cli("extract", "node-b", "--skip-check", "-i", str(inv))
    assert status != 0
    assert f"is being written by job {first['job_id']}" in err and str(tmp_path / "state-a") in err
    assert "preflight refused" in err                                           # before any launch
    status, out, err = cli("status", "node-b", "-i", str(inv))
    assert status != 0 and "no job of one-dir writing" in err                   # nothing was started
    _wait(cli, inv, "node-a")
    assert not (tmp_path / "out2" / outputlock.MARKER).exists()


def test_stale_marker_is_taken_over_and_another_machines_is_refused(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, {"node-a": ("out", "state")}, n=3)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    gone = tmp_path / "state" / "jobs" / "one-dir-gone"
    gone.mkdir(parents=True)
    (gone / "run.lock").write_text("")                                          # nobody holds it
    rec = {"job_id": "one-dir-gone", "jobdir": str(gone), "shard": None, "pid": 999999999,
           "machine": outputlock.machine(), "created_at": time.time() - 60}
    (out_dir / outputlock.MARKER).write_text(json.dumps(rec))
    assert outputlock.holder_state(rec) == "stale"
    status, out, err = cli("extract", "node-a", "--skip-check", "-i", str(inv))
    assert status == 0, err
    _wait(cli, inv, "node-a")
    assert _indexes(out_dir) == [0, 1, 2]

    other = dict(rec, machine={"machine_id": "0" * 32, "boot_id": "another-boot", "hostname": "gpu-node-7"})
    (out_dir / outputlock.MARKER).write_text(json.dumps(other))
    assert outputlock.holder_state(other) == "elsewhere"
    status, out, err = cli("extract", "node-a", "--skip-check", "-i", str(inv))
    assert status != 0
    assert "being written by job one-dir-gone" in err and "gpu-node-7" in err
    assert f"remove {out_dir / outputlock.MARKER}" in err


def test_status_group_counts_one_directory_reached_under_two_names_once(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, {"node-a": ("out", "state"), "node-b": ("out", "state")}, n=4)
    status, out, err = cli("extract", "node-a", "--skip-check", "-i", str(inv))
    assert status == 0, err
    _wait(cli, inv, "node-a")
    doc = json.loads(cli("status", "gpus", "--json", "-i", str(inv))[1])
    ids = {h["result"]["job"]["job_id"] for h in doc["hosts"]}
    assert len(ids) == 1                                       # both names find the one job of that directory
    g = doc["group"]
    assert g["done"] == 4 and g["expected"] == 4 and g["states"] == {"succeeded": 1}
    assert g["same_dir"][0]["host"] == "node-b" and g["same_dir"][0]["as"] == "node-a"
    status, out, err = cli("status", "gpus", "-i", str(inv))
    assert "group: 4/4 samples" in out and "counted once" in out
    # verify and gather: one directory listed under two names is one set of files, never a duplicate
    status, out, err = cli("verify", "gpus", "--shard", "--json", "-i", str(inv))
    union = json.loads(out)["group"]
    assert union["files"] == 4 and union["duplicates"] == [] and len(union["parts"]) == 1
    assert union["same_dir"] == [{"where": f"node-b:{tmp_path / 'out'}", "same_as": f"node-a:{tmp_path / 'out'}"}]
    assert not any("delete" in p or "more than once" in p for p in union["problems"])
    dest = tmp_path / "gathered"
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    g = json.loads(out)["group"]
    assert status == 0 and g["present"] == 4 and g["copied"] == 4 and g["dropped"] == [] and g["conflicts"] == []


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _run_json(path, k, n, *, dataset="d1"):
    ident = {"dataset": {"path": "/data/" + dataset, "sha256": dataset}, "model": {"path": "m"}, "layer_ids": [1, 2],
             "max_model_len": 64, "flow": "offline", "playbook": "one-dir", "shard": {"index": k, "count": n},
             "versions": {"torch": "x"}}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (path / "run.json").write_text(json.dumps({"format": "remote-ops-run/1", "identity": ident, "digest": digest,
                                               "created": "2026-12-02T00:00:00Z"}))


def test_gather_refuses_stale_files_and_keeps_the_runs_copy_of_a_returning_host(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, {"node-a": ("out-a", "state"), "node-b": ("out-b", "state"),
                                      "node-c": ("out-c", "state")})
    status, out, err = cli("extract", "gpus", "--shard", "--skip-check", "-i", str(inv))
    assert status == 0, err
    _wait(cli, inv, "gpus")

    # a stale data_99.pt in the destination: refused, nothing copied, never "11/10"
    dest = tmp_path / "gathered"
    dest.mkdir()
    shutil.copy(tmp_path / "out-a" / "data_0.pt", dest / "data_99.pt")
    status, out, err = cli("gather", "gpus", "--to", str(dest), "-i", str(inv))
    assert status == 1 and "11/10" not in out
    assert f"{dest} holds 1 file(s) beyond the dataset's 10 samples, e.g. data_99.pt" in out
    assert _indexes(dest) == [99]
    (dest / "data_99.pt").unlink()
    # one on a host: named, not copied, not counted (verify flags it)
    shutil.copy(tmp_path / "out-a" / "data_0.pt", tmp_path / "out-a" / "data_99.pt")
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    g = json.loads(out)["group"]
    assert status == 0 and g["present"] == 10 and g["copied"] == 10
    assert g["beyond"] == [f"node-a:{tmp_path}/out-a/data_99.pt"] and _indexes(dest) == list(range(10))
    status, out, err = cli("verify", "gpus", "-i", str(inv))
    assert status == 1 and "beyond the dataset's 10 samples, e.g. data_99.pt" in out and "union: 10/10" in out
    (tmp_path / "out-a" / "data_99.pt").unlink()

    # node-b's share moved to node-c, then node-b comes back holding a partial copy of it
    moved = tmp_path / "out-c" / "shard-1-of-3"
    shutil.copytree(tmp_path / "out-b", moved, ignore=shutil.ignore_patterns(".remote-ops-*"))
    (tmp_path / "out-b" / "data_7.pt").unlink()
    for d, (k, n) in ((tmp_path / "out-a", (0, 3)), (tmp_path / "out-b", (1, 3)), (tmp_path / "out-c", (2, 3)),
                      (moved, (1, 3))):
        _run_json(d, k, n)
    status, out, err = cli("verify", "gpus", "--json", "-i", str(inv))
    union = json.loads(out)["group"]
    assert status == 1 and [d["index"] for d in union["duplicates"]] == [1, 4]
    d = union["duplicates"][0]
    assert sorted(d["where"]) == [f"node-b:{tmp_path}/out-b", f"node-c:{moved}"]
    assert d["kept"] == f"node-c:{moved}" and "holding more of the share" in d["dropped"][0]["why"]
    text = "\n".join(union["problems"])
    assert "delete one copy" not in text and f"gather keeps node-c:{moved}'s" in text

    shutil.rmtree(dest)
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    g = json.loads(out)["group"]
    assert status == 0 and g["present"] == 10 and g["copied"] == 10, g
    assert [(x["index"], x["kept"], x["dropped"]) for x in g["dropped"]] == [
        (1, f"node-c:{moved}/data_1.pt", f"node-b:{tmp_path}/out-b/data_1.pt"),
        (4, f"node-c:{moved}/data_4.pt", f"node-b:{tmp_path}/out-b/data_4.pt")]
    status, out, err = cli("gather", "gpus", "--to", str(dest), "-i", str(inv))
    assert status == 0 and f"dropped data_1.pt of node-b:{tmp_path}/out-b/data_1.pt: kept node-c:{moved}/data_1.pt" in out

    # node-b's copies are of another run (a changed dataset), with other bytes: the run's copies are kept
    _run_json(tmp_path / "out-b", 1, 3, dataset="d2")
    shutil.copy(tmp_path / "out-a" / "data_3.pt", tmp_path / "out-b" / "data_1.pt")
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    g = json.loads(out)["group"]
    assert status == 0 and g["conflicts"] == [] and g["present"] == 10
    assert "its run.json is of another run" in g["dropped"][0]["why"] and not g["dropped"][0]["same_bytes"]
    assert _sha(dest / "data_1.pt") == _sha(moved / "data_1.pt")
    status, out, err = cli("verify", "gpus", "-i", str(inv))
    assert status == 1 and "run identity (run.json without its shard) differ" in out

    # a file only the other run's directory holds would be mixed in: the gather is refused
    (moved / "data_4.pt").unlink()
    (dest / "data_4.pt").unlink()
    status, out, err = cli("gather", "gpus", "--to", str(dest), "-i", str(inv))
    assert status == 1 and f"node-b:{tmp_path}/out-b holds files of another run" in out
    assert not (dest / "data_4.pt").exists()


def test_racing_claims_of_one_directory_have_one_winner(tmp_path):
    """Eight launches claim one output directory at once (threads, each holding its own run.lock as
    a launch does): exactly one gets it, the others are refused naming the winner; once the
    winner's lock is free its marker is stale and the next claim takes it over."""
    import fcntl
    import threading

    from remote_ops.agent.protocol import AgentFailure
    out = tmp_path / "out"
    out.mkdir()
    fds, won, refused = [], [], []
    start = threading.Barrier(8)

    def launch(i):
        jobdir = tmp_path / f"job-{i}"
        jobdir.mkdir()
        fd = os.open(jobdir / "run.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        fds.append(fd)
        start.wait()
        try:
            outputlock.claim(str(out), {"job_id": f"job-{i}", "jobdir": str(jobdir), "shard": [i, 8], "pid": os.getpid()})
            won.append(i)
        except AgentFailure as exc:
            refused.append(exc.message)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 7, (won, refused)
    assert all(f"being written by job job-{won[0]} (shard {won[0]}/8" in m for m in refused)
    assert json.loads((out / outputlock.MARKER).read_text())["job_id"] == f"job-{won[0]}"
    for fd in fds:
        os.close(fd)
    holder = outputlock.read(str(out))
    assert outputlock.holder_state(holder) == "stale"
    (tmp_path / "job-next").mkdir()
    rec = outputlock.claim(str(out), {"job_id": "job-next", "jobdir": str(tmp_path / "job-next"), "shard": None})
    assert rec["job_id"] == "job-next" and outputlock.read(str(out))["job_id"] == "job-next"
    assert not [n for n in os.listdir(out) if ".stale-" in n or n.endswith(".tmp")]
    jobfiles.release_output(str(out), "job-other")
    assert (out / outputlock.MARKER).exists()                  # only its own job releases it
    jobfiles.release_output(str(out), "job-next")
    assert not (out / outputlock.MARKER).exists()
