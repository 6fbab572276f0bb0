"""Slurm as a target, with a REAL Slurm: slurmctld + slurmd from the distribution's
packages (Debian's slurm-wlm: ``apt-get install slurm-wlm``) started by the fixture on this machine
as one node, reached as a login node over the real sshd. The stand-in job runs as a 3-task array:
submit, status (squeue + the tasks' exit files), logs, verify of the tasks' union, stop (scancel).
Skipped when slurmctld/slurmd are not installed or the tests do not run as root."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from remote_ops.agent.outputs import shares as rule
from remote_ops.agent.outputs import layout
from remote_ops.sshd import free_port
from tests.conftest import REPO, standin_playbook, write_inventory

pytestmark = [
    pytest.mark.skipif(not (shutil.which("slurmctld") and shutil.which("slurmd") and shutil.which("sbatch"))
                       or os.geteuid() != 0,
                       reason="needs Debian's slurm-wlm (slurmctld, slurmd, sbatch) and root"),
    # one worker runs them all (scripts/test.sh: --dist loadgroup): two workers each starting a one-node
    # Slurm of the same node name on this machine made one of them fail
    pytest.mark.xdist_group("slurm"),
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm cluster: slurmctld and slurmd in the foreground, auth/none, state in a tmp dir."""
    root = tmp_path_factory.mktemp("slurm")
    for d in ("state", "spool", "log"):
        (root / d).mkdir()
    node = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=remoteops
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)]
    time.sleep(1)
    procs.append(subprocess.Popen(["slurmd", "-D", "-f", str(conf), "-N", node], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    deadline = time.time() + 60
    try:
        while True:
            out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout
            if out.strip() in ("idle", "mixed", "allocated"):
                break
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                logs = "".join(p.read_text()[-1500:] for p in (root / "log").glob("*.log"))
                pytest.fail(f"Slurm did not come up (sinfo: {out.strip()!r}): {logs}")
            time.sleep(0.5)
        yield {"conf": str(conf), "env": env}
    finally:
        subprocess.run(["scancel", "--user", "root"], env=env, capture_output=True)
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


PLAYBOOK = standin_playbook("slurm-extract", 'slurm: {tasks: 3, time: "00:10:00"}')


def _inventory(sshd, slurm, tmp_path, *, n, sleep):
    pb = tmp_path / "slurm.yaml"
    pb.write_text(PLAYBOOK)
    host = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                           env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": slurm["conf"]},
                           vars={"scheduler": "slurm", "n": n, "sleep": sleep, "out": str(tmp_path / "out")},
                           playbook=str(pb))
    return write_inventory(tmp_path / "inv.yaml", {"cluster": host})


def _status(cli, inv):
    status, out, err = cli("status", "cluster", "--json", "-i", str(inv))
    assert status in (0, 1), err
    return json.loads(out)["job"]


def _wait(cli, inv, states, timeout=180):
    deadline = time.time() + timeout
    while time.time() < deadline:
        job = _status(cli, inv)
        if job["state"] in states:
            return job
        time.sleep(0.5)
    raise AssertionError(f"the Slurm job did not reach {states}: {job}")


@pytest.mark.long
def test_slurm_array_status_logs_verify(slurm, sshd, tmp_path, cli):
    inv = _inventory(sshd, slurm, tmp_path, n=10, sleep=0)
    t0 = time.time()
    status, out, err = cli("extract", "cluster", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]
    assert job["scheduler"] == "slurm" and job["slurm_id"] and len(job["tasks"]) == 3
    job = _wait(cli, inv, ("succeeded", "failed", "lost"))
    elapsed = time.time() - t0
    assert job["state"] == "succeeded", job
    assert [t["exit_code"] for t in job["tasks"]] == [0, 0, 0]
    assert (job["samples"]["done"], job["samples"]["expected"]) == (10, 10)
    for k in range(3):           # array task k wrote shard k of 3, global file names
        d = tmp_path / "out" / f"shard-{k}-of-3"
        assert sorted(i for i in map(layout.index_of, os.listdir(d)) if i is not None) == list(range(k, 10, 3))
        assert json.loads((d / "data_config.json").read_text())["shard"]["index"] == k

    status, out, err = cli("status", "cluster", "-i", str(inv))
    assert status == 0 and "succeeded" in out and "task 2: succeeded, 3/3 samples, exit 0" in out
    status, out, err = cli("logs", "cluster", "-i", str(inv))
    assert status == 0 and "== task 0 (succeeded) ==" in out and "shard 1/3: 3 of 10 samples" in out
    status, out, err = cli("verify", "cluster", "--all", "--json", "-i", str(inv))
    union = json.loads(out)["union"]
    assert status == 0 and union["ok"] and union["files"] == 10 and union["shards"] == 3, out
    status, out, err = cli("verify", "cluster", "-i", str(inv))
    assert status == 0 and f"cluster: 10 data_<N>.pt files in 3 shard dir(s) of {tmp_path}/out" in out
    assert "union: 10/10 samples in 3 output dir(s), 3 shard(s): complete and consistent" in out
    status, out, err = cli("gather", "cluster", "--to", str(tmp_path / "gathered"), "--json", "-i", str(inv))
    g = json.loads(out)["gathered"]
    assert status == 0 and g["ok"] and g["present"] == g["copied"] == 10, out
    assert "shard" not in json.loads((tmp_path / "gathered" / "data_config.json").read_text())
    sys.__stdout__.write(f"\n[timing] 3-task Slurm array of the stand-in, extract to succeeded: {elapsed:.1f} s\n")


def test_slurm_tail_follows_every_task(slurm, sshd, tmp_path, cli):
    inv = _inventory(sshd, slurm, tmp_path, n=6, sleep=0.5)
    status, out, err = cli("extract", "cluster", "--skip-check", "--tail", "-i", str(inv))
    assert status == 0, err
    for k in range(3):
        assert f"[task {k}] shard {k}/3: 2 of 6 samples (i % 3 == {k})" in out
        assert f"[task {k}] wrote 2 sample(s) to {tmp_path}/out/shard-{k}-of-3" in out
    assert "succeeded" in out.splitlines()[-1]
    # the ended array followed again: its logs, then the same end line, exit 0
    status, out2, err = cli("logs", "cluster", "--follow", "-i", str(inv))
    assert status == 0, err
    assert "== task 2 (succeeded) ==" in out2 and out2.strip().splitlines()[-1] == out.strip().splitlines()[-1]


def test_slurm_stop_cancels_the_array(slurm, sshd, tmp_path, cli):
    inv = _inventory(sshd, slurm, tmp_path, n=30, sleep=3)
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status == 0, err
    job = _wait(cli, inv, ("running",), timeout=60)
    t0 = time.time()
    status, out, err = cli("stop", "cluster", "--grace", "5", "--json", "-i", str(inv))
    assert status == 0, err
    rep = json.loads(out)
    assert rep["clean"] and rep["remaining"] == [] and rep["was"] == "running"
    job = _status(cli, inv)
    assert job["state"] == "stopped" and job["reason"] == "stopped by remote-ops' stop (scancel)"
    sq = subprocess.run(["squeue", "-h", "-j", str(job["slurm_id"])], env=slurm["env"], capture_output=True, text=True)
    assert sq.stdout.strip() == ""
    sys.__stdout__.write(f"\n[timing] stop (scancel) to no task left: {time.time() - t0:.1f} s\n")


SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"


def test_slurm_array_of_the_shipped_playbook_with_the_standin(slurm, sshd, tmp_path, cli, monkeypatch):
    """playbooks/eagle3-speculators-0.3.0.yaml (its optional HF_TOKEN unset) with the sandbox's
    stand-in command, on the real Slurm: submitted, run to the end, every sample verified."""
    from remote_ops import sandbox

    monkeypatch.delenv("HF_TOKEN", raising=False)
    paths = sandbox.SandboxPaths(tmp_path / "sandbox")
    sandbox.prepare_workdir(paths)
    entry = sandbox.host_entry(paths, sshd.server)
    entry["python"] = sys.executable          # the stand-in needs only torch + tqdm
    entry["playbook"] = str(SHIPPED)
    entry["env"]["SLURM_CONF"] = slurm["conf"]
    entry["vars"]["scheduler"] = "slurm"
    inv = write_inventory(tmp_path / "inv.yaml", {"cluster": entry})
    status, out, err = cli("extract", "cluster", "--skip-check", "--dry-run", "-i", str(inv))
    assert status == 0, err
    assert (f"note: slurm: files, dataset, disk, model and imports checked on the login node {os.uname().nodename}; "
            f"tasks run on partition debug (the default), nodes {socket.gethostname().split('.')[0]}: they need "
            "the same paths and Python there") in " ".join(out.split()), out
    status, out, err = cli("extract", "cluster", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]
    assert job["scheduler"] == "slurm" and job["slurm_id"]
    job = _wait(cli, inv, ("succeeded", "failed", "lost"), timeout=240)
    assert job["state"] == "succeeded", (job, cli("logs", "cluster", "-i", str(inv))[1])
    assert (job["samples"]["done"], job["samples"]["expected"]) == (24, 24)
    status, out, err = cli("verify", "cluster", "--all", "--json", "-i", str(inv))
    assert status == 0 and json.loads(out)["union"]["ok"], out
    status, out, err = cli("logs", "cluster", "-i", str(inv))
    assert "STAND-IN" in out


SECRET_PLAYBOOK = """\
name: slurm-secret
extract:
  command: ["{python}", "-c", "import os, sys; print('token seen:', os.environ.get('MY_TOKEN') == sys.argv[1] + 'value')",
            "secret-", "--output-dir", "{output_dir}"]
  output_dir: "{vars.out}"
  gpus: 0
  secrets:
    MY_TOKEN: {from_env: MY_TOKEN_HERE, optional: true}
  slurm: {tasks: 2, time: "00:05:00"}
"""


def _secret_inventory(sshd, slurm, tmp_path):
    pb = tmp_path / "secret.yaml"
    pb.write_text(SECRET_PLAYBOOK)
    host = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                           env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": slurm["conf"]},
                           vars={"scheduler": "slurm", "out": str(tmp_path / "out")}, playbook=str(pb))
    return write_inventory(tmp_path / "inv.yaml", {"cluster": host})


