"""Fleets: a group of real sshd hosts worked on in parallel; dead hosts never block or hide the others.

Hosts: three OpenSSH sshd instances on 127.0.0.1, 127.0.0.2, 127.0.0.3 (distinct ports on 127.0.0.1
where those addresses do not bind), each with its own venv holding the real speculators 0.3.0 and
vLLM 0.17.0 sources; plus two dead hosts: a port with nothing listening, and a port that accepts
TCP but never speaks SSH.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.sshd import SshdServer, free_port
from tests.conftest import LIVE_CONNECT_TIMEOUT, REPO, SPECULATORS, STANDIN, VLLM_NEW, write_inventory

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
LIVE = ("gpu1", "gpu2", "gpu3")


def _address(i: int) -> str:
    a = f"127.0.0.{i}"
    try:
        with socket.socket() as s:
            s.bind((a, 0))
        return a
    except OSError:
        return "127.0.0.1"


class Mute:
    """Accepts TCP connections and never answers (a hung host, a wrong port behind a firewall)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def close(self):
        self.stopped = True
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    servers, mute = [], Mute()
    hosts = {}
    try:
        for i, name in enumerate(LIVE, start=1):
            server = SshdServer(root / name / "sshd", address=_address(i)).start()
            servers.append(server)
            py = pkgsource.make_env(root / name / "venv", [SPECULATORS, VLLM_NEW])
            state = root / name / "state"
            state.mkdir()
            hosts[name] = {"hostname": server.address, "port": server.port, "user": server.user,
                           "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
                           "connect_timeout": LIVE_CONNECT_TIMEOUT,
                           "python": str(py), "workdir": str(root / name), "playbook": str(PLAYBOOK),
                           "env": {"REMOTE_OPS_STATE_DIR": str(state)},
                           "vars": {"output_dir": str(root / name / "out")}}
        base = dict(hosts["gpu1"])
        hosts["dead"] = dict(base, hostname="127.0.0.1", port=free_port(), connect_timeout=3)
        hosts["mute"] = dict(base, hostname="127.0.0.1", port=mute.port, connect_timeout=2)
        inv = write_inventory(root / "inventory.yaml", hosts,
                              {"gpus": list(LIVE), "mixed": ["gpu1", "dead", "gpu2", "mute", "gpu3"]})
        yield {"inventory": str(inv), "root": root, "servers": servers}
    finally:
        mute.close()
        for s in servers:
            s.stop()


def _json(out: str) -> dict:
    return json.loads(out)


def _site(fleet, name) -> Path:
    return pkgsource.site_packages(fleet["root"] / name / "venv" / "bin" / "python")


def test_addresses_distinct_hosts(fleet):
    """The live hosts really are separate sshd processes (distinct address or port)."""
    addrs = {(s.address, s.port) for s in fleet["servers"]}
    assert len(addrs) == len(LIVE)


def test_facts_on_group_in_parallel(fleet, cli):
    status, out, err = cli("-i", fleet["inventory"], "facts", "gpus", "--json")
    assert status == 0, err
    data = _json(out)
    assert [h["host"] for h in data["hosts"]] == list(LIVE)
    for h in data["hosts"]:
        assert h["ok"] is True
        assert h["result"]["packages"]["speculators"]["version"] == "0.3.0"


def test_comma_list_and_parallel_one(fleet, cli):
    status, out, err = cli("-i", fleet["inventory"], "--parallel", "1", "facts", "gpu3,gpu1", "--json")
    assert status == 0, err
    assert [h["host"] for h in _json(out)["hosts"]] == ["gpu3", "gpu1"]


def test_dead_hosts_do_not_block_or_hide_others(fleet, cli):
    t0 = time.monotonic()
    status, out, err = cli("-i", fleet["inventory"], "facts", "mixed", "--json")
    elapsed = time.monotonic() - t0
    data = _json(out)
    by = {h["host"]: h for h in data["hosts"]}
    assert [h["host"] for h in data["hosts"]] == ["gpu1", "dead", "gpu2", "mute", "gpu3"]
    for name in LIVE:
        assert by[name]["ok"] is True
    assert by["dead"]["ok"] is False and by["dead"]["error"]["exit_status"] == 3      # UNREACHABLE
    assert by["mute"]["ok"] is False and by["mute"]["error"]["exit_status"] == 5      # TIMEOUT
    assert status != 0
    # in parallel: the mute host's 2 s timeout is not added to the others' time one after another
    assert elapsed < 15


