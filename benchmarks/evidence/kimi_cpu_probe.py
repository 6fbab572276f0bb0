"""On a CPU machine, run vLLM 0.20.0's own code for what the Kimi-K2.5-shaped checkpoint needs at engine start.

    PYTHONPATH=TF:DEPS:SITE HF_HUB_OFFLINE=1 python benchmarks/evidence/kimi_cpu_probe.py CKPT_DIR

TF: transformers 4.57.6 (+ huggingface_hub 0.36.2, tokenizers 0.22.2, safetensors, pillow); SITE: vLLM 0.20.0's
sources (pkgsource.unpacked('vllm', '0.20.0')); DEPS: what importing them needs and torch does not bring,
installed with ``pip install --no-deps --target DEPS``: pybase64 aiohttp multidict attrs yarl propcache
aiohappyeyeballs aiosignal frozenlist gguf psutil pyzmq cachetools cbor2 openai_harmony openai httpx2 sniffio
anyio compressed_tensors loguru einops cloudpickle triton uvloop py-cpuinfo prometheus_client
llguidance==1.3.0 xgrammar==0.1.33 blake3 (the GPU bundle carries the same, GPU-NOTES.md). CKPT_DIR: the
kimi_k25 directory benchmarks/gpu/lib/models.py builds.

What it runs, printing one JSON line:
  - ModelConfig(trust_remote_code=True) as speculators' generator builds it: the config class vLLM picks,
    the architecture, multimodal and MLA detection, head size, dtype;
  - MULTIMODAL_REGISTRY.supports_multimodal_inputs and MultiModalBudget (what the Scheduler and every
    worker construct at start, even for text prompts): KimiK25ProcessingInfo loads the checkpoint's image
    processor (AutoImageProcessor, trust_remote_code) and runs vLLM's dummy vision chunk through it;
  - MoonViT3dPretrainedModel + KimiK25MultiModalProjector built from the checkpoint's vision config and
    loaded with vLLM's AutoWeightsLoader and KimiK25ForConditionalGeneration.hf_to_vllm_mapper (each weight
    loader checks the tensor's shape). The text model is the deepseek_v3 checkpoint's (same tensors under
    ``language_model.``); building it needs a GPU platform.
"""

from __future__ import annotations

import json
import sys


def main(ckpt: str) -> dict:
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig, set_current_vllm_config
    out: dict = {"checkpoint": ckpt}
    mc = ModelConfig(model=ckpt, tokenizer=ckpt, trust_remote_code=True, dtype="auto", max_model_len=1024,
                     enforce_eager=True)
    out["model_config"] = {"hf_config": f"{type(mc.hf_config).__module__}.{type(mc.hf_config).__name__}",
                           "architectures": mc.architectures, "multimodal": mc.is_multimodal_model,
                           "mla": bool(getattr(mc, "use_mla", False)), "head_size": mc.get_head_size(),
                           "dtype": str(mc.dtype)}
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.encoder_budget import MultiModalBudget
    out["supports_multimodal_inputs"] = MULTIMODAL_REGISTRY.supports_multimodal_inputs(mc)
    sc = SchedulerConfig(max_num_seqs=32, max_model_len=1024, max_num_batched_tokens=8192, is_encoder_decoder=False,
                         enable_chunked_prefill=False)
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=CacheConfig(block_size=16,
                    enable_prefix_caching=False), device_config=DeviceConfig(device="cpu"))
    budget = MultiModalBudget(vc, MULTIMODAL_REGISTRY)
    dummy = MULTIMODAL_REGISTRY.get_dummy_mm_inputs(mc, mm_counts={"vision_chunk": 1}, cache=budget.cache)
    out["mm_budget"] = {"max_tokens_per_item": dict(budget.mm_max_toks_per_item),
                        "encoder_compute_budget": budget.encoder_compute_budget,
                        "dummy_prompt_head": list(dummy["prompt_token_ids"][:6]),
                        "dummy_placeholders": {k: [(p.offset, p.length) for p in v]
                                               for k, v in dummy["mm_placeholders"].items()}}
    from safetensors.torch import load_file
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.kimi_k25 import KimiK25ForConditionalGeneration
    from vllm.model_executor.models.kimi_k25_vit import KimiK25MultiModalProjector, MoonViT3dPretrainedModel
    from vllm.model_executor.models.utils import AutoWeightsLoader
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, distributed_init_method="tcp://127.0.0.1:29533",
                                     local_rank=0, backend="gloo")
        initialize_model_parallel(1)
        torch.set_default_dtype(torch.bfloat16)
        root = torch.nn.Module()
        root.vision_tower = MoonViT3dPretrainedModel(mc.hf_config.vision_config, prefix="vision_tower")
        root.mm_projector = KimiK25MultiModalProjector(mc.hf_config.vision_config, prefix="mm_projector")
    weights = load_file(f"{ckpt}/model.safetensors")
    vision = [(k, v) for k, v in weights.items() if not k.startswith("language_model.")]
    loaded = AutoWeightsLoader(root).load_weights(vision, mapper=KimiK25ForConditionalGeneration.hf_to_vllm_mapper)
    params = {n for n, _ in root.named_parameters()}
    out["vision_weights"] = {"in_checkpoint": len(vision), "loaded": len(loaded), "parameters": len(params),
                             "not_loaded": sorted(params - set(loaded))}
    out["ok"] = (out["supports_multimodal_inputs"] and bool(out["mm_budget"]["max_tokens_per_item"])
                 and not out["vision_weights"]["not_loaded"] and len(loaded) == len(vision))
    return out


if __name__ == "__main__":
    res = main(sys.argv[1])
    print(json.dumps(res))
    sys.exit(0 if res["ok"] else 1)
