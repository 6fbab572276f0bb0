"""One playbook load per command: api.Inventory finds and loads each playbook file once
(api.Playbooks) and passes the loaded object down; the per-host functions never load it again.
Counted with the real loader wrapped, over a real sshd host."""

from __future__ import annotations

import sys

import pytest
import yaml

from remote_ops.playbook import loader as pbmod
from tests.conftest import REPO, write_inventory
from tests.extract.test_jobs import Env, _no_job_left_behind  # noqa: F401  (its autouse fixture applies here)

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def loads(monkeypatch):
    """The paths playbook.load was called with, since the last ``clear()``."""
    seen: list[str] = []
    real = pbmod.load

    def counting(path):
        seen.append(str(path))
        return real(path)
    monkeypatch.setattr(pbmod, "load", counting)
    return seen


def test_job_commands_load_the_playbook_once(tmp_path, sshd, cli, loads):
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "1"])
    for argv, want in ((("extract", "testhost", "--json"), 0), (("status", "testhost", "--json"), 0),
                       (("logs", "testhost", "-n", "5"), 0), (("stop", "testhost", "--json"), 0),
                       (("verify", "testhost", "--json"), None)):   # verify: whatever the stopped job wrote
        loads.clear()
        status, out, err = cli(*env.argv(*argv))
        if want is not None:
            assert status == want, (argv, err)
        assert out.strip(), argv
        assert loads == [str(env.playbook)], (argv, loads)


def test_stop_reads_the_grace_from_the_one_load(tmp_path, sshd, cli, loads):
    """stop used to load the playbook twice (the job's key, then its stop_grace_seconds); the grace
    still comes from the playbook (2 s here, the default is 30)."""
    env = Env(tmp_path, sshd, ["--max-samples", "200", "--sleep", "1"], {"stop_grace_seconds": 2})
    assert cli(*env.argv("extract", "testhost"))[0] == 0
    env.wait_log("Generating hidden states")
    loads.clear()
    status, out, err = cli(*env.argv("stop", "testhost"))
    assert status == 0, err
    assert "SIGKILL after 2s" in err
    assert loads == [str(env.playbook)]


def test_host_playbook_of_a_group_is_loaded_once(tmp_path, sshd, cli, loads):
    """Two hosts naming the same playbook file in the inventory: one load for the whole group."""
    state = tmp_path / "state"
    state.mkdir()
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "standin", "extract": {
        "command": ["{python}", "-c", "pass"], "workdir": str(tmp_path), "output_dir": str(tmp_path / "out")}}))
    entry = sshd.host_entry(sys.executable, playbook=str(pb), env={"REMOTE_OPS_STATE_DIR": str(state)})
    inv = write_inventory(tmp_path / "inventory.yaml", {"a": dict(entry), "b": dict(entry)})
    status, out, err = cli("-i", str(inv), "status", "a,b", "--json")
    assert [h["host"] for h in yaml.safe_load(out)["hosts"]] == ["a", "b"], out
    assert loads == [str(pb)], loads


def test_check_and_patch_load_the_playbook_once(tmp_path, sshd, cli, env_vllm017, loads):
    host_pb = write_inventory(tmp_path / "own.yaml", {"one": sshd.host_entry(str(env_vllm017),
                                                                            playbook=str(SHIPPED))})
    plain = write_inventory(tmp_path / "plain.yaml", {"one": sshd.host_entry(str(env_vllm017))})
    for argv in (("-i", str(plain), "check", "one", "--playbook", str(SHIPPED), "--no-drift"),
                 ("-i", str(host_pb), "check", "one", "--no-drift"),
                 ("-i", str(plain), "patch", "one", "--playbook", str(SHIPPED), "--dry-run"),
                 ("-i", str(host_pb), "patch", "one", "--dry-run")):
        loads.clear()
        status, out, err = cli(*argv, "--json")
        assert status in (0, 1), (argv, err)        # check exits 1 on findings (vLLM 0.17.0 has them)
        assert out.strip(), argv
        assert [p.rsplit("/", 1)[-1] for p in loads] == [SHIPPED.name], (argv, loads)
