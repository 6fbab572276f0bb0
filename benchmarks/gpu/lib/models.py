"""Tiny random checkpoints of the user's model family, built on the spot and offline (no download).

    python benchmarks/gpu/lib/models.py OUT_ROOT [--which deepseek_v3,kimi_k25,qwen3] [--samples 24]

Runs under transformers 4.57.6 (the bundle's tf/ first on the path; on the CPU machine a scratch target
dir) and writes, under OUT_ROOT:
  deepseek_v3/  DeepseekV3ForCausalLM: MLA (q_lora_rank, kv_lora_rank 512, qk_rope_head_dim 64), routed +
                shared experts, first_k_dense_replace=2 (layers 0-1 dense, 2-7 MoE), 8 routed experts,
                top-2 of 4 groups of 2 (topk_group 2), ``topk_method: noaux_tc`` + ``scoring_func: sigmoid``
                and a non-zero ``e_score_correction_bias`` (GPU-NOTES.md: vLLM needs both to load it)
  kimi_k25/     KimiK25ForConditionalGeneration: the same text weights under ``language_model.``, a minimal
                MoonViT3d vision tower + patch-merger projector named as vLLM 0.20.0's module tree
                (kimi_k25_vit.py), ``configuration_kimi_k25.py`` + ``auto_map`` (transformers 4.57.6 has no
                ``kimi_k25``; speculators calls AutoConfig.from_pretrained(path, trust_remote_code=True)), and an
                image processor (``image_processing_kimi_k25.py`` + preprocessor_config.json) that vLLM's
                KimiK25ProcessingInfo loads at engine start even for text-only prompts
  qwen3/        Qwen3ForCausalLM, dense
  dataset.jsonl {"input_ids": [...]} lines, 50-600 tokens (ids 4..1000: no special or media token)
and prints one JSON line per model (layers, hidden size, parameter count, files).

The KimiK25 config class mirrors vllm/transformers_utils/configs/kimi_k25.py (0.20.0). vLLM itself uses its
own registered class for model_type kimi_k25 and never runs this file's copy.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from benchmarks.gpu.lib.harness import save_word_tokenizer  # noqa: E402  (the tiny models' tokenizer, one copy)

VOCAB = 1024
MEDIA_PAD = "<|media_pad|>"
MEDIA_PAD_ID = VOCAB - 1          # inside the vocabulary of the text model; never in the dataset
WORDS = (4, 1000)                 # dataset token ids are drawn from this range
LAYERS = 8
LAYER_IDS = [1, 3, 5, 7]          # distinct and explicit (GPU-NOTES.md); 1 is dense, 3/5/7 MoE in deepseek_v3
FIRST_K_DENSE = 2

DEEPSEEK_V3 = dict(
    vocab_size=VOCAB, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
    num_hidden_layers=LAYERS, num_attention_heads=8, num_key_value_heads=8,
    n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
    routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=FIRST_K_DENSE,
    # MLA with DeepSeek-V3's own head sizes: kv_lora_rank + qk_rope_head_dim = 576 is what vLLM's MLA
    # backends on Hopper accept (MLACommonBackend.get_supported_head_sizes: 320, 576)
    q_lora_rank=192, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
    max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=None, rms_norm_eps=1e-6,
    initializer_range=0.05, bos_token_id=1, eos_token_id=2, pad_token_id=3, tie_word_embeddings=False,
    hidden_act="silu", attention_bias=False,
    # read by vLLM's DeepseekV2MoE (not DeepseekV3Config's own arguments): without noaux_tc vLLM has no
    # e_score_correction_bias parameter and loading fails with a KeyError on it
    topk_method="noaux_tc", scoring_func="sigmoid",
)

QWEN3 = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
             rope_theta=1000000.0, rms_norm_eps=1e-6, initializer_range=0.05, bos_token_id=1, eos_token_id=2,
             pad_token_id=3, tie_word_embeddings=False, hidden_act="silu")

# KimiK25VisionConfig (vllm/transformers_utils/configs/kimi_k25.py) at toy size. The processor below always
# makes GRID x GRID patches, equal to init_pos_emb_height/width, so the tower's position embedding is never
# interpolated (kimi_k25_vit.py Learnable2DInterpPosEmbDivided_fixed.forward).
GRID = 4
VISION = dict(patch_size=14, init_pos_emb_height=GRID, init_pos_emb_width=GRID, init_pos_emb_time=4,
              pos_emb_type="divided_fixed", num_attention_heads=2, num_hidden_layers=1, hidden_size=64,
              intermediate_size=128, merge_kernel_size=[2, 2], video_attn_type="spatial_temporal",
              merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=DEEPSEEK_V3["hidden_size"],
              projector_hidden_act="gelu", projector_ln_eps=1e-5)
FRAMES_PER_CHUNK = 4


def vision_weight_shapes(vision: dict = VISION, text_hidden: int = DEEPSEEK_V3["hidden_size"]) -> dict:
    """Checkpoint name -> shape of every vision tower and projector weight (the HF checkpoint's names: the
    projector as ``mm_projector.proj.0/2``, which KimiK25ForConditionalGeneration.hf_to_vllm_mapper renames)."""
    h, ps, mlp = vision["hidden_size"], vision["patch_size"], vision["intermediate_size"]
    kh, kw = vision["merge_kernel_size"]
    merged = h * kh * kw
    out = {
        "vision_tower.patch_embed.proj.weight": (h, 3, ps, ps),
        "vision_tower.patch_embed.proj.bias": (h,),
        "vision_tower.patch_embed.pos_emb.weight": (vision["init_pos_emb_height"], vision["init_pos_emb_width"], h),
    }
    for i in range(vision["num_hidden_layers"]):
        b = f"vision_tower.encoder.blocks.{i}."
        out.update({
            b + "norm0.weight": (h,), b + "norm0.bias": (h,), b + "norm1.weight": (h,), b + "norm1.bias": (h,),
            b + "wqkv.weight": (3 * h, h), b + "wqkv.bias": (3 * h,),
            b + "wo.weight": (h, h), b + "wo.bias": (h,),
            b + "mlp.fc0.weight": (mlp, h), b + "mlp.fc0.bias": (mlp,),
            b + "mlp.fc1.weight": (h, mlp), b + "mlp.fc1.bias": (h,),
        })
    out.update({
        "vision_tower.encoder.final_layernorm.weight": (h,), "vision_tower.encoder.final_layernorm.bias": (h,),
        "mm_projector.pre_norm.weight": (h,), "mm_projector.pre_norm.bias": (h,),
        "mm_projector.proj.0.weight": (merged, merged), "mm_projector.proj.0.bias": (merged,),
        "mm_projector.proj.2.weight": (text_hidden, merged), "mm_projector.proj.2.bias": (text_hidden,),
    })
    return out


KIMI_CONFIG_PY = '''"""KimiK25Config for transformers 4.57.6 (which has no kimi_k25): a copy of vLLM 0.20.0's
vllm/transformers_utils/configs/kimi_k25.py, so AutoConfig.from_pretrained(path, trust_remote_code=True)
works offline; text attributes resolve through text_config."""
from transformers import DeepseekV3Config
from transformers.configuration_utils import PretrainedConfig


class KimiK25VisionConfig(PretrainedConfig):
    model_type = "kimi_k25_vision"

    def __init__(self, patch_size=14, init_pos_emb_height=64, init_pos_emb_width=64, init_pos_emb_time=4,
                 pos_emb_type="divided_fixed", num_attention_heads=16, num_hidden_layers=27, hidden_size=1152,
                 intermediate_size=4304, merge_kernel_size=(2, 2), video_attn_type="spatial_temporal",
                 merge_type="sd2_tpool", mm_projector_type="patchmerger", mm_hidden_size=None,
                 projector_hidden_act="gelu", projector_ln_eps=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.init_pos_emb_height = init_pos_emb_height
        self.init_pos_emb_width = init_pos_emb_width
        self.init_pos_emb_time = init_pos_emb_time
        self.pos_emb_type = pos_emb_type
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.merge_kernel_size = merge_kernel_size
        self.video_attn_type = video_attn_type
        self.merge_type = merge_type
        self.mm_projector_type = mm_projector_type
        self.mm_hidden_size = mm_hidden_size if mm_hidden_size is not None else hidden_size
        self.projector_hidden_act = projector_hidden_act
        self.projector_ln_eps = projector_ln_eps


class KimiK25Config(PretrainedConfig):
    model_type = "kimi_k25"

    def __init__(self, vision_config=None, text_config=None, ignore_index=-100,
                 media_placeholder_token_id=163605, pad_token_id=0, use_unified_vision_chunk=False,
                 video_placeholder="<|kimi_k25_video_placeholder|>", **kwargs):
        if vision_config is None:
            self.vision_config = KimiK25VisionConfig()
        elif isinstance(vision_config, dict):
            self.vision_config = KimiK25VisionConfig(**vision_config)
        else:
            self.vision_config = vision_config
        if text_config is None:
            self.text_config = DeepseekV3Config()
        elif isinstance(text_config, dict):
            self.text_config = DeepseekV3Config(**text_config)
        else:
            self.text_config = text_config
        if self.vision_config.mm_hidden_size == self.vision_config.hidden_size:
            self.vision_config.mm_hidden_size = self.text_config.hidden_size
        self.ignore_index = ignore_index
        self.media_placeholder_token_id = media_placeholder_token_id
        self.use_unified_vision_chunk = use_unified_vision_chunk
        self.video_placeholder = video_placeholder
        if getattr(self.text_config, "quantization_config", None) is not None:
            self.quantization_config = self.text_config.quantization_config
        super().__init__(pad_token_id=pad_token_id, **kwargs)

    @property
    def hidden_size(self):
        return self.text_config.hidden_size

    @property
    def vocab_size(self):
        return self.text_config.vocab_size
'''

KIMI_IMAGE_PROCESSOR_PY = '''"""A minimal image processor with what vLLM 0.20.0's KimiK25ProcessingInfo / KimiK25Processor use
(model_executor/models/kimi_k25.py, transformers_utils/processors/kimi_k25.py): ``media_tokens_calculator``,
``num_frames_per_chunk`` and ``preprocess(vision_chunks)`` -> pixel_values [patches, 3, ps, ps] + grid_thws.
Every image or frame is resized to GRID x GRID patches, so the tower never interpolates its position
embedding. vLLM loads it at engine start (AutoImageProcessor, trust_remote_code) and runs it on its dummy
inputs while sizing the encoder budget, even when every prompt is text."""
import numpy as np
import torch
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


class KimiK25TinyImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values", "grid_thws"]

    def __init__(self, patch_size=14, grid=4, merge_kernel_size=(2, 2), num_frames_per_chunk=4, **kwargs):
        super().__init__(**kwargs)
        self.patch_size = patch_size
        self.grid = grid
        self.merge_kernel_size = list(merge_kernel_size)
        self.num_frames_per_chunk = num_frames_per_chunk

    @staticmethod
    def _frames(chunk):
        kind = chunk.get("type") if isinstance(chunk, dict) else "image"
        if kind == "video_chunk":
            return list(chunk["video_chunk"])
        return [chunk["image"] if isinstance(chunk, dict) else chunk]

    def media_tokens_calculator(self, chunk):
        kh, kw = self.merge_kernel_size
        return (self.grid // kh) * (self.grid // kw)   # frames are pooled over time (sd2_tpool)

    def _patches(self, frame):
        side = self.grid * self.patch_size
        img = frame.convert("RGB").resize((side, side))
        x = torch.from_numpy(np.asarray(img, dtype=np.float32) / 127.5 - 1.0).permute(2, 0, 1)   # 3, H, W
        ps, g = self.patch_size, self.grid
        x = x.reshape(3, g, ps, g, ps).permute(1, 3, 0, 2, 4)   # row, col, 3, ps, ps (row-major patches)
        return x.reshape(g * g, 3, ps, ps)

    def preprocess(self, vision_chunks, return_tensors=None, **kwargs):
        pixel_values, grid_thws = [], []
        for chunk in vision_chunks:
            frames = self._frames(chunk)
            pixel_values.extend(self._patches(f) for f in frames)
            grid_thws.append([len(frames), self.grid, self.grid])
        data = {"pixel_values": torch.cat(pixel_values), "grid_thws": torch.tensor(grid_thws, dtype=torch.long)}
        return BatchFeature(data=data, tensor_type=return_tensors)
'''


def build_tokenizer(out: Path) -> None:
    """A word-level tokenizer over w4..w1022 plus the specials and <|media_pad|> (id 1023): the tiny
    models' tokenizer (harness.save_word_tokenizer) with <|media_pad|> added."""
    save_word_tokenizer(out, VOCAB, 4096, [MEDIA_PAD])


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build_deepseek_v3(out: Path, seed: int = 1234) -> dict:
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(**DEEPSEEK_V3, torch_dtype="bfloat16")
    model = DeepseekV3ForCausalLM(cfg)
    with torch.no_grad():   # a correction bias that changes choices (zeros would not show a missing bias)
        for layer in model.model.layers[FIRST_K_DENSE:]:
            layer.mlp.gate.e_score_correction_bias.uniform_(0.0, 0.1)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    saved = json.loads((out / "config.json").read_text())
    missing = [k for k in ("topk_method", "scoring_func", "q_lora_rank", "kv_lora_rank") if k not in saved]
    if missing:
        raise SystemExit(f"deepseek_v3 config.json lacks {missing}")
    return {"model": "deepseek_v3", "dir": str(out), "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "params": _params(model), "moe_layers": list(range(FIRST_K_DENSE, LAYERS)),
            "dense_layers": list(range(FIRST_K_DENSE)), "architectures": saved.get("architectures")}


