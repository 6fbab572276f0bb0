"""A sample file counts only when it is whole, over the real sshd with the sandbox's
stand-in job (the shipped extract_hidden_states.py driven by a torch-CPU generator):

- a file cut short is written anew by the next extract's resume, which says so, and verify --all is
  clean after it;
- verify names a file cut short as not whole (a few bytes read, in sampled mode too) with the fix;
- gather refuses a host whose output holds a file cut short, naming it and the fix, before copying;
- files beyond the run's size are extra: named, never counted, and the gaps are of the run's size.
"""

from __future__ import annotations

import json
import sys

import pytest

from remote_ops.agent.outputs import layout
from remote_ops.extract import jobs as jobs_mod
from tests.conftest import standin_playbook, write_inventory

pytest.importorskip("torch")


def _inventory(sshd, tmp_path, n=6):
    pb = tmp_path / "pb.yaml"
    pb.write_text(standin_playbook("whole"))
    entry = sshd.host_entry(python=sys.executable, workdir=str(tmp_path),
                            env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")},
                            vars={"n": n, "sleep": 0, "out": str(tmp_path / "out")}, playbook=str(pb))
    return str(write_inventory(tmp_path / "inv.yaml", {"h": entry}))


def _extract(cli, inv):
    status, out, err = cli("extract", "h", "--tail", "--skip-check", "-i", inv)
    assert status == 0, (out, err)
    return out + err


def test_a_file_cut_short_is_named_by_verify_refused_by_gather_and_written_anew(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path)
    _extract(cli, inv)
    out_dir = tmp_path / "out"
    victim = out_dir / "data_3.pt"
    whole = victim.read_bytes()
    victim.write_bytes(whole[: len(whole) // 2])
    assert layout.whole(str(victim)) is not None and layout.whole(str(out_dir / "data_2.pt")) is None

    # verify: named in sampled mode too (every file's end is read), with the fix
    status, text, err = cli("verify", "h", "--sample", "1", "-i", inv)
    assert status == 1 and "data_3.pt: not whole: no zip end record" in text, text
    assert "fix: extract on this host again: its resume writes a file cut short anew" in text

    # gather: refused before a byte is copied, naming the file and the fix
    dest = tmp_path / "to"
    status, text, err = cli("gather", "h", "--to", str(dest), "-i", inv)
    assert status != 0 and "1 sample file(s) are not whole" in text + err and "data_3.pt" in text + err
    assert not [n for n in dest.iterdir() if n.name.startswith("data_")]

    # the next extract writes it anew, and says so
    text = _extract(cli, inv)
    assert "1 sample file(s) are not whole and will be written again" in text, text
    assert layout.whole(str(victim)) is None
    status, text, err = cli("verify", "h", "--all", "--json", "-i", inv)
    rec = json.loads(text)
    assert status == 0 and rec["ok"] and rec["files"] == 6 and rec["checked"] == 6, rec


def test_files_beyond_the_runs_size_are_extra_not_counted(sshd, tmp_path, cli):
    inv = _inventory(sshd, tmp_path)
    _extract(cli, inv)
    out_dir = tmp_path / "out"
    (out_dir / "data_99.pt").write_bytes((out_dir / "data_0.pt").read_bytes())
    (out_dir / "data_4.pt").unlink()
    status, text, err = cli("verify", "h", "--all", "--json", "-i", inv)
    rec = json.loads(text)
    assert status == 1 and not rec["ok"]
    assert rec["files"] == 5 and rec["expected"] == 6 and rec["extra"] == ["data_99.pt"], rec
    assert rec["gap_count"] == 1 and rec["gaps"] == [4] and rec["missing_after_last"] == 0, rec
    status, text, err = cli("verify", "h", "-i", inv)
    assert "1 file(s) beyond this run's 6 samples, e.g. data_99.pt: not counted" in text
    # the resume writes the one missing, and its end record counts 6/6, not 7/6 (data_99.pt is extra)
    text = _extract(cli, inv)
    st = json.loads(cli("status", "h", "--json", "-i", inv)[1])["job"]["samples"]
    assert st["done"] == 6 and st["expected"] == 6, (st, text)
