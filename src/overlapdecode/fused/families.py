"""Which Hugging Face models the fused path supports, by their config's model_type: the names alone, no torch,
so that a question about a model (facts.py, the bench's command line) does not import the fused path.

The re-layout itself (layout.py) checks the rest, from the weights and modules, and refuses with a ValueError
naming what the step does not implement.
"""

from __future__ import annotations

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
# The mixtures of experts among the decoders below: softmax over the router logits, top-k, the top-k weights
# renormalised (Mixtral always, Qwen3-MoE where config.norm_topk_prob), each expert a SiLU-gated MLP; gpt-oss: a
# router with a bias, the top k of its logits then their softmax, experts with biases, gate/up rows interleaved, a
# clamped SwiGLU.
MOE = ("qwen3_moe", "mixtral", "gpt_oss")
# Decoders of the Llama family's shape that change some part of its layer (fused by _fuse_decoder): per-head Q/K
# norms (Qwen3, Gemma 3), fused QKV and gate/up as shipped with partial rotary and LongRoPE (Phi-3), multipliers
# (Granite), layers without RoPE (SmolLM3), post-norms and whole-projection Q/K norms (OLMo2), Gemma's norms,
# GeGLU, scaled embeddings, soft-capping and sliding-window layers (Gemma 1/2/3), routed experts in place of the MLP
# (Qwen3-MoE, Mixtral: kernels/moe.py), and gpt-oss's attention sinks, biases and clamped experts.
DECODERS = ("qwen3", "phi3", "granite", "smollm3", "olmo2", "gemma", "gemma2", "gemma3_text") + MOE
SUPPORTED = LLAMA_FAMILY + ("gpt2",) + DECODERS


def model_family(model) -> str:
    """ "llama" or "gpt2", or a ValueError naming the supported families."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in LLAMA_FAMILY or model_type in DECODERS:
        return "llama"
    if model_type == "gpt2":
        return "gpt2"
    raise ValueError(
        f"model: the fused path supports the Llama family (Llama, Qwen2, Mistral), GPT-2, Qwen3, Phi-3, Granite, "
        f"SmolLM3, OLMo2, Gemma 1/2/3 (text), Qwen3-MoE, Mixtral and gpt-oss, got model_type {model_type!r} "
        f"({type(model).__name__}); use another strategy for it"
    )


def serves(config) -> bool:
    """Whether the fused path takes a model of this config, as far as the config alone tells: its family, and for
    the Llama family no sliding-window layers (the other families' sliding layers are the step's own:
    weights.LayerWeights.window). The other checks need the weights; they refuse very few models."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED:
        return False
    if model_type not in LLAMA_FAMILY:
        return True
    return "sliding_attention" not in (getattr(config, "layer_types", None) or [])
