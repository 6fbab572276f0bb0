"""Baseline drift facts kept between commands (remote_ops/check/baseline_memo.py): the same
analysis from the kept copy, on the real speculators 0.3.0 and vLLM 0.11.0 (baseline) / 0.20.0."""

from __future__ import annotations

import json
import shutil

from remote_ops import pkgsource
from remote_ops.agent.compat import op_check
from remote_ops.check import baseline_memo
from remote_ops.check import drift


def _raw():
    return op_check({"sys_path": [str(pkgsource.unpacked("speculators", "0.3.0")),
                                  str(pkgsource.unpacked("vllm", "0.20.0"))], "drift": True})


def test_the_second_analysis_reads_the_kept_facts_and_says_the_same(tmp_path, monkeypatch):
    raw = _raw()
    first = drift.analyse(json.loads(json.dumps(raw)), ["vllm"], None)
    kept = list(tmp_path.joinpath("drift-cache").glob("*.json"))
    assert len(kept) == 1 and first["baseline"]["version"] == "0.11.0" and first["drift"]
    calls = []
    real = drift.drift_facts.replay_facts
    monkeypatch.setattr(drift.drift_facts, "replay_facts", lambda *a, **k: calls.append(1) or real(*a, **k))
    second = drift.analyse(json.loads(json.dumps(raw)), ["vllm"], None)
    assert calls == []                                   # not recomputed
    assert second["drift"] == first["drift"] and second["drift_notes"] == first["drift_notes"]
    kept[0].write_text("{not json")                      # damaged: recomputed, and the same again
    third = drift.analyse(json.loads(json.dumps(raw)), ["vllm"], None)
    assert calls == [1] and third["drift"] == first["drift"]


def test_a_baseline_directory_of_the_users_is_never_kept(tmp_path):
    mine = tmp_path / "mine"
    shutil.copytree(pkgsource.unpacked("vllm", "0.11.0"), mine, symlinks=True)
    out = drift.analyse(_raw(), ["vllm"], str(mine))
    assert out["baseline"]["path"] == str(mine) and out["drift"]
    assert not list(tmp_path.joinpath("drift-cache").glob("*.json"))
    assert baseline_memo.entry({"library": "vllm", "version": "x", "path": str(mine)}, []) is None
