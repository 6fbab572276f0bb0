"""Bad input is refused before anything happens, over the real sshd: an empty
``gather --to`` (CLI and API), a job command whose --layer-ids repeat a layer; and the line of a gather
whose hosts are all unreachable names each host once."""

from __future__ import annotations

import json
import os
import socket
import sys

import pytest
import yaml

from remote_ops import api
from remote_ops.errors import Exit, UsageError
from tests.conftest import write_inventory
from tests.extract.test_jobs import Env

pytestmark = pytest.mark.timeout(120)


def test_gather_with_an_empty_to_is_refused_in_the_cli_and_the_api(tmp_path, sshd, cli, monkeypatch):
    env = Env(tmp_path, sshd)
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    status, out, err = cli(*env.argv("gather", "testhost", "--to", ""))
    assert status == Exit.USAGE and "gather --to is empty" in err, err
    with api.open_inventory(str(env.inventory)) as inv:
        with pytest.raises(UsageError, match="--to is empty"):
            inv.gather("testhost", to="  ")
    assert os.listdir(work) == []
    assert not (env.state / "jobs").exists()


def test_repeated_layer_ids_in_the_job_command_are_refused_before_the_host_is_touched(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, ["--layer-ids", "1,1,2,3"])
    status, out, err = cli(*env.argv("extract", "testhost"))
    assert status == Exit.USAGE, err
    assert "testhost: extract.command --layer-ids: layer ids [1, 1, 2, 3] repeat 1" in err, err
    assert "list each layer id once" in err
    assert env.jobdirs() == [] and not env.out.exists()


def test_a_model_sections_repeated_layer_ids_are_refused():
    from remote_ops.playbook.model_section import parse_layer_ids
    assert parse_layer_ids("2,4,5,7", "pb") == [2, 4, 5, 7]
    with pytest.raises(UsageError, match="repeat 4, 5"):
        parse_layer_ids("4,5,4,5,7", "pb")


def test_gather_of_an_all_unreachable_group_names_each_host_once(tmp_path, sshd, cli):
    ports = []
    for _ in range(2):                   # loopback ports nothing listens on
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    hosts = {n: sshd.host_entry(sys.executable, port=p, connect_timeout=3) for n, p in zip(("a", "b"), ports)}
    inv = write_inventory(tmp_path / "inv.yaml", hosts, groups={"pair": ["a", "b"]})
    status, out, err = cli("gather", "pair", "--to", str(tmp_path / "to"), "--output-dir", "/nonexistent",
                           "-i", str(inv), "--json")
    assert status != 0
    problems = json.loads(out)["group"]["problems"]
    assert [p.split(":")[0] for p in problems[:2]] == ["a", "b"], problems
    assert not any(p.startswith(("a: a:", "b: b:")) for p in problems), problems
