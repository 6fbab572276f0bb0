"""agent/job/diskneed.py: the disk an extraction needs, from hidden size x layers x tokens, against the
REAL files the shipped script writes (its own build_sample + save_atomic, torch 2.13 on the CPU)."""

from __future__ import annotations

import json

import pytest
import torch

from remote_ops.agent.job import diskneed
from tests.conftest import EXTRACT_SCRIPT, load_extract_script

SCRIPT = EXTRACT_SCRIPT


def script():
    return load_extract_script("ehs_disk")


@pytest.mark.parametrize("hidden, layers, lengths", [
    (8, 4, [1, 2, 3]), (64, 1, [7, 100]), (256, 4, [300, 17, 2047]), (2048, 4, [2047, 1500]),
    (7168, 3, [512])])
def test_need_is_an_upper_bound_of_the_real_files_and_tight(tmp_path, hidden, layers, lengths):
    ehs = script()
    total = 0
    for i, n in enumerate(lengths):
        rec = {"input_ids": list(range(n)), "loss_mask": None, "where": "ds.jsonl:%d" % (i + 1)}
        result = {"input_ids": torch.arange(n), "loss_mask": None,
                  "hidden_states": [torch.randn(n, hidden).to(torch.bfloat16) for _ in range(layers)]}
        sample = ehs.build_sample(torch, i, rec, result, layers)
        path = tmp_path / f"data_{i}.pt"
        ehs.save_atomic(torch, sample, str(path))
        total += path.stat().st_size
    need = diskneed.need_bytes(hidden, layers, sum(lengths), len(lengths))
    assert total <= need <= total + len(lengths) * 2048     # at most 2 KiB per file above the real size


def test_the_issues_example_kimi_k25():
    """4 layers x 2,048 tokens x hidden 7,168 x 2 bytes ~ 117 MB per sample; 5,000 samples ~ 590 GB."""
    per = diskneed.need_bytes(7168, 4, 2048, 1)
    assert 117.4e6 < per < 117.5e6
    assert 587e9 < diskneed.need_bytes(7168, 4, 2048 * 5000, 5000) < 588e9


def test_verdict_refuses_in_one_line_and_notes_otherwise():
    need = diskneed.need_bytes(2048, 4, 1_000_000, 500)
    no = diskneed.verdict(2048, 4, 1_000_000, 500, free_bytes=need, where="/data/out")
    assert not no["fits"] and no["need_bytes"] == need            # 5% margin
    assert "\n" not in no["line"] and no["line"].startswith("not enough disk at /data/out: 500 more samples")
    assert "15.3 GiB" in no["line"] and "1000000 tokens x 4 layers x 2048 hidden x 2 bytes" in no["line"]
    ok = diskneed.verdict(2048, 4, 1_000_000, 500, free_bytes=int(need * 1.06), where="/data/out", estimated=True)
    assert ok["fits"] and ok["line"].startswith("disk: 500 more samples (~1000000 tokens") and ok["estimated"]
    assert diskneed.verdict(2048, 4, 10, 1, free_bytes=None)["fits"]


def write(path, rows):
    path.write_text("".join((json.dumps(r) if not isinstance(r, str) else r) + "\n" for r in rows))
    return path


def test_dataset_tokens_counts_what_the_script_will_write(tmp_path):
    ds = write(tmp_path / "ds.jsonl", [{"input_ids": [1] * 10}, "", {"input_ids": [1] * 3000},
                                       {"text": "x" * 40, "loss_mask": [1] * 10}, {"input_ids": [2] * 5},
                                       {"input_ids": [3] * 7}])
    r = diskneed.dataset_tokens(str(ds))
    assert r == {"samples": 5, "tokens": 10 + 3000 + 10 + 5 + 7, "pending_samples": 5,
                 "pending_tokens": 3032, "text_samples": 1, "extrapolated_samples": 0, "exact": False,
                 "per_dir": [{"pending_samples": 5, "pending_tokens": 3032}]}
    r = diskneed.dataset_tokens(str(ds), max_samples=2, max_model_len=2048)     # cut to 2047 like the script
    assert (r["samples"], r["tokens"], r["exact"]) == (2, 10 + 2047, True)
    out = tmp_path / "out"
    out.mkdir()
    torch.save({}, out / "data_1.pt")                                          # already written: needs nothing
    r = diskneed.dataset_tokens(str(ds), max_model_len=2048, output_dir=str(out))
    assert (r["pending_samples"], r["pending_tokens"]) == (4, 10 + 10 + 5 + 7)


def test_dataset_tokens_extrapolates_past_its_time_budget(tmp_path):
    ds = write(tmp_path / "ds.jsonl", [{"input_ids": [1] * 100}] * 4 + [{"input_ids": [1] * 999}] * 6)
    ticks = iter(range(100))
    r = diskneed.dataset_tokens(str(ds), time_budget=4.5, clock=lambda: next(ticks))
    assert r["samples"] == 10 and r["extrapolated_samples"] == 6 and not r["exact"]
    assert r["tokens"] == 4 * 100 + 6 * 100                                     # the mean of what was read
    ticks = iter(range(100))
    r = diskneed.dataset_tokens(str(ds), max_samples=7, time_budget=4.5, clock=lambda: next(ticks))
    assert r["samples"] == 7 and r["extrapolated_samples"] == 3


def test_captured_layers_follow_the_generator():
    """speculators 0.3.0's default ids repeat for small models (GPU-NOTES: 6 layers -> [2, 3, 3, 5])."""
    assert diskneed.captured_layers(None, 22) == 4 and diskneed.captured_layers("", 6) == 3
    assert diskneed.captured_layers("2,4,5,7", 8) == 4 and diskneed.captured_layers([1, 1, 3], 8) == 2


