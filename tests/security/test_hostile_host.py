"""A hostile host (tests/hostile.py): what comes back over SSH never acts on the laptop. Each rule is
asserted over the real sshd and over ``connection: local``:

- gather writes only inside ``--to``: a listed name with ``..``, an absolute path, a line break or a
  non-ASCII digit, a foreign directory, a bad shard directory or output directory refuses the gather
  before anything is copied, nothing outside ``--to`` changes, and the refusal names the host's words
  escaped;
- a copy whose bytes differ from the host's hash is not kept, and the part still counts what it did copy;
- links in an output directory are never followed (gather refuses, verify exits non-zero), and sample
  names that only look like samples are never counted;
- a link planted in ``--to`` is replaced, never written through; copies are 0600 (``--host-mode``:
  the host's mode capped at 0644).

Every rewrite is checked to have hit an agent answer in flight (``hostile.rewrites``)."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest

from remote_ops.agent.outputs import layout
from tests import hostile
from tests.conftest import write_inventory

torch = pytest.importorskip("torch")

N = 3


def _sample(i: int) -> dict:
    g = torch.Generator().manual_seed(i)
    return {"input_ids": torch.arange(4 + i), "hidden_states": [torch.randn(4 + i, 8, generator=g) for _ in range(2)],
            "loss_mask": torch.ones(4 + i, dtype=torch.long)}


def _outputs(out, n: int = N) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        torch.save(_sample(i), out / layout.name(i))
    (out / "data_config.json").write_text(json.dumps({"data": {"num_samples": n}, "model": {"hidden_size": 8},
                                                      "hidden_states": {"layer_ids": [0, 1]}}))


def _inventory(tmp_path, sshd, kind: str, python) -> str:
    env = {"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")}
    if kind == "local":
        entry = {"connection": "local", "python": str(python), "env": env}
    else:
        entry = sshd.host_entry(python=str(python), env=env)
    return str(write_inventory(tmp_path / "inv.yaml", {"h": entry}))


@pytest.fixture(params=["sshd", "local"])
def kind(request):
    return request.param


def _gather(cli, inv, out, dest, *extra):
    status, text, err = cli("gather", "h", "--to", str(dest), "--output-dir", str(out), "-i", inv, *extra)
    return status, text + err


ESCAPES = [
    ("dot-dot", lambda tmp: {"files": {"1": {"name": "./../x"}}}, "./../x"),
    ("bashrc", lambda tmp: {"files": {"1": {"name": "./../../home/.bashrc"}}}, "./../../home/.bashrc"),
    ("absolute", lambda tmp: {"files": {"1": {"name": str(tmp / "abs-target")}}}, "abs-target"),
    ("newline", lambda tmp: {"files": {"1": {"name": "data_1.pt\n"}}}, "data_1.pt\\n"),
    ("arabic-digit", lambda tmp: {"files": {"1": {"name": "data_\u0661.pt"}}}, "data_\\u0661.pt"),
    ("leading-zero", lambda tmp: {"files": {"1": {"name": "data_01.pt"}}}, "data_01.pt"),
    ("foreign-dir", lambda tmp: {"files": {"1": {"dir": str(tmp / "home")}}}, "its directory is not one of"),
    ("index-bool", lambda tmp: {"files": {"1": {"index": True}}}, "index is not an int"),
    ("shard-dir", lambda tmp: {"shard_dirs": ["../../escape"]}, "../../escape"),
    ("output-dir", lambda tmp: {"output_dir": "/tmp/../etc"}, "/tmp/../etc"),
    ("added-entry", lambda tmp: {"add_files": [{"index": 7, "name": "../seven", "size": 1, "sha256": "0" * 64}]},
     "../seven"),
]


@pytest.mark.parametrize("case,rules,shown", ESCAPES, ids=[c[0] for c in ESCAPES])
def test_gather_refuses_a_listing_that_names_anything_but_samples(tmp_path, sshd, cli, kind, case, rules, shown):
    out, dest = tmp_path / "out", tmp_path / "work" / "to"
    _outputs(out)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".bashrc").write_text("the user's own\n")
    wrapper = hostile.wrapper(tmp_path, rules(tmp_path))
    inv = _inventory(tmp_path, sshd, kind, wrapper)
    before = hostile.tree(tmp_path)
    status, text = _gather(cli, inv, out, dest)
    assert hostile.rewrites(wrapper), "the fault never hit an agent answer"
    assert status != 0, text
    assert "break the rule for sample files" in text and shown in text, text
    assert "\x1b" not in text and "data_1.pt\n" not in text
    after = hostile.tree(tmp_path)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    # nothing changed but the destination (made, left empty), the wrapper's log, and the host's own
    # state and output-directory identity (agent/job/outputdir.py)
    allowed = (str(dest), str(wrapper) + ".log", str(tmp_path / "state"), str(out / ".remote-ops-dir"))
    assert {p for p in changed if p != str(dest.parent) and not p.startswith(allowed)} == set(), changed
    assert os.listdir(dest) == []


def test_a_copy_with_other_bytes_is_dropped_and_the_rest_counted(tmp_path, sshd, cli, kind):
    out, dest = tmp_path / "out", tmp_path / "to"
    _outputs(out)
    wrapper = hostile.wrapper(tmp_path, {"files": {"1": {"sha256": "0" * 64}}})
    inv = _inventory(tmp_path, sshd, kind, wrapper)
    status, text, err = cli("gather", "h", "--to", str(dest), "--output-dir", str(out), "-i", inv, "--json")
    assert hostile.rewrites(wrapper)
    doc = json.loads(text)
    g = doc.get("gathered") or doc["extra"]["gathered"]        # one host's record carries the group
    assert status != 0 and not g["ok"]
    assert g["copied"] == 2 and g["present"] == 2, g
    assert any("1 file(s) not copied" in p and "differs from the host's" in p for p in g["problems"]), g["problems"]
    assert sorted(os.listdir(dest)) == [".remote-ops-gather.json", "data_0.pt", "data_2.pt",
                                        "data_config.json"]          # no temporary left; the manifest


def test_links_on_the_host_are_never_followed(tmp_path, sshd, cli, kind):
    out, dest = tmp_path / "out", tmp_path / "to"
    _outputs(out, 4)
    secret = tmp_path / "secret"
    secret.write_bytes(b"the host user's private key")
    secret.chmod(0o600)
    (out / "data_3.pt").unlink()
    (out / "data_3.pt").symlink_to(secret)
    inv = _inventory(tmp_path, sshd, kind, sys.executable)
    status, text = _gather(cli, inv, out, dest)
    assert status != 0 and "not a regular file" in text and "data_3.pt" in text, text
    assert not dest.exists() or "data_3.pt" not in os.listdir(dest)
    status, text, err = cli("verify", "h", "--output-dir", str(out), "--all", "-i", inv, "--json")
    rec = json.loads(text)
    assert status != 0 and not rec["ok"] and rec["files"] == 3 and rec["links"] == ["data_3.pt"], rec
    status, text, err = cli("verify", "h", "--output-dir", str(out), "--all", "-i", inv)
    assert status != 0 and "names: 1 sample name(s) that are not regular files" in text


ODD = ["data_02.pt", "data_2.pt\n", "data_\u0662.pt", " data_2.pt"]


def test_names_that_only_look_like_samples_are_never_counted(tmp_path, sshd, cli, kind):
    out, dest = tmp_path / "out", tmp_path / "to"
    _outputs(out, 2)
    cfg = json.loads((out / "data_config.json").read_text())
    cfg["data"]["num_samples"] = 3
    (out / "data_config.json").write_text(json.dumps(cfg))
    for name in ODD:
        torch.save(_sample(2), out / name)
    inv = _inventory(tmp_path, sshd, kind, sys.executable)
    status, text, err = cli("verify", "h", "--output-dir", str(out), "--all", "-i", inv, "--json")
    rec = json.loads(text)
    assert status != 0 and not rec["ok"] and rec["files"] == 2 and sorted(rec["odd_names"]) == sorted(ODD), rec
    status, text, err = cli("verify", "h", "--output-dir", str(out), "--all", "-i", inv)
    assert status != 0 and "4 file name(s) that look like samples" in text
    assert f"e.g. {layout.show(sorted(ODD)[0])}: never counted" in text
    status, text = _gather(cli, inv, out, dest)
    assert status != 0 and "looks like a sample but is not one" in text, text
    assert not dest.exists() or not [n for n in os.listdir(dest) if n.startswith("data_")]


def test_a_link_planted_in_the_destination_is_replaced_not_written_through(tmp_path, sshd, cli, kind):
    out, dest = tmp_path / "out", tmp_path / "to"
    _outputs(out)
    (out / "data_2.pt").chmod(0o640)
    dest.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    (dest / "data_0.pt").symlink_to(victim)
    inv = _inventory(tmp_path, sshd, kind, sys.executable)
    status, text = _gather(cli, inv, out, dest)
    assert status == 0, text
    assert victim.read_text() == "keep me"
    assert not (dest / "data_0.pt").is_symlink() and (dest / "data_0.pt").read_bytes() == (out / "data_0.pt").read_bytes()
    assert {n: stat.S_IMODE((dest / n).stat().st_mode) for n in ("data_0.pt", "data_2.pt")} == \
        {"data_0.pt": 0o600, "data_2.pt": 0o600}
    for n in ("data_0.pt", "data_2.pt"):
        (dest / n).unlink()
    status, text = _gather(cli, inv, out, dest, "--host-mode")
    assert status == 0, text
    host_modes = {n: stat.S_IMODE((out / n).stat().st_mode) & 0o644 for n in ("data_0.pt", "data_2.pt")}
    assert {n: stat.S_IMODE((dest / n).stat().st_mode) for n in ("data_0.pt", "data_2.pt")} == host_modes
    assert host_modes["data_2.pt"] == 0o640


@pytest.mark.parametrize("name,expected,odd", [
    ("data_0.pt", ("data_pt", 0), False), ("data_12.pt", ("data_pt", 12), False),
    ("hs_3.safetensors", ("hs_safetensors", 3), False),
    ("data_01.pt", None, True), ("data_1.pt\n", None, True), ("data_\u0661.pt", None, True),
    ("data_1.safetensors", None, True), ("hs_1.pt", None, True), (" data_1.pt", None, True), ("data_ 1.pt", None, True),
    ("data_-1.pt", None, False), ("data_+1.pt", None, False), ("data_1.PT", None, False), ("../data_1.pt", None, False),
    ("data_1.pt/", None, False), (".data_1.pt.123.tmp", None, False), ("data_config.json", None, False),
    ("data_1.pt.bak", None, False),
])
def test_the_sample_name_rule(name, expected, odd):
    assert layout.parse(name) == expected
    if expected:
        assert layout.name(expected[1], expected[0]) == name
    assert layout.is_odd(name) == odd


def test_names_are_built_only_from_ints():
    for bad in (True, -1, 1.0, "1", None):
        with pytest.raises(ValueError):
            layout.name(bad)
    assert layout.index_of("hs_4.safetensors") is None and layout.index_of("hs_4.safetensors", "any") == 4
    assert layout.is_partial(".data_3.pt.77.tmp") and layout.is_partial("hs_3.safetensors.lock")
    assert layout.show("data_\u0661.pt\n\x1b") == "data_\\u0661.pt\\n\\x1b"


def test_a_second_gather_reads_no_file_again_unless_asked(tmp_path, sshd, cli, kind):
    """Issue 49 item 1: the host keeps each file's sha256 by (size, times, inode), --to keeps a manifest:
    a rerun into a complete destination hashes nothing on either side; a file rewritten on the host is
    hashed again and copied; one changed in --to is caught by --checksum (and by size or mtime without)."""
    out, dest = tmp_path / "out", tmp_path / "to"
    _outputs(out, 4)
    inv = _inventory(tmp_path, sshd, kind, sys.executable)

    def gather(*extra):
        status, text, err = cli("gather", "h", "--to", str(dest), "--output-dir", str(out), "-i", inv, "--json", *extra)
        doc = json.loads(text)
        return status, doc.get("gathered") or doc["extra"]["gathered"], doc
    status, g, doc = gather()
    assert status == 0 and g["copied"] == 4 and g["host_digests"] == {"hashed": 4, "reused": 0}, g
    assert (dest / ".remote-ops-gather.json").exists()
    status, g, doc = gather()
    assert status == 0 and g["copied"] == 0 and g["skipped"] == 4
    assert g["host_digests"] == {"hashed": 0, "reused": 4} and doc["quick"] == 4, (g, doc)
    # a sample rewritten on the host (a new inode, as the job writes): hashed again there, copied
    torch.save(_sample(7), out / "data_1.tmp")
    os.replace(out / "data_1.tmp", out / "data_1.pt")
    status, g, doc = gather()
    assert status == 0 and g["copied"] == 1 and g["host_digests"] == {"hashed": 1, "reused": 3}
    assert (dest / "data_1.pt").read_bytes() == (out / "data_1.pt").read_bytes()
    # bytes changed in --to keeping size and mtime: only --checksum reads them
    target = dest / "data_2.pt"
    st = target.stat()
    data = bytearray(target.read_bytes())
    data[-30] ^= 0xFF
    with open(target, "r+b") as fh:
        fh.write(bytes(data))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    status, g, doc = gather()
    assert status == 0 and g["copied"] == 0
    status, g, doc = gather("--checksum")
    assert status == 0 and g["copied"] == 1 and (dest / "data_2.pt").read_bytes() == (out / "data_2.pt").read_bytes()
