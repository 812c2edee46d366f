"""Which Hugging Face models the fused path supports (SUPPORTED, `serves` from a config alone), and their weights
re-laid out for it, once per model (`fuse_weights`): the Llama family, GPT-2, and the decoders of the Llama
family's shape with their own changes (DECODERS), each read from its modules and config; anything the step does
not implement is a ValueError naming it.

The layout itself, and why the Hugging Face parameters become views of it, is weights.py's. Nothing here imports
Triton: a question about a model (facts.py) imports this module, not the kernels.
"""

from __future__ import annotations

import torch

from ..tp import row_reduce_of
from ..tp.shard import is_sharded
from .experts import MOE, experts_fields
from .weights import (
    FusedWeights,
    LayerWeights,
    bias_of,
    conv1d_out_in,
    fuse_rows,
    fused_weight,
    layer_weight,
    refuse,
)

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
# The mixtures of experts among the decoders below: softmax over the router logits, top-k, the top-k weights
# renormalised (Mixtral always, Qwen3-MoE where config.norm_topk_prob), each expert a SiLU-gated MLP; gpt-oss: a
# router with a bias, the top k of its logits then their softmax, experts with biases, gate/up rows interleaved, a
# clamped SwiGLU.
# Decoders of the Llama family's shape that change some part of its layer (fused by _fuse_decoder): per-head Q/K
# norms (Qwen3, Gemma 3), fused QKV and gate/up as shipped with partial rotary and LongRoPE (Phi-3), multipliers
# (Granite), layers without RoPE (SmolLM3), post-norms and whole-projection Q/K norms (OLMo2), Gemma's norms,
# GeGLU, scaled embeddings, soft-capping and sliding-window layers (Gemma 1/2/3), routed experts in place of the MLP
# (Qwen3-MoE, Mixtral: kernels/moe.py), and gpt-oss's attention sinks, biases and clamped experts.
DECODERS = ("qwen3", "phi3", "granite", "smollm3", "olmo2", "gemma", "gemma2", "gemma3_text") + MOE
SUPPORTED = LLAMA_FAMILY + ("gpt2",) + DECODERS