def test_a_set_secret_reaches_every_task_through_a_private_file(slurm, sshd, tmp_path, cli, monkeypatch):
    """A secret set here is written to the job's 0600 secrets.json, read by each array task, never
    in the batch script, job.json, argv or the logs; removed once every task ended. Unset (it is
    optional): the job runs without it."""
    inv = _secret_inventory(sshd, slurm, tmp_path)
    value = "secret-value"
    monkeypatch.setenv("MY_TOKEN_HERE", value)
    status, out, err = cli("extract", "cluster", "--json", "-i", str(inv))
    assert status == 0, err
    job = _wait(cli, inv, ("succeeded", "failed", "lost"), timeout=120)
    assert job["state"] == "succeeded", job
    jobdir = tmp_path / "state" / "slurm" / job["job_id"]
    logs = [(jobdir / f"task-{k}.log").read_text() for k in range(2)]
    assert all("token seen: True" in text for text in logs), logs
    for f in jobdir.iterdir():
        assert value not in f.read_text(errors="replace"), f
    assert json.loads((jobdir / "job.json").read_text())["secret_names"] == ["MY_TOKEN"]
    assert not (jobdir / "secrets.json").exists()        # every task ended: removed
    # unset and optional: no obstacle, no file, the task sees no token
    monkeypatch.delenv("MY_TOKEN_HERE")
    status, out, err = cli("extract", "cluster", "--json", "-i", str(inv))
    assert status == 0, err
    job = _wait(cli, inv, ("succeeded", "failed", "lost"), timeout=120)
    assert job["state"] == "succeeded", job
    jobdir = tmp_path / "state" / "slurm" / job["job_id"]
    assert "token seen: False" in (jobdir / "task-0.log").read_text()
    assert json.loads((jobdir / "job.json").read_text())["secret_names"] == []


