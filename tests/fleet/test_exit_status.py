"""REFERENCE's exit-status table holds for a group, over the real sshd: a group with
a host that fails (unreachable) and hosts that succeed or have findings exits with the failed host's
status for every command (status, verify, gather, extract, check, patch), the first failed host in
target order when several fail, 1 when the only trouble is findings (or a failed job, or an incomplete
union), 0 when all is well; the other hosts are served all the same."""

from __future__ import annotations

import json
import socket
import sys

import pytest
import yaml

from remote_ops.errors import Exit
from tests.conftest import standin_extract, write_playbook
from tests.patch.test_over_ssh import GEN, SHIPPED, site_file

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.long
def test_a_groups_exit_status_is_the_tables(tmp_path, sshd, fresh_env017, cli):
    state = tmp_path / "state"
    state.mkdir()
    env = {"REMOTE_OPS_STATE_DIR": str(state)}
    out_dir = tmp_path / "out"
    job_pb = write_playbook(tmp_path / "standin.yaml", "standin", standin_extract(
        "--batch-size", "2", "--max-samples", "6", workdir=tmp_path, output_dir=out_dir, expected_samples=6))
    hosts = {
        "lib": sshd.host_entry(str(fresh_env017), env=env, playbook=str(SHIPPED)),   # check finds calls to fix
        "job": sshd.host_entry(sys.executable, env=env, playbook=str(job_pb)),      # the stand-in job
        "dead": sshd.host_entry(sys.executable, port=_free_port(), connect_timeout=3, playbook=str(job_pb)),
        "nopy": sshd.host_entry("/nonexistent/python3", env=env, playbook=str(job_pb)),
    }
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"hosts": hosts, "groups": {
        "libs": ["lib", "dead"], "jobs": ["job", "dead"], "lib-only": ["lib"], "job-only": ["job"],
        "dead-first": ["dead", "nopy"], "nopy-first": ["nopy", "dead"]}}))

    def run(*args):
        status, out, err = cli("-i", str(inv), *args)
        return status, out, err

    # check: findings alone -> 1; with a host unreachable -> that host's 3 (the findings still printed)
    status, out, err = run("check", "lib-only")
    assert status == Exit.FINDINGS, err
    status, out, err = run("check", "libs", "--json")
    assert status == Exit.UNREACHABLE, err
    rec = json.loads(out)
    assert rec["failed"] == ["dead"] and rec["hosts"][0]["result"]["findings"], rec["hosts"][0]
    # several hosts failing: the first failed host's status, in target order
    assert run("check", "dead-first")[0] == Exit.UNREACHABLE
    assert run("check", "nopy-first")[0] == Exit.REMOTE

    # patch: the reachable host is patched all the same; exit 3
    target = site_file(fresh_env017, GEN)
    before = target.read_bytes()
    status, out, err = run("patch", "libs", "--yes")
    assert status == Exit.UNREACHABLE and target.read_bytes() != before, out + err
    assert run("check", "lib-only")[0] == Exit.OK

    # extract: the live host's job starts; exit 3
    status, out, err = run("extract", "jobs")
    assert status == Exit.UNREACHABLE, out + err
    wait_ended(tmp_path, run, "job-only")
    assert run("status", "job-only")[0] == Exit.OK
    status, out, err = run("status", "jobs", "--json")
    assert status == Exit.UNREACHABLE, err
    assert json.loads(out)["hosts"][0]["result"]["job"]["state"] == "succeeded"

    # verify / gather: complete on the live host, exit 3 with the dead one
    assert run("verify", "job-only")[0] == Exit.OK
    assert run("verify", "jobs")[0] == Exit.UNREACHABLE
    status, out, err = run("gather", "jobs", "--to", str(tmp_path / "gathered"))
    assert status == Exit.UNREACHABLE, out + err
    assert (tmp_path / "gathered" / "data_5.pt").exists()

    # findings only (a missing sample): 1 for verify and gather; with the dead host still 3
    (out_dir / "data_4.pt").unlink()
    assert run("verify", "job-only")[0] == Exit.FINDINGS
    assert run("gather", "job-only", "--to", str(tmp_path / "gathered2"))[0] == Exit.FINDINGS
    assert run("verify", "jobs")[0] == Exit.UNREACHABLE
    assert run("gather", "jobs", "--to", str(tmp_path / "gathered3"))[0] == Exit.UNREACHABLE

    # a failed job: status 1; with the dead host, 3
    crash = write_playbook(tmp_path / "crash.yaml", "crash", standin_extract(
        "--max-samples", "6", "--crash-at", "2", workdir=tmp_path, output_dir=tmp_path / "out-crash"))
    run("extract", "job-only", "--playbook", str(crash))
    wait_ended(tmp_path, run, "job-only", "--playbook", str(crash))
    assert run("status", "job-only", "--playbook", str(crash))[0] == Exit.FINDINGS
    assert run("status", "jobs", "--playbook", str(crash))[0] == Exit.UNREACHABLE


def wait_ended(tmp_path, run, *target, timeout=120):
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, out, err = run("status", *target, "--json")
        rec = json.loads(out)
        jobs = [h["result"]["job"] for h in rec["hosts"] if h["ok"]] if "hosts" in rec else [rec["job"]]
        if jobs and all(j["state"] not in ("starting", "running") for j in jobs):
            return
        time.sleep(0.3)
    raise AssertionError(f"the job of {target} did not end: {out}")