def build_kimi_k25(out: Path, text_dir: Path, seed: int = 4321) -> dict:
    """The Kimi-K2.5 layout around ``text_dir``'s DeepSeek-V3 weights (unchanged, under ``language_model.``)."""
    import torch
    from safetensors.torch import load_file, save_file
    out.mkdir(parents=True, exist_ok=True)
    for f in text_dir.iterdir():   # the tokenizer files
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, out / f.name)
    text_cfg = json.loads((text_dir / "config.json").read_text())
    text_cfg.pop("architectures", None)
    text_cfg.pop("auto_map", None)
    text = load_file(str(text_dir / "model.safetensors"))
    weights = {f"language_model.{k}": v for k, v in text.items()}
    gen = torch.Generator().manual_seed(seed)
    for name, shape in vision_weight_shapes().items():
        if name.endswith(".bias"):
            t = torch.zeros(shape)
        elif "norm" in name and name.endswith(".weight"):
            t = torch.ones(shape)
        else:
            t = torch.randn(shape, generator=gen) * 0.02
        weights[name] = t.to(torch.bfloat16).contiguous()
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "configuration_kimi_k25.py").write_text(KIMI_CONFIG_PY)
    (out / "image_processing_kimi_k25.py").write_text(KIMI_IMAGE_PROCESSOR_PY)
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "auto_map": {"AutoConfig": "configuration_kimi_k25.KimiK25Config"},
        "text_config": text_cfg,
        "vision_config": dict(VISION),
        "media_placeholder_token_id": MEDIA_PAD_ID,
        "ignore_index": -100,
        "pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": text_cfg.get("transformers_version"),
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "auto_map": {"AutoImageProcessor": "image_processing_kimi_k25.KimiK25TinyImageProcessor"},
        "patch_size": VISION["patch_size"], "grid": GRID, "merge_kernel_size": VISION["merge_kernel_size"],
        "num_frames_per_chunk": FRAMES_PER_CHUNK}, indent=2))
    return {"model": "kimi_k25", "dir": str(out), "text_weights_from": str(text_dir),
            "layers": text_cfg["num_hidden_layers"], "hidden": text_cfg["hidden_size"],
            "text_tensors": len(text), "vision_tensors": len(vision_weight_shapes()),
            "params": sum(v.numel() for v in weights.values()), "architectures": config["architectures"]}


