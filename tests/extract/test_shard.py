"""One dataset over a group, over the real sshd: three inventory hosts on the one
sshd, each with its own state dir and output dir, run the sandbox's stand-in job (the shipped
extract_hidden_states.py driven by a torch-CPU generator) with --shard. Checked: the assignment
(sorted by name, i % N == k, global file names, data_config.json's shard), status totals, the
union's verify (complete; a planted bad file, a duplicate and a missing sample named with their
host), a stopped host's share resumed by running the group again, a share moved to another host,
a changed group refused, and gather (sha256-checked copies, a rerun copies nothing)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time

import pytest

from remote_ops.agent.outputs import shares as rule
from remote_ops.agent.outputs import layout
from remote_ops.extract import jobs as jobs_mod
from remote_ops.extract import shard as shard_mod
from tests.conftest import standin_playbook, write_inventory

HOSTS = ("node-c", "node-a", "node-b")       # listed out of order: the assignment sorts by name


def _inventory(sshd, tmp_path, *, n=10, sleep=0.0, shard="false"):
    pb = tmp_path / "shard.yaml"
    pb.write_text(standin_playbook("shard-extract", f"shard: {shard}"))
    hosts = {}
    for name in HOSTS:
        hosts[name] = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                                      env={"REMOTE_OPS_STATE_DIR": str(tmp_path / f"state-{name}")},
                                      vars={"n": n, "sleep": sleep, "out": str(tmp_path / f"out-{name}")},
                                      playbook=str(pb))
    return write_inventory(tmp_path / "inv.yaml", hosts, groups={"gpus": list(HOSTS)})


def _indexes(path):
    return sorted(i for i in map(layout.index_of, os.listdir(path)) if i is not None)


def _wait(cli, inv, target, *extra, timeout=120):
    return jobs_mod.wait_ended(lambda: json.loads(cli("status", target, *extra, "--json", "-i", str(inv))[1]),
                               timeout=timeout)


def _sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def test_assignment_is_sorted_by_name_and_round_robin():
    class H:
        def __init__(self, name):
            self.name = name
    a = shard_mod.assign([H("node-c"), H("node-a"), H("node-b")])
    assert a == {"node-a": (0, 3), "node-b": (1, 3), "node-c": (2, 3)}
    assert [rule.share_count(10, k, 3) for k in range(3)] == [4, 3, 3]
    assert list(rule.expand(rule.runs([1, 4, 7, 10]))) == [1, 4, 7, 10] and rule.runs([1, 4, 7, 10]) == [[1, 4, 3]]
    with pytest.raises(ValueError):
        rule.parse("3/3")


def test_union_names_the_host_of_every_problem():
    def part(host, k, idx, **kw):
        base = {"host": host, "output_dir": f"/o/{host}", "total": 6, "layer_ids": [1, 2], "hidden_size": 8,
                "package_versions": {"torch": "2"}, "shard": [k, 2], "files": len(idx),
                "indexes": rule.runs(idx), "checked": len(idx), "bad": []}
        return {**base, **kw}
    ok = shard_mod.union([part("a", 0, [0, 2, 4]), part("b", 1, [1, 3, 5])])
    assert ok.ok and ok.files == 6 and ok.missing_count == 0
    bad = shard_mod.union([part("a", 0, [0, 2, 4, 3]), part("b", 1, [1, 5], hidden_size=9,
                                                            bad=[{"file": "data_5.pt", "problem": "does not load"}])])
    text = "\n".join(bad.problems)
    assert not bad.ok
    assert "hidden size differ" in text and "/o/b" in text
    assert bad.missing_count == 0 and bad.duplicates == []          # 3 is on a only
    assert "b: /o/b/data_5.pt: does not load" in text
    gap = shard_mod.union([part("a", 0, [0, 2, 4])], ["b"])
    assert gap.missing == [[1, 3, 2]] and "shard 1/2: 3 sample(s) missing; no reachable host holds it" in \
        "\n".join(gap.problems) and "b: unreachable" in gap.problems[0]


def test_group_shards_one_dataset_verify_resume_and_gather(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, shard="false")
    status, out, err = cli("extract", "gpus", "--shard", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    doc = json.loads(out)
    cmds = {h["host"]: h["result"]["job"]["command"][-2:] for h in doc["hosts"]}
    assert cmds == {"node-a": ["--shard", "0/3"], "node-b": ["--shard", "1/3"], "node-c": ["--shard", "2/3"]}
    doc = _wait(cli, inv, "gpus")
    assert {h["result"]["job"]["state"] for h in doc["hosts"]} == {"succeeded"}
    assert doc["group"]["done"] == 10 and doc["group"]["expected"] == 10 and doc["group"]["states"] == {"succeeded": 3}
    per_host = {h["host"]: h["result"]["job"]["samples"] for h in doc["hosts"]}
    assert {h: (s["done"], s["expected"]) for h, s in per_host.items()} == \
        {"node-a": (4, 4), "node-b": (3, 3), "node-c": (3, 3)}

    # the assignment: host k of 3 (sorted by name) holds i % 3 == k, files named by global index
    for k, name in enumerate(("node-a", "node-b", "node-c")):
        out_dir = tmp_path / f"out-{name}"
        assert _indexes(out_dir) == list(range(k, 10, 3))
        cfg = json.loads((out_dir / "data_config.json").read_text())
        assert cfg["shard"] == {"index": k, "count": 3, "assignment": "i % count == index",
                                "samples": len(range(k, 10, 3))}
        assert cfg["data"]["num_samples"] == 10

    status, out, err = cli("status", "gpus", "-i", str(inv))
    assert status == 0 and "group: 10/10 samples over 3/3 host(s) (3 succeeded)" in out

    # the union verifies as one dataset (automatically: the outputs record their shard)
    status, out, err = cli("verify", "gpus", "--all", "--json", "-i", str(inv))
    assert status == 0, (out, err)
    union = json.loads(out)["group"]
    assert union["ok"] and union["files"] == 10 and union["total"] == 10 and union["shards"] == 3
    assert all(h["result"]["ok"] and h["result"]["expected"] in (3, 4) for h in json.loads(out)["hosts"])

    # a planted bad file: named with its host; then deleted: the missing sample is named with its shard's host
    bad = tmp_path / "out-node-b" / "data_4.pt"
    good = bad.read_bytes()
    bad.write_bytes(good[: len(good) // 2])
    status, out, err = cli("verify", "gpus", "--all", "-i", str(inv))
    assert status == 1
    assert "union: 9/10 samples" in out and "PROBLEMS" in out, out      # a file cut short is not a sample
    assert f"node-b: {tmp_path}/out-node-b/data_4.pt: does not load" in out
    bad.unlink()
    status, out, err = cli("verify", "gpus", "--json", "-i", str(inv))
    union = json.loads(out)["group"]
    assert status == 1 and union["missing"] == [[4, 1, 1]]
    assert union["missing_by_shard"] == [{"shard": [1, 3], "missing": 1, "held_by": [f"node-b:{tmp_path}/out-node-b"]}]

    # a duplicate on another host: both copies named (and the file is outside node-c's shard)
    dup = tmp_path / "out-node-c" / "data_0.pt"
    shutil.copy(tmp_path / "out-node-a" / "data_0.pt", dup)
    status, out, err = cli("verify", "gpus", "-i", str(inv))
    assert status == 1
    assert f"data_0.pt on node-a:{tmp_path}/out-node-a and node-c:{tmp_path}/out-node-c" in out
    assert "outside this directory's shard 2/3" in out
    dup.unlink()

    # extract GROUP --shard again: only node-b's missing sample is written, the others have nothing to do
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "out-node-a").glob("data_*.pt")}
    status, out, err = cli("extract", "gpus", "--shard", "--skip-check", "-i", str(inv))
    assert status == 0, err
    _wait(cli, inv, "gpus")
    assert _indexes(tmp_path / "out-node-b") == [1, 4, 7]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "out-node-a").glob("data_*.pt")} == mtimes
    status, out, err = cli("logs", "node-b", "-i", str(inv))
    assert "resuming: 2 of 3 samples already written, 1 to go" in out
    status, out, err = cli("logs", "node-a", "-i", str(inv))
    assert "all 4 samples are already in" in out
    status, out, err = cli("verify", "gpus", "--all", "-i", str(inv))
    assert status == 0 and "complete and consistent" in out

    # gather: the union in one directory, every file the host's bytes; a rerun copies nothing
    dest = tmp_path / "gathered"
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    assert status == 0, (out, err)
    g = json.loads(out)["group"]
    assert g["ok"] and g["present"] == 10 and g["copied"] == 10 and g["total"] == 10
    assert _indexes(dest) == list(range(10))
    for i in range(10):
        src = tmp_path / f"out-node-{'abc'[i % 3]}" / f"data_{i}.pt"
        assert _sha(dest / f"data_{i}.pt") == _sha(src)
    cfg = json.loads((dest / "data_config.json").read_text())
    assert "shard" not in cfg and cfg["data"]["num_samples"] == 10
    assert [s["shard"] for s in cfg["gathered_from"]] == [[0, 3], [1, 3], [2, 3]]
    assert not [n for n in os.listdir(dest) if n.endswith(".tmp")]
    (dest / "data_5.pt").write_bytes(b"not the host's bytes")
    status, out, err = cli("gather", "gpus", "--to", str(dest), "-i", str(inv))
    assert status == 0 and f"gathered into {dest}: 10/10 samples (1 copied" in out
    assert _sha(dest / "data_5.pt") == _sha(tmp_path / "out-node-c" / "data_5.pt")

    # a stray copy of index 0 with other bytes in node-b's directory (both of the run): verify flags it as
    # outside node-b's shard, and gather keeps the copy of the directory whose shard owns it (node-a's)
    other = tmp_path / "out-node-b" / "data_0.pt"
    shutil.copy(tmp_path / "out-node-a" / "data_3.pt", other)
    (dest / "data_0.pt").unlink()
    status, out, err = cli("gather", "gpus", "--to", str(dest), "--json", "-i", str(inv))
    g = json.loads(out)["group"]
    assert status == 0 and g["ok"] and g["conflicts"] == [], g
    (d,) = g["dropped"]
    assert d["dropped"] == f"node-b:{tmp_path}/out-node-b/data_0.pt" and not d["same_bytes"]
    assert "the copy in the directory whose shard owns it" in d["why"]
    assert _sha(dest / "data_0.pt") == _sha(tmp_path / "out-node-a" / "data_0.pt")
    status, out, err = cli("verify", "gpus", "-i", str(inv))
    assert status == 1 and "outside this directory's shard" in out and "the copy in the directory whose shard owns it" in out
    other.unlink()

    # the gathered directory verifies as one unsharded dataset of 10
    status, out, err = cli("gather", "gpus", "--to", str(dest), "-i", str(inv))
    assert status == 0
    status, out, err = cli("verify", "node-a", "--output-dir", str(dest), "--all", "--json", "-i", str(inv))
    assert status == 0 and json.loads(out)["files"] == 10 and json.loads(out)["expected"] == 10


def test_stopped_host_resumes_and_a_share_moves(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, n=12, sleep=2.5, shard="true")     # the playbook's extract.shard
    status, out, err = cli("extract", "gpus", "--skip-check", "-i", str(inv))
    assert status == 0, err
    assert "shard 1/3 into" in out
    deadline = time.time() + 60
    while not ((tmp_path / "out-node-b").exists() and _indexes(tmp_path / "out-node-b")):
        assert time.time() < deadline, "node-b wrote nothing"
        time.sleep(0.2)
    status, out, err = cli("stop", "node-b", "-i", str(inv))
    assert status == 0, err
    partial = _indexes(tmp_path / "out-node-b")
    assert 1 <= len(partial) < 4 and all(i % 3 == 1 for i in partial)
    doc = _wait(cli, inv, "gpus")
    states = {h["host"]: h["result"]["job"]["state"] for h in doc["hosts"]}
    assert states == {"node-a": "succeeded", "node-b": "stopped", "node-c": "succeeded"}
    assert doc["group"]["idle_left"] == 4 - len(partial) and doc["group"]["done"] == 8 + len(partial)
    # the stopped host lost only its share
    status, out, err = cli("verify", "gpus", "--json", "-i", str(inv))
    union = json.loads(out)["group"]
    assert status == 1 and [m["shard"] for m in union["missing_by_shard"]] == [[1, 3]]
    assert union["missing_count"] == 4 - len(partial)

    # node-b's share moved to node-c (as if node-b were gone): its own job and subdirectory there
    status, out, err = cli("extract", "node-c", "--shard", "1/3", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]
    assert job["key"] == "shard-extract.shard-1-of-3"
    assert job["output_dir"] == str(tmp_path / "out-node-c" / "shard-1-of-3")
    _wait(cli, inv, "node-c", "--job", job["job_id"])
    assert _indexes(tmp_path / "out-node-c" / "shard-1-of-3") == [1, 4, 7, 10]
    assert _indexes(tmp_path / "out-node-c") == [2, 5, 8, 11]
    status, out, err = cli("verify", "node-a,node-c", "--all", "-i", str(inv))   # without node-b: complete
    assert status == 0 and "union: 12/12 samples in 3 output dir(s), 3 shard(s): complete" in out, out
    status, out, err = cli("verify", "gpus", "-i", str(inv))                      # with it: node-b's copies twice
    assert status == 1 and "written more than once" in out and "node-b:" in out

    # a changed group (other hosts, other N) is refused: node-a's directory holds shard 0/3
    status, out, err = cli("extract", "node-a,node-c", "--shard", "--skip-check", "-i", str(inv))
    assert status != 0
    assert "holds shard 0/3 of a sharded run, this run is shard 0/2" in err

    # running the group again resumes node-b's own share where it stopped
    shutil.rmtree(tmp_path / "out-node-c" / "shard-1-of-3")
    status, out, err = cli("extract", "gpus", "--skip-check", "-i", str(inv))
    assert status == 0, err
    _wait(cli, inv, "gpus")
    assert _indexes(tmp_path / "out-node-b") == [1, 4, 7, 10]
    status, out, err = cli("logs", "node-b", "-i", str(inv))
    assert f"resuming: {len(partial)} of 4 samples already written" in out
    status, out, err = cli("verify", "gpus", "--all", "-i", str(inv))
    assert status == 0 and "complete and consistent" in out


def test_one_run_computed_twice_verify_and_gather_keep_the_same_copy():
    """Two copies of one run's sample with other bytes (a share computed twice, equal shares): verify's
    union and gather follow one rule (issue 46, item 6): the same copy kept, the same words, no refusal."""
    run = "r" * 64
    cfg = json.dumps({"data": {"num_samples": 2}, "model": {"hidden_size": 8}})

    def listing(host, sha):
        return shard_mod.admit({"output_dir": f"/o/{host}", "identity": host, "config_text": cfg, "shard_dirs": [],
                                "run": {"run": run}, "run_text": None,
                                "files": [{"index": 0, "name": "data_0.pt", "size": 1, "sha256": sha * 64},
                                          {"index": 1, "name": "data_1.pt", "size": 1, "sha256": "c" * 64}]})
    per_host, _, g = shard_mod.plan({"node-b": [listing("node-b", "b")], "node-a": [listing("node-a", "a")]})
    assert g.problems == [] and g.conflicts == []
    (d0, d1) = g.dropped
    assert d0["kept"] == "node-a:/o/node-a/data_0.pt" and not d0["same_bytes"]
    assert d0["why"] == "computed twice in this run (both run.json agree); kept the first by host name and path " \
                        "(the shares are equal)"

    def part(host):
        return {"host": host, "output_dir": f"/o/{host}", "total": 2, "layer_ids": None, "hidden_size": 8,
                "package_versions": None, "shard": [0, 1], "files": 2, "indexes": rule.runs([0, 1]), "checked": 2,
                "bad": [], "run": run}
    u = shard_mod.union([part("node-b"), part("node-a")])
    dup = u.duplicates[0]
    assert dup["kept"] == "node-a:/o/node-a" and dup["dropped"][0]["why"] == d0["why"]
    assert "gather keeps node-a:/o/node-a's (computed twice in this run" in "\n".join(u.problems)
