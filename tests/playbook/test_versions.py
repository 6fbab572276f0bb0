"""Edits that know where they apply (when:), the coverage refusal, and check --candidates, over a real
sshd against real speculators / vLLM sources from PyPI (0.16.0, 0.17.0, 0.20.0, 0.33.0)."""

from __future__ import annotations

import json
import re
import os
from pathlib import Path

import pytest

from remote_ops import pkgsource
from remote_ops.errors import ConfigError
from remote_ops.playbook import conditions
from remote_ops.playbook import loader as playbook
from tests.conftest import REPO

SHIPPED = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"
GEN = "speculators/data_generation/vllm_hidden_states_generator.py"
SPEC_RELEASES = ["0.3.0", "0.4.0", "0.4.0.1", "0.5.0", "0.6.0", "0.6.0.1", "0.6.0.2", "0.7.0", "0.7.0.1",
                 "0.7.0.2", "0.8.0", "0.8.1", "0.9.0"]


def site_file(python: Path, rel: str) -> Path:
    return next(Path(python).parent.parent.glob(f"lib/python*/site-packages/{rel}"))


def env_with(tmp_path, vllm: str) -> Path:
    return pkgsource.make_env(tmp_path / f"venv-{vllm}", [("speculators", "0.3.0"), ("vllm", vllm)])


def host_inv(inventory_file, python, state, playbook_path=SHIPPED):
    return inventory_file(python=str(python), env={"REMOTE_OPS_STATE_DIR": str(state)}, playbook=str(playbook_path))


# ------------------------------------------------------------------ the loader
_EDIT = "patches:\n  - module: a.b\n    edits:\n      - id: e\n        call: f\n        drop: [x]\n"
BAD_WHEN = [
    (_EDIT + "        when: {vllm: '>>0.17'}\n", 7, "invalid version specifier '>>0.17' for vllm in when of edit 'e'"),
    (_EDIT + "        when: {finding: yes}\n", 7, "when.finding of edit 'e' must be 'present'"),
    (_EDIT + "        when: {finding: present}\n", 7, "needs fixes: entries"),
    (_EDIT + "        when: [vllm]\n", 7, "when of edit 'e' must be a mapping"),
    (_EDIT + "        when: {'no such': '>=1'}\n", 7, "'no such' is neither a distribution name"),
    ("patches:\n  - module: a.b\n    when: {finding: present}\n    edits:\n      - id: e\n        call: f\n"
     "        drop: [x]\n", 5, "its group's when asks for its finding"),
]


@pytest.mark.parametrize("text,line,message", BAD_WHEN)
def test_bad_when_names_its_line(tmp_path, text, line, message):
    p = tmp_path / "pb.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as exc:
        playbook.load(p)
    assert exc.value.message.startswith(f"{p}:{line}:") or f":{line}" in exc.value.one_line(), exc.value.one_line()
    assert message in exc.value.one_line()


def test_group_when_is_merged_into_each_edit(tmp_path):
    p = tmp_path / "pb.yaml"
    p.write_text("patches:\n  - module: a.b\n    when: {vllm: '>=0.16'}\n    edits:\n"
                 "      - id: e\n        call: f\n        drop: [x]\n        when: {vllm: '>=0.17', anchor: present}\n"
                 "      - id: g\n        call: f\n        drop: [y]\n")
    e, g = playbook.load(p).patches[0].edits
    assert e.when.to_json() == {"vllm": ">=0.16,>=0.17", "anchor": "present"}
    assert g.when.to_json() == {"vllm": ">=0.16"}
    sel = conditions.by_version([e, g], {"vllm": "0.16.0"})
    assert [x.id for x in sel.active] == ["g"]
    assert sel.skipped == [{"edit": "e", "why": "not for this version: vllm 0.16.0 does not satisfy vllm>=0.16,>=0.17",
                            "when": e.when.to_json()}]
    assert [x.id for x in conditions.by_version([e, g], {"vllm": "0.17.0"}).active] == ["e", "g"]
    assert conditions.by_version([g], {}).skipped[0]["why"] == \
        "not for this version: vllm is not installed (when: vllm>=0.16)"


def test_anchor_condition(tmp_path):
    p = tmp_path / "pb.yaml"
    p.write_text("patches:\n  - module: a.b\n    edits:\n"
                 "      - id: t\n        when: {anchor: present}\n        replace: {old: \"a = 1\\n\", new: \"a = 2\\n\"}\n"
                 "      - id: c\n        when: {anchor: present}\n        call: run\n        drop: [x]\n")
    t, c = playbook.load(p).patches[0].edits
    sel = conditions.by_anchor(conditions.Selection(active=[t, c]), "a = 1\nobj.run(x=1)\n")
    assert [e.id for e in sel.active] == ["t", "c"]
    sel = conditions.by_anchor(conditions.Selection(active=[t, c]), "a = 2\nstop(x=1)\n")
    assert [e.id for e in sel.active] == ["t"]          # the new text counts: already applied, not absent
    assert "a call to run is not in it" in sel.skipped[0]["why"]
    sel = conditions.by_anchor(conditions.Selection(active=[t]), "b = 1\n")
    assert sel.active == [] and "its old text is not in it" in sel.skipped[0]["why"]


