"""--json results are the same whichever way a host was named or reached.

1. facts and check over every way of naming one machine: an inventory host, ``user@host:port``, an
   ~/.ssh/config alias, an Ansible YAML host, an Ansible INI host (all over the real sshd), and
   ``localhost``, ``connection: local``, ``ansible_connection: local`` (a subprocess): the same
   values, apart from the host's own name and what moves between two calls (free disk, memory).
2. every command (facts, check, patch, history, rollback, extract, status, logs, stop, verify, with
   the torch stand-in job) over the ad-hoc ``localhost`` and over an inventory host on the real
   sshd: the same JSON shape (keys and value types, recursively).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import yaml

from remote_ops.errors import Exit
from tests.conftest import REPO, standin_extract, write_inventory, write_playbook

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"

pytestmark = pytest.mark.timeout(300)


def shape(x):
    """Keys and value types, recursively (a list: the shape of its first item)."""
    if isinstance(x, dict):
        return {k: shape(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [shape(x[0])] if x else []
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, (int, float)):
        return "number"
    return type(x).__name__


def _no_timings(x):
    """Without measured durations (``timing``, ``*_s`` like ``elapsed_s``): they differ between calls."""
    if isinstance(x, dict):
        return {k: _no_timings(v) for k, v in x.items() if k != "timing" and not k.endswith("_s")}
    if isinstance(x, list):
        return [_no_timings(v) for v in x]
    return x


def _volatile_free(facts: dict) -> dict:
    return {k: v for k, v in facts.items() if k not in ("host", "disk", "memory", "load")}


def test_facts_and_check_same_for_every_way_of_naming_a_host(sshd, env_vllm017, tmp_path, monkeypatch, cli):
    py = str(env_vllm017)
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host gpu-alias\n    HostName 127.0.0.1\n    Port {sshd.port}\n"
                   f"Host *\n    User {sshd.user}\n    IdentityFile {sshd.identity_file}\n"
                   f"    UserKnownHostsFile {sshd.known_hosts}\n")
    monkeypatch.setenv("REMOTE_OPS_SSH_CONFIG", str(cfg))
    ours = write_inventory(tmp_path / "inv.yaml", {"named": sshd.host_entry(py),
                                                    "here": {"connection": "local", "python": py}})
    ansible_vars = {"ansible_host": "127.0.0.1", "ansible_port": sshd.port, "ansible_user": sshd.user,
                    "ansible_ssh_private_key_file": str(sshd.identity_file), "ansible_python_interpreter": py,
                    "ansible_ssh_common_args": f"-o UserKnownHostsFile={sshd.known_hosts}"}
    ayml = tmp_path / "hosts.yml"
    ayml.write_text(yaml.safe_dump({"all": {"children": {"gpus": {"hosts": {
        "ansible-yaml": ansible_vars,
        "ansible-local": {"ansible_connection": "local", "ansible_python_interpreter": py}}}}}}))
    aini = tmp_path / "hosts.ini"
    aini.write_text("[gpus]\nansible-ini " + " ".join(f"{k}='{v}'" for k, v in ansible_vars.items()) + "\n")
    ways = [
        ("named", ["-i", str(ours)]),
        (f"{sshd.user}@127.0.0.1:{sshd.port}", ["--python", py]),
        ("gpu-alias", ["--python", py]),
        ("ansible-yaml", ["-i", str(ayml)]),
        ("ansible-ini", ["-i", str(aini)]),
        ("localhost", ["--python", py]),
        ("here", ["-i", str(ours)]),
        ("ansible-local", ["-i", str(ayml)]),
    ]
    facts, checks = {}, {}
    for name, extra in ways:
        status, out, err = cli("facts", name, "--json", *extra)
        assert status == 0, (name, err)
        facts[name] = json.loads(out)
        assert facts[name]["host"] == name
        status, out, err = cli("check", name, "--json", *extra)
        assert status == Exit.FINDINGS, (name, err)
        checks[name] = json.loads(out)
    first = ways[0][0]
    for name, _ in ways[1:]:
        assert _volatile_free(facts[name]) == _volatile_free(facts[first]), name
        assert shape(facts[name]) == shape(facts[first]), name
        a = _no_timings({k: v for k, v in checks[name].items() if k != "host"})
        b = _no_timings({k: v for k, v in checks[first].items() if k != "host"})
        assert shape(checks[name]) == shape(checks[first]), name
        assert a == b, name
    assert len(checks[first]["findings"]) >= 4


def _wait_state(cli, target, extra, states=("succeeded", "failed", "stopped", "lost"), timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, out, err = cli("status", target, "--json", *extra)
        assert status in (0, 1), err
        rec = json.loads(out)
        # a job that just ended records its cleanup a moment after its exit (supervisor.py writes
        # exit.json twice): wait for that too, so both transports' records have the same shape
        if rec["job"]["state"] in states and (rec["job"]["state"] == "running" or "cleanup" not in rec["job"]
                                              or rec["job"]["cleanup"] is not None):
            return status, rec
        time.sleep(0.2)
    raise AssertionError(f"{target}: job never reached {states}")


def _every_command(cli, target: str, extra: list[str], fresh_py: str, data: Path) -> dict:
    """Run every command on ``target``; returns command -> (exit status, JSON)."""
    short, long_ = data / "standin.yaml", data / "standin-long.yaml"
    for path, args in ((short, ["--max-samples", "6", "--sleep", "0.02"]),
                       (long_, ["--max-samples", "100000", "--sleep", "0.5"])):
        write_playbook(path, path.stem, standin_extract("--batch-size", "2", *args, workdir=data,
                                                        output_dir=data / f"out-{path.stem}", expected_samples=6))
    py = ["--python", sys.executable]
    runs: dict = {}

    def run(key, *args, expect=(0,)):
        status, out, err = cli(*args, "--json", *extra)
        assert status in expect, (key, target, status, err)
        runs[key] = (status, json.loads(out))
        return runs[key][1]

    run("facts", "facts", target, "--python", fresh_py)
    run("check", "check", target, "--python", fresh_py, expect=(Exit.FINDINGS,))
    patched = run("patch", "patch", target, "--python", fresh_py, "--playbook", str(SHIPPED), "--yes")
    assert patched["changed"]
    run("patch-again", "patch", target, "--python", fresh_py, "--playbook", str(SHIPPED), "--yes")
    run("history", "history", target, "--python", fresh_py)
    run("rollback", "rollback", target, "--python", fresh_py)
    # --watch 0: the record is the job at launch; with the early-death watch (up to 3 s) this short job
    # may have ended over one transport and not the other, and the two records would differ in state
    run("extract", "extract", target, *py, "--playbook", str(short), "--watch", "0")
    runs["status-done"] = _wait_state(cli, target, [*extra, *py, "--playbook", str(short)])
    assert runs["status-done"][1]["job"]["state"] == "succeeded"
    run("logs", "logs", target, *py, "--playbook", str(short), "-n", "5")
    run("verify", "verify", target, *py, "--playbook", str(short), "--all")
    assert runs["verify"][1]["ok"] and runs["verify"][1]["files"] == 6
    run("extract-long", "extract", target, *py, "--playbook", str(long_), "--watch", "0")
    _wait_state(cli, target, [*extra, *py, "--playbook", str(long_)], states=("running",))
    run("status-running", "status", target, *py, "--playbook", str(long_))
    run("stop", "stop", target, *py, "--playbook", str(long_))
    assert runs["stop"][1]["clean"]
    return runs


@pytest.mark.long
def test_every_command_same_json_over_localhost_and_sshd(sshd, fresh_env017, tmp_path, monkeypatch, cli):
    ssh_state, local_state = tmp_path / "state-ssh", tmp_path / "state-local"
    ssh_data, local_data = tmp_path / "ssh", tmp_path / "local"
    for d in (ssh_state, local_state, ssh_data, local_data):
        d.mkdir()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "viassh": sshd.host_entry(env={"REMOTE_OPS_STATE_DIR": str(ssh_state)})})
    over_ssh = _every_command(cli, "viassh", ["-i", str(inv)], str(fresh_env017), ssh_data)
    # localhost: the agent runs in a subprocess of the controller and inherits its environment
    monkeypatch.setenv("REMOTE_OPS_STATE_DIR", str(local_state))
    monkeypatch.setenv("REMOTE_OPS_INVENTORY", str(tmp_path / "none.yaml"))
    over_local = _every_command(cli, "localhost", [], str(fresh_env017), local_data)
    assert list(over_ssh) == list(over_local)
    for key in over_ssh:
        (s1, a), (s2, b) = over_ssh[key], over_local[key]
        assert s1 == s2, key
        assert shape(a) == shape(b), key
    assert (local_state / "journal").exists() and (ssh_state / "journal").exists()
