"""verify of hs_<N>.safetensors outputs bounds what counts by the run's size, as for data_<N>.pt (agent/verify.py
_counts): files beyond it (a larger run's leftovers, or several clients' shares of a run stopped and relaunched with
a smaller max_samples) are named as extra, never counted and never make gaps."""

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

from remote_ops.agent.outputs import safetensors as verify_hs  # noqa: E402
from tests.helpers_ops import drain  # noqa: E402


def write(d, i, seq=4, layers=3, hidden=8):
    st.save_file({"hidden_states": torch.randn(seq, layers, hidden).to(torch.bfloat16),
                  "token_ids": torch.arange(seq, dtype=torch.int64)}, str(d / f"hs_{i}.safetensors"))


def test_files_beyond_the_runs_size_are_extra_not_gaps(tmp_path):
    # three clients' shares of 30 rows stopped early (0-2, 10-12, 20-22), then the run relaunched with 6 samples
    for i in (0, 1, 2, 3, 4, 5, 10, 11, 20, 21, 22):
        write(tmp_path, i)
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected_default": 6, "all": True}))
    assert res["files"] == 6 and res["expected"] == 6 and res["gap_count"] == 0 and res["missing_after_last"] == 0
    assert res["extra_count"] == 5 and res["extra"][0] == "hs_10.safetensors" and res["checked"] == 6
    assert not res["ok"]
    assert len(res["name_problems"]) == 1 and any("5 file(s) beyond this run's 6 samples, e.g. hs_10.safetensors" in p for p in res["name_problems"])
    # the whole run: nothing extra, no name problem (no run.json here: the identity's own problem stays)
    for i in range(30):
        write(tmp_path, i)
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected_default": 30, "all": True}))
    assert res["extra_count"] == 0 and res["files"] == 30 and res["name_problems"] == [] and res["gap_count"] == 0
    # no size known: every file counts (the gaps are below the highest)
    (tmp_path / "hs_7.safetensors").unlink()
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "all": False}))
    assert res["gaps"] == [7] and res["extra_count"] == 0 and not res["ok"]