def test_sbatch_without_a_reachable_controller_says_so(sshd, tmp_path, cli):
    """No slurmctld answers: one line with sbatch's own words (no literal \\n), the fix is to reach the
    controller, not the partition or gres options; no job directory is left behind."""
    node = socket.gethostname().split(".")[0]
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=none\nSlurmctldHost={node}(127.0.0.1)\nSlurmctldPort={free_port()}\n"
                    "AuthType=auth/none\nCredType=cred/none\nMessageTimeout=2\n"
                    f"NodeName={node} NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
                    f"PartitionName=debug Nodes={node} Default=YES State=UP\n")
    pb = tmp_path / "pb.yaml"
    pb.write_text(PLAYBOOK)
    host = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                           env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": str(conf)},
                           vars={"scheduler": "slurm", "n": 3, "sleep": 0, "out": str(tmp_path / "out")},
                           playbook=str(pb))
    inv = write_inventory(tmp_path / "inv.yaml", {"cluster": host})
    status, out, err = cli("extract", "cluster", "--skip-check", "--dry-run", "-i", str(inv))
    assert status == 0, err        # where the tasks run is a note: sinfo's words, no guess
    assert (f"checked on the login node {os.uname().nodename}; tasks run on the cluster's default partition "
            "(sinfo: slurm_load_partitions: Unable to contact slurm controller") in " ".join(out.split()), out
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status != 0
    assert "sbatch refused the job: Batch job submission failed: Unable to contact slurm controller" in err, err
    assert "scontrol ping" in err and "partition" not in err and "gres" not in err
    assert "\\n" not in err and len(err.strip().splitlines()) == 1
    assert list((tmp_path / "state" / "slurm").glob("*/batch.py")) == []