def test_preflight_counts_measures_and_refuses_in_one_line(tmp_path, monkeypatch):
    """Free space is read at the output directory's nearest existing parent (statvfs recorded and
    answered here: the disk's real free space moves while other tests write, so comparing two reads
    of it was flaky)."""
    import os
    import types
    probed = []
    real_statvfs = os.statvfs

    def statvfs(path):
        probed.append(path)
        real_statvfs(path)                                          # the real call still has to succeed
        return types.SimpleNamespace(f_bavail=1000, f_frsize=4096)
    monkeypatch.setattr(diskneed.os, "statvfs", statvfs)
    ds = write(tmp_path / "ds.jsonl", [{"input_ids": [1] * 3000}] * 10)
    v = diskneed.preflight(2048, 4, str(ds), str(tmp_path / "not" / "made" / "yet"), max_model_len=2048)
    assert v["counts"]["pending_tokens"] == 10 * 2047 and v["counts"]["exact"]
    assert probed == [str(tmp_path)] and v["free_bytes"] == 4096 * 1000
    assert not v["fits"]                                            # ~336 MB do not fit in 4 MB
    monkeypatch.setattr(diskneed.os, "statvfs", real_statvfs)
    assert diskneed.preflight(2048, 4, str(ds), str(tmp_path), max_model_len=2048)["fits"]
    huge = diskneed.preflight(7168 * 10**6, 4, str(ds), str(tmp_path), max_model_len=2048)
    assert not huge["fits"] and huge["line"].startswith(f"not enough disk at {tmp_path}: 10 more samples")


def test_for_job_reads_the_checkpoint_config_like_the_model_preflight(tmp_path):
    """jobs.probe's disk need: config.json through agent/model.py's reader (text_config of a
    multimodal wrapper too), check.model's default layer-ids formula, a dataset relative to the workdir."""
    model = tmp_path / "kimi"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                   "text_config": {"hidden_size": 7168, "num_hidden_layers": 61}}))
    write(tmp_path / "ds.jsonl", [{"input_ids": [1] * 100}] * 3)
    need = {"model": str(model), "workdir": str(tmp_path), "dataset": "ds.jsonl", "layer_ids": None,
            "default_layer_ids": [2, "n // 2", "n - 3", "n - 1"], "max_samples": 5000, "max_model_len": 2048}
    v = diskneed.for_job(need, str(tmp_path / "out"))
    assert (v["hidden_size"], v["layers"], v["tokens"], v["samples"]) == (7168, 4, 300, 3)
    assert v["need_bytes"] == diskneed.need_bytes(7168, 4, 300, 3) and v["fits"]
    assert diskneed.for_job(dict(need, layer_ids=[5, 5, 9]), str(tmp_path))["layers"] == 2
    assert "does not exist" in diskneed.for_job(dict(need, model=str(tmp_path / "nope")), str(tmp_path))["unknown"]
    assert "cannot read the dataset" in diskneed.for_job(dict(need, dataset="missing.jsonl"), str(tmp_path))["unknown"]
    (model / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    assert "no hidden_size" in diskneed.for_job(need, str(tmp_path))["unknown"]


def test_several_directories_each_take_their_share_against_their_own_filesystem(tmp_path, monkeypatch):
    """Two output directories: sample N's need goes to run_identity.dir_index's directory (files already
    in either directory need nothing); directories on one filesystem are summed against its free space once."""
    ds = write(tmp_path / "ds.jsonl", [{"input_ids": [1] * (10 * (i + 1))} for i in range(5)])
    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    torch.save({}, b / "data_3.pt")
    counts = diskneed.dataset_tokens(str(ds), output_dir=[str(a), str(b)])
    assert counts["per_dir"] == [{"pending_samples": 3, "pending_tokens": 10 + 30 + 50},   # 0, 2, 4
                                 {"pending_samples": 1, "pending_tokens": 20}]             # 1 (3 is there)
    shard = diskneed.dataset_tokens(str(ds), output_dir=[str(a), str(b)], shard=[1, 2])   # samples 1, 3
    assert shard["samples"] == 2 and shard["per_dir"] == [{"pending_samples": 1, "pending_tokens": 20},
                                                          {"pending_samples": 0, "pending_tokens": 0}]
    # one filesystem (the real one): one verdict for both, the sum of their shares
    v = diskneed.preflight(8, 1, str(ds), [str(a), str(b)])
    (fs,) = v["filesystems"]
    assert fs["dirs"] == [str(a), str(b)] and fs["tokens"] == 110 and v["fits"]
    assert v["need_bytes"] == diskneed.need_bytes(8, 1, 110, 4)
    assert "(one filesystem)" in v["line"]
    # two filesystems: each held to its own free space; the one that does not fit is the line
    monkeypatch.setattr(diskneed, "_device", lambda d: 1 if d.endswith("/a") else 2)
    free = {str(a): 10**9, str(b): diskneed.need_bytes(8, 1, 20, 1) // 2}
    monkeypatch.setattr(diskneed, "free_bytes", lambda d: free[d])
    v = diskneed.preflight(8, 1, str(ds), [str(a), str(b)])
    assert [f["fits"] for f in v["filesystems"]] == [True, False] and not v["fits"]
    assert v["line"].startswith(f"not enough disk at {b}: 1 more samples (20 tokens") and str(a) not in v["line"]
    free[str(b)] = 10**9
    v = diskneed.preflight(8, 1, str(ds), [str(a), str(b)])
    assert v["fits"] and v["line"].count("disk: ") == 2 and v["free_bytes"] == 2 * 10**9
