"""What `patch` verifies, against real speculators 0.3.0 + vLLM 0.17.0 sources over a real sshd:
the edits' `fixes` (one symbol matcher: a symbol spelled by its defining module matches the name the
caller imported), findings left in the patched modules (refused unless --allow-findings), and the
`verified: ...` / `not verified: ...` line every patch result carries, for people and in --json."""

from __future__ import annotations

import json
import sys

from tests.patch.test_over_ssh import GEN, SHIPPED, journal, site_file

MOD = "speculators.data_generation.vllm_hidden_states_generator"


def one_edit_book(tmp_path, fixes: str, check: bool = True):
    p = tmp_path / "one.yaml"
    p.write_text(
        "name: one-edit\n"
        + (f"check:\n  targets: [{MOD}]\n  against: [vllm]\n" if check else "")
        + "patches:\n"
        f"  - module: {MOD}\n"
        "    edits:\n"
        "      - id: scheduler-config-add-is-encoder-decoder\n"
        "        call: SchedulerConfig\n"
        "        add: {is_encoder_decoder: 'False'}\n"
        f"        fixes: [{fixes}]\n")
    return p


def test_symbol_spelled_by_its_defining_module_matches_and_remaining_findings_refuse(
        sshd, fresh_env017, state_dir, inventory_file, cli, tmp_path):
    """The generator imports SchedulerConfig from vllm.config; the fixes entry spells it by the module
    that defines it (vllm.config.scheduler). Both resolve to the same class: the finding is matched and
    counted gone. The other three findings of the module remain, so patch refuses without
    --allow-findings (dry run too), and applies with it, saying what remains."""
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    pb = one_edit_book(tmp_path, "{kind: missing-argument, symbol: vllm.config.scheduler.SchedulerConfig, "
                                 "name: is_encoder_decoder}")
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    for extra in (["--yes"], ["--dry-run"]):
        status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(pb), *extra)
        assert status == 8, (extra, out, err)
        assert "still has 3 finding(s) in the patched module(s)" in err and "--allow-findings" in err
        assert target.read_bytes() == original and journal(state_dir) == []

    status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(pb), "--yes", "--allow-findings",
                           "--json")
    assert status == 0, err
    ver = json.loads(out)["verification"]
    assert ver["verified"] and ver["targeted_gone"] == 1 and ver["findings_before"] == 4
    assert {(f["kind"], f["name"]) for f in ver["remaining"]} == {
        ("unexpected-keyword", "eos_token_id"), ("unexpected-keyword", "kv_cache_specs"),
        ("missing-argument", "block_size")}
    assert ver["line"].startswith("verified: 1 targeted findings gone, ")
    assert "3 finding(s) remain in the patched module(s)" in ver["line"]
    assert b"is_encoder_decoder=False" in target.read_bytes()


def test_unmatched_spelling_and_absent_finding_are_refused_not_passed(
        sshd, fresh_env017, state_dir, inventory_file, cli, tmp_path):
    target = site_file(fresh_env017, GEN)
    original = target.read_bytes()
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    cases = [
        # a misspelled symbol names nothing in vLLM and no finding: it would have matched nothing
        ("{kind: missing-argument, symbol: vllm.config.scheduler.SchedulerConfg, name: is_encoder_decoder}",
         "vllm.config.scheduler.SchedulerConfg, which is defined nowhere"),
        # right symbol, a parameter the unpatched text has no finding about: nothing to verify
        ("{kind: missing-argument, symbol: vllm.config.SchedulerConfig, name: max_num_seqs}",
         "claims to fix missing-argument vllm.config.SchedulerConfig(max_num_seqs), but the unpatched module "
         "has no such finding"),
    ]
    for fixes, message in cases:
        pb = one_edit_book(tmp_path, fixes)
        status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(pb), "--yes", "--allow-findings")
        assert status == 8, (fixes, out, err)
        assert message in err, err
        assert f"edit scheduler-config-add-is-encoder-decoder ({pb}:11)" in err, err
        assert target.read_bytes() == original and journal(state_dir) == []


def test_human_output_says_what_was_verified(sshd, fresh_env017, state_dir, inventory_file, cli, tmp_path):
    inv = inventory_file(python=str(fresh_env017), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(SHIPPED), "--yes")
    assert status == 0, err
    assert "verified: 4 targeted findings gone, " in out and " calls re-checked" in out, out
    status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(SHIPPED), "--yes")
    assert status == 0 and "not verified: nothing to change (every edit is already applied)" in out, out


def test_playbook_without_check_is_not_verified_and_says_so(sshd, state_dir, tmp_path, cli, inventory_file):
    work = tmp_path / "work"
    (work / "app").mkdir(parents=True)
    (work / "app" / "__init__.py").write_text("")
    (work / "app" / "mod.py").write_text("def f(**kw):\n    return kw\n\n\nf(a=1, b=2)\n")
    pb = tmp_path / "nocheck.yaml"
    pb.write_text("patches:\n  - module: app.mod\n    edits:\n      - id: drop-b\n        call: f\n"
                  "        drop: [b]\n")
    inv = inventory_file(python=sys.executable, workdir=str(work), env={"REMOTE_OPS_STATE_DIR": str(state_dir)})
    status, out, err = cli("-i", str(inv), "patch", "testhost", "-p", str(pb), "--yes")
    assert status == 0, err
    assert "not verified: the playbook has no check: section" in out, out
    assert (work / "app" / "mod.py").read_text().endswith("f(a=1)\n")
    status, out, err = cli("-i", str(inv), "rollback", "testhost", "--json")
    assert status == 0 and json.loads(out)["changed"]
