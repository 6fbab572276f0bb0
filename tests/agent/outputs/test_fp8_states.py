"""verify of FP8 hidden-state files (hs_connectors' FP8HiddenStatesConnector): files written by hs_connectors'
own quantisation code pass; a missing or misshapen scales tensor, a NaN code, a bad scale fail."""

import json
import struct
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from remote_ops.agent.outputs import safetensors as verify_hs  # noqa: E402
from tests.helpers_ops import drain  # noqa: E402

from remote_ops import pkgsource  # noqa: E402

HS_SRC = pkgsource.unpacked("hs-connectors", "0.9.0")   # the real wheel from PyPI (cached), never a skip


@pytest.fixture(scope="module")
def fp8_utils():
    sys.path.insert(0, str(HS_SRC))
    try:
        from hs_connectors import fp8_utils
        yield fp8_utils
    finally:
        sys.path.remove(str(HS_SRC))


def states(seed, seq, layers=3, hidden=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(seq, layers, hidden, generator=g)
    x[:, :, 5] *= 30
    return x.to(torch.bfloat16)


def write_fp8(fp8_utils, path, seed, seq, **replace):
    """What FP8HiddenStatesConnector._write_tensors saves (hs_connectors/fp8_hidden_states_connector.py)."""
    tensors = {"hidden_states": states(seed, seq), "token_ids": torch.arange(seq, dtype=torch.int64)}
    fp8, scales = fp8_utils.quantize_tensor_to_fp8(tensors["hidden_states"])
    out = {**tensors, "hidden_states": fp8, fp8_utils.SCALES_KEY: scales, **replace}
    st.save_file({k: v for k, v in out.items() if v is not None}, str(path))
    return tensors["hidden_states"], fp8, scales


def set_byte(path, tensor, k, value):
    """Byte k of ``tensor``'s data in a written file set to ``value``."""
    raw = bytearray(path.read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    begin = json.loads(raw[8:8 + n])[tensor]["data_offsets"][0]
    raw[8 + n + begin + k] = value
    path.write_bytes(bytes(raw))


def test_connector_written_fp8_files_pass_and_dequantise_as_training_does(tmp_path, fp8_utils):
    for i, seq in enumerate((4, 9, 6)):
        bf16, fp8, scales = write_fp8(fp8_utils, tmp_path / f"hs_{i}.safetensors", i, seq)
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": 3, "all": True}))
    # every check of the files passes (no run.json here: the run identity is not this test's subject)
    assert (res["inconsistent_count"], res["non_finite_count"], res["unloadable_count"], res["gap_count"]) == \
        (0, 0, 0, 0), res
    assert res["dtypes"] == ["F8_E4M3"] and res["checked"] == 3 and res["layers_hidden"] == [[3, 16]]
    header, start, problem = verify_hs.read_header(str(tmp_path / "hs_2.safetensors"))
    assert problem is None and header["hidden_states"]["dtype"] == "F8_E4M3"
    ids, got = verify_hs.load_states(torch, str(tmp_path / "hs_2.safetensors"), header, start)
    want = fp8_utils.dequantize_fp8_tensor(fp8, scales, dtype=torch.float32)
    assert ids.tolist() == list(range(6)) and torch.equal(got, want)
    assert torch.nn.functional.cosine_similarity(got, bf16.float(), dim=-1).min() > 0.99


@pytest.mark.parametrize("case,replace,problem", [
    ("no-scales", {"hidden_states_scales": None},
     "hidden_states is F8_E4M3 without hidden_states_scales: the states cannot be dequantised"),
    ("per-layer-scales", {"hidden_states_scales": torch.ones(5, 3, 1)},
     "hidden_states_scales has shape [5, 3, 1], not [5, 1, 1] (one scale per token)"),
    ("scales-short", {"hidden_states_scales": torch.ones(4, 1, 1)},
     "hidden_states_scales has shape [4, 1, 1], not [5, 1, 1] (one scale per token)"),
    ("bf16-scales", {"hidden_states_scales": torch.ones(5, 1, 1, dtype=torch.bfloat16)},
     "hidden_states_scales has dtype BF16, not F32"),
])
def test_a_wrong_scales_tensor_is_a_problem_loaded_or_not(tmp_path, fp8_utils, case, replace, problem):
    for i in range(6):
        write_fp8(fp8_utils, tmp_path / f"hs_{i}.safetensors", i, 5, **(replace if i in (0, 3) else {}))
    # sample 2: files 0 and 5 are loaded, 3 is judged from its header alone
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": 6, "sample": 2, "seed": 0}))
    assert not res["ok"]
    found = {p["index"]: p["problem"] for p in res["inconsistent"]}
    assert set(found) == {0, 3}, found
    assert problem in found[0] and found[3] == "hs_3.safetensors: " + problem


def test_scales_beside_bf16_states_are_a_problem(tmp_path):
    st.save_file({"hidden_states": states(0, 4), "token_ids": torch.arange(4), "hidden_states_scales":
                  torch.ones(4, 1, 1)}, str(tmp_path / "hs_0.safetensors"))
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": 1, "all": True}))
    assert not res["ok"] and "hidden_states_scales beside BF16 hidden_states" in res["inconsistent"][0]["problem"]


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_a_nan_code_is_found(tmp_path, fp8_utils, code):
    for i in range(3):
        write_fp8(fp8_utils, tmp_path / f"hs_{i}.safetensors", i, 5)
    set_byte(tmp_path / "hs_1.safetensors", "hidden_states", 17, code)
    assert torch.isnan(st.load_file(str(tmp_path / "hs_1.safetensors"))["hidden_states"].float()).sum() == 1
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": 3, "all": True}))
    assert not res["ok"] and res["non_finite"] == [{"index": 1, "problem": "hidden_states has 1 NaN/inf values "
                                                                            "(FP8 codes)"}]


def test_largest_finite_code_is_not_nan_and_a_bad_scale_is(tmp_path, fp8_utils):
    write_fp8(fp8_utils, tmp_path / "hs_0.safetensors", 0, 5)
    set_byte(tmp_path / "hs_0.safetensors", "hidden_states", 3, 0x7E)      # 448, e4m3fn's largest
    write_fp8(fp8_utils, tmp_path / "hs_1.safetensors", 1, 5,
              hidden_states_scales=torch.tensor([1.0, float("inf"), 0.0, 1.0, 1.0]).reshape(5, 1, 1))
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": 2, "all": True}))
    assert not res["ok"] and res["non_finite"] == [{"index": 1, "problem": "hidden_states_scales has 2 NaN/inf "
                                                                            "or non-positive values"}]
