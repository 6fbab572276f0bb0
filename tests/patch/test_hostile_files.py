"""Hostile patch targets over the real sshd and the real ``patch`` command: non-UTF-8, CRLF, symlinks,
read-only, owned by another user; anchors missing, ambiguous or half-applied by hand.

Each gives a correct result or a clear one-line refusal, never a damaged file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from tests.conftest import write_inventory


def _setup(sshd, env_python, tmp_path, edits, name="mod.py"):
    wd = tmp_path / "wd"
    wd.mkdir(exist_ok=True)
    pb = tmp_path / "pb.yaml"
    pb.write_text(yaml.safe_dump({"name": "hostile", "patches": [{"path": name, "edits": edits}]}))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        str(env_python), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")})})
    return wd, pb, inv


TEXT_EDIT = [{"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = 2\n"}}]
CALL_EDIT = [{"id": "drop-b", "call": "f", "drop": ["b"]}]


def _patch(cli, inv, pb, *extra):
    return cli("patch", "h", "-i", str(inv), "--playbook", str(pb), "--yes", *extra)


def _one_line(err):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("remote-ops: "), err
    assert "Traceback" not in err and "internal error" not in err, err


def _no_leftovers(wd: Path):
    assert not [p.name for p in wd.iterdir() if "remote-ops" in p.name], "temporary file left"


def test_latin1_file_with_coding_cookie_is_patched_in_its_encoding(sshd, env_vllm017, tmp_path, cli):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT)
    src = "# -*- coding: latin-1 -*-\nNAME = 'caf\u00e9'\nX = 1\n".encode("latin-1")
    (wd / "mod.py").write_bytes(src)
    status, out, err = _patch(cli, inv, pb)
    assert status == 0, err
    assert (wd / "mod.py").read_bytes() == src.replace(b"X = 1", b"X = 2")
    _no_leftovers(wd)


def test_invalid_utf8_is_refused_and_untouched(sshd, env_vllm017, tmp_path, cli):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT)
    src = b"X = 1\nY = '\xff\xfe broken'\n"
    (wd / "mod.py").write_bytes(src)
    status, out, err = _patch(cli, inv, pb)
    assert status in (2, 8), err
    _one_line(err)
    assert "mod.py" in err and ("utf-8" in err.lower() or "decode" in err.lower() or "encoding" in err.lower()), err
    assert (wd / "mod.py").read_bytes() == src
    _no_leftovers(wd)


@pytest.mark.parametrize("edits", [TEXT_EDIT, CALL_EDIT], ids=["text", "call"])
def test_crlf_file_keeps_crlf(sshd, env_vllm017, tmp_path, cli, edits):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, edits)
    src = b"def f(a, b=0):\r\n    return a\r\n\r\nX = 1\r\nf(1, b=2)\r\n"
    (wd / "mod.py").write_bytes(src)
    status, out, err = _patch(cli, inv, pb)
    assert status == 0, err
    new = (wd / "mod.py").read_bytes()
    assert new == (src.replace(b"X = 1", b"X = 2") if edits is TEXT_EDIT else src.replace(b"f(1, b=2)", b"f(1)"))
    assert b"\n" not in new.replace(b"\r\n", b""), "a bare LF crept into a CRLF file"
    status, out, err = _patch(cli, inv, pb)           # idempotent
    assert status == 0 and (wd / "mod.py").read_bytes() == new


def test_symlink_patches_the_real_file_and_keeps_the_link(sshd, env_vllm017, tmp_path, cli):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT, name="link.py")
    (wd / "real").mkdir()
    real = wd / "real" / "mod.py"
    real.write_text("X = 1\n")
    (wd / "link.py").symlink_to("real/mod.py")
    status, out, err = _patch(cli, inv, pb)
    assert status == 0, err
    assert (wd / "link.py").is_symlink() and os.readlink(wd / "link.py") == "real/mod.py"
    assert real.read_text() == "X = 2\n"
    _no_leftovers(wd)
    _no_leftovers(wd / "real")


def test_symlink_pointing_outside_is_refused(sshd, env_vllm017, tmp_path, cli):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT, name="link.py")
    outside = tmp_path / "outside.py"
    outside.write_text("X = 1\n")
    (wd / "link.py").symlink_to(outside)
    status, out, err = _patch(cli, inv, pb)
    assert status in (2, 8), err
    _one_line(err)
    assert "outside" in err
    assert outside.read_text() == "X = 1\n"


@pytest.mark.parametrize("mode", [0o444, 0o400, 0o555])
def test_read_only_file_is_patched_keeping_its_mode_or_refused(sshd, env_vllm017, tmp_path, cli, mode):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT)
    (wd / "mod.py").write_text("X = 1\n")
    os.chmod(wd / "mod.py", mode)
    status, out, err = _patch(cli, inv, pb)
    text = (wd / "mod.py").read_text()
    if status == 0:
        assert text == "X = 2\n"
        assert stat.S_IMODE((wd / "mod.py").stat().st_mode) == mode, "mode not kept"
    else:
        _one_line(err)
        assert text == "X = 1\n"
    _no_leftovers(wd)


def test_file_owned_by_another_user_keeps_owner_or_is_refused(sshd, env_vllm017, tmp_path, cli):
    if os.geteuid() != 0:
        pytest.skip("needs root to chown the target to nobody")
    import pwd
    nobody = pwd.getpwnam("nobody")
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT)
    (wd / "mod.py").write_text("X = 1\n")
    os.chown(wd / "mod.py", nobody.pw_uid, nobody.pw_gid)
    os.chmod(wd / "mod.py", 0o640)
    status, out, err = _patch(cli, inv, pb)
    st = (wd / "mod.py").stat()
    if status == 0:
        assert (wd / "mod.py").read_text() == "X = 2\n"
        assert (st.st_uid, st.st_gid) == (nobody.pw_uid, nobody.pw_gid), "owner not kept"
        assert stat.S_IMODE(st.st_mode) == 0o640
        backup = next((tmp_path / "state").glob("journal/*/*.orig"))
        bm = stat.S_IMODE(backup.stat().st_mode)
        assert bm & 0o077 == 0, f"backup {bm:o} readable by others"
    else:
        _one_line(err)
        assert (wd / "mod.py").read_text() == "X = 1\n"
    _no_leftovers(wd)


def test_hardlinked_file_is_refused(sshd, env_vllm017, tmp_path, cli):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, TEXT_EDIT)
    (wd / "mod.py").write_text("X = 1\n")
    os.link(wd / "mod.py", tmp_path / "twin.py")
    status, out, err = _patch(cli, inv, pb)
    assert status != 0
    _one_line(err)
    assert (wd / "mod.py").read_text() == "X = 1\n" and (tmp_path / "twin.py").read_text() == "X = 1\n"


# ------------------------------------------------------------------------------ anchors
@pytest.mark.parametrize("src,edits,words", [
    ("Y = 1\n", TEXT_EDIT, "anchor not found"),
    ("X = 1\nX = 1\n", TEXT_EDIT, "ambiguous"),
    ("def f(a, b=0):\n    return a\n\ng(1)\n", CALL_EDIT, "f"),
    ("def f(a, b=0):\n    return a\n\nf(1, b=2)\nf(3, b=4)\n", CALL_EDIT, "expected 1"),
], ids=["missing", "ambiguous", "callee-missing", "call-ambiguous"])
def test_bad_anchor_refusal_names_the_edit(sshd, env_vllm017, tmp_path, cli, src, edits, words):
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, edits)
    (wd / "mod.py").write_text(src)
    status, out, err = _patch(cli, inv, pb)
    assert status in (2, 8), err
    _one_line(err)
    assert edits[0]["id"] in err and words in err, err
    assert (wd / "mod.py").read_text() == src


def test_half_applied_by_hand_is_refused_naming_the_edit(sshd, env_vllm017, tmp_path, cli):
    """Two edits; the second was done by hand *differently*: refuse, name it, change nothing."""
    edits = [{"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = 2\n"}},
             {"id": "add-c", "call": "f", "add": {"c": "3"}}]
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, edits)
    src = "def f(a, c=0):\n    return a\n\nX = 1\nf(1, c=99)\n"
    (wd / "mod.py").write_text(src)
    status, out, err = _patch(cli, inv, pb)
    assert status in (2, 8), err
    _one_line(err)
    assert "add-c" in err, err
    assert (wd / "mod.py").read_text() == src


def test_half_applied_by_hand_identically_completes_the_rest(sshd, env_vllm017, tmp_path, cli):
    edits = [{"id": "x-two", "replace": {"old": "X = 1\n", "new": "X = 2\n"}},
             {"id": "add-c", "call": "f", "add": {"c": "3"}}]
    wd, pb, inv = _setup(sshd, env_vllm017, tmp_path, edits)
    (wd / "mod.py").write_text("def f(a, c=0):\n    return a\n\nX = 2\nf(1)\n")
    status, out, err = _patch(cli, inv, pb)
    assert status == 0, err
    assert (wd / "mod.py").read_text() == "def f(a, c=0):\n    return a\n\nX = 2\nf(1, c=3)\n"