def build_qwen3(out: Path, seed: int = 99) -> dict:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    torch.manual_seed(seed)
    cfg = Qwen3Config(**QWEN3, torch_dtype="bfloat16")
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return {"model": "qwen3", "dir": str(out), "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "params": _params(model), "dense_layers": list(range(LAYERS)), "moe_layers": [],
            "architectures": json.loads((out / "config.json").read_text()).get("architectures")}


GATE_SCALE = 0.01          # --unambiguous-routing: every mlp.gate.weight times this
BIAS_SPACING = 0.25        # ... and e_score_correction_bias a permutation of 0, 0.25, 0.5, ... per router


def text_key(key: str) -> str:
    """A checkpoint key without the wrapper's ``language_model.`` prefix: the DeepSeek-V3 checkpoint and the
    Kimi-K2.5-shaped wrapper name the same text tensor by the same text key."""
    return key[len("language_model."):] if key.startswith("language_model.") else key


def _key_seed(key: str) -> int:
    import hashlib
    return int.from_bytes(hashlib.sha256(text_key(key).encode()).digest()[:8], "big")


def routing_bias(key: str, experts: int):
    """The correction bias of one router: 0, 0.25, ..., (experts - 1) * 0.25 in an order seeded by the text
    key (so both checkpoints get the same values), float32 (exact in bf16)."""
    import torch
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(_key_seed(key)))
    return perm.to(torch.float32) * BIAS_SPACING