# ------------------------------------------------------------------ over sshd, real releases
@pytest.mark.long
def test_vllm_016_patches_and_checks_clean(sshd, tmp_path, inventory_file, cli):
    python = env_with(tmp_path, "0.16.0")
    state = tmp_path / "state"
    inv = host_inv(inventory_file, python, state)
    target = site_file(python, GEN)
    original = target.read_bytes()

    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--dry-run")
    assert status == 0, err
    dry = json.loads(out)
    states = {e["edit"]: e for e in dry["edits"]}
    eos = states["request-drop-eos-token-id"]
    assert eos["state"] == "not-applicable" and eos["why"] == \
        "not for this version: vllm 0.16.0 does not satisfy vllm>=0.17" and eos["when"] == {"vllm": ">=0.17"}
    # the transformers-5 edit: this host's environment holds no transformers at all (sources only)
    assert states["pydantic-rebuild-knows-torch"]["why"] == \
        "not for this version: transformers is not installed (when: transformers>=5)"
    assert all(e["state"] == "pending" for k, e in states.items()
               if k not in ("request-drop-eos-token-id", "pydantic-rebuild-knows-torch"))
    # verification counts only the edits that applied: the three findings that 0.16.0 has
    assert dry["verification"]["verified"] and dry["verification"]["targeted_gone"] == 3, dry["verification"]
    assert "2 edit(s) not for this host: request-drop-eos-token-id, pydantic-rebuild-knows-torch" in \
        dry["verification"]["line"]
    assert target.read_bytes() == original

    status, out, err = cli("-i", str(inv), "patch", "testhost", "--dry-run")
    assert status == 0, err
    assert "edit request-drop-eos-token-id: not for this version: vllm 0.16.0 does not satisfy vllm>=0.17" in out
    assert "edit scheduler-add-block-size: applies (line 148)" in out

    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--yes")
    assert status == 0, err
    done = json.loads(out)
    assert done["changed"] and done["verification"]["targeted_gone"] == 3
    assert "eos_token_id=" in target.read_text()          # 0.16.0's Request still takes it: left as it was

    status, out, err = cli("-i", str(inv), "--json", "check", "testhost", "--strict")
    assert status == 0, err
    assert json.loads(out)["findings"] == [] and json.loads(out)["drift"] == []

    # a rerun changes nothing, and still says which edit is not for this version (the one-exec path)
    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--yes")
    assert status == 0, err
    again = json.loads(out)
    assert again["changed"] is False
    assert {e["edit"]: e["state"] for e in again["edits"]}["request-drop-eos-token-id"] == "not-applicable"


FINDING_BOOK = """\
name: finding-present
requires: {speculators: "==0.3.0"}
check:
  targets: [speculators.data_generation.vllm_hidden_states_generator]
  against: [vllm]
patches:
  - module: speculators.data_generation.vllm_hidden_states_generator
    edits:
      - id: request-drop-eos-token-id
        when: {finding: present}
        call: Request
        drop: [eos_token_id]
        fixes: [{kind: unexpected-keyword, symbol: vllm.v1.request.Request, name: eos_token_id}]
"""


@pytest.mark.parametrize("vllm,state", [("0.16.0", "not-applicable"), ("0.17.0", "pending")])
def test_finding_present_is_decided_on_the_host(sshd, tmp_path, inventory_file, cli, vllm, state):
    book = tmp_path / "finding.yaml"
    book.write_text(FINDING_BOOK)
    python = env_with(tmp_path, vllm)
    inv = host_inv(inventory_file, python, tmp_path / "state", book)
    # (this one-edit playbook leaves the host's other findings: --allow-findings)
    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--dry-run", "--allow-findings")
    assert status == 0, err
    (edit,) = json.loads(out)["edits"]
    assert edit["state"] == state, edit
    if state == "not-applicable":
        assert edit["why"].startswith("not for this host: its finding (unexpected-keyword vllm.v1.request.Request "
                                      "eos_token_id) is not on it")
        return
    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--yes", "--allow-findings")
    assert status == 0, err
    assert json.loads(out)["verification"]["targeted_gone"] == 1
    # once applied, the finding is gone because of the edit: it stays "applied", not "not-applicable"
    status, out, err = cli("-i", str(inv), "--json", "patch", "testhost", "--dry-run")
    assert [e["state"] for e in json.loads(out)["edits"]] == ["applied"]


ONE_LINE = ("playbook eagle3-speculators-0.3.0 does not cover this host: vllm 0.33.0 does not satisfy "
            "vllm>=0.16,<0.33 (there: _get_kv_cache_groups_uniform_spec, get_kv_cache_config_from_groups, "
            "unify_hybrid_kv_cache_specs gone from vllm.v1.core.kv_cache_utils)")


