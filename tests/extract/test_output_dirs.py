"""One output spread over several directories (``output_dir: [A, B]``, one per disk),
over the real sshd with the stand-in job (the shipped script's own data path, torch on the CPU).

- The samples alternate over the two directories (sample N in the (N % 2)-th); a stop and a resume
  writes only the missing samples, each in its own directory; status counts both directories.
- verify finds the whole output from either directory and fails on a corrupt file in the second,
  naming it; gather brings all into one local directory (its run.json without the list).
- A changed list (order included) is refused at preflight naming ``output_dirs``; a second job whose
  list shares one directory with a running job is refused naming that job.
- The disk preflight holds each directory's share to its own filesystem (two directories on one
  filesystem: summed once).
- The server flow (one directory through vLLM's connector) refuses a list in one line.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from remote_ops.agent import shards as rule
from remote_ops.agent.outputs import layout
from remote_ops.agent.job import outputlock
from remote_ops.extract import jobs as jobs_mod
from tests.conftest import standin_playbook, write_inventory


PLAYBOOK = standin_playbook("two-disks")


def _inventory(sshd, tmp_path, hosts: dict, *, n=10, sleep=0.0, playbook=PLAYBOOK):
    """``hosts``: name -> (list of output dir names, state dir name)."""
    pb = tmp_path / "pb.yaml"
    pb.write_text(playbook)
    entries = {name: sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                                     env={"REMOTE_OPS_STATE_DIR": str(tmp_path / state)},
                                     vars={"n": n, "sleep": sleep, "out": [str(tmp_path / o) for o in outs]},
                                     playbook=str(pb))
               for name, (outs, state) in hosts.items()}
    return write_inventory(tmp_path / "inv.yaml", entries, groups={"gpus": list(hosts)})


def _indexes(path):
    return sorted(i for i in map(layout.index_of, os.listdir(path)) if i is not None)


def _status(cli, inv, target):
    return json.loads(cli("status", target, "--json", "-i", str(inv))[1])


def _wait(cli, inv, target, timeout=120):
    return jobs_mod.wait_ended(lambda: _status(cli, inv, target), timeout=timeout)


def test_two_directories_alternate_resume_verify_and_gather(sshd, tmp_path, cli):
    a, b = tmp_path / "nvme0", tmp_path / "nvme1"
    # 1 s a sample and a stop once 2 files are there: the stop has ~8 s to land before the job would end
    # by itself (with 0.4 s and 4 files, 2.4 s: a loaded CI machine once let all 10 through; with 0.6 s, 8
    # test processes on 2 CPUs did once)
    inv = _inventory(sshd, tmp_path, {"node": (["nvme0", "nvme1"], "state")}, n=10, sleep=1.0)
    status, out, err = cli("extract", "node", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]
    assert job["output_dirs"] == [str(a), str(b)]
    for d in (a, b):       # one claim per directory, both the job's
        assert json.loads((d / outputlock.MARKER).read_text())["job_id"] == job["job_id"]
    deadline = time.monotonic() + 60
    while len(_indexes(a)) + len(_indexes(b)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    status, out, err = cli("stop", "node", "-i", str(inv))
    assert status == 0, err
    st = _wait(cli, inv, "node")["job"]
    assert st["state"] == "stopped"
    first_a, first_b = _indexes(a), _indexes(b)
    assert first_a and first_b and len(first_a) + len(first_b) < 10
    assert all(i % 2 == 0 for i in first_a) and all(i % 2 == 1 for i in first_b)
    assert st["samples"]["done"] == len(first_a) + len(first_b)          # both directories counted
    for d in (a, b):
        assert not (d / outputlock.MARKER).exists()                       # every claim released
    before = {p: p.stat().st_mtime_ns for d in (a, b) for p in d.glob("data_*.pt")}

    # resume: only the missing samples, each in its own directory
    status, out, err = cli("extract", "node", "--skip-check", "-i", str(inv))
    assert status == 0, err
    assert "are this run's (run.json): resuming" in out and f"{a} and {b}" in out
    st = _wait(cli, inv, "node")["job"]
    assert st["state"] == "succeeded" and st["samples"]["done"] == 10
    assert _indexes(a) == [0, 2, 4, 6, 8] and _indexes(b) == [1, 3, 5, 7, 9]
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())     # nothing rewritten
    status, log, err = cli("logs", "node", "-i", str(inv))
    assert f"resuming: {len(before)} of 10 samples already written, {10 - len(before)} to go" in log
    ra, rb = (json.loads((d / "run.json").read_text()) for d in (a, b))
    assert ra["digest"] == rb["digest"] and ra["identity"]["output_dirs"] == [str(a), str(b)]

    # verify: the whole output, from either directory
    status, out, err = cli("verify", "node", "--all", "--json", "-i", str(inv))
    rec = json.loads(out)
    assert status == 0 and rec["ok"] and rec["files"] == 10 and rec["output_dirs"] == [str(a), str(b)], rec
    status, out, err = cli("verify", "node", "--all", "--output-dir", str(b), "--json", "-i", str(inv))
    assert status == 0 and json.loads(out)["files"] == 10
    status, out, err = cli("verify", "node", "--all", "--output-dir", str(b), "-i", str(inv))
    assert status == 0 and f"node: 10 data_<N>.pt files of 10 expected in {a} + {b}" in out, out
    status, out, err = cli("status", "node", "-i", str(inv))
    assert f"output: {a} + {b}" in out and "10/10" in out, out
    # a corrupt file in the second directory fails it, named with its directory
    good = (b / "data_3.pt").read_bytes()
    (b / "data_3.pt").write_bytes(good[: len(good) // 2])
    status, out, err = cli("verify", "node", "--all", "--json", "-i", str(inv))
    rec = json.loads(out)
    assert status == 1 and not rec["ok"]
    assert [u["file"] for u in rec["unloadable"]] == [str(b / "data_3.pt")]
    (b / "data_3.pt").write_bytes(good)
    # one sample in both directories is one copy too many
    (a / "data_3.pt").write_bytes(good)
    status, out, err = cli("verify", "node", "--json", "-i", str(inv))
    rec = json.loads(out)
    assert status == 1 and any("in two of the output directories, e.g. data_3.pt" in p
                               for p in rec["config_problems"]), rec
    (a / "data_3.pt").unlink()

    # gather: all ten into one local directory; its run.json is the run's, without the list
    dest = tmp_path / "gathered"
    status, out, err = cli("gather", "node", "--to", str(dest), "--json", "-i", str(inv))
    assert status == 0, out + err
    assert _indexes(dest) == list(range(10))
    assert (dest / "data_3.pt").read_bytes() == good
    assert "output_dirs" not in json.loads((dest / "run.json").read_text())["identity"]


def test_a_changed_list_and_a_second_job_on_one_of_the_directories_are_refused(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path, {"node": (["d0", "d1"], "state")}, n=6)
    status, out, err = cli("extract", "node", "--skip-check", "--tail", "-i", str(inv))    # progress over both
    assert status == 0 and "succeeded" in out and "6/6 samples" in out, out + err
    assert "2 output directories: sample N goes to the ((N // 1) % 2)-th of" in out
    for outs in (["d1", "d0"], ["d0", "d1", "d2"], ["d0"]):
        inv = _inventory(sshd, tmp_path, {"node": (outs, "state")}, n=6)
        status, out, err = cli("extract", "node", "--skip-check", "-i", str(inv))
        assert status != 0 and "preflight refused" in err
        first = tmp_path / outs[0]       # the first directory of the new list holding another run's files
        assert f"{first} holds 3 sample file(s) of another run: output_dirs " in err, err
        assert "--overwrite" in err
    assert _indexes(tmp_path / "d0") == [0, 2, 4] and _indexes(tmp_path / "d1") == [1, 3, 5]

    # a running job on [e0, e1]; another job (its own state dir: another machine on a shared file
    # system) on [e2, e1] shares e1: refused naming the running job, nothing of it claimed
    inv = _inventory(sshd, tmp_path, {"node-a": (["e0", "e1"], "state-a"), "node-b": (["e2", "e1"], "state-b")},
                     n=20, sleep=0.5)
    status, out, err = cli("extract", "node-a", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    first = json.loads(out)["job"]
    # the same first directory (the same job slot), another list: not the job asked for, so no attach
    other = _inventory(sshd, tmp_path, {"node-a": (["e0", "e3"], "state-a")}, n=20, sleep=0.5)
    status, out, err = cli("extract", "node-a", "--skip-check", "-i", str(other))
    assert status != 0 and f"is being written by job {first['job_id']} into {tmp_path / 'e0'}, {tmp_path / 'e1'}; " \
        f"this launch names {tmp_path / 'e0'}, {tmp_path / 'e3'}" in err, err
    inv = _inventory(sshd, tmp_path, {"node-a": (["e0", "e1"], "state-a"), "node-b": (["e2", "e1"], "state-b")},
                     n=20, sleep=0.5)
    status, out, err = cli("extract", "node-b", "--skip-check", "-i", str(inv))
    assert status != 0
    assert f"{tmp_path / 'e1'} is being written by job {first['job_id']}" in err, err
    assert not (tmp_path / "e2" / outputlock.MARKER).exists()
    assert cli("stop", "node-a", "-i", str(inv))[0] == 0
    _wait(cli, inv, "node-a")


def test_the_disk_preflight_holds_each_directorys_share_to_its_filesystem(sshd, tmp_path, cli):
    """Both directories on the test's one filesystem: their shares are summed against its free space
    once; a model whose samples cannot fit is refused naming both, before any launch."""
    model = tmp_path / "model"
    model.mkdir()
    ds = tmp_path / "ds.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": [1] * 50}) + "\n" for _ in range(8)))
    pb = PLAYBOOK.replace("  gpus: 0\n", f"  gpus: 0\n  disk: {{dataset: {ds}, model: {model}, layer_ids: '1'}}\n")
    for hidden, fits in ((16, True), (10**12, False)):
        (model / "config.json").write_text(json.dumps({"hidden_size": hidden, "num_hidden_layers": 4}))
        inv = _inventory(sshd, tmp_path, {"node": (["f0", "f1"], "state")}, n=8, playbook=pb)
        status, out, err = cli("extract", "node", "--skip-check", "--dry-run", "--json", "-i", str(inv))
        doc = json.loads(out)
        need = doc["preflight"]["disk"]["need"]
        (fs,) = need["filesystems"]
        assert fs["dirs"] == [str(tmp_path / "f0"), str(tmp_path / "f1")] and fs["samples"] == 8
        assert need["fits"] is fits and (status == 0) is fits, doc
        where = f"{tmp_path / 'f0'} + {tmp_path / 'f1'} (one filesystem)"
        if fits:
            assert f"disk: 8 more samples (400 tokens x 1 layers x 16 hidden x 2 bytes) need" in out and where in out
        else:
            assert f"not enough disk at {where}: 8 more samples" in json.dumps(doc)
    # one directory named twice (a symlink to it): refused before any launch
    os.symlink(tmp_path / "f0", tmp_path / "f0-link")
    inv = _inventory(sshd, tmp_path, {"node": (["f0", "f0-link"], "state")}, n=8)
    status, out, err = cli("extract", "node", "--skip-check", "--dry-run", "-i", str(inv))
    assert status != 0 and f"{tmp_path / 'f0'} and {tmp_path / 'f0-link'} are the same directory" in out + err


@pytest.mark.parametrize("flow", ["server", "hs_safetensors"])
def test_a_job_that_writes_one_directory_refuses_a_list_in_one_line(tmp_path, flow):
    from remote_ops.errors import ConfigError
    from remote_ops.connect.inventory import Host
    from remote_ops.extract.extract_spec import parse_spec
    from remote_ops.playbook.loader import load as load_playbook
    extra = ('  server: {command: ["{python}", "-m", "vllm", "serve", "m", "--port", "{port}"], port: 8000}\n'
             if flow == "server" else "  output_layout: hs_safetensors\n")
    pb_path = tmp_path / "pb.yaml"
    pb_path.write_text(PLAYBOOK + extra)
    host = Host(name="h", hostname="127.0.0.1", vars={"out": ["/n0/hs", "/n1/hs"]})
    with pytest.raises(ConfigError) as exc:
        parse_spec(load_playbook(pb_path), host)
    assert "output_dir names several directories, but this job writes one" in str(exc.value)
    one = Host(name="h", hostname="127.0.0.1", vars={"out": ["/n0/hs"]})
    assert parse_spec(load_playbook(pb_path), one).output_dirs == ["/n0/hs"]


def test_the_spec_fills_the_command_with_every_directory_and_refuses_what_the_job_would_split(tmp_path):
    from remote_ops.connect.inventory import Host
    from remote_ops.errors import ConfigError
    from remote_ops.extract.extract_spec import parse_spec
    from remote_ops.playbook.loader import load as load_playbook
    pb_path = tmp_path / "pb.yaml"
    pb_path.write_text(PLAYBOOK)
    pb = load_playbook(pb_path)
    spec = parse_spec(pb, Host(name="h", hostname="x", workdir="/w", vars={"out": ["/n0/hs", "rel"]}))
    assert spec.output_dirs == ["/n0/hs", "/w/rel"] and spec.output_dir == "/n0/hs"
    assert spec.command[spec.command.index("--output-dir") + 1] == "/n0/hs:/w/rel"
    assert spec.to_json()["output_dirs"] == ["/n0/hs", "/w/rel"]
    one = parse_spec(pb, Host(name="h", hostname="x", workdir="/w", vars={"out": "/n0/hs"}))
    assert one.output_dirs == ["/n0/hs"] and one.several_dirs is None and "output_dirs" not in one.to_json()
    for out, expect in ((["/a", "/a/"], "output_dir names /a/ twice"), ([], "output_dir is an empty list"),
                        ("/data/x:y", "holds ':', which separates the directories"),
                        (["/a", "/b:c"], "holds ':', which separates the directories")):
        with pytest.raises(ConfigError) as exc:
            parse_spec(pb, Host(name="h", hostname="x", workdir="/w", vars={"out": out}))
        assert expect in str(exc.value), str(exc.value)
