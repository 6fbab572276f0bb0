"""The verify --logits GPU check's pieces that run without a GPU (benchmarks/gpu/logits_check.py): the doctored
copies replace exactly the last captured tensor (a wrong layer, a perturbation of the stated size), and the
control playbook is the shipped server-flow playbook less --no-enable-prefix-caching, and still loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

torch = pytest.importorskip("torch")

from benchmarks.gpu import logits_check as lc  # noqa: E402


def _run(tmp_path):
    src = tmp_path / "out"
    src.mkdir()
    (src / "run.json").write_text("{}")
    g = torch.Generator().manual_seed(1)
    for i in range(3):
        hs = [torch.randn(5, 8, generator=g).to(torch.bfloat16) for _ in range(4)]
        torch.save({"input_ids": torch.arange(5), "hidden_states": hs, "loss_mask": torch.ones(5)}, src / f"data_{i}.pt")
    return src


@pytest.mark.parametrize("how", ["wrong-layer", "perturbed", "perturbed-small"])
def test_doctor_replaces_only_the_last_tensor(tmp_path, how):
    src = _run(tmp_path)
    dst = tmp_path / how
    r = subprocess.run([sys.executable, "-c", lc.DOCTOR, str(src), str(dst), how, str(lc.DOCTORED[how] or 0)],
                       capture_output=True, text=True, check=True)
    assert json.loads(r.stdout)["files"] == 3 and (dst / "run.json").exists()
    for i in range(3):
        a = torch.load(src / f"data_{i}.pt", weights_only=True)
        b = torch.load(dst / f"data_{i}.pt", weights_only=True)
        assert torch.equal(a["input_ids"], b["input_ids"]) and len(b["hidden_states"]) == 4
        assert all(torch.equal(x, y) for x, y in zip(a["hidden_states"][:-1], b["hidden_states"][:-1]))
        last, new = a["hidden_states"][-1].float(), b["hidden_states"][-1].float()
        if how == "wrong-layer":
            assert torch.equal(b["hidden_states"][-1], a["hidden_states"][-2])
        else:
            rel = ((new - last).pow(2).mean(-1).sqrt() / last.pow(2).mean(-1).sqrt()).mean().item()
            assert abs(rel - lc.DOCTORED[how]) < 0.5 * lc.DOCTORED[how], rel


def test_control_playbook_drops_only_the_prefix_caching_flag(tmp_path):
    from remote_ops.playbook.loader import load as load_playbook
    text = lc.gfc.PB090.read_text()
    lines = [line for line in text.splitlines(keepends=True) if '"--no-enable-prefix-caching",' not in line]
    assert len(text.splitlines()) - len(lines) == 1
    p = tmp_path / "eagle3-speculators-0.9.0-prefix-caching-on.yaml"
    p.write_text("".join(lines))
    pb = load_playbook(p)
    assert "--no-enable-prefix-caching" not in json.dumps(pb.extract["server"]["command"])
    assert "--no-enable-prefix-caching" in json.dumps(load_playbook(lc.gfc.PB090).extract["server"]["command"])


def test_results_section_reads_every_figure_from_the_json(tmp_path):
    from benchmarks.render import gpu_logits_results as glr
    d = json.loads((REPO / "benchmarks" / "results" / "gpu_logits_tp1.json").read_text())
    p = tmp_path / "gpu_logits_x.json"
    p.write_text(json.dumps(d))
    text = glr.render(p)
    c = d["steps"]["logits_deepseek_v3"]["correct"]["logits"]
    assert f"| deepseek_v3 | the run's files | pass | 0 | yes | {100 * c['top1']:.2f}% | {c['mean_abs_delta']:.4f} |" in text
    # a case that did not go as expected reads NO in the last column
    d["steps"]["logits_kimi_k25"]["perturbed"]["logits"]["ok"] = True
    d["steps"]["logits_kimi_k25"]["perturbed"]["rc"] = 0
    p.write_text(json.dumps(d))
    row = [line for line in glr.render(p).splitlines() if line.startswith("| kimi_k25 | last tensor + noise of 10%")][0]
    assert row.endswith("| NO |")
