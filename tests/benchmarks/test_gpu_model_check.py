"""The GPU model check's pieces that run without a GPU (benchmarks/gpu/model_check.py and friends):
the router margin against an independent grouped top-k, the routing-clear masks, the measure on
synthetic outputs (a routing flip on an unclear token passes, a wrong clear row fails, the corrupted copy
fails), the Kimi vision weight names against vLLM 0.20.0's module tree, the installed-package copy and
the GPU_RESULTS.md section."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from benchmarks.evidence import kimi_weight_names as kw  # noqa: E402
from benchmarks.gpu import model_check as mc  # noqa: E402
from benchmarks.gpu import routing_compare as rc  # noqa: E402
from benchmarks.render import gpu_results  # noqa: E402

from remote_ops import pkgsource  # noqa: E402


def vllm_grouped_topk(sfc, n_group, topk_group, top_k):
    """vLLM 0.20.0 grouped_topk's selection (fused_moe/router/grouped_topk_router.py), on biased scores."""
    t, e = sfc.shape
    group_scores = sfc.view(t, n_group, -1).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = mask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, -1)
    tmp = sfc.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(tmp, k=top_k, dim=-1)[1].sort(dim=-1)[0]


@pytest.mark.parametrize("n_group,topk_group", [(4, 2), (1, 1), (4, 4)])
def test_router_margin_chooses_as_vllm_and_noise_below_it_changes_nothing(n_group, topk_group):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(400, 32, generator=g), torch.randn(8, 32, generator=g) * 0.3
    bias = torch.rand(8, generator=g) * 0.1
    margin, chosen, sfc = rc.router_margin(torch, x, w, bias, n_group, topk_group, 2)
    assert torch.equal(chosen, vllm_grouped_topk(sfc, n_group, topk_group, 2))
    assert bool((margin > 0).all())
    # a change of every score by less than the margin never changes the choice
    for seed in range(5):
        noise = (torch.rand(sfc.shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1)
        noisy = sfc + noise * (margin.unsqueeze(-1) * 0.99)
        assert torch.equal(vllm_grouped_topk(noisy, n_group, topk_group, 2), chosen)


def test_router_margin_is_tight_a_push_past_it_flips_the_choice():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(50, 16, generator=g), torch.randn(8, 16, generator=g) * 0.3
    margin, chosen, sfc = rc.router_margin(torch, x, w, None, 1, 1, 2)
    t = int(margin.argmin())
    ranked = sfc[t].sort(descending=True)[1]
    bump = torch.zeros(8)
    bump[ranked[2]] = float(margin[t]) * 2.02     # the third expert just above the second (gap = 2 x margin)
    _, chosen2, _ = rc.router_margin(torch, x[t:t + 1], w, bump, 1, 1, 2)
    assert not torch.equal(chosen2[0], chosen[t])


@pytest.mark.parametrize("n_group,topk_group", [(4, 2), (1, 1)])
def test_flip_choice_changes_the_choice(n_group, topk_group):
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(300, 16, generator=g), torch.randn(8, 16, generator=g) * 0.3
    margin, chosen, sfc = rc.router_margin(torch, x, w, torch.rand(8, generator=g) * 0.1, n_group, topk_group, 2)
    assert torch.equal(rc.select(torch, sfc, n_group, topk_group, 2), chosen)
    alt = rc.flip_choice(torch, sfc, margin, chosen, n_group, topk_group, 2)
    changed = (alt != chosen).any(dim=-1)
    if n_group == 1:
        assert bool(changed.all())
    else:   # a group swap that drops a group without a chosen expert changes nothing: the margin is conservative
        assert float(changed.float().mean()) > 0.8


def test_clear_masks_own_and_causal():
    m = {2: torch.tensor([0.5, 0.001, 0.5, 0.5]), 4: torch.tensor([0.5, 0.5, 0.5, 0.001])}
    assert rc.clear_masks(torch, m, 1, 0.01) == (None, None)            # before any MoE layer
    own, causal = rc.clear_masks(torch, m, 2, 0.01)
    assert own.tolist() == [True, False, True, True] and causal.tolist() == own.tolist()
    own, causal = rc.clear_masks(torch, m, 4, 0.01)
    assert own.tolist() == [True, False, True, False]
    assert causal.tolist() == [True, False, False, False]              # token 1's flip at layer 2 reaches 2, 3


def _synthetic(tmp_path, n=5, tokens=12, layers=(1, 3), hidden=16):
    g = torch.Generator().manual_seed(3)
    rows = [[1] + [4 + i + j for j in range(tokens - 1 + i)] for i in range(n)]
    refs = [{l: torch.randn(len(r), hidden, generator=g) for l in layers} for r in rows]
    out = tmp_path / "out"
    out.mkdir()
    for i, (r, ref) in enumerate(zip(rows, refs)):
        torch.save({"input_ids": torch.tensor(r), "hidden_states": [ref[l].to(torch.bfloat16) for l in layers],
                    "loss_mask": torch.ones(len(r), dtype=torch.long)}, out / f"data_{i}.pt")
    return rows, refs, out, list(layers)


def _measure(d, rows, refs, layers, margins=None, thr=0.01, moe=True):
    """Layer 1 dense, layer 3 MoE; every router clear unless ``margins`` {sample: {3: margin [T]}} says not."""
    m = rc.Measure("x")
    files = rc.sample_files(d)
    for i, ids in enumerate(rows):
        mg = (margins or {}).get(i) or {3: torch.full((len(ids),), 0.5)}
        masks = {l: rc.clear_masks(torch, mg, l, thr) for l in layers}
        rc.measure_file(torch, m, files[i].name, torch.load(files[i]), ids, layers, refs[i], None, masks,
                        min(mg) if moe else None)
    return m.summary(moe, len(rows), 0.5)


def test_measure_tolerates_a_flip_on_an_unclear_token_only(tmp_path):
    rows, refs, out, layers = _synthetic(tmp_path)
    assert _measure(out, rows, refs, layers)["ok"]
    # sample 0, token 5: a wrong row at the MoE layer 3 (as a routing flip gives)
    d = torch.load(out / "data_0.pt")
    d["hidden_states"][1][5] = -d["hidden_states"][1][5]
    torch.save(d, out / "data_0.pt")
    t = len(rows[0])
    unclear = {0: {3: torch.tensor([0.5] * 5 + [0.001] + [0.5] * (t - 6))}}
    r = _measure(out, rows, refs, layers, margins=unclear)
    assert r["ok"] and r["below_tolerance"] == 1 and r["routing_clear_below_tolerance"] == 0
    clear = {0: {3: torch.full((t,), 0.5)}}
    r = _measure(out, rows, refs, layers, margins=clear)
    assert not r["ok"] and r["fails_on"] == ["cosine (routing-clear tokens below tolerance)"]
    assert not _measure(out, rows, refs, layers, moe=False)["ok"]        # dense: every token counts


def test_the_corrupted_copy_fails_on_ids_and_on_cosine(tmp_path):
    rows, refs, out, layers = _synthetic(tmp_path)
    info = rc.corrupt_copy(out, tmp_path / "neg")
    assert info["rows_shuffled_in"] not in info["swapped"]
    r = _measure(tmp_path / "neg", rows, refs, layers)
    assert not r["ok"]
    assert "ids" in r["fails_on"] and any(f.startswith("cosine") for f in r["fails_on"])
    assert _measure(out, rows, refs, layers)["ok"]                        # the original is untouched


def test_kimi_vision_weight_names_are_vllm_0_20_0_parameters():
    root = Path(pkgsource.unpacked("vllm", "0.20.0")) / "vllm"
    res = kw.cross_check(root)
    assert res["only_in_checkpoint"] == [] and res["only_in_vllm"] == []
    assert len(res["confirmed"]) == res["written"] == 23
    assert res["renamed_by_mapper"]["mm_projector.proj.0.weight"] == "mm_projector.linear_1.weight"


def test_the_weight_name_walk_can_fail():
    src = (Path(pkgsource.unpacked("vllm", "0.20.0")) / "vllm" / kw.FILES[0]).read_text()
    walker = kw.Walker([src.replace("self.wqkv = QKVParallelLinear", "self.qkv = QKVParallelLinear")], repeat=1)
    names = walker.params("MoonViT3dPretrainedModel", "vision_tower")
    assert "vision_tower.encoder.blocks.0.qkv.weight" in names
    assert "vision_tower.encoder.blocks.0.wqkv.weight" not in names


def test_package_copy_says_whether_it_is_as_installed(tmp_path):
    site = tmp_path / "site"
    pkg = site / "speculators" / "data_generation"
    pkg.mkdir(parents=True)
    files = {"speculators/__init__.py": b"", "speculators/data_generation/custom_worker.py": b"x = 1\n"}
    record = []
    for rel, data in files.items():
        (site / rel).write_bytes(data)
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{rel},sha256={h},{len(data)}")
    (site / "speculators-0.3.0.dist-info").mkdir()
    (site / "speculators-0.3.0.dist-info" / "RECORD").write_text("\n".join(record) + "\n")
    r = mc.copy_package_as_installed(site, tmp_path / "spec")
    assert r["as_installed"] and r["generator_files_as_installed"]
    (site / "speculators/data_generation/custom_worker.py").write_text("x = 2\n")   # patched in place
    r = mc.copy_package_as_installed(site, tmp_path / "spec")
    assert not r["as_installed"] and r["differ_from_record"] == ["speculators/data_generation/custom_worker.py"]
    assert not r["generator_files_as_installed"]
    # a copy for a run that patches it: the patched-in-place file comes back from the bundle's tar
    import tarfile
    pristine = tmp_path / "pristine.py"
    pristine.write_bytes(files["speculators/data_generation/custom_worker.py"])
    bundle = tmp_path / "bundle.tar.gz"
    with tarfile.open(bundle, "w:gz") as tf:
        tf.add(pristine, arcname="site/speculators/data_generation/custom_worker.py")
    r = mc.pristine_package_copy(site, tmp_path / "spec", bundle)
    assert r["as_installed"] and r["restored_from_bundle"] == ["speculators/data_generation/custom_worker.py"]
    assert r["site_differed_from_record"] == ["speculators/data_generation/custom_worker.py"]
    assert (tmp_path / "spec/speculators/data_generation/custom_worker.py").read_bytes() == b"x = 1\n"
    assert (site / "speculators/data_generation/custom_worker.py").read_text() == "x = 2\n"   # site untouched
    r = mc.pristine_package_copy(site, tmp_path / "spec", None)      # no bundle: said, not hidden
    assert not r["as_installed"] and "restored_from_bundle" not in r


def test_gpu_results_renders_the_model_section(tmp_path):
    doc = {"tensor_parallel_size": 1, "gpus": ["NVIDIA H200"], "versions": {"vllm": "0.20.0"}, "elapsed_s": 301.5,
           "steps": {"build": {"layer_ids": "1,3,5,7", "dataset": {"samples": 24, "tokens": 9011}}},
           "models": {"deepseek_v3": {"family": "DeepSeek-V3", "outcome": "works",
                                      "extract": {"rc": 0, "files": 24, "expected": 24, "seconds": 80.2},
                                      "compare": {"result": {
                                          "moe_layers": [2, 3], "margin_threshold": 0.01,
                                          "output": {"tokens_compared": 36044, "within_tolerance_share": 0.985,
                                                     "min_cosine": 0.72, "moe_layer_routing_clear_share": 0.9,
                                                     "routing_clear_within_tolerance_share": 1.0,
                                                     "min_cosine_routing_clear": 0.9993},
                                          "negative_control": {"ok": False, "fails_on": ["ids", "cosine"]},
                                          "bf16_reference_vs_float32": {"share_routed_differently": 0.012}}}}}}
    f = tmp_path / "gpu_models_tp1.json"
    f.write_text(json.dumps(doc))
    text = "\n".join(gpu_results.render_models([f]))
    assert "| DeepSeek-V3 | 1 | 0.20.0 | works | gpu_models_tp1.json |" in text
    assert "36044" in text and "98.50 %" in text and "0.9993" in text and "fails on ids, cosine" in text


def _verdict(extract, compare=None, name="kimi_k25"):
    import types
    doc = {"models": {name: {"extract": extract, "compare": {"result": compare} if compare else {}}}}
    h = mc.ModelCheck.__new__(mc.ModelCheck)
    h.args, h.samples = types.SimpleNamespace(models=[name], dry=False), 24
    h.run = types.SimpleNamespace(doc=doc, save=lambda: None)
    h.verdict()
    return doc["models"][name]["outcome"], doc["verdict"][name]


def test_verdict_outcomes():
    ok = {"ok": True, "negative_control_fails": True}
    assert _verdict({"rc": 0, "files": 24}, ok) == ("works", True)
    assert _verdict({"rc": 0, "files": 24}, {"ok": True, "negative_control_fails": False}) == ("failed", False)
    assert _verdict({"rc": 0, "files": 23}, ok) == ("failed", False)
    refusal = {"rc": 8, "files": 0, "message": "preflight refused: KimiK25ForConditionalGeneration has no model"}
    assert _verdict(refusal) == ("refused before the engine started", True)
    assert _verdict(refusal, name="deepseek_v3") == ("failed", False)
    gpu = {"rc": 8, "files": 0, "message": "the job needs 1 GPU(s)",   # the class named elsewhere only
           "preflight": {"problems": ["the job needs 1 GPU(s)"], "model": "KimiK25ForConditionalGeneration"}}
    assert _verdict(gpu) == ("failed", False)
