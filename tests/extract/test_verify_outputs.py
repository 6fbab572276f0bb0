"""`remote-ops verify` over a real sshd, with the host's real torch: NaN/inf in hidden states and
shape/dtype/layout differences between samples are found and reported (JSON and human output), and a
consistent set is reported clean (so the checks are not just failing everything)."""

from __future__ import annotations

import pytest

from tests.run_records import record_run
from tests.extract.test_jobs import Env, cli_json

torch = pytest.importorskip("torch")

LAYERS, HIDDEN = 3, 8


def sample(tokens: int = 5, dtype=torch.float32, ids_dtype=torch.long, mask_len: int | None = None,
           rows: int | None = None) -> dict:
    g = torch.Generator().manual_seed(tokens)
    return {"input_ids": torch.arange(tokens, dtype=ids_dtype),
            "hidden_states": [torch.randn(rows or tokens, HIDDEN, generator=g).to(dtype) for _ in range(LAYERS)],
            "loss_mask": torch.ones(mask_len or tokens, dtype=torch.long)}


def write(out, samples: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, s in samples.items():
        torch.save(s, out / f"data_{i}.pt")


def test_consistent_outputs_are_clean(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, extract={"expected_samples": 4})
    write(tmp_path / "out", {i: sample(tokens=4 + i) for i in range(4)})
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and not rec["ok"] and not rec["identity"]["recorded"]    # files of no known run
    record_run(tmp_path / "out", [list(range(4 + i)) for i in range(4)], list(range(LAYERS)))
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"], (err, rec)
    assert rec["identity"]["ids_compared"] == 4 and rec["identity"]["ids_differ"] == 0
    assert rec["checked"] == 4 and rec["non_finite_count"] == 0 and rec["inconsistent_count"] == 0


def test_nan_and_inf_in_hidden_states_are_found(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, extract={"expected_samples": 4})
    bad_nan, bad_inf = sample(tokens=6), sample(tokens=7)
    bad_nan["hidden_states"][1][2, 3] = float("nan")
    bad_inf["hidden_states"][2][0, 0] = float("inf")
    bad_inf["hidden_states"][2][1, 1] = float("-inf")
    write(tmp_path / "out", {0: sample(), 1: bad_nan, 2: bad_inf, 3: sample(tokens=8)})
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and not rec["ok"], err
    assert [(n["index"], n["problem"]) for n in rec["non_finite"]] == [
        (1, "hidden_states[1] has 1 NaN/inf values"), (2, "hidden_states[2] has 2 NaN/inf values")]
    assert rec["inconsistent_count"] == 0
    status, out, _ = cli(*env.argv("verify", "testhost", "--all"))
    assert status == 1 and "NaN/inf: data_1.pt hidden_states[1] has 1 NaN/inf values" in out, out


def test_shape_and_dtype_differences_are_found(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd, extract={"expected_samples": 5})
    write(tmp_path / "out", {
        0: sample(),                                   # the reference
        1: sample(dtype=torch.float16),                # hidden states in another dtype
        2: sample(ids_dtype=torch.float32),            # token ids as floats
        3: sample(tokens=5, rows=4),                   # 4 hidden-state rows for 5 tokens
        4: sample(tokens=5, mask_len=3),               # loss mask shorter than the tokens
    })
    s, rec, err = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and not rec["ok"], err
    problems = {(i["index"], i["problem"]) for i in rec["inconsistent"]}
    assert (1, "differs from data_0.pt in hidden_states") in problems
    assert (2, "differs from data_0.pt in input_ids") in problems
    assert (2, "input_ids has dtype torch.float32, not an integer type") in problems
    assert {(3, f"hidden_states[{k}] has 4 rows for 5 tokens") for k in range(LAYERS)} <= problems
    assert (4, "loss_mask length 3 != input_ids length 5") in problems
    assert not any(i == 0 for i, _ in problems) and rec["non_finite_count"] == 0
    status, out, _ = cli(*env.argv("verify", "testhost", "--all"))
    assert status == 1 and "inconsistent: data_1.pt differs from data_0.pt in hidden_states" in out, out
