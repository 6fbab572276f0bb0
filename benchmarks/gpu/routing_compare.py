"""Compare extracted hidden states with a transformers forward, telling expert-routing flips from wrong data.

    python benchmarks/gpu/routing_compare.py --ref-model DIR --hs-dir OUT --dataset data.jsonl [--neg-dir DIR]
                                  [--device cuda] [--fake-engine] [--json result.json]

A bf16 engine and a float32 reference take different experts for tokens whose router is nearly tied
(issue 22: 1.5 % of token vectors below cosine 0.999 in the MoE layers of a tiny DeepSeek-V3). To separate
those from wrong rows, two references run on the dataset's own ids:
  - float32, with a forward hook on every MoE router (DeepseekV3TopkRouter) recording per token the
    routing margin as noaux_tc selects, on the sigmoid scores plus e_score_correction_bias: the largest
    change of every score that cannot change the experts chosen (from the gap between the topk_group-th
    and the next group score, a group scoring its top-2 experts, and the gap between the k-th and the
    (k+1)-th expert inside the chosen groups; see router_margin);
  - bf16 (the engine's dtype), recorded beside it: cosine against the engine, and how often its own
    routing differs from float32's (the size of the effect, measured, not assumed).
A token is routing-clear at layer L when (1) its own routers at every MoE layer <= L have a margin above
the threshold, and (2) it is insensitive to every near tie of its sample: a third, float32 forward in which
every router with a margin <= the threshold takes its other choice (flip_choice: the smallest change that
alters it) moves the token's state at L by less than cosine 0.9999. (2) covers what (1) cannot see: an
earlier token whose experts flip reaches later tokens through attention. Requiring every earlier token to
be clear instead ("causally clear", reported) leaves almost no token of a MoE layer past the first tens of
positions. The threshold (--margin auto) is the smallest candidate above --margin-safety times the largest
score change the bf16 reference shows on any router of a routing-clear token (a change below the margin
cannot change the experts: router_margin). Verdict (MoE): ids exact, every routing-clear token within
tolerance (cosine >= 0.999 against float32), routing-clear tokens at least --min-clear-share of the token
vectors of MoE layers, dense layers all within tolerance. Dense models: min cosine >= 0.999, as before.

The negative control (--neg-dir): a copy of the output with one sample's rows shuffled (all layers, one
permutation) and two other samples' files swapped; the same measure must fail.

--fake-engine writes --hs-dir first from the bf16 reference itself, in the shipped script's format
(data_<i>.pt with input_ids, hidden_states, loss_mask; data_config.json): the CPU check of this measure.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path

TOLERANCE = 0.999
AUTO_MARGINS = (0.005, 0.0075, 0.01, 0.015, 0.02)   # candidates of --margin auto
SENSITIVITY = 0.9999                 # cosine a token keeps when every near-tied router takes its other choice


# ------------------------------------------------------------------ routing margins (pure torch)
def router_margin(torch, x, weight, bias, n_group: int, topk_group: int, top_k: int):
    """Per-token routing margin and chosen experts of a noaux_tc sigmoid router, in float32.

    ``x``: [T, H] router input; ``weight``: [E, H]; ``bias``: [E] (e_score_correction_bias) or None.
    The margin is the largest change of every biased score that cannot change the choice: half the gap
    between the k-th and (k+1)-th expert inside the chosen groups, and a quarter of the gap between the
    topk_group-th and the next group score (a group scores the sum of its top two, so a difference of two
    group scores moves by up to four times the change of one score).
    Returns (margin [T], chosen [T, top_k] sorted ids, scores_for_choice [T, E])."""
    scores = torch.nn.functional.linear(x.float(), weight.float()).sigmoid()
    sfc = scores + (bias.float().unsqueeze(0) if bias is not None else 0.0)
    t, e = sfc.shape
    per_group = e // n_group
    if n_group > 1 and topk_group < n_group:
        group_scores = sfc.view(t, n_group, per_group).topk(min(2, per_group), dim=-1)[0].sum(dim=-1)
        gs = group_scores.sort(dim=-1, descending=True)[0]
        group_margin = (gs[:, topk_group - 1] - gs[:, topk_group]) / (2 * min(2, per_group))
        chosen_groups = group_scores.topk(topk_group, dim=-1)[1]
        gmask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, chosen_groups, True)
        emask = gmask.unsqueeze(-1).expand(t, n_group, per_group).reshape(t, e)
    else:
        group_margin = torch.full((t,), float("inf"), dtype=sfc.dtype, device=sfc.device)
        emask = torch.ones_like(sfc, dtype=torch.bool)
    masked = sfc.masked_fill(~emask, float("-inf"))
    ranked, order = masked.sort(dim=-1, descending=True)
    if top_k < int(emask[0].sum()):
        expert_margin = (ranked[:, top_k - 1] - ranked[:, top_k]) / 2
    else:
        expert_margin = torch.full((t,), float("inf"), dtype=sfc.dtype, device=sfc.device)
    chosen = order[:, :top_k].sort(dim=-1)[0]
    return torch.minimum(group_margin, expert_margin), chosen, sfc


def select(torch, sfc, n_group: int, topk_group: int, top_k: int):
    """The experts noaux_tc chooses from biased scores ``sfc`` [T, E] (vLLM's grouped_topk), sorted ids."""
    t, e = sfc.shape
    if n_group > 1 and topk_group < n_group:
        group_scores = sfc.view(t, n_group, -1).topk(min(2, e // n_group), dim=-1)[0].sum(dim=-1)
        gmask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
            1, group_scores.topk(topk_group, dim=-1)[1], True)
        sfc = sfc.masked_fill(~gmask.unsqueeze(-1).expand(t, n_group, e // n_group).reshape(t, e), float("-inf"))
    return sfc.topk(top_k, dim=-1)[1].sort(dim=-1)[0]


def flip_choice(torch, sfc, margin, chosen, n_group: int, topk_group: int, top_k: int):
    """The choice after the smallest change that alters it (router_margin's bound is tight): every score
    moved by just over the margin, down for the chosen experts (or, where the group gap binds, for every
    expert of the chosen groups) and up for the others."""
    t, e = sfc.shape
    push = (margin.clamp(max=1.0) * 1.01 + 1e-6).unsqueeze(-1)
    is_chosen = torch.zeros_like(sfc, dtype=torch.bool).scatter_(1, chosen, True)
    alt = select(torch, torch.where(is_chosen, sfc - push, sfc + push), n_group, topk_group, top_k)
    if n_group > 1 and topk_group < n_group:
        group_scores = sfc.view(t, n_group, -1).topk(min(2, e // n_group), dim=-1)[0].sum(dim=-1)
        in_group = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(
            1, group_scores.topk(topk_group, dim=-1)[1], True).unsqueeze(-1).expand(t, n_group, e // n_group)
        alt_g = select(torch, torch.where(in_group.reshape(t, e), sfc - push, sfc + push), n_group, topk_group,
                       top_k)
        alt = torch.where((alt == chosen).all(dim=-1, keepdim=True), alt_g, alt)
    return alt


def clear_masks(torch, margins: dict, layer: int, thr: float):
    """(own, causal) routing-clear masks [T] at ``layer`` from {moe_layer: margin [T]}."""
    own = None
    causal_prev = None
    for l in sorted(margins):
        if l > layer:
            break
        ok = margins[l] > thr
        own = ok if own is None else own & ok
        if l < layer:   # earlier tokens' states at layers < L reach token t through attention at L
            prefix_ok = torch.cummin(ok.to(torch.int8), dim=0)[0].bool()
            causal_prev = prefix_ok if causal_prev is None else causal_prev & prefix_ok
    if own is None:
        return None, None
    causal = own if causal_prev is None else own & causal_prev
    return own, causal


class Measure:
    """Counts for one output directory against the references.

    "routing-clear" is the causal mask of clear_masks (the verdict's); "own" the token's own routers only."""

    def __init__(self, name: str):
        self.name = name
        self.samples = 0
        self.ids_mismatch: list = []
        self.shape_mismatch: list = []
        self.missing: list = []
        self.n = self.within = 0
        self.clear_n = self.clear_within = 0
        self.own_n = self.own_within = 0
        self.dense_n = self.dense_within = 0
        self.moe_n = self.moe_clear = 0
        self.min_all = self.min_clear = self.min_own = self.min_dense = None
        self.min_clear_at = None
        self.bf16_n = self.bf16_within = 0
        self.min_bf16 = None
        self.sum_cos = 0.0
        self.per_layer: dict = {}

    @staticmethod
    def _min(cur, val):
        return val if cur is None or val < cur else cur

    def add(self, torch, fname, layer, cos32, cos16, own_clear, causal_clear, is_dense_layer):
        w = cos32 >= TOLERANCE
        n = int(cos32.numel())
        self.n += n
        self.within += int(w.sum())
        self.sum_cos += float(cos32.sum())
        self.min_all = self._min(self.min_all, float(cos32.min()))
        pl = self.per_layer.setdefault(layer, {"tokens": 0, "within": 0, "clear": 0, "clear_within": 0, "min": None,
                                               "min_clear": None})
        pl["tokens"] += n
        pl["within"] += int(w.sum())
        pl["min"] = self._min(pl["min"], round(float(cos32.min()), 6))
        if cos16 is not None:
            self.bf16_n += n
            self.bf16_within += int((cos16 >= TOLERANCE).sum())
            self.min_bf16 = self._min(self.min_bf16, float(cos16.min()))
        if is_dense_layer:
            self.dense_n += n
            self.dense_within += int(w.sum())
            self.min_dense = self._min(self.min_dense, float(cos32.min()))
        own = torch.ones_like(w) if own_clear is None else own_clear
        clear = torch.ones_like(w) if causal_clear is None else causal_clear
        if not is_dense_layer:
            self.moe_n += n
            self.moe_clear += int(clear.sum())
        if bool(own.any()):
            c = cos32[own]
            self.own_n += int(own.sum())
            self.own_within += int((c >= TOLERANCE).sum())
            self.min_own = self._min(self.min_own, float(c.min()))
        if bool(clear.any()):
            c = cos32[clear]
            self.clear_n += int(clear.sum())
            self.clear_within += int((c >= TOLERANCE).sum())
            pl["clear"] += int(clear.sum())
            pl["clear_within"] += int((c >= TOLERANCE).sum())
            m = float(c.min())
            pl["min_clear"] = self._min(pl["min_clear"], round(m, 6))
            if self.min_clear is None or m < self.min_clear:
                self.min_clear = m
                self.min_clear_at = {"file": fname, "layer": layer, "token": int(torch.nonzero(clear)[int(c.argmin())])}

    def summary(self, moe: bool, expected_samples: int, min_clear_share: float) -> dict:
        r6 = lambda v: None if v is None else round(v, 6)   # noqa: E731
        share = lambda a, b: None if not b else round(a / b, 6)   # noqa: E731
        res = {
            "samples": self.samples, "expected_samples": expected_samples,
            "ids_mismatch_count": len(self.ids_mismatch), "ids_mismatch": self.ids_mismatch[:10],
            "shape_mismatch_count": len(self.shape_mismatch), "shape_mismatch": self.shape_mismatch[:10],
            "missing_files": self.missing[:10], "missing_count": len(self.missing),
            "tokens_compared": self.n,
            "within_tolerance_share": share(self.within, self.n),
            "below_tolerance": self.n - self.within,
            "min_cosine": r6(self.min_all), "mean_cosine": r6(self.sum_cos / self.n) if self.n else None,
            "routing_clear_tokens": self.clear_n, "routing_clear_share": share(self.clear_n, self.n),
            "moe_layer_tokens": self.moe_n, "moe_layer_routing_clear_share": share(self.moe_clear, self.moe_n),
            "routing_clear_within_tolerance_share": share(self.clear_within, self.clear_n),
            "routing_clear_below_tolerance": self.clear_n - self.clear_within,
            "min_cosine_routing_clear": r6(self.min_clear), "min_cosine_routing_clear_at": self.min_clear_at,
            "own_clear_tokens": self.own_n, "own_clear_share": share(self.own_n, self.n),
            "own_clear_within_tolerance_share": share(self.own_within, self.own_n),
            "own_clear_below_tolerance": self.own_n - self.own_within,
            "min_cosine_own_clear": r6(self.min_own),
            "dense_layer_tokens": self.dense_n, "dense_layer_within_tolerance_share": share(self.dense_within, self.dense_n),
            "min_cosine_dense_layers": r6(self.min_dense),
            "vs_bf16_reference": {"tokens": self.bf16_n, "within_tolerance_share": share(self.bf16_within, self.bf16_n),
                                  "min_cosine": r6(self.min_bf16)},
            "per_layer": {str(k): v for k, v in sorted(self.per_layer.items())},
        }
        fails = []
        if self.samples != expected_samples or self.missing:
            fails.append("files")
        if self.ids_mismatch:
            fails.append("ids")
        if self.shape_mismatch:
            fails.append("shapes")
        if not self.n:
            fails.append("nothing compared")
        if moe:
            if self.clear_n - self.clear_within:
                fails.append("cosine (routing-clear tokens below tolerance)")
            if not self.moe_n or self.moe_clear / self.moe_n < min_clear_share:
                fails.append("too few routing-clear tokens")
            if self.dense_n - self.dense_within:
                fails.append("cosine (dense layers below tolerance)")
        elif self.n - self.within:
            fails.append("cosine (below tolerance)")
        res["fails_on"] = fails
        res["ok"] = not fails
        return res


def measure_file(torch, m: Measure, fname: str, d: dict, ids: list[int], layer_ids: list[int], ref32: dict,
                 ref16: dict | None, masks: dict, first_moe: int | None, device: str = "cpu") -> None:
    """Add one output file (``d``: data_<i>.pt's dict) to ``m``: its ids against the dataset's, each layer's
    rows against the references' ({layer: [T, H]}), with the routing-clear masks {layer: (own, causal)}."""
    m.samples += 1
    got_ids = d["input_ids"].to(torch.long).tolist()
    if got_ids != list(ids):
        m.ids_mismatch.append({"file": fname, "tokens": len(got_ids), "expected_tokens": len(ids)})
    hs = d["hidden_states"]
    if len(hs) != len(layer_ids):
        m.shape_mismatch.append({"file": fname, "layers": len(hs), "expected": len(layer_ids)})
        return
    for j, l in enumerate(layer_ids):
        got = hs[j].float().to(device)
        r32 = ref32[l].float()
        if tuple(got.shape) != tuple(r32.shape):
            m.shape_mismatch.append({"file": fname, "layer": l, "shape": list(got.shape), "expected": list(r32.shape)})
            continue
        cos32 = torch.nn.functional.cosine_similarity(got, r32, dim=-1).cpu()
        cos16 = (torch.nn.functional.cosine_similarity(got, ref16[l].float(), dim=-1).cpu()
                 if ref16 is not None else None)
        own, causal = masks.get(l) or (None, None)
        m.add(torch, fname, l, cos32, cos16, None if own is None else own.cpu(),
              None if causal is None else causal.cpu(), first_moe is None or l < first_moe)


# ------------------------------------------------------------------ references
class Reference:
    """A transformers model with hooks on the compared decoder layers and on every MoE router."""

    def __init__(self, torch, model_dir: str, dtype, device: str, layer_ids: list[int]):
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()
        self.device = device
        self.cfg = self.model.config
        self.layer_ids = layer_ids
        self.states: dict = {}
        self.margins: dict = {}
        self.chosen: dict = {}
        self.sfc: dict = {}
        self.hf_choice_agrees = [0, 0]
        self.flip_below: float | None = None   # when set, routers with a margin <= it take flip_choice
        self.flipped = 0
        self.moe_layers: list[int] = []
        layers = self.model.model.layers
        for i in layer_ids:
            layers[i].register_forward_hook(self._layer_hook(i))
        for i, layer in enumerate(layers):
            gate = getattr(getattr(layer, "mlp", None), "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias") and hasattr(gate, "weight") \
                    and getattr(gate, "n_routed_experts", None):
                self.moe_layers.append(i)
                gate.register_forward_hook(self._gate_hook(i))

    def _layer_hook(self, i):
        def fn(mod, inp, out):
            self.states[i] = (out[0] if isinstance(out, tuple) else out).detach()[0]
        return fn

    def _gate_hook(self, i):
        torch = self.torch

        def fn(mod, inp, out):
            x = inp[0].reshape(-1, inp[0].shape[-1])
            margin, chosen, sfc = router_margin(torch, x, mod.weight, mod.e_score_correction_bias, mod.n_group,
                                                mod.topk_group, mod.top_k)
            self.margins[i], self.chosen[i], self.sfc[i] = margin, chosen, sfc
            hf = out[0] if isinstance(out, tuple) else out   # DeepseekV3TopkRouter: (topk_indices, weights)
            if torch.is_tensor(hf) and hf.dim() == 2 and hf.shape == chosen.shape:
                same = (hf.sort(dim=-1)[0].to(chosen.device) == chosen).all(dim=-1)
                self.hf_choice_agrees[0] += int(same.sum())
                self.hf_choice_agrees[1] += int(same.numel())
            if self.flip_below is None or not isinstance(out, tuple) or len(out) != 2:
                return None
            near = margin <= self.flip_below
            if not bool(near.any()):
                return None
            alt = flip_choice(torch, sfc, margin, chosen, mod.n_group, mod.topk_group, mod.top_k)
            idx = torch.where(near.unsqueeze(-1), alt, out[0].sort(dim=-1)[0])
            scores = torch.nn.functional.linear(x.float(), mod.weight.float()).sigmoid()
            weights = scores.gather(1, idx)
            if getattr(mod, "norm_topk_prob", False):
                weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
            weights = weights * getattr(mod, "routed_scaling_factor", 1.0)
            self.flipped += int(near.sum())
            return idx.to(out[0].dtype), weights.to(out[1].dtype)
        return fn

    def run(self, ids: list[int]) -> None:
        torch = self.torch
        self.states.clear()
        self.margins.clear()
        self.chosen.clear()
        self.sfc.clear()
        with torch.no_grad():
            self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device))


# ------------------------------------------------------------------ outputs on disk
def read_dataset(path: Path, limit: int | None) -> list[list[int]]:
    rows = []
    with open(path) as fh:
        for line in fh:
            if line.strip():
                ids = json.loads(line)["input_ids"]
                rows.append(ids[:limit] if limit else ids)
    return rows


def sample_files(d: Path) -> dict[int, Path]:
    return {int(p.stem.split("_")[1]): p for p in d.glob("data_*.pt") if p.stem.split("_")[1].isdigit()}


def corrupt_copy(src: Path, dst: Path, seed: int = 7, below: int | None = None) -> dict:
    """Copy ``src`` to ``dst``; shuffle one sample's rows (every layer, one permutation; input_ids kept) and
    swap two other samples' files (samples with an index below ``below``, when given)."""
    import torch
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    files = sorted((i, f) for i, f in sample_files(dst).items() if below is None or i < below)
    if len(files) < 3:
        return {"error": f"only {len(files)} files: nothing to corrupt"}
    rng = random.Random(seed)
    (i_shuf, f_shuf), (i_a, f_a), (i_b, f_b) = rng.sample(files, 3)
    d = torch.load(f_shuf, map_location="cpu")
    n = d["input_ids"].shape[0]
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    while n > 1 and bool((perm == torch.arange(n)).all()):
        perm = torch.randperm(n, generator=g)
    d["hidden_states"] = [h[perm].contiguous() for h in d["hidden_states"]]
    torch.save(d, f_shuf)
    tmp = f_a.with_suffix(".swap")
    f_a.rename(tmp)
    f_b.rename(f_a)
    tmp.rename(f_b)
    return {"rows_shuffled_in": f_shuf.name, "tokens": n, "swapped": [f_a.name, f_b.name]}


def write_fake_engine(torch, ref16: Reference, rows: list[list[int]], layer_ids: list[int], out: Path,
                      model_dir: str) -> dict:
    """The shipped script's output, made from the bf16 reference (the CPU stand-in for the engine)."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for i, ids in enumerate(rows):
        ref16.run(ids)
        hs = [ref16.states[l].to(torch.bfloat16).cpu().contiguous() for l in layer_ids]
        torch.save({"input_ids": torch.tensor(ids, dtype=torch.long), "hidden_states": hs,
                    "loss_mask": torch.ones(len(ids), dtype=torch.long)}, out / f"data_{i}.pt")
    (out / "data_config.json").write_text(json.dumps({
        "model": {"target_model_path": model_dir}, "data": {"num_samples": len(rows)},
        "hidden_states": {"layer_ids": layer_ids}, "note": "STAND-IN: written from the bf16 reference"}))
    return {"files": len(rows), "dir": str(out)}


def quantiles(torch, values: list, qs=(0.5, 0.99, 0.999, 1.0)) -> dict | None:
    if not values:
        return None
    v = torch.cat([x.flatten().float().cpu() for x in values])
    if v.numel() > 1_000_000:   # torch.quantile's input limit; a strided subsample is enough here
        v = v[:: v.numel() // 1_000_000 + 1]
    return {f"p{q * 100:g}": round(float(torch.quantile(v, q)), 6) for q in qs}


# ------------------------------------------------------------------ main
def compare(args) -> dict:
    import torch
    t0 = time.monotonic()
    hs_dir = Path(args.hs_dir)
    cfg_file = hs_dir / "data_config.json"
    data_cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    layer_ids = (data_cfg.get("hidden_states") or {}).get("layer_ids")
    if not layer_ids and args.layer_ids:
        layer_ids = [int(x) for x in args.layer_ids.split(",")]
    if not layer_ids:
        raise SystemExit("no layer ids: neither data_config.json nor --layer-ids")
    rows = read_dataset(Path(args.dataset), args.max_model_len - 1 if args.max_model_len else None)
    if args.samples:
        rows = rows[:args.samples]
    res: dict = {"reference_model": args.ref_model, "layer_ids": layer_ids, "device": args.device,
                 "tolerance": TOLERANCE, "min_clear_share": args.min_clear_share,
                 "margin_safety": args.margin_safety,
                 "references": "transformers float32 (routing margins hooked) and bfloat16, on the dataset's ids"}
    ref32 = Reference(torch, args.ref_model, torch.float32, args.device, layer_ids)
    ref16 = Reference(torch, args.ref_model, torch.bfloat16, args.device, layer_ids)
    moe_layers = ref32.moe_layers
    first_moe = min(moe_layers) if moe_layers else None
    res["moe_layers"] = moe_layers
    res["router"] = ({k: getattr(ref32.cfg, k, None) for k in ("n_routed_experts", "num_experts_per_tok", "n_group",
                                                                "topk_group", "topk_method", "scoring_func")}
                     if moe_layers else None)
    if args.fake_engine:
        res["fake_engine"] = write_fake_engine(torch, ref16, rows, layer_ids, hs_dir, args.ref_model)
    dirs = {"output": hs_dir}
    if args.neg_dir:
        res["negative_control_corruption"] = corrupt_copy(hs_dir, Path(args.neg_dir), below=len(rows))
        dirs["negative_control"] = Path(args.neg_dir)
    files = {k: sample_files(d) for k, d in dirs.items()}
    if not moe_layers:
        cands = [0.0]            # no router: every token is routing-clear, the dense verdict applies
    else:
        cands = [args.margin] if args.margin is not None else list(AUTO_MARGINS)
    measures = {c: {k: Measure(k) for k in dirs} for c in cands}
    calib = {c: {"pairs": 0, "own_clear_pairs": 0, "clear_pairs": 0, "max_noise": 0.0, "flipped": 0,
                 "causal_tokens": 0, "tokens": 0} for c in cands}
    noise, flips_16, route_tokens, margins_all = [], 0, 0, []
    for i, ids in enumerate(rows):
        ref32.run(ids)
        states32, margins32 = dict(ref32.states), dict(ref32.margins)
        ref16.run(ids)
        step_noise = {}
        for l in moe_layers:   # the bf16 reference's own routing against float32's: the effect's size
            step_noise[l] = (ref16.sfc[l] - ref32.sfc[l]).abs().amax(dim=-1)
            noise.append(step_noise[l])
            flips_16 += int((ref16.chosen[l] != ref32.chosen[l]).any(dim=-1).sum())
            route_tokens += int(ref32.chosen[l].shape[0])
            margins_all.append(margins32[l])
        loaded = {}
        for k in dirs:
            f = files[k].get(i)
            loaded[k] = (f.name, torch.load(f, map_location="cpu")) if f is not None else None
        for c in cands:
            insensitive = {}
            if moe_layers:   # every near-tied router (margin <= c) takes its other choice: who moves?
                ref32.flip_below, ref32.flipped = c, 0
                try:
                    ref32.run(ids)
                finally:
                    ref32.flip_below = None
                calib[c]["flipped"] += ref32.flipped
                for l in layer_ids:
                    insensitive[l] = torch.nn.functional.cosine_similarity(
                        ref32.states[l].float(), states32[l].float(), dim=-1) >= SENSITIVITY
            masks = {}
            for l in layer_ids:
                own, causal = clear_masks(torch, margins32, l, c)
                if own is None:
                    masks[l] = (None, None)
                    continue
                masks[l] = (own, own & insensitive[l])
                calib[c]["causal_tokens"] += int(causal.sum())
                calib[c]["tokens"] += int(causal.numel())
            for l in moe_layers:   # bf16's score change on the routers of tokens this threshold calls clear
                later = [L for L in layer_ids if L >= l]
                if not later:
                    continue
                own_l = clear_masks(torch, margins32, l, c)[0]
                clear_l = own_l & insensitive[min(later)]
                calib[c]["pairs"] += int(own_l.numel())
                calib[c]["own_clear_pairs"] += int(own_l.sum())
                if bool(clear_l.any()):
                    calib[c]["clear_pairs"] += int(clear_l.sum())
                    calib[c]["max_noise"] = max(calib[c]["max_noise"], float(step_noise[l][clear_l].max()))
            for k, m in measures[c].items():
                if loaded[k] is None:
                    m.missing.append(i)
                    continue
                measure_file(torch, m, loaded[k][0], loaded[k][1], ids, layer_ids, states32, ref16.states,
                             masks, first_moe, args.device)
    expected = len(rows)
    # the threshold: the smallest candidate above the largest score change the bf16 reference shows on every
    # router it calls clear (a change below the margin cannot change the experts: router_margin)
    fitting = [c for c in cands if calib[c]["clear_pairs"] and calib[c]["max_noise"] * args.margin_safety < c]
    if not moe_layers:
        chosen, source = cands[0], "dense model: no router"
    elif args.margin is not None:
        chosen, source = args.margin, "given"
    else:
        chosen = min(fitting) if fitting else max(cands)
        source = "calibrated" if fitting else "calibration failed: largest candidate"
    res["margin_threshold"] = chosen
    res["margin_threshold_source"] = source
    res["margin_calibration"] = []
    for c in cands:
        o = measures[c]["output"].summary(bool(moe_layers), expected, args.min_clear_share)
        res["margin_calibration"].append({
            "margin": c, "near_tied_routers_flipped": calib[c]["flipped"],
            "bf16_reference_max_score_change_on_clear_routers": round(calib[c]["max_noise"], 6),
            "own_clear_router_share": round(calib[c]["own_clear_pairs"] / calib[c]["pairs"], 6)
            if calib[c]["pairs"] else None,
            "causally_clear_share": round(calib[c]["causal_tokens"] / calib[c]["tokens"], 6)
            if calib[c]["tokens"] else None,
            "routing_clear_share": o["routing_clear_share"],
            "moe_layer_routing_clear_share": o["moe_layer_routing_clear_share"],
            "routing_clear_within_tolerance_share": o["routing_clear_within_tolerance_share"],
            "min_cosine_routing_clear": o["min_cosine_routing_clear"],
            "own_clear_share": o["own_clear_share"],
            "own_clear_within_tolerance_share": o["own_clear_within_tolerance_share"],
            "min_cosine_own_clear": o["min_cosine_own_clear"]})
    for k, m in measures[chosen].items():
        res[k] = m.summary(bool(moe_layers), expected, args.min_clear_share)
    if moe_layers:
        res["bf16_reference_vs_float32"] = {
            "router_tokens": route_tokens, "tokens_routed_differently": flips_16,
            "share_routed_differently": round(flips_16 / route_tokens, 6) if route_tokens else None,
            "max_score_change": quantiles(torch, noise),
            "routing_margin_float32": quantiles(torch, margins_all, (0.001, 0.01, 0.05, 0.5)),
            "hf_router_agrees_with_margin_code": ref32.hf_choice_agrees}
    res["ok"] = bool(res["output"]["ok"])
    if args.neg_dir:
        res["negative_control_fails"] = not res["negative_control"]["ok"]
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-model", required=True, help="transformers checkpoint of the text model")
    ap.add_argument("--hs-dir", required=True, help="the job's output_dir (data_<i>.pt, data_config.json)")
    ap.add_argument("--dataset", required=True, help="the job's JSONL dataset (input_ids lines)")
    ap.add_argument("--neg-dir", default=None, help="write the corrupted copy here and measure it too")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--margin", default="auto",
                    help="routing margin (sigmoid score units) above which a router is clear; 'auto': the smallest "
                         f"of {AUTO_MARGINS} above the bf16 reference's largest score change on the routers it "
                         "calls clear")
    ap.add_argument("--margin-safety", type=float, default=2.0,
                    help="--margin auto: the margin must exceed this many times the bf16 reference's score change "
                         "(the engine's bf16 arithmetic is not transformers')")
    ap.add_argument("--min-clear-share", type=float, default=0.05,
                    help="routing-clear share of the token vectors of MoE layers the verdict needs")
    ap.add_argument("--layer-ids", default=None, help="when the output has no data_config.json")
    ap.add_argument("--max-model-len", type=int, default=None, help="the job's max_model_len (ids cut to -1)")
    ap.add_argument("--samples", type=int, default=None, help="compare only the first N samples")
    ap.add_argument("--fake-engine", action="store_true", help="write --hs-dir from the bf16 reference first")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    args.margin = None if args.margin == "auto" else float(args.margin)
    res = compare(args)
    text = json.dumps(res)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(text)
    return 0 if res["ok"] and res.get("negative_control_fails", True) else 1


if __name__ == "__main__":
    sys.exit(main())