@pytest.mark.long
def test_a_task_near_its_time_limit_requeues_itself_and_resumes(slurm, sshd, tmp_path, cli):
    """What Slurm sends a task before its time limit (--signal=B:USR1@120), sent now with scancel
    --signal=USR1 --batch: the task stops its command, requeues itself (scontrol requeue), runs again
    (SLURM_RESTART_COUNT 1) and resumes the files it had not written; the array ends succeeded
    with every sample once."""
    inv = _inventory(sshd, slurm, tmp_path, n=12, sleep=1)
    status, out, err = cli("extract", "cluster", "--skip-check", "--json", "-i", str(inv))
    assert status == 0, err
    job = json.loads(out)["job"]
    jobdir = tmp_path / "state" / "slurm" / job["job_id"]
    batch = (jobdir / "batch.py").read_text()
    assert "#SBATCH --requeue" in batch and "#SBATCH --signal=B:USR1@120" in batch
    log0 = jobdir / "task-0.log"
    deadline = time.time() + 60
    while "1 of 12" not in (log0.read_text() if log0.exists() else "") and "shard 0/3" not in (
            log0.read_text() if log0.exists() else ""):
        assert time.time() < deadline, "task 0 did not start"
        time.sleep(0.3)
    time.sleep(1.5)        # a sample or two written
    r = subprocess.run(["scancel", "--signal=USR1", "--batch", f"{job['slurm_id']}_0"], env=slurm["env"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    deadline = time.time() + 60
    while "requeued (1 of at most 3)" not in log0.read_text():
        assert time.time() < deadline, log0.read_text()
        time.sleep(0.3)
    # Slurm holds a requeued task back for a while (its begin time): let it start now (what an
    # admin may do; the wait is the cluster's, not remote-ops')
    for _ in range(20):
        u = subprocess.run(["scontrol", "update", f"JobId={job['slurm_id']}_0", "StartTime=now"], env=slurm["env"],
                           capture_output=True, text=True)
        if u.returncode == 0:
            break
        time.sleep(0.5)
    job = _wait(cli, inv, ("succeeded", "failed", "lost"), timeout=240)
    text = log0.read_text()
    assert "task 0: Slurm's time limit is near: stopped and requeued (1 of at most 3)" in text, text
    assert text.count("[remote-ops] task 0 of 3 on ") == 2 and "(run 2)" in text, text
    assert job["state"] == "succeeded", (job, text)
    assert (job["samples"]["done"], job["samples"]["expected"]) == (12, 12)
    d = tmp_path / "out" / "shard-0-of-3"
    assert sorted(i for i in map(layout.index_of, os.listdir(d)) if i is not None) == list(range(0, 12, 3))



def _cancel_outside(cli, inv, slurm):
    """A running array cancelled by scancel behind remote-ops' back (no stop record): its tasks leave
    the queue without exit files. The job's record when every task has gone."""
    job = _wait(cli, inv, ("running",), timeout=60)
    r = subprocess.run(["scancel", str(job["slurm_id"])], env=slurm["env"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return _wait(cli, inv, ("succeeded", "failed", "lost", "stopped"), timeout=60)


def test_tasks_that_left_the_queue_without_accounting_say_so_in_one_line(slurm, sshd, tmp_path, cli):
    """The suite's Slurm has no accounting (AccountingStorageType=accounting_storage/none): a task that
    left the queue without an exit file stays "lost", and status says in one line that sacct could not
    tell, in sacct's own words, asked once for the ended job (sacct.json); ``logs --follow`` on the
    ended array prints its end line and exits 1 as status does."""
    inv = _inventory(sshd, slurm, tmp_path, n=30, sleep=3)
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status == 0, err
    job = _cancel_outside(cli, inv, slurm)
    assert job["state"] == "lost" and {t["state"] for t in job["tasks"]} == {"lost"}, job
    assert job["accounting"] == ("sacct: Slurm accounting is not configured on this cluster (Slurm accounting "
                                 "storage is disabled): a task's final state is its exit file's, node and "
                                 "elapsed time are not known"), job
    assert all(t["node"] is None and t["slurm_state"] is None for t in job["tasks"])
    kept = json.loads((tmp_path / "state" / "slurm" / job["job_id"] / "sacct.json").read_text())
    assert kept == {"tasks": {}, "note": job["accounting"]}
    status, out, err = cli("status", "cluster", "-i", str(inv))
    assert status == 1 and "  sacct: Slurm accounting is not configured on this cluster" in out, out
    assert "task 0: lost, " in out
    status, out, err = cli("status", "cluster", "--all", "--json", "-i", str(inv))     # the login node's jobs
    listed = json.loads(out)["jobs"]
    assert status == 0 and [j["job_id"] for j in listed] == [job["job_id"]], out
    assert listed[0]["accounting"] == job["accounting"] and listed[0]["slurm_id"] == job["slurm_id"]
    status, out, err = cli("status", "cluster", "--all", "-i", str(inv))
    assert f"cluster: {job['job_id']} (STAND-IN): lost after " in out, out
    status, out, err = cli("logs", "cluster", "--follow", "-i", str(inv))
    assert status == 1, (out, err)
    end = out.strip().splitlines()[-2:]
    assert end[0].startswith(f"{job['job_id']} (STAND-IN): lost after ") and end[0].endswith(
        " - task 0 lost; task 1 lost; task 2 lost"), out
    assert end[1] == f"  {job['accounting']}", out
    status, out, err = cli("logs", "cluster", "--follow", "--json", "-i", str(inv))
    events = [json.loads(line) for line in out.splitlines()]
    assert status == 1 and [e["event"] for e in events] == ["logs", "end"], out
    assert events[-1]["status"]["state"] == "lost" and events[0]["job_id"] == job["job_id"]


FAKE_SACCT = """\
#!/bin/sh
# sacct of a cluster with accounting, which the suite's Slurm has not: rows in the format sacct
# documents (--parsable2 --noheader --format=JobID,State,ExitCode,Elapsed,NodeList) for the job "$2"
printf '%s_0|TIMEOUT|0:0|00:10:03|gpu02\\n%s_0.batch|CANCELLED|0:15|00:10:05|gpu02\\n' "$2" "$2"
printf '%s_1|CANCELLED by 0|0:0|00:00:00|None assigned\\n%s_2|OUT_OF_MEMORY|0:125|00:01:00|gpu03\\n' "$2" "$2"
"""


def test_tasks_that_left_the_queue_end_as_sacct_says(slurm, sshd, tmp_path, cli):
    """With accounting (sacct's rows from a script in front of PATH: the suite's Slurm has no slurmdbd;
    squeue, sbatch and scancel are the real ones): each task that left the queue without an exit file
    takes sacct's final state, exit code, node and elapsed time."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sacct").write_text(FAKE_SACCT)
    (fake / "sacct").chmod(0o755)
    pb = tmp_path / "slurm.yaml"
    pb.write_text(PLAYBOOK)
    host = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                           env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": slurm["conf"],
                                "PATH": f"{fake}:{os.environ['PATH']}"},
                           vars={"scheduler": "slurm", "n": 30, "sleep": 3, "out": str(tmp_path / "out")},
                           playbook=str(pb))
    inv = write_inventory(tmp_path / "inv.yaml", {"cluster": host})
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status == 0, err
    job = _cancel_outside(cli, inv, slurm)
    assert job["accounting"] is None, job
    t = {x["task"]: x for x in job["tasks"]}
    assert (t[0]["state"], t[0]["slurm_state"], t[0]["node"], t[0]["elapsed_s"], t[0]["exit_code"]) == \
        ("failed", "TIMEOUT", "gpu02", 603, 0)
    assert (t[1]["state"], t[1]["slurm_state"], t[1]["node"]) == ("stopped", "CANCELLED", None)
    assert (t[2]["state"], t[2]["signal"], t[2]["reason"]) == ("failed", 125, "Slurm: OUT_OF_MEMORY on gpu03 "
                                                                               "after 60 s, signal 125")
    assert job["state"] == "failed" and job["reason"].startswith(
        "task 0 failed (exit code 0), Slurm: TIMEOUT on gpu02 after 603 s; task 2 failed"), job
    status, out, err = cli("status", "cluster", "-i", str(inv))
    assert status == 1 and "task 0: failed (Slurm: TIMEOUT on gpu02 after 603 s), " in out, out


LAYERED = PLAYBOOK.replace('"--hidden-size", "16"]', '"--hidden-size", "16", "--layer-ids", "{vars.layers}"]')


def _layered_inventory(sshd, slurm, tmp_path, *, layers, n=6, sleep=0):
    pb = tmp_path / "slurm.yaml"
    pb.write_text(LAYERED)
    host = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                           env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state"), "SLURM_CONF": slurm["conf"]},
                           vars={"scheduler": "slurm", "n": n, "sleep": sleep, "layers": layers,
                                 "out": str(tmp_path / "out")}, playbook=str(pb))
    return write_inventory(tmp_path / "inv.yaml", {"cluster": host})


def _tree(root):
    return sorted((str(p.relative_to(root)), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file())


def test_the_login_node_preflight_refuses_another_run_in_the_task_directories(slurm, sshd, tmp_path, cli):
    """Each array task's shard-K-of-N holds the run identity: the login node's preflight compares
    every task's run.json before sbatch; another run's samples refuse the submit in one line naming
    the task, its directory and the difference, with a fix a Slurm job can take (not --overwrite);
    nothing is submitted and no file changes. The same run resumes with a note per task."""
    inv = _layered_inventory(sshd, slurm, tmp_path, layers="1,2,3")
    status, out, err = cli("extract", "cluster", "--skip-check", "--dry-run", "-i", str(inv))
    assert status == 0, err
    assert "record it in their shard-K-of-3/run.json as they start" in " ".join(out.split()), out
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status == 0, err
    first = _wait(cli, inv, ("succeeded", "failed", "lost"))
    assert first["state"] == "succeeded", first
    before = _tree(tmp_path / "out")

    inv = _layered_inventory(sshd, slurm, tmp_path, layers="0,1,2")
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status != 0, out
    line = " ".join(err.split())
    assert (f"array task 0: {tmp_path}/out/shard-0-of-3 holds 2 sample file(s) of another run: layer_ids "
            "[1,2,3] -> [0,1,2]") in line, err
    assert f"(also task(s) 1, 2: {tmp_path}/out/shard-1-of-3, {tmp_path}/out/shard-2-of-3)" in line, err
    assert "--overwrite is not offered for Slurm jobs" in line and "start over with" not in line, err
    assert _tree(tmp_path / "out") == before
    jobs = sorted(p.name for p in (tmp_path / "state" / "slurm").iterdir() if p.is_dir())
    assert jobs == [first["job_id"]]                     # nothing submitted
    assert _status(cli, inv)["job_id"] == first["job_id"]

    inv = _layered_inventory(sshd, slurm, tmp_path, layers="1,2,3")     # the same run: a resume, noted per task
    status, out, err = cli("extract", "cluster", "--skip-check", "--dry-run", "-i", str(inv))
    assert status == 0, err
    assert "task(s) 0, 1, 2 resume their 6 sample file(s) (run.json)" in " ".join(out.split()), out


def test_slurm_speaks_for_itself_and_an_ended_array_keeps_its_own_count_and_time(slurm, sshd, tmp_path, cli):
    """Status, extract and stop of an array in Slurm's words (no pid, no squeue reason "None", no
    literal task-%a.log, scancel rather than SIGTERM/SIGKILL); a cancelled array reports what its
    tasks had written by their end (each task records it on scancel's SIGTERM) and an elapsed time
    that stops growing, also after a later array completed the directories."""
    inv = _inventory(sshd, slurm, tmp_path, n=30, sleep=1)
    status, out, err = cli("extract", "cluster", "--skip-check", "-i", str(inv))
    assert status == 0, err
    assert "pid None" not in out and "Slurm job " in out and "3 array task(s)" in out, out
    assert "%a" not in out and f"logs: {tmp_path}/state/slurm/" in out, out
    job = _wait(cli, inv, ("running",), timeout=60)
    deadline = time.time() + 60
    while _status(cli, inv)["samples"]["done"] < 3:
        assert time.time() < deadline
        time.sleep(0.3)
    status, out, err = cli("status", "cluster", "-i", str(inv))
    assert "running (None)" not in out and "(None)" not in out and "pid None" not in out, out
    assert "%a" not in out and "task-0.log .. task-2.log" in out, out
    status, out, err = cli("stop", "cluster", "-i", str(inv))
    assert status == 0, err
    assert f"(scancel of Slurm job {job['slurm_id']}, 3 array task(s))" in err and "SIGKILL" not in err, err
    assert f"scancel {job['slurm_id']}: Slurm lists no task of it" in out, out
    stopped = _wait(cli, inv, ("stopped",), timeout=60)
    assert all(t["samples_counted"] == "at its end" for t in stopped["tasks"]), stopped
    written = stopped["samples"]["done"]
    assert 3 <= written < 30
    time.sleep(2.5)
    again = _status(cli, inv)
    assert again["elapsed_s"] == stopped["elapsed_s"], (again, stopped)     # its own time, not growing
    # a later array completes the directories: the cancelled one still says what it had written
    inv2 = _inventory(sshd, slurm, tmp_path, n=30, sleep=0)
    status, out, err = cli("extract", "cluster", "--skip-check", "--json", "-i", str(inv2))
    assert status == 0, err
    done = _wait(cli, inv2, ("succeeded", "failed", "lost"))
    assert done["state"] == "succeeded" and done["samples"]["done"] == 30, done
    assert done["samples"]["at_start"] == written, done
    assert done["rate_per_s"] == round((30 - written) / done["elapsed_s"], 3) or done["rate_per_s"] > 0
    status, out, err = cli("status", "cluster", "--job", stopped["job_id"], "--json", "-i", str(inv))
    old = json.loads(out)["job"]
    assert old["samples"]["done"] == written and old["elapsed_s"] == stopped["elapsed_s"], old
