"""benchmarks/gpu/fp8_check.py on CPU: real safetensors files, hs_connectors' own quantisation code."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "fp8_check.py"
from remote_ops import pkgsource  # noqa: E402

HS_SRC = pkgsource.unpacked("hs-connectors", "0.9.0")   # the real wheel from PyPI (cached), never a skip


def states(seed, seq, layers=4, hidden=256):
    """bf16 states shaped like a decoder's: Gaussian, a few outlier channels 40x, the last layer 8x larger."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(seq, layers, hidden, generator=g)
    x[:, :, [3, 77, 200]] *= 40
    x[:, -1] *= 8
    return x.to(torch.bfloat16)


def write(d, i, hs):
    st.save_file({"hidden_states": hs, "token_ids": torch.arange(hs.shape[0], dtype=torch.int64)},
                 str(d / f"hs_{i}.safetensors"))


def run(d, out, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), str(d), "--out", str(out), "--hs-connectors", str(HS_SRC),
                           "--code-rev", "test", *extra], capture_output=True, text=True, timeout=300)


def test_every_vector_within_threshold_and_fp8_files_written(tmp_path):
    d = tmp_path / "bf16"
    d.mkdir()
    for i, seq in enumerate((5, 17, 33)):
        write(d, i, states(i, seq))
    out, fp8_dir = tmp_path / "fp8.json", tmp_path / "fp8"
    p = run(d, out, "--write-fp8", str(fp8_dir))
    assert p.returncode == 0, p.stderr + p.stdout
    r = json.loads(out.read_text())
    assert r["ok"] and r["files"] == 3 and r["below"] == 0
    assert r["vectors"] == (5 + 17 + 33) * 4                  # every token x layer
    assert 0.999 <= r["min_cosine"] <= r["mean_cosine"] < 1.0  # quantised: close, not exact
    assert r["below_levels"]["0.999"] == 0 and r["below_levels"]["0.99"] == 0
    assert r["below_levels"]["0.9999"] >= r["below_levels"]["0.9995"] > 0     # FP8 is not lossless
    assert r["bytes_fp8_with_scales"] == 55 * 4 * 256 + 55 * 4 and r["bytes_hidden_states_bf16"] == 55 * 4 * 256 * 2
    assert r["hs_connectors"]["path"] == str(HS_SRC / "hs_connectors")
    assert [f["file"] for f in r["per_file"]] == ["hs_0.safetensors", "hs_1.safetensors", "hs_2.safetensors"]
    # the files written are the connector's format: F8_E4M3 states and float32 per-token scales
    header = json.loads((fp8_dir / "hs_1.safetensors").read_bytes()[8:8 + int.from_bytes(
        (fp8_dir / "hs_1.safetensors").read_bytes()[:8], "little")])
    assert header["hidden_states"]["dtype"] == "F8_E4M3" and header["hidden_states"]["shape"] == [17, 4, 256]
    assert header["hidden_states_scales"] == {**header["hidden_states_scales"], "dtype": "F32", "shape": [17, 1, 1]}


def test_fails_when_a_vector_is_off(tmp_path):
    """One layer of one token 1e-6 of the token's largest value: below FP8's smallest step at that token's
    scale, it dequantises to zero (cosine 0), and the script exits 1 naming the file, token and layer."""
    d = tmp_path / "bf16"
    d.mkdir()
    write(d, 0, states(0, 9))
    bad = states(1, 9).float()
    bad[6, 1] = bad[6, 1] / bad[6, 1].abs().max() * 1e-6 * bad[6].abs().max()
    write(d, 1, bad.to(torch.bfloat16))
    out = tmp_path / "fp8.json"
    p = run(d, out)
    assert p.returncode == 1, p.stderr + p.stdout
    r = json.loads(out.read_text())
    assert not r["ok"] and r["below"] >= 1 and r["min_cosine"] < 0.5
    assert r["below_levels"]["0.999"] == r["below"] and r["below_levels"]["0.99"] >= 1
    good, worst = r["per_file"]
    assert good["below"] == 0 and worst["below"] >= 1 and worst["worst"] == {"token": 6, "layer": 1}
    assert r["per_layer_min"][1] == worst["min_cosine"]


def test_no_files_is_a_failure(tmp_path):
    out = tmp_path / "fp8.json"
    p = run(tmp_path, out)
    assert p.returncode == 1 and json.loads(out.read_text())["files"] == 0
    assert run(tmp_path / "absent", out).returncode == 2