@pytest.mark.long
def test_vllm_033_is_refused_in_one_line(sshd, tmp_path, inventory_file, cli):
    python = env_with(tmp_path, "0.33.0")
    inv = host_inv(inventory_file, python, tmp_path / "state")
    target = site_file(python, GEN)
    original = target.read_bytes()
    status, out, err = cli("-i", str(inv), "patch", "testhost", "--yes")
    assert status == 8
    lines = [ln for ln in err.splitlines() if ln.strip()]
    # the refusal names the playbook that claims this vLLM: the server flow of speculators 0.9.0
    assert lines == [f"remote-ops: testhost: {ONE_LINE} (nothing was changed; eagle3-speculators-0.9.0 claims "
                     f"vllm 0.33.0 with speculators==0.9.0 (then `remote-ops -i {os.path.abspath(inv)} check testhost "
                     f"--playbook eagle3-speculators-0.9.0 --strict`); `remote-ops -i {os.path.abspath(inv)} check testhost "
                     "--candidates` lists the speculators releases and their findings against this host's vllm)"], err
    assert target.read_bytes() == original
    # extract's preflight says the same before any GPU time (the deciding problem)
    status, out, err = cli("-i", str(inv), "extract", "testhost", "--dry-run")
    assert status == 8
    last = [ln for ln in err.splitlines() if ln.startswith("remote-ops: ")]
    assert len(last) == 1 and last[0].startswith(
        f"remote-ops: testhost: preflight refused to start eagle3-speculators-0.3.0: {ONE_LINE} (nothing was changed; "
        "eagle3-speculators-0.9.0 claims vllm 0.33.0"), err


@pytest.mark.long
@pytest.mark.parametrize("vllm", ["0.20.0", "0.33.0"])
def test_candidates_lists_every_release(sshd, tmp_path, inventory_file, cli, vllm):
    python = env_with(tmp_path, vllm)
    inv = host_inv(inventory_file, python, tmp_path / "state")
    status, out, err = cli("-i", str(inv), "--json", "check", "testhost", "--candidates")
    assert status == 0, err
    rec = json.loads(out)
    rows = {r["release"]: r for r in rec["rows"]}
    assert list(rows) == SPEC_RELEASES and rec["installed"] == {"speculators": "0.3.0", "vllm": vllm}
    assert rec["timing"]["shipped"] == len(SPEC_RELEASES) and rec["timing"]["round_trips"] == 3
    old, mid, new = rows["0.3.0"], rows["0.4.0"], rows["0.9.0"]
    assert old["installed"] and old["declared"] == "==0.11.0 [datagen]" and old["baseline"] == "0.11.0"
    assert mid["declared"] == "<=0.16.0,>=0.12.0 [datagen]" and mid["baseline"] == "0.16.0"
    assert old["flow"] == mid["flow"] == "in-process"
    assert all(rows[v]["flow"] == "server" and rows[v]["findings"] == 0 and rows[v]["declared"] == "none"
               for v in SPEC_RELEASES[3:])
    if vllm == "0.20.0":
        assert old["findings"] == 4 and old["playbooks"] == ["eagle3-speculators-0.3.0"]
        # the server flow's no-chunked-prefill playbook (vllm >=0.17,<0.24: check last-chunk) covers speculators
        # 0.9.0 on this host
        assert new["playbooks"] == ["eagle3-speculators-0.9.0-no-chunked-prefill"] and rows["0.8.0"]["playbooks"] == []
        assert "unexpected-keyword vllm.v1.request.Request" in old["finding_symbols"]
    else:
        assert old["findings"] == 6 and old["playbooks"] == [] and new["playbooks"] == ["eagle3-speculators-0.9.0"]
        assert "missing-symbol vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups" in old["finding_symbols"]
        assert mid["findings"] == 4
    # a second call: every release is staged on the host already, nothing is shipped
    status, out, err = cli("-i", str(inv), "--json", "check", "testhost", "--candidates")
    again = json.loads(out)
    assert again["timing"]["shipped"] == 0 and again["timing"]["round_trips"] == 2
    assert [r["findings"] for r in again["rows"]] == [r["findings"] for r in rec["rows"]]
    status, out, err = cli("-i", str(inv), "check", "testhost", "--candidates")
    assert status == 0 and "0.9.0" in out and "server" in out and "in-process" in out
    # the installed version's row is the PyPI release, and the table says so (a patched host's
    # `check` counts its own files)
    text = " ".join(out.split())
    assert re.search(r"^0\.3\.0 \* ", out, re.M) and "(installed)" not in text
    assert ("* the installed version. Each row checks the release's sources from PyPI; the host's installed "
            "speculators files (patched or not) are what `remote-ops check testhost` checks") in text
