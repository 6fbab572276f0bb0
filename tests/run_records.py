"""Test helper: the run.json (remote_ops/agent/outputs/run_identity.py) of files a test writes itself,
so that verify can hold them to a run: a JSONL dataset whose line i is sample i's token ids."""

from __future__ import annotations

import json
from pathlib import Path

from remote_ops.agent.outputs import run_identity as ri


def record_run(out: Path, token_ids: list[list[int]], layer_ids: list[int], max_model_len: int | None = None) -> dict:
    """Write ``out``/../dataset.jsonl (line i: ``token_ids[i]``) and ``out``/run.json naming it."""
    ds = Path(out).parent / "dataset.jsonl"
    ds.write_text("".join(json.dumps({"input_ids": list(ids)}) + "\n" for ids in token_ids))
    ident = {"dataset": ri.dataset_facts(str(ds), None), "model": None, "layer_ids": list(layer_ids),
             "max_model_len": max_model_len, "flow": "generator", "playbook": None, "shard": None, "versions": {}}
    return ri.write(str(out), ident)
