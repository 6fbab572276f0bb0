"""verify knows speculators' data_<N>.pt layout: files written here, checked over a real sshd by the
host's torch (this venv's, torch 2.13.0 CPU)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
import yaml

from tests.run_records import record_run

pytestmark = pytest.mark.timeout(180)

L, H = 4, 16


def sample(seq=6, layers=L, hidden=H, **over):
    d = {"input_ids": torch.arange(seq, dtype=torch.long),
         "hidden_states": [torch.randn(seq, hidden, dtype=torch.bfloat16) for _ in range(layers)],
         "loss_mask": torch.ones(seq, dtype=torch.long)}
    d.update(over)
    return d


def config(layers=L, hidden=H):
    return {"version": "2.0", "model": {"hidden_size": hidden},
            "hidden_states": {"layer_ids": list(range(layers))},
            "data": {"num_samples": 6},
            "format": {"schema": {"hidden_states": {"num_tensors": layers}}}}


@pytest.fixture
def host(tmp_path, sshd, cli):
    out = tmp_path / "out"
    out.mkdir()
    state = tmp_path / "state"
    state.mkdir()
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"h": sshd.host_entry(sys.executable,
                                                                   env={"REMOTE_OPS_STATE_DIR": str(state)})}}))

    def verify(*extra):
        status, o, err = cli("-i", str(inv), "verify", "h", "--output-dir", str(out), "--all", *extra)
        return status, o, err
    return out, verify


def write(out, samples, cfg=None):
    for i, s in enumerate(samples):
        if s is not None:
            torch.save(s, out / f"data_{i}.pt")
    if cfg is not None:
        (out / "data_config.json").write_text(json.dumps(cfg))


def verify_json(verify, *extra):
    status, out, err = verify("--json", *extra)
    return status, json.loads(out)


def test_good_layout_passes_and_reports_it(host):
    out, verify = host
    write(out, [sample(seq=3 + i) for i in range(6)], config())
    record_run(out, [list(range(3 + i)) for i in range(6)], list(range(L)))
    status, rec = verify_json(verify, "--expected", "6")
    assert status == 0 and rec["ok"], rec
    assert rec["layers_hidden"] == [[L, H]] and rec["config"]["layers"] == L and rec["config"]["hidden"] == H
    status, text, _ = verify()
    assert status == 0 and f"layout: {L} layers x {H} (data_config.json: {L} layers x {H})" in text


@pytest.mark.parametrize("bad, expect", [
    (sample(hidden_states=[torch.full((6, H), float("nan"))] * L), "NaN/inf"),
    (sample(hidden_states=[torch.randn(6, H)] * (L - 1) + [torch.randn(5, H)]), "has 5 rows for 6 tokens"),
    (sample(hidden_states=[torch.randn(6, H)] * (L - 1) + [torch.randn(6, H + 1)]), "hidden_states[3] has shape"),
    (sample(hidden_states=[torch.randn(6, H, 1)] * L), "not [seq_len, hidden]"),
    (sample(hidden_states=[torch.ones(6, H, dtype=torch.long)] * L), "not a float type"),
    ({k: v for k, v in sample().items() if k != "loss_mask"}, "missing key 'loss_mask'"),
    (sample(input_ids=torch.zeros(6, dtype=torch.float32)), "not an integer type"),
    (sample(input_ids=torch.zeros(1, 6, dtype=torch.long)), "not [seq_len]"),
    (sample(loss_mask=torch.ones(5, dtype=torch.long)), "loss_mask length 5 != input_ids length 6"),
], ids=["nan", "rows", "hidden-mismatch", "3d", "int-hidden", "missing-key", "float-ids", "2d-ids", "mask-len"])
def test_bad_file_is_reported(host, bad, expect):
    out, verify = host
    write(out, [sample(), sample(), bad, sample()], config())
    status, rec = verify_json(verify)
    problems = [p["problem"] for p in rec["inconsistent"] + rec["non_finite"]]
    assert status == 1 and not rec["ok"]
    assert any(expect in p for p in problems), problems
    assert all(p["index"] == 2 for p in rec["inconsistent"] + rec["non_finite"]), rec


def test_truncated_file_gap_and_count(host):
    out, verify = host
    write(out, [sample(), sample(), sample(), None, sample()], config())
    (out / ".data_3.pt.4242.tmp").write_bytes(b"half")          # an interrupted write: reported, not counted
    with open(out / "data_1.pt", "r+b") as fh:
        fh.truncate(50)
    status, rec = verify_json(verify, "--expected", "7")
    assert status == 1
    assert [u["index"] for u in rec["unloadable"]] == [1]
    assert rec["gaps"] == [3] and rec["missing_after_last"] == 2
    assert rec["temporaries"] == [".data_3.pt.4242.tmp"] and rec["files"] == 4
    status, text, _ = verify()
    assert "1 unfinished temporary file(s) such as .data_3.pt.4242.tmp" in " ".join(text.split())


def test_layout_must_match_data_config(host):
    out, verify = host
    write(out, [sample(), sample()], config(layers=3, hidden=H))
    status, rec = verify_json(verify)
    assert status == 1
    assert any("4 layers of hidden size 16; data_config.json says 3 of 16" in p["problem"] for p in rec["inconsistent"])
    write(out, [sample(), sample()], config(layers=L, hidden=32))
    status, rec = verify_json(verify)
    assert status == 1 and any("says 4 of 32" in p["problem"] for p in rec["inconsistent"])
    (out / "data_config.json").write_text("{not json")
    status, rec = verify_json(verify)
    assert status == 1 and rec["config_problems"] and "does not parse" in rec["config_problems"][0]


def test_layer_count_differing_between_files(host):
    out, verify = host
    write(out, [sample(), sample(layers=L + 1)])      # no data_config.json: files compared to each other
    status, rec = verify_json(verify)
    assert status == 1 and any("differs from data_0.pt in hidden_states" in p["problem"] for p in rec["inconsistent"])


@pytest.mark.parametrize("written,asked,ok", [(3, 3, True), (3, 5, False)])
def test_expected_count_is_what_the_job_was_asked_to_write(tmp_path, sshd, cli, written, asked, ok):
    """max_samples (the shipped default 5000) larger than the dataset: the job writes data_config.json
    with num_samples = what it was asked to write, and verify counts against that (issue 22)."""
    from remote_ops.playbook import loader as pb_mod
    out = tmp_path / "out"
    out.mkdir()
    cfg = config()
    cfg["data"]["num_samples"] = asked
    write(out, [sample() for _ in range(written)], cfg)
    record_run(out, [list(range(6))] * asked, list(range(L)))
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"h": sshd.host_entry(
        sys.executable, env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")},
        playbook=str(pb_mod.find("eagle3-speculators-0.3.0")), vars={"output_dir": str(out)})}}))
    status, o, err = cli("-i", str(inv), "verify", "h", "--all", "--json")
    rec = json.loads(o)
    assert rec["ok"] is ok and status == (0 if ok else 1), rec
    assert rec["expected"] == asked and rec["expected_from"] == "data_config.json num_samples"
    assert rec["missing_after_last"] == asked - written