def make_routing_unambiguous(ckpt: Path) -> dict:
    """Rewrite ``ckpt``'s model.safetensors so that bf16 and float32 pick the same experts for every token:
    every ``mlp.gate.weight`` times GATE_SCALE (router logits near 0, sigmoid scores near 0.5) and every
    ``mlp.gate.e_score_correction_bias`` set to distinct values BIAS_SPACING apart (routing_bias), which then
    decide the choice with a margin far above bf16's rounding. Applied to each checkpoint from the same
    built weights; keys are taken without ``language_model.``. Returns what was changed."""
    import torch
    from safetensors.torch import load_file, save_file
    f = ckpt / "model.safetensors"
    w = load_file(str(f))
    gates, biases = [], []
    for k in sorted(w):
        if k.endswith("mlp.gate.weight"):
            w[k] = (w[k].float() * GATE_SCALE).to(w[k].dtype).contiguous()
            gates.append(k)
        elif k.endswith("mlp.gate.e_score_correction_bias"):
            w[k] = routing_bias(k, w[k].numel()).to(w[k].dtype).contiguous()
            biases.append(k)
    if not gates or len(gates) != len(biases):
        raise SystemExit(f"{ckpt}: {len(gates)} router weights and {len(biases)} correction biases: not a "
                         "noaux_tc MoE checkpoint as built here")
    save_file(w, str(f), metadata={"format": "pt"})
    return {"dir": str(ckpt), "gate_weights_scaled": len(gates), "biases_set": len(biases),
            "gate_scale": GATE_SCALE, "bias_spacing": BIAS_SPACING}