def model_family(model, name: str | None = None) -> str:
    """ "llama" or "gpt2", or a ValueError naming the supported families. `name`: the model's, for the error
    (default: its class's; a caller with the config alone names its architecture)."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in LLAMA_FAMILY or model_type in DECODERS:
        return "llama"
    if model_type == "gpt2":
        return "gpt2"
    raise ValueError(
        f"strategy 'fused': the fused path supports the Llama family (Llama, Qwen2, Mistral), GPT-2, Qwen3, Phi-3, "
        f"Granite, SmolLM3, OLMo2, Gemma 1/2/3 (text), Qwen3-MoE, Mixtral and gpt-oss, got model_type {model_type!r} "
        f"({name or type(model).__name__}); use another strategy for it"
    )


def serves(config) -> bool:
    """Whether the fused path takes a model of this config, as far as the config alone tells: its family, in the
    Llama family a window for each sliding layer (llama_windows), and no GPTQ act-order checkpoint (desc_act in its
    quantization_config: its layers keep their input features in another order, act_order_layers). The other
    checks need the weights (the other families' windows are read from their modules); they refuse very few models."""
    model_type = getattr(config, "model_type", None)
    quantized = getattr(config, "quantization_config", None)
    if model_type not in SUPPORTED or (isinstance(quantized, dict) and quantized.get("desc_act")):
        return False
    return model_type not in LLAMA_FAMILY or _window_refusal(config) is None


def llama_windows(cfg) -> list[int | None]:
    """Each layer's sliding window in the Llama family, as its Hugging Face modeling masks it (keys at
    positions > the query's - window): Mistral's config.sliding_window on every layer (its modeling reads no
    layer_types), Qwen2's on the layers config.layer_types marks sliding (those from max_window_layers on where
    use_sliding_window), Llama none; a ValueError where the config marks sliding layers the modeling cannot
    give a window."""
    why = _window_refusal(cfg)
    if why is not None:
        raise ValueError(f"strategy 'fused': {why}; use another strategy for it")
    n, window = cfg.num_hidden_layers, getattr(cfg, "sliding_window", None)
    if cfg.model_type == "mistral":
        return [window] * n
    kinds = list(getattr(cfg, "layer_types", None) or ["full_attention"] * n)
    return [window if kind == "sliding_attention" else None for kind in kinds[:n]]


def _window_refusal(cfg) -> str | None:
    """Why a Llama-family config's sliding layers have no window the step can take, or None."""
    if cfg.model_type == "mistral" or "sliding_attention" not in (getattr(cfg, "layer_types", None) or []):
        return None
    if cfg.model_type == "llama":  # LlamaModel builds a causal mask only: it would attend to the whole sequence
        return "Llama's config.layer_types marks sliding-window layers, which its modeling does not mask as such"
    if getattr(cfg, "sliding_window", None) is None:
        return f"{cfg.model_type}'s config.layer_types marks sliding-window layers but config.sliding_window is None"
    return None


# Rotary variants whose frequencies do not depend on the sequence length (HF precomputes `inv_freq`).
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
_TANH_GELU = ("gelu_pytorch_tanh", "gelu_new")


def act_order_layers(model) -> list[str]:
    """The layers of `model` holding GPTQ act-order weights (quant/modules.py Int4Linear.act_order), which the fused
    kernels do not read: their packed input features are in another order than the activations'."""
    return [name for name, m in model.named_modules() if getattr(m, "act_order", None) is not None]


def fuse_weights(model) -> FusedWeights:
    """The fused weights of `model`, its parameters re-bound as views of them (no copy if already so)."""
    family = model_family(model)
    ordered = act_order_layers(model)
    if ordered:
        raise ValueError(
            f"strategy 'fused': {ordered[0]} ({len(ordered)} layers in all) holds GPTQ act-order weights (desc_act: "
            f"g_idx other than arange(in_features) // group_size), which the fused kernels do not read; use "
            f"strategy 'static' or 'compiled' (every other preset runs them)"
        )
    # not inference tensors, even under inference_mode: they become the Hugging Face model's parameters
    with torch.inference_mode(False), torch.no_grad():
        if family == "gpt2":
            return _fuse_gpt2(model)
        if model.config.model_type in LLAMA_FAMILY:
            return _fuse_llama(model)
        return _fuse_decoder(model)


# --- the two families -------------------------------------------------------------------------------------


def _fuse_llama(model) -> FusedWeights:
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"strategy 'fused': the fused path supports the SiLU MLP, got hidden_act={cfg.hidden_act!r}")
    windows = llama_windows(cfg)
    rotary = model.model.rotary_emb
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise ValueError(f"strategy 'fused': the fused path supports RoPE types {_STATIC_ROPE}, got {rope_type!r}")
    first = model.model.layers[0].self_attn
    head_dim = first.head_dim
    layers = []
    for block, window in zip(model.model.layers, windows):
        attn, mlp = block.self_attn, block.mlp
        projs = [attn.q_proj, attn.k_proj, attn.v_proj]
        layers.append(
            LayerWeights(
                norm1_w=block.input_layernorm.weight.detach(),
                norm1_b=None,
                w_qkv=fused_weight(projs),
                b_qkv=fuse_rows([(p, "bias") for p in projs]),
                w_o=layer_weight(attn.o_proj),
                b_o=bias_of(attn.o_proj),
                norm2_w=block.post_attention_layernorm.weight.detach(),
                norm2_b=None,
                w_up=fused_weight([mlp.gate_proj, mlp.up_proj]),
                b_up=fuse_rows([(mlp.gate_proj, "bias"), (mlp.up_proj, "bias")]),
                w_down=layer_weight(mlp.down_proj),
                b_down=bias_of(mlp.down_proj),
                scale=float(attn.scaling),
                window=window,
            )
        )
    return FusedWeights(
        family="llama",
        layers=layers,
        embed=model.model.embed_tokens.weight.detach(),
        pos_embed=None,
        norm_w=model.model.norm.weight.detach(),
        norm_b=None,
        lm_head=layer_weight(model.lm_head),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        eps=float(cfg.rms_norm_eps),
        norm="rms",
        act="silu_mul",
        inv_freq=rotary.inv_freq.detach().float(),
        rope_scale=float(rotary.attention_scaling),
        tp=row_reduce_of(first.o_proj),
    )


