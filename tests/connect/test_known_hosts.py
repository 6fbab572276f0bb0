"""known_hosts as OpenSSH reads it, over the real sshd: @revoked keys refused, @cert-authority lines
parsed (and host certificates refused with the reason), patterns, hashed names, malformed lines."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from remote_ops.connect.hostkeys import host_matches, parse_known_hosts
from remote_ops.errors import Exit
from tests.conftest import write_inventory


def _keygen(path: Path) -> list[str]:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.with_suffix(".pub").read_text().split()[:2]


def _server_key(sshd) -> list[str]:
    return sshd.known_hosts.read_text().split()[1:3]


def _facts(cli, sshd, tmp_path, text: str, *extra: str):
    kh = tmp_path / "known_hosts"
    kh.write_text(text)
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(known_hosts=str(kh))})
    return kh, cli("facts", "h", "--json", "-i", str(inv), *extra)


@pytest.mark.parametrize("listed_too", [False, True], ids=["revoked-only", "revoked-and-listed"])
def test_revoked_server_key_is_refused_even_with_accept_new(sshd, tmp_path, cli, listed_too):
    kt, b64 = _server_key(sshd)
    plain = f"[127.0.0.1]:{sshd.port} {kt} {b64}\n" if listed_too else ""
    text = f"# site keys\n@revoked * {kt} {b64} old key\n" + plain
    for extra in ([], ["--accept-new"]):
        kh, (status, out, err) = _facts(cli, sshd, tmp_path, text, *extra)
        assert status == Exit.HOSTKEY, err
        assert len(err.strip().splitlines()) == 1, err
        assert f"REVOKED HOST KEY for 127.0.0.1:{sshd.port}" in err and f"{kh}:2 marks @revoked" in err
        assert "SHA256:" in err and "--accept-new" in err and "Traceback" not in err
        assert kh.read_text() == text     # nothing recorded


def test_revoked_server_key_with_another_key_of_its_type_listed_is_revoked_not_changed(sshd, tmp_path, cli):
    kt, b64 = _server_key(sshd)
    okt, ob64 = _keygen(tmp_path / "other")
    text = f"[127.0.0.1]:{sshd.port} {okt} {ob64}\n@revoked [127.0.0.1]:* {kt} {b64}\n"
    kh, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == Exit.HOSTKEY and "REVOKED HOST KEY" in err and f"{kh}:2" in err and "CHANGED" not in err


def test_revoked_line_for_another_key_plus_the_servers_line_works(sshd, tmp_path, cli):
    kt, b64 = _server_key(sshd)
    okt, ob64 = _keygen(tmp_path / "other")
    text = f"@revoked * {okt} {ob64}\n[127.0.0.1]:{sshd.port} {kt} {b64}\n"
    _, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == 0, err
    # the same revoked line for another host only: ours is untouched
    text = f"@revoked [127.0.0.1]:{sshd.port + 1} {kt} {b64}\n[127.0.0.1]:{sshd.port} {kt} {b64}\n"
    _, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == 0, err


def test_cert_authority_lines_do_not_break_other_hosts_lines(sshd, tmp_path, cli):
    kt, b64 = _server_key(sshd)
    ckt, cb64 = _keygen(tmp_path / "ca")
    text = (f"@cert-authority *.example.com,10.0.0.* {ckt} {cb64} site CA\n"
            f"[127.0.0.1]:{sshd.port} {kt} {b64}\n")
    _, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == 0, err
    # a CA line that covers this host too: the host's own line still works, as with OpenSSH
    _, (status, out, err) = _facts(cli, sshd, tmp_path, text.replace("10.0.0.*", "127.0.0.1*"))
    assert status == 0, err


def test_a_host_trusted_only_through_a_ca_is_refused_naming_the_limitation(sshd, tmp_path, cli):
    ckt, cb64 = _keygen(tmp_path / "ca")
    text = f"@cert-authority [127.0.0.1]:* {ckt} {cb64}\n"
    kh, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == Exit.HOSTKEY and len(err.strip().splitlines()) == 1, err
    assert f"@cert-authority, {kh}:1" in err and "cannot check host certificates" in err
    assert "ssh-keyscan" in err and "--accept-new" in err
    # --accept-new records the host's own key, as for any unknown key; then it works without
    kh, (status, out, err) = _facts(cli, sshd, tmp_path, text, "--accept-new")
    assert status == 0, err
    assert kh.read_text().splitlines()[1].startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ")
    inv = tmp_path / "inv.yaml"
    assert cli("facts", "h", "-i", str(inv))[0] == 0


def test_wildcard_and_negated_patterns(sshd, tmp_path, cli):
    kt, b64 = _server_key(sshd)
    _, (status, out, err) = _facts(cli, sshd, tmp_path, f"other,[127.0.0.?]:* {kt} {b64}\n")
    assert status == 0, err
    _, (status, out, err) = _facts(cli, sshd, tmp_path, f"*,![127.0.0.1]:{sshd.port} {kt} {b64}\n")
    assert status == Exit.HOSTKEY and "unknown host key" in err


def test_malformed_lines_are_skipped_not_fatal(sshd, tmp_path, cli):
    kt, b64 = _server_key(sshd)
    text = ("@revoked\n@unknown-marker * ssh-ed25519 AAAA\nbad ssh-rsa not*base64\nonly-two fields\n"
            f"x sk-ssh-ed25519@openssh.com AAAA\n[127.0.0.1]:{sshd.port} {kt} {b64}\n")
    _, (status, out, err) = _facts(cli, sshd, tmp_path, text)
    assert status == 0, err


def test_parse_keeps_markers_and_line_numbers():
    text = ("# c\n\n@revoked * ssh-ed25519 AAAA\n@cert-authority *.ex ssh-rsa AAAA c\n"
            "a,b ssh-ed25519 AAAA\n@bogus x ssh-ed25519 AAAA\n")
    got = [(ln.lineno, ln.marker, ln.patterns) for ln in parse_known_hosts(text).lines]
    assert got == [(3, "revoked", ("*",)), (4, "cert-authority", ("*.ex",)), (5, None, ("a", "b"))]


@pytest.mark.parametrize("name,patterns,want", [
    ("[h]:2222", ("[h]:2222",), True),
    ("[h]:2222", ("h",), False),
    ("Host.EXAMPLE.com", ("*.example.com",), True),
    ("a.example.com", ("*.example.com", "!a.example.com"), False),
    ("h1", ("h?",), True),
    ("h12", ("h?",), False),
    ("h", ("[h]",), False),                 # brackets are literal, not a character class
])
def test_host_patterns(name, patterns, want):
    assert host_matches(name, patterns) is want
