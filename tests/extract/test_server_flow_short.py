"""A resume of the server flow rewrites a whole hs_<N>.safetensors whose shape differs from its token ids (vLLM #44485's short states): speculators' client counts any file whose header parses as done, so the launch
sets such a file aside (.short-<UTC>/) and the client writes that sample again; verify names it before, and is clean
after. Over the real sshd with the sandbox's stand-ins (tests/extract/test_server_flow.py's Env)."""

from __future__ import annotations

import json
import struct

import pytest

from tests.extract.test_server_flow import LAYERS, Env, assert_sample_is_row, cli_json, read_sample

pytestmark = pytest.mark.timeout(180)


def write_short(path, rows_kept):
    """The file rewritten whole with only its first ``rows_kept`` hidden-state rows (token_ids unchanged)."""
    import torch
    t = read_sample(path)
    hs = t["hidden_states"][:rows_kept].contiguous()
    ids = t["token_ids"].contiguous()
    blobs = [hs.view(torch.uint8).numpy().tobytes(), ids.numpy().tobytes()]
    header = {"hidden_states": {"dtype": "BF16", "shape": list(hs.shape), "data_offsets": [0, len(blobs[0])]},
              "token_ids": {"dtype": "I64", "shape": list(ids.shape),
                            "data_offsets": [len(blobs[0]), len(blobs[0]) + len(blobs[1])]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def test_resume_rewrites_a_short_file(tmp_path, sshd, cli):
    env = Env(tmp_path, sshd)
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    short = env.out / "hs_5.safetensors"
    n = read_sample(short)["token_ids"].shape[0]
    write_short(short, n - 3)
    kept = (env.out / "hs_9.safetensors").stat().st_mtime_ns
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 1 and any(i["index"] == 5 and f"{n - 3} rows for {n} tokens" in i["problem"]
                          for i in rec["inconsistent"]), rec["inconsistent"]
    status, out, err = cli(*env.argv("extract", "testhost", "--tail"))
    assert status == 0, err + out
    assert "remote-ops: 1 sample file(s) whose shape differs from their token ids moved to" in out
    assert "Saved 1 new data points" in out
    assert_sample_is_row(short, 5)
    assert read_sample(short)["hidden_states"].shape[1] == LAYERS
    aside = list(env.out.glob(".short-*/hs_5.safetensors"))
    assert len(aside) == 1 and read_sample(aside[0])["hidden_states"].shape[0] == n - 3
    assert (env.out / "hs_9.safetensors").stat().st_mtime_ns == kept
    s, rec, _ = cli_json(cli, env, "verify", "testhost", "--all")
    assert s == 0 and rec["ok"] and rec["files"] == 12, rec
