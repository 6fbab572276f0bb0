"""Every token vector of several extraction outputs against one float32 reference, and against each other.

    python benchmarks/gpu/flows_compare.py --ref-model DIR --dataset data.jsonl --json result.json \
        --output NAME=DIR:LAYOUT:IDS [--output ...] [--pair A,B ...] [--negative NAME] [--device cuda]

LAYOUT is ``pt`` (the 0.3.0 flow: data_<i>.pt with input_ids and hidden_states, layer id i = the output of
decoder layer i) or ``hs`` (the server flow: hs_<i>.safetensors with token_ids and hidden_states [seq, L,
hidden], aux layer id k = the residual stream entering decoder layer k, i.e. the output of layer k-1). IDS is
the comma list of the output's layer ids. Each output's ids are mapped to decoder layers, so outputs of
both flows are compared on the same layers.

The reference is ONE transformers float32 forward per dataset row (the row's own ids, cut like the job cut
them), with a hook on every decoder layer. Every token vector of every output is compared with it (cosine):
the result counts n_total, n >= 0.999 and the minimum for each output and each layer; nothing is sampled and
no token is left out. With routing made unambiguous (benchmarks/gpu/lib/models.py --unambiguous-routing) a bf16 engine
and the float32 reference choose the same experts, so every vector must match; the routers' float32 margins
(benchmarks/gpu/routing_compare.py router_margin: the largest change of every score that cannot change the choice) are
recorded per MoE layer as evidence of that, with whether the float32 and a bf16 transformers forward chose
the same experts for every token.

--pair A,B compares two outputs with each other on their common decoder layers (the wrapper against the
plain model, the server flow against the 0.3.0 flow): n_total, n >= 0.999, n >= 0.9999, minimum cosine, and
how many vectors are bitwise equal. --negative NAME measures NAME again with every sample's rows rolled by
one token against the reference: that must fail (the measure can tell wrong data).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TOLERANCE = 0.999
TIGHT = 0.9999


def parse_output(spec: str) -> dict:
    """NAME=DIR:LAYOUT:IDS -> {name, dir, layout, layer_ids, decoder_layers}."""
    name, rest = spec.split("=", 1)
    d, layout, ids = rest.rsplit(":", 2)
    if layout not in ("pt", "hs"):
        raise SystemExit(f"--output {spec}: layout must be pt or hs")
    layer_ids = [int(x) for x in ids.split(",") if x.strip()]
    decoder = [i if layout == "pt" else i - 1 for i in layer_ids]
    if min(decoder) < 0:
        raise SystemExit(f"--output {spec}: server-flow id 0 (the embeddings) is not compared here")
    return {"name": name, "dir": Path(d), "layout": layout, "layer_ids": layer_ids, "decoder_layers": decoder}


def sample_files(out: dict) -> dict[int, Path]:
    pat, pre = ("data_*.pt", "data_") if out["layout"] == "pt" else ("hs_*.safetensors", "hs_")
    found = {}
    for p in out["dir"].glob(pat):
        idx = p.name[len(pre):].split(".")[0]
        if idx.isdigit():
            found[int(idx)] = p
    return found


def load_sample(torch, out: dict, path: Path) -> tuple[list[int], list]:
    """(token ids, [tensor [T, H] per layer id])."""
    if out["layout"] == "pt":
        d = torch.load(path, map_location="cpu")
        return d["input_ids"].to(torch.long).tolist(), list(d["hidden_states"])
    from safetensors.torch import load_file
    d = load_file(str(path))
    return d["token_ids"].to(torch.long).tolist(), list(d["hidden_states"].unbind(1))


class Count:
    """n_total, n >= TOLERANCE, n >= TIGHT, min and sum of cosines, bitwise-equal vectors."""

    def __init__(self):
        self.n = self.within = self.tight = self.equal = 0
        self.min = None
        self.sum = 0.0
        self.min_at = None

    def add(self, cos, where=None, equal=None):
        n = int(cos.numel())
        if not n:
            return
        self.n += n
        self.within += int((cos >= TOLERANCE).sum())
        self.tight += int((cos >= TIGHT).sum())
        self.sum += float(cos.double().sum())
        m = float(cos.min())
        if self.min is None or m < self.min:
            self.min = m
            self.min_at = dict(where or {}, token=int(cos.argmin()))
        if equal is not None:
            self.equal += int(equal.sum())

    def doc(self, with_equal=False) -> dict:
        d = {"n_total": self.n, "n_within_0_999": self.within, "n_below_0_999": self.n - self.within,
             "n_within_0_9999": self.tight, "min_cosine": None if self.min is None else round(self.min, 6),
             "mean_cosine": round(self.sum / self.n, 7) if self.n else None, "min_at": self.min_at}
        if with_equal:
            d["n_bitwise_equal"] = self.equal
        return d


def read_rows(path: Path, cut: int | None) -> list[list[int]]:
    rows = []
    for line in open(path):
        if line.strip():
            ids = json.loads(line)["input_ids"]
            rows.append(ids[:cut] if cut else ids)
    return rows


def compare(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    t0 = time.monotonic()
    outs = {o["name"]: o for o in map(parse_output, args.output)}
    pairs = [tuple(p.split(",")) for p in args.pair]
    for a, b in pairs:
        if a not in outs or b not in outs:
            raise SystemExit(f"--pair {a},{b}: both must be --output names")
    rows = read_rows(Path(args.dataset), args.max_model_len - 1 if args.max_model_len else None)
    need = sorted({l for o in outs.values() for l in o["decoder_layers"]})
    ref = {}
    model = AutoModelForCausalLM.from_pretrained(args.ref_model, torch_dtype=torch.float32).to(args.device).eval()
    layers = model.model.layers
    for l in need:
        layers[l].register_forward_hook(
            lambda mod, inp, out, l=l: ref.__setitem__(l, (out[0] if isinstance(out, tuple) else out)[0].detach()))
    # the routers (DeepSeek-V3's DeepseekV3TopkRouter): float32 margins, and the choice of a bf16 forward
    routers = {i: layer.mlp.gate for i, layer in enumerate(layers)
               if hasattr(getattr(layer, "mlp", None), "gate") and hasattr(layer.mlp.gate, "e_score_correction_bias")}
    margins: dict[int, Count] = {}
    chosen32: dict[int, object] = {}
    route = {"tokens": 0, "same_choice_bf16": 0}
    if routers:
        from benchmarks.gpu.routing_compare import router_margin

        def router_hook(i):
            def hook(mod, inp, out):
                x = inp[0].reshape(-1, inp[0].shape[-1])
                m, ch, _ = router_margin(torch, x, mod.weight, mod.e_score_correction_bias, mod.n_group,
                                         mod.topk_group, mod.top_k)
                if mod.weight.dtype == torch.float32:
                    margins.setdefault(i, []).append(m)
                    chosen32[i] = ch
                elif i in chosen32:
                    same = (ch == chosen32[i]).all(dim=-1)
                    route["tokens"] += int(same.numel())
                    route["same_choice_bf16"] += int(same.sum())
            return hook
        for i, gate in routers.items():
            gate.register_forward_hook(router_hook(i))
        model16 = AutoModelForCausalLM.from_pretrained(args.ref_model, torch_dtype=torch.bfloat16).to(args.device).eval()
        for i, layer in enumerate(model16.model.layers):
            if i in routers:
                layer.mlp.gate.register_forward_hook(router_hook(i))
    files = {n: sample_files(o) for n, o in outs.items()}
    per_out = {n: {"all": Count(), "layers": {l: Count() for l in o["decoder_layers"]}, "missing": [],
                   "ids_mismatch": [], "shape_mismatch": [], "extra_files": sorted(i for i in files[n] if i >= len(rows))}
               for n, o in outs.items()}
    per_pair = {p: {"all": Count(), "layers": {}, "not_compared": []} for p in pairs}
    neg = Count() if args.negative else None
    for i, ids in enumerate(rows):
        ref.clear()
        chosen32.clear()
        with torch.no_grad():
            model(input_ids=torch.tensor([ids], device=args.device))
            if routers:
                model16(input_ids=torch.tensor([ids], device=args.device))
        loaded = {}
        for n, o in outs.items():
            f = files[n].get(i)
            po = per_out[n]
            if f is None:
                po["missing"].append(i)
                continue
            got_ids, hs = load_sample(torch, o, f)
            if got_ids != list(ids):
                po["ids_mismatch"].append({"sample": i, "tokens": len(got_ids), "expected": len(ids)})
                continue
            if len(hs) != len(o["layer_ids"]):
                po["shape_mismatch"].append({"sample": i, "layers": len(hs), "expected": len(o["layer_ids"])})
                continue
            by_layer = {}
            for l, h in zip(o["decoder_layers"], hs):
                r = ref[l].float()
                if tuple(h.shape) != tuple(r.shape):
                    po["shape_mismatch"].append({"sample": i, "layer": l, "shape": list(h.shape)})
                    continue
                got = h.to(args.device).float()
                cos = torch.nn.functional.cosine_similarity(got, r, dim=-1)
                where = {"sample": i, "decoder_layer": l}
                po["all"].add(cos, where)
                po["layers"][l].add(cos, where)
                by_layer[l] = h
                if neg is not None and n == args.negative and got.shape[0] > 1:
                    neg.add(torch.nn.functional.cosine_similarity(torch.roll(got, 1, dims=0), r, dim=-1))
            loaded[n] = by_layer
        for a, b in pairs:
            pp = per_pair[(a, b)]
            if a not in loaded or b not in loaded:
                pp["not_compared"].append(i)
                continue
            for l in sorted(set(loaded[a]) & set(loaded[b])):
                x, y = loaded[a][l], loaded[b][l]
                if x.shape != y.shape:
                    pp["not_compared"].append(i)
                    continue
                cos = torch.nn.functional.cosine_similarity(x.to(args.device).float(), y.to(args.device).float(), dim=-1)
                eq = (x.view(torch.int16) == y.view(torch.int16)).all(dim=-1) if x.dtype == y.dtype == torch.bfloat16 \
                    else (x == y).all(dim=-1)
                where = {"sample": i, "decoder_layer": l}
                pp["all"].add(cos, where, eq)
                pp["layers"].setdefault(l, Count()).add(cos, where, eq)
    res: dict = {"reference": f"transformers float32 forward of {args.ref_model} on {args.device}",
                 "dataset": {"path": args.dataset, "rows": len(rows), "tokens": sum(map(len, rows))},
                 "tolerance": TOLERANCE, "outputs": {}, "pairs": {}}
    ok = True
    for n, o in outs.items():
        po = per_out[n]
        expected = len(rows) * len(o["layer_ids"])
        d = {"dir": str(o["dir"]), "layout": o["layout"], "layer_ids": o["layer_ids"],
             "decoder_layers": o["decoder_layers"], "samples": len(files[n]), "expected_samples": len(rows),
             **po["all"].doc(), "tokens_expected": sum(map(len, rows)) * len(o["layer_ids"]),
             "missing": po["missing"][:20], "missing_count": len(po["missing"]),
             "ids_mismatch": po["ids_mismatch"][:20], "ids_mismatch_count": len(po["ids_mismatch"]),
             "shape_mismatch": po["shape_mismatch"][:20], "shape_mismatch_count": len(po["shape_mismatch"]),
             "extra_files": po["extra_files"][:20],
             "per_layer": {str(l): c.doc() for l, c in po["layers"].items()}}
        d["ok"] = (d["n_total"] == d["tokens_expected"] and d["n_below_0_999"] == 0 and not po["missing"]
                   and not po["ids_mismatch"] and not po["shape_mismatch"] and not po["extra_files"]
                   and expected > 0)
        ok = ok and d["ok"]
        res["outputs"][n] = d
    for (a, b), pp in per_pair.items():
        d = {**pp["all"].doc(with_equal=True), "not_compared": pp["not_compared"][:20],
             "not_compared_count": len(pp["not_compared"]),
             "per_layer": {str(l): c.doc(with_equal=True) for l, c in sorted(pp["layers"].items())}}
        d["ok"] = d["n_total"] > 0 and d["n_below_0_999"] == 0 and not pp["not_compared"]
        ok = ok and d["ok"]
        res["pairs"][f"{a} vs {b}"] = d
    if neg is not None:
        d = neg.doc()
        d["fails"] = d["n_below_0_999"] > 0
        d["what"] = f"{args.negative} with every sample's rows rolled by one token"
        res["negative_control"] = d
        ok = ok and d["fails"]
    if routers:
        mins = {}
        for i, ms in margins.items():
            v = torch.cat([m.flatten() for m in ms])
            mins[str(i)] = {"tokens": int(v.numel()), "min_margin": round(float(v.min()), 6),
                            "median_margin": round(float(v.median()), 6)}
        res["routing"] = {"moe_layers": sorted(routers), "float32_margin_per_layer": mins,
                          "router_tokens": route["tokens"], "bf16_same_choice_as_float32": route["same_choice_bf16"],
                          "note": "margin: the largest change of every biased score that cannot change the experts "
                                  "chosen (benchmarks/gpu/routing_compare.py router_margin)"}
    res["ok"] = ok
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref-model", required=True)
    ap.add_argument("--dataset", required=True, help="JSONL with input_ids, the rows both flows were given")
    ap.add_argument("--output", action="append", required=True, help="NAME=DIR:pt|hs:IDS")
    ap.add_argument("--pair", action="append", default=[], help="A,B: two --output names to compare")
    ap.add_argument("--negative", default=None, help="an --output name measured again with rows rolled by one")
    ap.add_argument("--max-model-len", type=int, default=None, help="rows cut to this - 1, as the jobs cut them")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    res = compare(args)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    print(json.dumps({"ok": res["ok"], "outputs": {n: {k: o[k] for k in ("n_total", "n_within_0_999", "min_cosine")}
                                                   for n, o in res["outputs"].items()},
                      "pairs": {n: {k: p[k] for k in ("n_total", "n_within_0_999", "min_cosine", "n_bitwise_equal")}
                                for n, p in res["pairs"].items()},
                      "negative_control_fails": (res.get("negative_control") or {}).get("fails")}))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