def _fuse_gpt2(model) -> FusedWeights:
    cfg = model.config
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(
            f"strategy 'fused': the fused path supports GPT-2's tanh GELU, got "
            f"activation_function={cfg.activation_function!r}"
        )
    if getattr(cfg, "reorder_and_upcast_attn", False):
        raise ValueError("strategy 'fused': the fused path does not support reorder_and_upcast_attn")
    tr = model.transformer
    layers = []
    for block in tr.h:
        attn, mlp = block.attn, block.mlp
        layers.append(
            LayerWeights(
                norm1_w=block.ln_1.weight.detach(),
                norm1_b=block.ln_1.bias.detach(),
                w_qkv=conv1d_out_in(attn.c_attn),
                b_qkv=bias_of(attn.c_attn),
                w_o=conv1d_out_in(attn.c_proj),
                b_o=bias_of(attn.c_proj),
                norm2_w=block.ln_2.weight.detach(),
                norm2_b=block.ln_2.bias.detach(),
                w_up=conv1d_out_in(mlp.c_fc),
                b_up=bias_of(mlp.c_fc),
                w_down=conv1d_out_in(mlp.c_proj),
                b_down=bias_of(mlp.c_proj),
                scale=float(attn.scaling),
            )
        )
    return FusedWeights(
        family="gpt2",
        layers=layers,
        embed=tr.wte.weight.detach(),
        pos_embed=tr.wpe.weight.detach(),
        norm_w=tr.ln_f.weight.detach(),
        norm_b=tr.ln_f.bias.detach(),
        lm_head=layer_weight(model.lm_head),
        n_heads=cfg.n_head,
        n_kv_heads=cfg.n_head,
        head_dim=tr.h[0].attn.head_dim,  # n_head is local under tp
        eps=float(cfg.layer_norm_epsilon),
        norm="layer",
        act="gelu_tanh",
        inv_freq=None,
        rope_scale=1.0,
        tp=row_reduce_of(tr.h[0].attn.c_proj),
    )


# --- the decoders of the Llama family's shape with their own changes (DECODERS) -----------------------------


def _module_eps(norm, eps: float, cfg, name: str) -> None:
    """A norm module's epsilon must be the model's (the kernels take one), else a ValueError naming it."""
    got = getattr(norm, "variance_epsilon", getattr(norm, "eps", eps))
    if float(got) != eps:
        refuse(cfg, f"{name} epsilon {got} (the other norms have {eps})")


def _rope_tables(model, cfg) -> dict:
    """The model's rotary tables as FusedWeights fields: inv_freq and rope_scale, Gemma 3's local table, LongRoPE's
    long table and switch; a ValueError for a rotary the step cannot reproduce."""
    rotary = model.model.rotary_emb
    out = {}
    layer_types = getattr(cfg, "layer_types", None)
    if hasattr(rotary, "full_attention_inv_freq"):  # Gemma 3: a table per layer type
        kinds = sorted(set(layer_types))
        if not set(kinds) <= {"full_attention", "sliding_attention"}:
            refuse(cfg, f"layer types {kinds}")
        for kind in kinds:
            if rotary.rope_type[kind] not in _STATIC_ROPE:
                refuse(cfg, f"{rotary.rope_type[kind]!r} RoPE of its {kind} layers")
        out.update(
            inv_freq=rotary.full_attention_inv_freq.detach().float(),
            rope_scale=float(rotary.full_attention_attention_scaling),
        )
        if "sliding_attention" in kinds:
            out.update(
                local_inv_freq=rotary.sliding_attention_inv_freq.detach().float(),
                local_rope_scale=float(rotary.sliding_attention_attention_scaling),
            )
        return out
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type == "longrope":
        return _longrope_tables(rotary, cfg)
    if rope_type not in _STATIC_ROPE:
        refuse(cfg, f"{rope_type!r} RoPE (the fused path supports {', '.join(_STATIC_ROPE)} and longrope)")
    return dict(inv_freq=rotary.inv_freq.detach().float(), rope_scale=float(rotary.attention_scaling))


