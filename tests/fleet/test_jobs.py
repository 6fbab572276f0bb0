"""extract / status / logs / verify / stop on a group: in parallel, per-host vars reach the playbook,
a dead host is reported (and named) without hiding the others."""

from __future__ import annotations

import json
import sys
import time

import pytest

from remote_ops.sshd import free_port
from tests.conftest import STANDIN, write_inventory


PLAYBOOK = f"""\
name: fleet-extract
vars: {{n: 2}}
extract:
  command: ["{{python}}", "{STANDIN}", "--output-dir", "{{output_dir}}", "--max-samples", "{{vars.n}}",
            "--batch-size", "2"]
  output_dir: "{{vars.out}}"
  expected_samples: "{{vars.n}}"
  gpus: 0
  stop_grace_seconds: 1
"""


@pytest.fixture
def fleet(sshd, tmp_path):
    pb = tmp_path / "fleet.yaml"
    pb.write_text(PLAYBOOK)
    hosts = {}
    for name, n in (("node-a", 3), ("node-b", 5)):
        state = tmp_path / f"state-{name}"
        hosts[name] = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                                      env={"REMOTE_OPS_STATE_DIR": str(state)},
                                      vars={"n": n, "out": str(tmp_path / f"out-{name}")},
                                      playbook=str(pb))
    hosts["node-dead"] = sshd.host_entry(port=free_port(), playbook=str(pb),
                                         vars={"n": 1, "out": str(tmp_path / "out-dead")})
    inv = write_inventory(tmp_path / "inv.yaml", hosts,
                          groups={"live": ["node-a", "node-b"], "all3": ["node-a", "node-dead", "node-b"]})
    return inv


def _wait_all_done(cli, inv, group, timeout=90):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, out, err = cli("status", group, "--json", "-i", str(inv))
        doc = json.loads(out)
        states = [h["result"]["job"]["state"] for h in doc["hosts"] if h["ok"]]
        if states and all(s in ("succeeded", "failed", "stopped", "lost") for s in states):
            return doc
        time.sleep(0.5)
    raise AssertionError(f"jobs did not finish: {out}")


def test_group_extract_status_verify_logs_stop(fleet, cli):
    inv = fleet
    status, out, err = cli("extract", "all3", "--skip-check", "--json", "-i", str(inv))
    doc = json.loads(out)
    assert status == 3, err                       # the dead host's status: unreachable
    assert doc["failed"] == ["node-dead"]
    by_host = {h["host"]: h for h in doc["hosts"]}
    assert by_host["node-a"]["ok"] and by_host["node-b"]["ok"]
    assert "node-dead: " in err and "connection refused" in err

    doc = _wait_all_done(cli, inv, "live")
    jobs = {h["host"]: h["result"]["job"] for h in doc["hosts"]}
    assert {h: j["state"] for h, j in jobs.items()} == {"node-a": "succeeded", "node-b": "succeeded"}

    # per-host vars reached the playbook: each host made its own number of samples in its own dir
    status, out, err = cli("verify", "live", "--json", "-i", str(inv))
    assert status == 0, err
    counts = {h["host"]: (h["result"]["files"], h["result"]["output_dir"]) for h in json.loads(out)["hosts"]}
    assert counts["node-a"][0] == 3 and counts["node-a"][1].endswith("out-node-a")
    assert counts["node-b"][0] == 5 and counts["node-b"][1].endswith("out-node-b")

    status, out, err = cli("logs", "live", "-i", str(inv))
    assert status == 0 and "node-a:" in out and "node-b:" in out and "wrote 3 sample(s)" in out

    # people get a per-host table; the dead host is a FAILED row and the exit status says so
    status, out, err = cli("status", "all3", "-i", str(inv))
    assert status == 3
    assert "FAILED" in out and "node-dead" in out and "succeeded" in out

    status, out, err = cli("stop", "live", "--json", "-i", str(inv))
    assert status == 0, err
    assert all(h["result"]["clean"] for h in json.loads(out)["hosts"])


def test_group_tail_is_refused_with_a_hint(fleet, cli):
    status, out, err = cli("extract", "live", "--tail", "-i", str(fleet))
    assert status == 2 and "--tail follows one host" in err and "status live" in err
    status, out, err = cli("logs", "live", "--follow", "-i", str(fleet))
    assert status == 2 and "--follow follows one host" in err
