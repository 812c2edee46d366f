"""Tiny random models of the decoder families the fused path supports beyond the Llama family and GPT-2
(layout.DECODERS) and of the Llama family's sliding-window configs (Mistral, Qwen2), for the CPU tests
(test_fused_families.py, test_fused_kernels.py) and, at real sizes, the GPU test: each config turns on what its family
changes (per-head Q/K norms, partial rotary, LongRoPE, multipliers, NoPE
layers, post-norms, Gemma's norms and GeGLU, soft-capping, sliding windows shorter than a call, routed experts), with
weights large enough that a dropped change changes the tokens."""

from __future__ import annotations

import torch
import transformers

WINDOW = 6  # sliding windows: shorter than the test calls' prompt + new tokens
LONGROPE_SWITCH = 6  # Phi-3 LongRoPE's original_max_position_embeddings: shorter than the test prompts
SMALL = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=2,
    pad_token_id=0,
    bos_token_id=1,
)


def _longrope(base: dict) -> dict:
    """Phi-3 LongRoPE parameters over 0.75 of the head (Phi-4-mini's), factors of the right length, distinct."""
    pairs = int(base["hidden_size"] // base["num_attention_heads"] * 0.75) // 2  # Phi-3 has no head_dim field
    return dict(
        rope_type="longrope",
        rope_theta=10000.0,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=LONGROPE_SWITCH,
        short_factor=[1.0 + 0.1 * i for i in range(pairs)],
        long_factor=[2.0 + 0.5 * i for i in range(pairs)],
    )


# Gemma 3: its global layers' linear scaling, its local layers' own base frequency
GEMMA3_ROPE = dict(
    full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1_000_000.0),
    sliding_attention=dict(rope_type="default", rope_theta=10_000.0),
)


