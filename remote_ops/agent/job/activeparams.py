"""Parameters one token passes through in a forward, counted from a checkpoint's config.json (stdlib only).

The compute bound of the launch plan takes 2 FLOPs per active parameter per token. Counted: each decoder
layer's attention projections (multi-head or grouped-query: q, k, v, o; multi-head latent attention where
the MLA fields are there: q_a/q_b or q, kv_a, kv_b, o) and its MLP (gated: gate, up, down); in an MoE layer
only the experts a token is routed to (num_experts_per_tok) plus the shared experts and the router.
Not counted: the embeddings (a lookup), the lm_head (the extraction asks for one token per sample), the
norms, and the attention's score and value products (they grow with the sequence length).
A field it needs that is missing gives {"unknown": why}, never a guess.
"""


def _int(cfg, *names):
    for name in names:
        v = cfg.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


def text_config(cfg):
    """The language model's part of a config: text_config when the top level has no hidden_size."""
    if cfg.get("hidden_size") is None and isinstance(cfg.get("text_config"), dict):
        return cfg["text_config"]
    return cfg


def _attention(c, hidden):
    heads = _int(c, "num_attention_heads")
    if not heads:
        return None, "no num_attention_heads"
    if _int(c, "kv_lora_rank") and _int(c, "qk_rope_head_dim") is not None:     # MLA (DeepSeek-V2/V3, Kimi)
        nope, rope = _int(c, "qk_nope_head_dim"), _int(c, "qk_rope_head_dim")
        v_dim, kv_rank, q_rank = _int(c, "v_head_dim"), _int(c, "kv_lora_rank"), _int(c, "q_lora_rank")
        if nope is None or v_dim is None:
            return None, "MLA config without qk_nope_head_dim / v_head_dim"
        qk = nope + rope
        q = hidden * q_rank + q_rank * heads * qk if q_rank else hidden * heads * qk
        return q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden, "MLA"
    kv = _int(c, "num_key_value_heads") or heads
    head_dim = _int(c, "head_dim") or hidden // heads
    return hidden * heads * head_dim * 2 + hidden * kv * head_dim * 2, "GQA %d/%d" % (heads, kv)


def count(cfg):
    """{active_params, attention, per_layer, layers, moe_layers, routed, shared, how} or {"unknown": why}."""
    c = text_config(cfg)
    hidden, layers = _int(c, "hidden_size"), _int(c, "num_hidden_layers")
    if not hidden or not layers:
        return {"unknown": "no hidden_size / num_hidden_layers"}
    attn, kind = _attention(c, hidden)
    if attn is None:
        return {"unknown": kind}
    inter = _int(c, "intermediate_size")
    experts = _int(c, "n_routed_experts", "num_experts", "num_local_experts")
    topk = _int(c, "num_experts_per_tok", "moe_topk")
    if experts and not topk:
        return {"unknown": "an MoE config (%d experts) without num_experts_per_tok" % experts}
    dense_mlp = 3 * hidden * inter if inter else None
    moe_layers, moe_mlp, shared = 0, 0, 0
    if experts:
        expert_inter = _int(c, "moe_intermediate_size") or inter
        if not expert_inter:
            return {"unknown": "an MoE config without moe_intermediate_size / intermediate_size"}
        n_shared = _int(c, "n_shared_experts") or 0
        shared = n_shared * 3 * hidden * expert_inter
        if _int(c, "shared_expert_intermediate_size"):                     # Qwen2-MoE's one shared expert
            shared += 3 * hidden * _int(c, "shared_expert_intermediate_size")
        moe_mlp = topk * 3 * hidden * expert_inter + shared + hidden * experts
        first_dense = _int(c, "first_k_dense_replace") or 0
        freq, sparse_step = _int(c, "moe_layer_freq") or 1, _int(c, "decoder_sparse_step") or 1
        # DeepSeek's rule (i >= first_k_dense_replace and i % moe_layer_freq == 0), Qwen-MoE's
        # ((i + 1) % decoder_sparse_step == 0)
        moe_layers = sum(1 for i in range(first_dense, layers) if i % freq == 0 and (i + 1) % sparse_step == 0)
        if moe_layers < layers and dense_mlp is None:
            return {"unknown": "dense layers without intermediate_size"}
    elif dense_mlp is None:
        return {"unknown": "no intermediate_size"}
    total = layers * attn + moe_layers * moe_mlp + (layers - moe_layers) * (dense_mlp or 0)
    how = "%d layers, attention %s" % (layers, kind)
    if experts:
        how += ", MoE %d of %d experts + %d shared in %d layers" % (topk, experts, _int(c, "n_shared_experts") or 0,
                                                                    moe_layers)
    how += "; embeddings and lm_head not counted"
    return {"active_params": total, "attention_params": layers * attn, "layers": layers,
            "moe_layers": moe_layers, "routed": topk if experts else None, "experts": experts, "how": how}
