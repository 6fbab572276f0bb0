"""Cross-check, statically, the vision weight names benchmarks/gpu/lib/models.py writes for the Kimi-K2.5-shaped
checkpoint against vLLM's own module tree (parameter names read from the class definitions, no import).

    python benchmarks/evidence/kimi_weight_names.py [--vllm 0.20.0]

Walks the ``__init__`` of MoonViT3dPretrainedModel and KimiK25MultiModalProjector (kimi_k25_vit.py) and of
every class they build from the parsed files; leaves are torch / vLLM layers with known parameters. The
checkpoint's names go through KimiK25ForConditionalGeneration.hf_to_vllm_mapper (read from kimi_k25.py)
first. Prints the confirmed names, the names only one side has, and every assumption the walk made (a bias
whose presence depends on an argument, a module it could not resolve and took as parameter-free).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FILES = ("model_executor/models/kimi_k25_vit.py", "model_executor/models/kimi_k25.py",
         "model_executor/layers/attention/mm_encoder_attention.py")
LINEAR = {"ColumnParallelLinear", "RowParallelLinear", "QKVParallelLinear", "ReplicatedLinear",
          "MergedColumnParallelLinear"}
WITH_BIAS = {"LayerNorm": True, "Conv2d": None, "Conv3d": None, "Linear": None}   # None: bias= decides
PARAM_FREE = {"GELUActivation", "get_act_fn", "Dropout", "Identity", "GELU", "SiLU"}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


class Walker:
    def __init__(self, sources: list[str], repeat: int):
        self.classes: dict[str, ast.ClassDef] = {}
        for src in sources:
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.ClassDef):
                    self.classes.setdefault(node.name, node)
        self.repeat = repeat
        self.assumptions: list[str] = []

    def _init_assignments(self, cls: ast.ClassDef):
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            return
        for node in ast.walk(init):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    yield t.attr, node.value

    def params(self, class_name: str, prefix: str) -> set[str]:
        out: set[str] = set()
        cls = self.classes.get(class_name)
        if cls is None:
            self.assumptions.append(f"{prefix}: class {class_name} not in the parsed files, taken as parameter-free")
            return out
        seen: dict[str, set[str]] = {}
        for attr, value in self._init_assignments(cls):
            names = self._expr(value, f"{prefix}.{attr}", attr, seen)
            if names is not None:   # None: not a module/parameter (or a re-assignment such as .to())
                seen[attr] = names
        for names in seen.values():
            out |= names
        return out

    def _expr(self, value: ast.expr, prefix: str, attr: str, seen: dict):
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        name = _name(func)
        if isinstance(func, ast.Attribute) and func.attr == "to":   # self.x = self.x.to(...) keeps self.x
            return None
        if name == "Parameter":
            return {prefix}
        if name == "ModuleList":
            arg = value.args[0] if value.args else None
            if isinstance(arg, ast.ListComp) and isinstance(arg.elt, ast.Call):
                out: set[str] = set()
                for i in range(self.repeat):
                    out |= self._expr(arg.elt, f"{prefix}.{i}", attr, {}) or set()
                return out
            self.assumptions.append(f"{prefix}: ModuleList of an unparsed form, taken as empty")
            return set()
        if name in LINEAR or name in WITH_BIAS:
            out = {f"{prefix}.weight"}
            fixed = WITH_BIAS.get(name)
            if fixed:
                out.add(f"{prefix}.bias")
                return out
            bias = next((k.value for k in value.keywords if k.arg == "bias"), None)
            if bias is None:
                out.add(f"{prefix}.bias")   # torch and vLLM default: bias=True
            elif isinstance(bias, ast.Constant):
                if bias.value:
                    out.add(f"{prefix}.bias")
            else:
                out.add(f"{prefix}.bias")
                self.assumptions.append(f"{prefix}.bias: present when `{ast.unparse(bias)}` is true "
                                        f"(True for Kimi-K2.5's tower: attn_bias=True, MLP2 bias=True)")
            return out
        if name in PARAM_FREE:
            return set()
        if name in self.classes:
            return self.params(name, prefix)
        if name and name[:1].isupper():
            self.assumptions.append(f"{prefix}: {name} not resolved, taken as parameter-free")
            return set()
        return None


def hf_to_vllm_prefixes(kimi_src: str) -> dict[str, str]:
    """KimiK25ForConditionalGeneration.hf_to_vllm_mapper's orig_to_new_prefix, read from the source."""
    for node in ast.walk(ast.parse(kimi_src)):
        if isinstance(node, ast.keyword) and node.arg == "orig_to_new_prefix" and isinstance(node.value, ast.Dict):
            return {ast.literal_eval(k): ast.literal_eval(v) for k, v in zip(node.value.keys, node.value.values)}
    raise SystemExit("hf_to_vllm_mapper.orig_to_new_prefix not found in kimi_k25.py")


def cross_check(vllm_root: Path) -> dict:
    from benchmarks.gpu.lib.models import VISION, vision_weight_shapes
    sources = [(vllm_root / f).read_text() for f in FILES]
    walker = Walker(sources, repeat=VISION["num_hidden_layers"])
    expected = walker.params("MoonViT3dPretrainedModel", "vision_tower") | \
        walker.params("KimiK25MultiModalProjector", "mm_projector")
    mapping = hf_to_vllm_prefixes(sources[1])
    written = {}
    for name in vision_weight_shapes():
        mapped = name
        for old, new in mapping.items():
            if mapped.startswith(old):
                mapped = new + mapped[len(old):]
                break
        written[name] = mapped
    got = set(written.values())
    return {"vllm": str(vllm_root), "written": len(written), "expected": len(expected),
            "confirmed": sorted(got & expected), "only_in_checkpoint": sorted(got - expected),
            "only_in_vllm": sorted(expected - got), "renamed_by_mapper": {k: v for k, v in written.items() if k != v},
            "assumptions": sorted(set(walker.assumptions))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vllm", default="0.20.0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from remote_ops import pkgsource
    res = cross_check(Path(pkgsource.unpacked("vllm", args.vllm)) / "vllm")
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"vLLM {args.vllm}: {len(res['confirmed'])} of {res['written']} vision weight names confirmed "
              f"against the module tree ({res['expected']} parameters there)")
        for k in ("only_in_checkpoint", "only_in_vllm"):
            print(f"{k}: {res[k] or 'none'}")
        print("renamed by hf_to_vllm_mapper:", res["renamed_by_mapper"])
        print("assumptions:", *(["none"] if not res["assumptions"] else res["assumptions"]), sep="\n  ")
    return 0 if not res["only_in_checkpoint"] and not res["only_in_vllm"] else 1


if __name__ == "__main__":
    sys.exit(main())