def tensor_hashes(ckpt: Path, text_only: bool = True) -> dict[str, str]:
    """{text key: sha256 of dtype, shape and bytes} of ``ckpt``'s tensors (the wrapper's vision tower and
    projector left out with ``text_only``)."""
    import hashlib
    import torch
    from safetensors.torch import load_file
    out = {}
    for k, t in load_file(str(ckpt / "model.safetensors")).items():
        if text_only and k.startswith(("vision_tower.", "mm_projector.")):
            continue
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        out[text_key(k)] = h.hexdigest()
    return out


def shared_tensors_check(plain: Path, wrapper: Path) -> dict:
    """The text tensors of the plain checkpoint and the wrapper, compared by hash: every key on both sides,
    every hash equal. ``ok`` False names what differs (a wrong fixture must fail before any run)."""
    a, b = tensor_hashes(plain), tensor_hashes(wrapper)
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    routers = [k for k in a if k.endswith(("mlp.gate.weight", "mlp.gate.e_score_correction_bias"))]
    return {"ok": bool(a) and not only_a and not only_b and not differ, "tensors": len(a),
            "equal": len(a) - len(differ) - len(only_a), "router_tensors": len(routers),
            "differ": differ[:20], "only_plain": only_a[:20], "only_wrapper": only_b[:20]}


def dataset_rows(samples: int, seed: int = 20261201, low: int = 50, high: int = 600) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(*WORDS) for _ in range(rng.randrange(low, high))] for _ in range(samples)]


def write_dataset(path: Path, rows: list[list[int]]) -> dict:
    with open(path, "w") as fh:
        for ids in rows:
            fh.write(json.dumps({"input_ids": ids}) + "\n")
    return {"path": str(path), "samples": len(rows), "tokens": sum(map(len, rows)),
            "min_tokens": min(map(len, rows)), "max_tokens": max(map(len, rows))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_root")
    ap.add_argument("--which", default="deepseek_v3,kimi_k25,qwen3")
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--unambiguous-routing", action="store_true",
                    help="router weights x0.01 and correction biases 0.25 apart (make_routing_unambiguous)")
    args = ap.parse_args(argv)
    root = Path(args.out_root)
    root.mkdir(parents=True, exist_ok=True)
    which = [w.strip() for w in args.which.split(",") if w.strip()]
    print(json.dumps({"dataset": write_dataset(root / "dataset.jsonl", dataset_rows(args.samples))}), flush=True)
    if "deepseek_v3" in which or "kimi_k25" in which:
        print(json.dumps(build_deepseek_v3(root / "deepseek_v3")), flush=True)
    if "kimi_k25" in which:
        print(json.dumps(build_kimi_k25(root / "kimi_k25", root / "deepseek_v3")), flush=True)
    if "qwen3" in which:
        print(json.dumps(build_qwen3(root / "qwen3")), flush=True)
    if args.unambiguous_routing:   # after the wrapper copied the built text weights: both from the same ones
        for m in ("deepseek_v3", "kimi_k25"):
            if (root / m).is_dir():
                print(json.dumps({"routing": make_routing_unambiguous(root / m)}), flush=True)
    if (root / "deepseek_v3").is_dir() and (root / "kimi_k25").is_dir():
        check = shared_tensors_check(root / "deepseek_v3", root / "kimi_k25")
        print(json.dumps({"shared_tensors": check}), flush=True)
        if not check["ok"]:
            print(f"the wrapper's text tensors differ from the plain checkpoint's: {check}", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
