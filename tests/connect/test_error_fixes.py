"""Every fix a connection error prints works as printed, over the real sshd on a port
other than 22: the changed-host-key line names host:port and its ssh-keygen command removes the
stored ``[host]:port`` entry; a bad identity_file is named with the file and why (missing,
unreadable, passphrase-protected, a public key, not a key), never "cannot reach the host"."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest

from remote_ops.errors import Exit
from tests.conftest import write_inventory


def _keygen(path, passphrase=""):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)], check=True)


def test_changed_host_key_fix_works_as_printed_on_a_non_22_port(sshd, tmp_path, cli):
    assert sshd.port != 22
    other = tmp_path / "other"
    _keygen(other)
    kt, b64 = other.with_suffix(".pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kt} {b64}\n")
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(known_hosts=str(kh))})
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.HOSTKEY, err
    assert f"HOST KEY CHANGED for 127.0.0.1:{sshd.port}:" in err
    printed = re.search(r"remove the old entry with (ssh-keygen .+?) and reconnect with --accept-new", err)
    assert printed, err
    assert printed.group(1) == f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {kh}"
    # the printed command, through a shell, as a user pastes it
    p = subprocess.run(printed.group(1), shell=True, capture_output=True, text=True)
    assert p.returncode == 0 and "not found" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert f"[127.0.0.1]:{sshd.port}" not in kh.read_text()
    # then the original command, accepting the host's real key as the hint says, succeeds
    status, out, err = cli("facts", "h", "-i", str(inv), "--accept-new")
    assert status == 0, err
    assert cli("facts", "h", "-i", str(inv))[0] == 0


def test_unknown_host_key_names_host_and_port(sshd, tmp_path, cli):
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(known_hosts=str(tmp_path / "kh"))})
    status, out, err = cli("facts", "h", "-i", str(inv))
    assert status == Exit.HOSTKEY and f"unknown host key for 127.0.0.1:{sshd.port} (" in err, err


def _facts(cli, sshd, tmp_path, key, **env):
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(identity_file=str(key))})
    return cli("facts", "h", "-i", str(inv), env={"SSH_AUTH_SOCK": "", **env})


def test_missing_identity_file_is_named_not_unreachable(sshd, tmp_path, cli):
    key = tmp_path / "no-such-key"
    status, out, err = _facts(cli, sshd, tmp_path, key)
    assert status == Exit.AUTH, err
    assert err.strip() == (f"remote-ops: h: cannot use identity_file {key}: no such file (fix identity_file "
                           "for this host in the inventory (or IdentityFile in ~/.ssh/config))")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_identity_file(sshd, tmp_path, cli):
    key = tmp_path / "key"
    shutil.copy(sshd.identity_file, key)
    key.chmod(0)
    status, out, err = _facts(cli, sshd, tmp_path, key)
    assert status == Exit.AUTH and f"cannot use identity_file {key}: cannot be read" in err, err


@pytest.mark.parametrize("kind", ["public", "garbage", "directory"])
def test_wrong_type_identity_file(sshd, tmp_path, cli, kind):
    key = tmp_path / "key"
    if kind == "directory":
        key.mkdir()
        why = "it is a directory, not a key file"
    elif kind == "public":
        shutil.copy(str(sshd.identity_file) + ".pub", key)
        why = "it is a public key; name the private key (the file without .pub)"
    else:
        key.write_text("hello\n")
        why = "it is not a private key file"
    status, out, err = _facts(cli, sshd, tmp_path, key)
    assert status == Exit.AUTH, err
    assert f"cannot use identity_file {key}: {why}" in err


def test_passphrase_protected_identity_file_and_its_printed_fix(sshd, tmp_path, cli):
    if not shutil.which("ssh-agent") or not shutil.which("ssh-add"):
        pytest.skip("ssh-agent is not installed")
    key = tmp_path / "key"
    shutil.copy(sshd.identity_file, key)
    key.chmod(0o600)
    subprocess.run(["ssh-keygen", "-q", "-p", "-P", "", "-N", "s3cret", "-f", str(key)], check=True)
    status, out, err = _facts(cli, sshd, tmp_path, key)
    assert status == Exit.AUTH, err
    assert f"cannot use identity_file {key}: it is protected by a passphrase" in err
    printed = re.search(r"\(load it into ssh-agent \((ssh-add .+?)\) and rerun", err)
    assert printed and printed.group(1) == f"ssh-add {key}", err
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho s3cret\n")
        askpass.chmod(0o700)
        env = dict(os.environ, SSH_AUTH_SOCK=str(sock), SSH_ASKPASS=str(askpass), SSH_ASKPASS_REQUIRE="force")
        p = subprocess.run(printed.group(1), shell=True, env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        status, out, err = _facts(cli, sshd, tmp_path, key, SSH_AUTH_SOCK=str(sock))
        assert status == 0, err
    finally:
        agent.terminate()
        agent.wait()


def test_refused_key_is_named(sshd, tmp_path, cli):
    key = tmp_path / "stranger"
    _keygen(key)
    status, out, err = _facts(cli, sshd, tmp_path, key)
    assert status == Exit.AUTH, err
    assert f"authentication refused by {sshd.user}@127.0.0.1:{sshd.port} with identity_file {key} (" in err, err
    assert f".ssh/authorized_keys on the host" in err