def family_configs(size: dict | None = None) -> dict:
    """name -> (model class name, config class name, config keywords). `size` replaces SMALL's sizes (the GPU
    test's real shapes); head_dim is then size["head_dim"]."""
    base = dict(SMALL, **(size or {}))
    D = base.pop("head_dim", 24)
    window = base.pop("window", WINDOW)
    moe = base.pop("moe_intermediate_size", 40)  # experts' width: not a multiple of the kernels' tiles
    return {
        # head_dim from the config (24, not hidden / heads = 16): the per-head Q/K norms over it
        "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(base, head_dim=D)),
        # with QKV biases, and one sliding-window layer of two
        "qwen3-sliding": (
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(
                base,
                head_dim=D,
                attention_bias=True,
                use_sliding_window=True,
                sliding_window=window,
                layer_types=["sliding_attention", "full_attention"] * (base["num_hidden_layers"] // 2),
            ),
        ),
        # the Llama family with every layer sliding: Mistral's config window (Mistral-7B-v0.1's 4096 at real sizes
        # is the GPU test's 64), Qwen2's where use_sliding_window, from layer max_window_layers on (QKV biases)
        "mistral-sliding": ("MistralForCausalLM", "MistralConfig", dict(base, head_dim=D, sliding_window=window)),
        "qwen2-sliding": (
            "Qwen2ForCausalLM",
            "Qwen2Config",
            dict(base, use_sliding_window=True, sliding_window=window, max_window_layers=0),
        ),
        # fused qkv_proj / gate_up_proj as shipped, partial rotary (Phi-4-mini's 0.75)
        "phi3": (
            "Phi3ForCausalLM",
            "Phi3Config",
            dict(base, rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
        ),
        # LongRoPE switching at 6 positions: the test calls' prompts (8) are past it (the long table; the short one
        # in test_fused_families.py's LongRoPE tests); Phi-3's own original_max_position_embeddings is the switch
        "phi3-longrope": (
            "Phi3ForCausalLM",
            "Phi3Config",
            dict(base, rope_parameters=_longrope(base), original_max_position_embeddings=LONGROPE_SWITCH),
        ),
        "granite": (
            "GraniteForCausalLM",
            "GraniteConfig",
            dict(
                base,
                head_dim=D,
                embedding_multiplier=6.0,
                attention_multiplier=0.3,
                residual_multiplier=0.4,
                logits_scaling=4.0,
            ),
        ),
        # layer 1 without RoPE
        "smollm3": (
            "SmolLM3ForCausalLM",
            "SmolLM3Config",
            dict(base, head_dim=D, no_rope_layers=[1, 0] * (base["num_hidden_layers"] // 2)),
        ),
        # norms after each branch and none before, Q/K norms over the whole projections
        "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(base, head_dim=D)),
        "gemma": ("GemmaForCausalLM", "GemmaConfig", dict(base, head_dim=D, hidden_activation="gelu_pytorch_tanh")),
        "gemma2": (
            "Gemma2ForCausalLM",
            "Gemma2Config",
            dict(
                base,
                head_dim=D,
                attn_implementation="eager",  # Hugging Face's attention that soft-caps (its SDPA does not)
                query_pre_attn_scalar=20,
                attn_logit_softcapping=3.0,
                final_logit_softcapping=2.0,
                sliding_window=window,
                layer_types=["sliding_attention", "full_attention"] * (base["num_hidden_layers"] // 2),
            ),
        ),
        "gemma3": (
            "Gemma3ForCausalLM",
            "Gemma3TextConfig",
            dict(
                base,
                head_dim=D,
                query_pre_attn_scalar=20,
                sliding_window=window,
                layer_types=["sliding_attention", "full_attention"] * (base["num_hidden_layers"] // 2),
                rope_parameters=GEMMA3_ROPE,
            ),
        ),
        # routed experts in every layer: 8 of 10 per token (Qwen3-30B-A3B's 8), the top-k weights not renormalised,
        # Qwen3's per-head Q/K norms
        "qwen3-moe": (
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            dict(
                base, head_dim=D, num_experts=10, num_experts_per_tok=8, moe_intermediate_size=moe, norm_topk_prob=False
            ),
        ),
        # 2 of 5 per token, renormalised, in layer 0; layer 1 a dense MLP (mlp_only_layers)
        "qwen3-moe-dense": (
            "Qwen3MoeForCausalLM",
            "Qwen3MoeConfig",
            dict(
                base,
                head_dim=D,
                num_experts=5,
                num_experts_per_tok=2,
                moe_intermediate_size=moe,
                norm_topk_prob=True,
                mlp_only_layers=list(range(1, base["num_hidden_layers"], 2)),
            ),
        ),
        # 2 of 6 per token, always renormalised (Mixtral's experts are intermediate_size wide)
        "mixtral": (
            "MixtralForCausalLM",
            "MixtralConfig",
            dict(base, head_dim=D, num_local_experts=6, num_experts_per_tok=2, intermediate_size=moe),
        ),
        # gpt-oss: attention sinks, Q/K/V/O biases, a sliding layer then a full one, YaRN, 2 of 5 experts per token
        # (the top k of the biased router's logits, then their softmax), experts with biases, interleaved gate/up
        # and the clamped SwiGLU (its limit reached: family_model's larger gate/up weights)
        "gpt-oss": ("GptOssForCausalLM", "GptOssConfig", _gpt_oss(base, D, window, moe, 5, 2)),
        # 3 of 7 per token
        "gpt-oss-top3": ("GptOssForCausalLM", "GptOssConfig", _gpt_oss(base, D, window, moe, 7, 3)),
    }


def _gpt_oss(base: dict, D: int, window: int, width: int, experts: int, top_k: int) -> dict:
    """gpt-oss's config at `base`'s sizes: experts `width` wide (a multiple of 4: Hugging Face's grouped_mm experts
    want 16-byte strides), YaRN over a quarter of max_position_embeddings (gpt-oss's factor 32 at 4096 of 131072)."""
    yarn = dict(rope_type="yarn", rope_theta=150000.0, factor=4.0, beta_fast=32.0, beta_slow=1.0, truncate=False)
    yarn["original_max_position_embeddings"] = base["max_position_embeddings"] // 4
    return dict(
        base,
        head_dim=D,
        intermediate_size=width,
        num_local_experts=experts,
        num_experts_per_tok=top_k,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"] * (base["num_hidden_layers"] // 2),
        rope_parameters=yarn,
    )


FAMILIES = list(family_configs())

# Real sizes of each family for the GPU test (tests/gpu/test_gpu_fused.py): the widths of a released model
# (Mistral-7B, Qwen2-1.5B, Qwen3-0.6B, Phi-4-mini, Granite-3.1-2B, SmolLM3-3B, OLMo-2-1B, Gemma-2B, Gemma-2-2B, Gemma-3-1B, Qwen3-30B-A3B,
# Mixtral-8x7B, gpt-oss-20b), two layers, sliding windows of 64 (shorter than its calls); Granite with its released
# multipliers, the mixtures of experts with their released expert counts and top k
_QWEN3 = dict(hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072)
_PHI4 = dict(hidden_size=3072, num_attention_heads=24, num_key_value_heads=8, intermediate_size=8192)
_QWEN3_MOE = dict(  # Qwen3-30B-A3B
    hidden_size=2048,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    intermediate_size=6144,
    moe_intermediate_size=768,
    vocab_size=151936,
)
_GPT_OSS_20B = dict(
    hidden_size=2880,
    num_attention_heads=64,
    num_key_value_heads=8,
    head_dim=64,
    moe_intermediate_size=2880,
    vocab_size=201088,
    window=64,
)
_GEMMA2 = dict(hidden_size=2304, num_attention_heads=8, num_key_value_heads=4, head_dim=256, intermediate_size=9216)
REAL_SIZES = {
    "mistral-sliding": dict(
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        vocab_size=32000,
        window=64,
    ),
    "qwen2-sliding": dict(
        hidden_size=1536,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        window=64,
    ),
    "qwen3": dict(_QWEN3, vocab_size=151936),
    "qwen3-sliding": dict(_QWEN3, vocab_size=151936, window=64),
    "phi3": dict(_PHI4, vocab_size=200064),
    "phi3-longrope": dict(_PHI4, vocab_size=200064),
    "granite": dict(
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=8192,
        vocab_size=49155,
    ),
    "smollm3": dict(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        intermediate_size=11008,
        vocab_size=128256,
    ),
    "olmo2": dict(
        hidden_size=2048,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=128,
        intermediate_size=8192,
        vocab_size=100352,
    ),
    "gemma": dict(
        hidden_size=2048,
        num_attention_heads=8,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=16384,
        vocab_size=256000,
    ),
    "gemma2": dict(_GEMMA2, vocab_size=256000, window=64),
    "gemma3": dict(
        hidden_size=1152,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        intermediate_size=6912,
        vocab_size=262144,
        window=64,
    ),
    "qwen3-moe": _QWEN3_MOE,
    "qwen3-moe-dense": _QWEN3_MOE,
    "mixtral": dict(  # Mixtral-8x7B
        hidden_size=4096,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=14336,
        moe_intermediate_size=14336,
        vocab_size=32000,
    ),
    "gpt-oss": _GPT_OSS_20B,
    "gpt-oss-top3": _GPT_OSS_20B,
}
_QWEN3_30B_ROUTING = dict(num_experts=128, num_experts_per_tok=8, norm_topk_prob=True)
REAL_CONFIG = {  # released values where the tiny tests use others
    "granite": dict(
        embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0
    ),
    "gemma2": dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=256),
    "gemma3": dict(query_pre_attn_scalar=256),
    "qwen3-moe": _QWEN3_30B_ROUTING,
    "qwen3-moe-dense": _QWEN3_30B_ROUTING,
    "mixtral": dict(num_local_experts=8, num_experts_per_tok=2),
    "gpt-oss": dict(num_local_experts=32, num_experts_per_tok=4),  # gpt-oss-20b's
}


def real_model(name: str, device="cuda"):
    """Family `name` at its REAL_SIZES, two layers, Hugging Face's initial scale (matrices normal(0, 0.02))."""
    return family_model(
        name, dict(REAL_SIZES[name], num_hidden_layers=2), device=device, std=0.02, **REAL_CONFIG.get(name, {})
    )


def family_model(name: str, size: dict | None = None, device="cpu", seed: int = 0, std: float = 0.1, **config):
    """The random model `name` of family_configs, float32, eval: matrices (the experts' stacks included) normal(0,
    std) (larger than Hugging Face's 0.02, so that soft-caps, multipliers and norms move the logits), norm weights
    normal(1, 0.1) (Gemma's, which add 1, normal(0, 0.1)), biases normal(0, 0.1). `config`: more config keywords."""
    model_cls, cfg_cls, kw = family_configs(size)[name]
    torch.manual_seed(seed)
    cfg = getattr(transformers, cfg_cls)(**dict(kw, **config))
    with torch.device(device):
        model = getattr(transformers, model_cls)(cfg).eval()
    gemma = cfg.model_type.startswith("gemma")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("sinks"):  # gpt-oss: large enough to take much of each softmax
                p.normal_(1.0, 1.0)
            elif pname.endswith("gate_up_proj"):  # gpt-oss's experts: past the activation's clamp at times
                p.normal_(0.0, 4 * std)
            elif pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in pname:
                p.normal_(0.0 if gemma else 1.0, 0.1)
            elif p.dim() >= 2:  # matrices, and the experts' (E, out, in) stacks
                p.normal_(0.0, std)
    return model
