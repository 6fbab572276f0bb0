"""A ProxyJump chain over the real test sshd: a failure is blamed on the hop that failed (the jump
host or the target), with that hop's own host:port and the fix for that hop."""

from __future__ import annotations

import json
import shutil

from remote_ops.errors import Exit
from remote_ops.sshd import free_port
from tests.conftest import REPO, write_inventory

NO_SSH_CONFIG = {"REMOTE_OPS_SSH_CONFIG": "/nonexistent/ssh_config"}


def _facts(cli, inv, host="target"):
    return cli("facts", host, "-i", str(inv), env=NO_SSH_CONFIG)


def test_an_unresolvable_jump_host_is_named_not_the_target(sshd, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {
        "target": sshd.host_entry(proxy_jump="nosuchbastion.invalid")})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert "cannot resolve jump host name 'nosuchbastion.invalid'" in err
    assert "check proxy_jump" in err
    assert "127.0.0.1" not in err          # the target was never tried: it is not blamed


def test_a_refused_jump_port_is_the_jump_hosts_port(sshd, tmp_path, cli):
    dead = free_port()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "target": sshd.host_entry(proxy_jump=f"{sshd.user}@127.0.0.1:{dead}")})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert f"cannot reach jump host {sshd.user}@127.0.0.1:{dead}: connection refused" in err
    assert "sshd running on the jump host" in err and "proxy_jump" in err
    assert f":{sshd.port}" not in err


def test_an_inventory_jump_host_is_named_by_its_inventory_name(sshd, tmp_path, cli):
    dead = free_port()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "bastion": sshd.host_entry(port=dead),
        "target": sshd.host_entry(proxy_jump="bastion")})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert f"cannot reach jump host bastion ({sshd.user}@127.0.0.1:{dead}): connection refused" in err


def test_the_bastion_works_and_the_target_port_is_closed(sshd, tmp_path, cli):
    """The bastion (the suite's sshd, as its own bastion) connects; the target behind it does not
    listen: one line naming the jump host and the target's host:port, no ChannelException."""
    dead = free_port()
    inv = write_inventory(tmp_path / "inv.yaml", {
        "bastion": sshd.host_entry(),
        "target": sshd.host_entry(port=dead, proxy_jump="bastion")})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert f"jump host bastion cannot connect to 127.0.0.1:{dead} (Connect failed)" in err
    assert "ChannelException" not in err and "check hostname for this host in the inventory" in err
    assert len(err.strip().splitlines()) == 1
    # --json carries the same message
    status, out, _ = cli("facts", "target", "-i", str(inv), "--json", env=NO_SSH_CONFIG)
    assert status == Exit.UNREACHABLE
    assert "jump host bastion cannot connect" in json.dumps(json.loads(out))


def test_a_target_name_the_bastion_cannot_resolve(sshd, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {
        "bastion": sshd.host_entry(),
        "target": sshd.host_entry(hostname="nosuchtarget.invalid", proxy_jump="bastion")})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert f"jump host bastion cannot connect to nosuchtarget.invalid:{sshd.port}" in err
    assert "resolves and connects to nosuchtarget.invalid itself" in err


def test_the_second_hop_of_a_chain_is_named(sshd, tmp_path, cli):
    """Two hops: the first works, the second's port is closed: the second hop is named, with its port."""
    dead = free_port()
    first, second = f"{sshd.user}@127.0.0.1:{sshd.port}", f"{sshd.user}@127.0.0.1:{dead}"
    inv = write_inventory(tmp_path / "inv.yaml", {"target": sshd.host_entry(proxy_jump=[first, second])})
    status, out, err = _facts(cli, inv)
    assert status == Exit.UNREACHABLE, err
    assert f"jump host {first} cannot connect to 127.0.0.1:{dead}" in err


def test_the_shipped_gpu_host_example_blames_its_bastion(tmp_path, cli):
    """The committed inventory.yaml, as a new user runs it before editing: the bastion is what
    cannot be resolved (gpu01 is resolved on the bastion, so it is never blamed)."""
    inv = tmp_path / "inventory.yaml"
    shutil.copy(REPO / "inventory.yaml", inv)
    status, out, err = cli("facts", "gpu-host", "-i", str(inv), env=NO_SSH_CONFIG)
    assert status == Exit.UNREACHABLE, err
    assert "jump host name 'bastion.example.internal'" in err and "proxy_jump" in err
    assert "gpu01" not in err


def test_an_adhoc_target_is_not_told_to_check_the_inventory(cli):
    status, out, err = cli("facts", "ml@nosuchhost.invalid:2222", env=NO_SSH_CONFIG)
    assert status == Exit.UNREACHABLE, err
    assert "cannot resolve host name 'nosuchhost.invalid'" in err
    assert "host name given on the command line" in err and "inventory" not in err