def test_dead_hosts_parallel_one_still_completes(fleet, cli):
    status, out, err = cli("-i", fleet["inventory"], "--parallel", "1", "facts", "mixed", "--json")
    by = {h["host"]: h for h in _json(out)["hosts"]}
    assert {n for n, h in by.items() if h["ok"]} == set(LIVE)
    assert status in (3, 5)


@pytest.mark.parametrize("command", [("facts",), ("check",), ("patch", "--dry-run")])
def test_human_output_names_failed_hosts(fleet, cli, command):
    status, out, err = cli("-i", fleet["inventory"], command[0], "mixed", *command[1:])
    assert status != 0
    for name in LIVE:
        assert name in out
    assert any(line.startswith("remote-ops: mute:") for line in err.splitlines()), err
    for line in err.splitlines():
        if line.startswith("remote-ops: dead:"):
            assert "connection refused" in line
            break
    else:
        pytest.fail(f"no line for the dead host in: {err}")


def test_check_on_group(fleet, cli):
    status, out, err = cli("-i", fleet["inventory"], "check", "gpus", "--json")
    data = _json(out)
    assert len(data["hosts"]) == len(LIVE)
    assert status == 1, err   # 1: findings (speculators 0.3.0 vs vLLM 0.17)
    for h in data["hosts"]:
        assert h["ok"]
        assert {(f["kind"], f["name"]) for f in h["result"]["findings"]} == {
            ("unexpected-keyword", "eos_token_id"), ("unexpected-keyword", "kv_cache_specs"),
            ("missing-argument", "block_size"), ("missing-argument", "is_encoder_decoder")}, h["host"]
    assert data["failed"] == []


def test_check_mixed_group_reports_failures_and_findings(fleet, cli):
    status, out, err = cli("-i", fleet["inventory"], "check", "mixed", "--json")
    data = _json(out)
    assert len(data["hosts"]) == 5
    assert status not in (0, 1)
    failed = [h["error"]["host"] for h in data["hosts"] if "error" in h]
    assert failed == ["dead", "mute"] == data["failed"]


def test_patch_group_then_noop_then_status(fleet, cli):
    inv = fleet["inventory"]
    status, out, err = cli("-i", inv, "patch", "gpus", "--yes", "--json")
    assert status == 0, err
    data = _json(out)
    assert [h["host"] for h in data["hosts"]] == list(LIVE)
    for h in data["hosts"]:
        assert h["ok"] and h["result"]["changed"] is True
        assert h["result"]["round_trips"] <= 3
    # every host's file really changed, independently
    for name in LIVE:
        text = (_site(fleet, name) / "speculators/data_generation/vllm_hidden_states_generator.py").read_text()
        assert "sample_tokens" in text
    # the rerun changes nothing and costs no more round trips
    status, out, err = cli("-i", inv, "patch", "gpus", "--yes", "--json")
    assert status == 0, err
    for h in _json(out)["hosts"]:
        assert h["ok"] and h["result"]["changed"] is False
        assert h["result"]["round_trips"] <= 1
    # history per host
    status, out, err = cli("-i", inv, "history", "gpus", "--json")
    assert status == 0, err
    # rollback across the group restores the pristine bytes
    status, out, err = cli("-i", inv, "rollback", "gpus", "--json")
    assert status == 0, err
    pristine = (pkgsource.unpacked(*SPECULATORS) / "speculators/data_generation/vllm_hidden_states_generator.py")
    for name in LIVE:
        now = _site(fleet, name) / "speculators/data_generation/vllm_hidden_states_generator.py"
        assert now.read_bytes() == pristine.read_bytes()