def _longrope_tables(rotary, cfg) -> dict:
    """LongRoPE (Phi-3): Hugging Face uses its short table while a forward's largest position + 1 stays within
    original_max_position_embeddings and its long one past it, per forward; the step chooses the same way on the
    device (forward.step_ropes). The short table is the one the module was made with (`original_inv_freq`: its
    `inv_freq` buffer may hold the long one after a long forward)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    switch = params.get("original_max_position_embeddings", getattr(cfg, "original_max_position_embeddings", None))
    if switch is None:
        refuse(cfg, "LongRoPE without original_max_position_embeddings")
    short = rotary.original_inv_freq.detach().float()
    long, scale = ROPE_INIT_FUNCTIONS["longrope"](cfg, short.device, seq_len=int(switch) + 1)
    if float(scale) != float(rotary.attention_scaling):
        refuse(cfg, f"LongRoPE attention factors ({scale} long, {rotary.attention_scaling} short)")
    return dict(
        inv_freq=short,
        rope_scale=float(rotary.attention_scaling),
        long_inv_freq=long.to(short.device).float(),
        rope_switch=int(switch),
    )


def _applied_softcap(cfg, cap: float) -> float | None:
    """The attention soft-cap as Hugging Face's attention implementation applies it: its eager, flex and flash
    attention apply it; its SDPA attention does not (transformers before 5.24 ran Gemma 2 on SDPA and dropped the
    cap there; later versions refuse the pair), so neither does the step; another implementation is refused."""
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    if impl == "sdpa":
        return None
    if impl in ("eager", "flex_attention") or impl.startswith("flash"):
        return cap
    refuse(cfg, f"attention soft-capping under attn_implementation={impl!r}")


def _fuse_decoder(model) -> FusedWeights:
    """The DECODERS: the Llama family's layer with what each changes, read from its modules and config; anything
    the step does not implement is a ValueError naming it."""
    cfg = model.config
    mt = cfg.model_type
    gemma = mt.startswith("gemma")
    inner = model.model
    if is_sharded(model):
        refuse(cfg, "tensor-parallel shards (the fused path shards the Llama family and GPT-2 only)")
    if gemma:
        act_name = getattr(cfg, "hidden_activation", None) or cfg.hidden_act
        if act_name not in _TANH_GELU:
            refuse(cfg, f"activation {act_name!r} (GeGLU with the tanh GELU is supported)")
        act = "gelu_tanh_mul"
    else:
        if getattr(cfg, "hidden_act", "silu") != "silu":
            refuse(cfg, f"hidden_act={cfg.hidden_act!r} (the SiLU MLP is supported)")
        act = "silu_mul"
    # OLMo2 and gpt-oss: the norm weight times the float32 normalised x (gpt-oss keeps its norms in float32)
    norm = "rms_offset" if gemma else ("rms_f32" if mt in ("olmo2", "gpt_oss") else "rms")
    eps = float(cfg.rms_norm_eps)
    first = inner.layers[0].self_attn
    head_dim = first.head_dim
    ropes = _rope_tables(model, cfg)
    layer_types = list(getattr(cfg, "layer_types", None) or [])
    unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if unknown:
        refuse(cfg, f"layer types {unknown}")
    if getattr(cfg, "attention_chunk_size", None):
        refuse(cfg, "chunked attention")
    layers = []
    for i, block in enumerate(inner.layers):
        attn, mlp = block.self_attn, block.mlp
        if hasattr(attn, "qkv_proj"):  # Phi-3: fused as shipped (a view, no copy)
            w_qkv, b_qkv = layer_weight(attn.qkv_proj), bias_of(attn.qkv_proj)
        else:
            projs = [attn.q_proj, attn.k_proj, attn.v_proj]
            w_qkv = fused_weight(projs)
            b_qkv = fuse_rows([(p, "bias") for p in projs])
        moe = {}
        if hasattr(mlp, "experts"):  # Qwen3-MoE, Mixtral: the experts' (E, 2I, H) and (E, H, I) tensors as shipped
            moe = experts_fields(mlp, cfg)
            w_up, b_up, w_down = moe.pop("w_up"), moe.pop("b_up", None), moe.pop("w_down")
        elif hasattr(mlp, "gate_up_proj"):  # Phi-3: gate rows then up rows, as shipped
            w_up, b_up = layer_weight(mlp.gate_up_proj), bias_of(mlp.gate_up_proj)
        else:
            w_up = fused_weight([mlp.gate_proj, mlp.up_proj])
            b_up = fuse_rows([(mlp.gate_proj, "bias"), (mlp.up_proj, "bias")])
        if gemma and hasattr(block, "pre_feedforward_layernorm"):  # Gemma 2/3: four norms a layer
            norm1, norm2 = block.input_layernorm, block.pre_feedforward_layernorm
            post_attn, post_ffn = block.post_attention_layernorm, block.post_feedforward_layernorm
        elif mt == "olmo2":  # norms after each branch, none before
            norm1, norm2 = None, None
            post_attn, post_ffn = block.post_attention_layernorm, block.post_feedforward_layernorm
        else:
            norm1, norm2, post_attn, post_ffn = block.input_layernorm, block.post_attention_layernorm, None, None
        norms = (
            ("input norm", norm1),
            ("MLP norm", norm2),
            ("post-attention norm", post_attn),
            ("post-MLP norm", post_ffn),
        )
        for name, module in norms:
            if module is not None:
                _module_eps(module, eps, cfg, name)
        q_norm = getattr(attn, "q_norm", None)
        if q_norm is not None:
            whole = (cfg.num_attention_heads * head_dim,) if mt == "olmo2" else (head_dim,)
            if tuple(q_norm.weight.shape) != whole:
                refuse(cfg, f"q_norm over {tuple(q_norm.weight.shape)} (the fused path's is over {whole})")
            _module_eps(q_norm, eps, cfg, "q_norm")
            if mt == "olmo2" and 2 * ropes["inv_freq"].numel() != head_dim:
                refuse(cfg, "partial rotary with whole-projection Q/K norms")
        window = getattr(attn, "sliding_window", None)
        if mt in ("phi3", "mixtral"):
            window = getattr(cfg, "sliding_window", None)  # these give every layer the config's window
        if layer_types and layer_types[i] == "sliding_attention" and window is None:
            refuse(cfg, f"sliding layer {i} without a window")
        if getattr(attn, "attn_logit_softcapping", None) != getattr(cfg, "attn_logit_softcapping", None):
            refuse(cfg, "per-layer attention soft-capping")
        rope = "global"
        if not getattr(attn, "use_rope", True):  # SmolLM3's NoPE layers
            rope = None
        elif ropes.get("local_inv_freq") is not None and layer_types[i] == "sliding_attention":
            rope = "local"
        layers.append(
            LayerWeights(
                norm1_w=None if norm1 is None else norm1.weight.detach(),
                norm1_b=None,
                w_qkv=w_qkv,
                b_qkv=b_qkv,
                w_o=layer_weight(attn.o_proj),
                b_o=bias_of(attn.o_proj),
                norm2_w=None if norm2 is None else norm2.weight.detach(),
                norm2_b=None,
                w_up=w_up,
                b_up=b_up,
                w_down=w_down if moe else layer_weight(mlp.down_proj),
                b_down=moe.pop("b_down", None) if moe else bias_of(mlp.down_proj),
                scale=float(attn.scaling),
                q_norm=None if q_norm is None else q_norm.weight.detach(),
                k_norm=None if q_norm is None else attn.k_norm.weight.detach(),
                post_attn_w=None if post_attn is None else post_attn.weight.detach(),
                post_ffn_w=None if post_ffn is None else post_ffn.weight.detach(),
                rope=rope,
                window=window,
                sinks=None if getattr(attn, "sinks", None) is None else attn.sinks.detach(),
                **moe,
            )
        )
    _module_eps(inner.norm, eps, cfg, "final norm")
    if getattr(model.lm_head, "bias", None) is not None:
        refuse(cfg, "LM head bias")
    embed = inner.embed_tokens
    embed_scale = None
    if getattr(embed, "embed_scale", None) is not None:  # Gemma: sqrt(hidden), rounded to the model dtype
        scale = embed.embed_scale
        if scale.is_meta:  # a model not materialised yet: the value it is initialised with
            scale = torch.tensor(float(embed.scalar_embed_scale))
        embed_scale = float(scale.to(embed.weight.dtype))
    if mt == "granite":
        embed_scale = float(cfg.embedding_multiplier)
    softcap = getattr(cfg, "final_logit_softcapping", None) if gemma else None
    attn_softcap = getattr(cfg, "attn_logit_softcapping", None) if gemma else None
    if attn_softcap is not None:
        attn_softcap = _applied_softcap(cfg, attn_softcap)
    return FusedWeights(
        family="llama",
        layers=layers,
        embed=embed.weight.detach(),
        pos_embed=None,
        norm_w=inner.norm.weight.detach(),
        norm_b=None,
        lm_head=layer_weight(model.lm_head),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        eps=eps,
        norm=norm,
        act=act,
        tp=None,
        model_type=mt,
        embed_scale=embed_scale,
        residual_scale=float(cfg.residual_multiplier) if mt == "granite" else None,
        logit_div=float(cfg.logits_scaling) if mt == "granite" else None,
        logit_softcap=None if softcap is None else float(softcap),
        attn_softcap=None if attn_softcap is None else float(attn_softcap),
        **ropes,
    )
