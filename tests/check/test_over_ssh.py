"""`remote-ops check` / `inspect` end to end over a real sshd, on venvs holding the real packages."""

from __future__ import annotations

import json
import textwrap

import pytest

EXPECTED_017 = {
    ("vllm.v1.core.kv_cache_utils.get_kv_cache_config_from_groups", "unexpected-keyword", "kv_cache_specs"),
    ("vllm.v1.core.sched.scheduler.Scheduler", "missing-argument", "block_size"),
    ("vllm.config.SchedulerConfig", "missing-argument", "is_encoder_decoder"),
    ("vllm.v1.request.Request", "unexpected-keyword", "eos_token_id"),
}


def test_check_017_json_and_exit_status(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    assert status == 1, err
    res = json.loads(out)
    assert res["host"] == "testhost" and res["mode"] == "static"
    assert res["versions"] == {"speculators": "0.3.0", "vllm": "0.17.0"}
    assert {(f["symbol"], f["kind"], f["name"]) for f in res["findings"]} == EXPECTED_017
    for f in res["findings"]:
        assert set(f) >= {"path", "line", "symbol", "kind", "name", "message", "suggestion"}
        # the analysed file is the one the host's interpreter imports, not a local copy
        assert f["path"].startswith(str(env_vllm017.parent.parent))
    assert res["unknown"] == []
    # timing is reported, not bounded here (benchmarks/controller/run.py and benchmarks/evidence/check_matrix.py measure it)
    assert res["timing"]["host_analysis_s"] > 0 and res["timing"]["round_trip_s"] >= res["timing"]["host_analysis_s"]
    # drift against the version speculators pins (0.11.0), fetched and analysed on the controller
    assert res["baseline"]["version"] == "0.11.0" and res["baseline"]["source"].startswith("declared by speculators")
    assert {(d["kind"], d["name"]) for d in res["drift"]} >= {
        ("attribute-gone", "get_input_embeddings"), ("default-changed", "enable_prefix_caching"),
        ("default-changed", "enable_chunked_prefill"), ("return-changed", "collective_rpc")}


def test_check_011_clean(sshd, inventory_file, env_vllm011, cli):
    inv = inventory_file(python=str(env_vllm011))
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    assert status == 0, err
    res = json.loads(out)
    assert res["versions"]["vllm"] == "0.11.0"
    assert res["findings"] == [] and res["unknown"] == []


def test_check_is_one_round_trip(sshd, env_vllm017):
    from remote_ops.check import check as check_mod
    sess = sshd.session(python=str(env_vllm017))
    try:
        res = check_mod.run(sess, check_mod.CheckRequest())
        assert sess.stats.execs == 1 and sess.stats.sftp_requests == 0
        assert len(res["findings"]) == 4
    finally:
        sess.close()


def test_check_human_output(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("check", "testhost", "-i", str(inv))
    assert status == 1
    assert "vllm_hidden_states_generator.py:234" in out
    assert "eos_token_id" in out and "pass block_size=VLLM_BLOCK_SIZE" in out
    assert "4 finding(s)" in out


def test_check_playbook_targets(sshd, inventory_file, env_vllm017, cli, tmp_path):
    pb = tmp_path / "pb.yaml"
    pb.write_text(textwrap.dedent("""\
        name: t
        check:
          targets: [speculators.data_generation.custom_worker]
          against: [vllm]
    """))
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("check", "testhost", "--json", "--playbook", str(pb), "-i", str(inv))
    assert status == 0, err
    res = json.loads(out)
    assert [t["module"] for t in res["targets"]] == ["speculators.data_generation.custom_worker"]


def test_inspect_over_ssh(sshd, inventory_file, env_vllm017, cli):
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("inspect", "testhost", "vllm.v1.request:Request",
                           "vllm.v1.core.sched.scheduler:Scheduler.add_request", "--json", "-i", str(inv))
    assert status == 0, err
    res = json.loads(out)
    assert res["mode"] == "static"
    req = res["symbols"][0]
    assert req["parameters"][0] == {"name": "request_id", "kind": "positional-or-keyword",
                                    "required": True, "default": None, "annotation": "str"}
    status, out, err = cli("inspect", "testhost", "vllm.v1.request:Request", "-i", str(inv))
    assert status == 0 and "static" in out and "request_id" in out


def test_runtime_without_the_library_importable_is_an_error_not_clean(sshd, inventory_file, env_vllm017, cli):
    # the test venvs hold vLLM's sources only (no torch, no dependencies): --runtime cannot import it
    inv = inventory_file(python=str(env_vllm017))
    status, out, err = cli("check", "testhost", "--runtime", "-i", str(inv))
    assert status == 7
    assert "--runtime cannot import vllm" in err


@pytest.mark.long
def test_emit_playbook_draft_needs_a_person_then_patches_clean(sshd, inventory_file, fresh_env017, cli, tmp_path):
    """check --emit-playbook: mechanical fixes (drop keywords, block_size=VLLM_BLOCK_SIZE from the module
    constant), a placeholder where no constant exists; the loader refuses the draft until it is filled."""
    import yaml

    inv = inventory_file(python=str(fresh_env017))
    draft = tmp_path / "draft.yaml"
    status, out, err = cli("check", "testhost", "--emit-playbook", str(draft), "-i", str(inv))
    assert status == 1 and draft.exists(), err
    doc = yaml.safe_load(draft.read_text())
    edits = {e["call"]: e for p in doc["patches"] for e in p["edits"] if "call" in e}
    assert edits["Request"]["drop"] == ["eos_token_id"]
    assert edits["get_kv_cache_config_from_groups"]["drop"] == ["kv_cache_specs"]
    assert edits["Scheduler"]["add"] == {"block_size": "VLLM_BLOCK_SIZE"}
    assert "FILL-ME" in edits["SchedulerConfig"]["add"]["is_encoder_decoder"]
    assert doc["requires"] == {"speculators": "==0.3.0", "vllm": "==0.17.0"}

    status, out, err = cli("patch", "testhost", "--playbook", str(draft), "--dry-run", "-i", str(inv))
    assert status == 2 and "placeholder" in err and f"{draft}:" in err

    # drift fixes: the baseline's defaults passed explicitly (guesses marked), exact-text edits
    assert edits["CacheConfig"]["add"] == {"enable_prefix_caching": "False"}
    assert "FILL-ME (guess" in edits["CacheConfig"]["note"]
    draft.write_text(draft.read_text().replace("FILL-ME value for is_encoder_decoder", "'False'")
                     .replace("FILL-ME (guess, confirm and delete this marker)", "confirmed"))
    status, out, err = cli("patch", "testhost", "--playbook", str(draft), "--yes", "-i", str(inv))
    assert status == 0, err
    status, out, err = cli("check", "testhost", "--json", "--strict", "-i", str(inv))
    assert status == 0, err
    res = json.loads(out)
    assert res["findings"] == [] and res["drift"] == []


@pytest.mark.long
def test_strict_fails_on_drift_alone(sshd, inventory_file, fresh_env017, cli):
    """After the shipped playbook: no findings, the four measured items gone; what drift remains is
    shown under its own heading, exit 0; --strict makes it exit 1."""
    inv = inventory_file(python=str(fresh_env017))
    status, out, err = cli("patch", "testhost", "--playbook", "eagle3-speculators-0.3.0", "--yes", "-i", str(inv))
    assert status == 0, err
    status, out, err = cli("check", "testhost", "--json", "-i", str(inv))
    assert status == 0, err
    res = json.loads(out)
    assert res["findings"] == [] and res["drift"], res
    names = {d["name"] for d in res["drift"]}
    assert not names & {"get_input_embeddings", "enable_prefix_caching", "enable_chunked_prefill", "collective_rpc"}
    status, out, err = cli("check", "testhost", "-i", str(inv))
    assert status == 0 and "drift against vllm 0.11.0" in out and "no findings, %d drift item(s)" % len(names) in out
    status, out, err = cli("check", "testhost", "--strict", "-i", str(inv))
    assert status == 1


def test_inspect_on_several_hosts_is_one_json_document(sshd, tmp_path, env_vllm017, cli):
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"a": sshd.host_entry(str(env_vllm017)),
                                                  "b": sshd.host_entry(str(env_vllm017))})
    status, out, err = cli("inspect", "a,b", "vllm.v1.request:Request", "--json", "-i", str(inv))
    assert status == 0, err
    doc = json.loads(out)                       # one document, not one per host
    assert doc["failed"] == [] and [h["host"] for h in doc["hosts"]] == ["a", "b"]
    assert all(h["result"]["symbols"][0]["kind"] == "class" for h in doc["hosts"])