def test_patch_mixed_group_patches_live_hosts(fleet, cli):
    inv = fleet["inventory"]
    status, out, err = cli("-i", inv, "patch", "mixed", "--yes", "--json")
    data = _json(out)
    by = {h["host"]: h for h in data["hosts"]}
    assert {n for n, h in by.items() if h["ok"]} == set(LIVE)
    assert by["dead"]["error"]["host"] == "dead" and by["mute"]["error"]["host"] == "mute"
    assert status != 0
    status, out, err = cli("-i", inv, "rollback", "gpus", "--json")
    assert status == 0, err


def test_api_fleet(fleet):
    import remote_ops.api as ro

    with ro.open_inventory(fleet["inventory"], parallel=2) as inv:
        assert inv.hosts("gpus") == list(LIVE)
        res = inv.facts("mixed")
        assert [r.host for r in res] == ["gpu1", "dead", "gpu2", "mute", "gpu3"]
        assert res.failed_hosts == ["dead", "mute"]
        assert res.exit_status == 3
        assert res["gpu2"].value["packages"]["vllm"]["version"] == "0.17.0"
        assert set(res.to_json()["hosts"][0]) >= {"host", "ok", "result"}
        checked = inv.check("gpus")
        assert checked.ok and all("findings" in r.value for r in checked)
        dry = inv.patch("gpus", dry_run=True)
        assert dry.ok and all(r.value["diff"] and not r.value["changed"] for r in dry)


def test_extract_status_stop_on_group_with_per_host_vars(fleet, cli, tmp_path):
    """extract/status/stop take a GROUP; each host's inventory vars fill the playbook's templates."""
    import yaml

    py = pkgsource.make_env(tmp_path / "venv", [SPECULATORS, VLLM_NEW], with_torch=True)
    pb = yaml.safe_load(PLAYBOOK.read_text())
    pb["extract"] = {"command": ["{python}", "{vars.script}", "--output-dir", "{output_dir}",
                                 "--max-samples", "{vars.samples}", "--sleep", "{vars.sleep}"],
                     "output_dir": "{vars.out}", "gpus": {"count": 0, "free": False}}
    pb_path = tmp_path / "pb.yaml"
    pb_path.write_text(yaml.safe_dump(pb, sort_keys=False))
    hosts = {}
    for server, (name, samples, sleep) in zip(fleet["servers"], (("x1", 4, 0), ("x2", 8, 0), ("x3", 400, 3))):
        state = tmp_path / f"state-{name}"
        state.mkdir()
        hosts[name] = {"hostname": server.address, "port": server.port, "user": server.user,
                       "identity_file": str(server.identity_file), "known_hosts": str(server.known_hosts),
                       "connect_timeout": LIVE_CONNECT_TIMEOUT,
                       "python": str(py), "workdir": str(tmp_path), "playbook": str(pb_path),
                       "env": {"REMOTE_OPS_STATE_DIR": str(state)},
                       "vars": {"script": str(STANDIN), "samples": samples, "sleep": sleep, "target_model": "tiny-standin",
                                "out": str(tmp_path / f"out-{name}")}}
    inv = str(write_inventory(tmp_path / "inventory.yaml", hosts, {"jobs": ["x1", "x2", "x3"]}))
    status, out, err = cli("-i", inv, "patch", "x1", "--yes", "--json")   # one venv behind all three
    assert status == 0, err
    status, out, err = cli("-i", inv, "extract", "jobs", "--json")
    assert status == 0, err
    started = {h["host"]: h["result"] for h in json.loads(out)["hosts"]}
    for name in hosts:
        assert str(tmp_path / f"out-{name}") in started[name]["job"]["command"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, out, err = cli("-i", inv, "status", "jobs", "--json")
        states = {h["host"]: h["result"]["job"]["state"] for h in json.loads(out)["hosts"]}
        if states["x1"] == states["x2"] == "succeeded" and states["x3"] == "running":
            break
        time.sleep(0.5)
    assert states == {"x1": "succeeded", "x2": "succeeded", "x3": "running"}
    assert len(list((tmp_path / "out-x1").glob("data_*.pt"))) == 4
    assert len(list((tmp_path / "out-x2").glob("data_*.pt"))) == 8
    status, out, err = cli("-i", inv, "stop", "jobs", "--grace", "5", "--json")
    assert status == 0, err
    status, out, err = cli("-i", inv, "status", "x3", "--json")
    assert json.loads(out)["job"]["state"] == "stopped"
