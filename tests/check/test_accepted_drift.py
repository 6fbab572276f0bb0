"""check.accepted_drift: drift a person reviewed and kept, with the reason, in the playbook."""

from __future__ import annotations

import json

import pytest

from remote_ops.check import drift

from remote_ops.playbook import loader as playbook
from remote_ops.errors import ConfigError, Exit
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"

HEAD = "name: t\ncheck:\n  targets: [a.b]\n  against: [vllm]\n  accepted_drift:\n"


@pytest.mark.parametrize("entry, line, message", [
    ("    - {kind: default-changed, symbol: vllm.X, name: y}\n", 6, "needs why"),
    ("    - {kind: default-changed, symbol: vllm.X, name: y, why: ''}\n", 6, "needs why"),
    ("    - {kind: defaults-changed, symbol: vllm.X, name: y, why: ok}\n", 6, "unknown drift kind 'defaults-changed'"),
    ("    - {kind: default-changed, symbol: vllm.X, name: y, why: ok, reason: no}\n", 6, "unknown key 'reason'"),
    ("    - just a string\n", 6, "entries must be mappings"),
])
def test_schema_errors_name_the_line(tmp_path, entry, line, message):
    p = tmp_path / "pb.yaml"
    p.write_text(HEAD + entry)
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    assert f"pb.yaml:{line}" in exc.value.one_line() and message in exc.value.one_line()


def test_apply_accepted_moves_matches_and_reports_stale_entries():
    items = [{"kind": "default-changed", "symbol": "vllm.config.A", "name": "x", "path": "f.py", "line": 3},
             {"kind": "default-changed", "symbol": "vllm.config.A", "name": "y", "path": "f.py", "line": 3},
             {"kind": "return-changed", "symbol": "vllm.f", "name": "f", "path": "f.py", "line": 9}]
    accepted = [{"kind": "default-changed", "symbol": "vllm.config.A", "name": "y", "why": "checked"},
                {"kind": "attribute-gone", "symbol": "vllm.B", "name": "z", "why": "old"}]
    res = drift.apply_accepted({"drift": list(items)}, accepted)
    assert [d["name"] for d in res["drift"]] == ["x", "f"]
    assert [(d["name"], d["accepted"]) for d in res["drift_accepted"]] == [("y", "checked")]
    assert res["accepted_unmatched"] == [accepted[1]]
    # same kind and name on another symbol is not the reviewed item
    other = drift.apply_accepted({"drift": [dict(items[1], symbol="vllm.config.B")]}, accepted[:1])
    assert len(other["drift"]) == 1 and other["drift_accepted"] == []


def test_shipped_playbook_accepts_only_what_remains_after_its_patches(sshd, fresh_env017, state_dir,
                                                                      inventory_file, cli):
    """On the real wheels (speculators 0.3.0 x vLLM 0.17.0 against the 0.11.0 baseline): before the
    patch the four measured drift items are reported and not accepted; after it no drift is left
    outside the reviewed list, so --strict passes."""
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)},
                         playbook=str(SHIPPED))
    status, out, err = cli("-i", str(inv), "check", "testhost", "--json")
    before = json.loads(out)
    names = {(d["kind"], d["name"]) for d in before["drift"]}
    assert {("default-changed", "enable_prefix_caching"), ("default-changed", "enable_chunked_prefill"),
            ("return-changed", "collective_rpc"), ("attribute-gone", "get_input_embeddings")} <= names
    accepted_names = {a["name"] for a in playbook.load(SHIPPED).check["accepted_drift"]}
    assert not names & accepted_names          # none of the measured four is waved through
    status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes", "--json")
    assert status == 0, err
    status, out, err = cli("-i", str(inv), "check", "testhost", "--strict", "--json")
    after = json.loads(out)
    assert status == Exit.OK, after["drift"]
    assert after["findings"] == [] and after["drift"] == []
    assert {d["name"] for d in after["drift_accepted"]} <= accepted_names and after["drift_accepted"]
    status, out, err = cli("-i", str(inv), "check", "testhost", "-v")
    assert "drift item(s) accepted" in out and "accepted:" in out
