"""Why a strategy cannot give a model Hugging Face's tokens: one sentence naming what the model has or lacks,
read from what hf/architecture.py found in its modules and config, or None.

plan.py asks before any device work, and turns a refusal into one ValueError that names the strategy and
suggests the presets that can serve the model (docs/DESIGN.md: an unsupported architecture or setting is
refused up front, never a compiler traceback). The fused path checks its own families (fused/layout.py).
"""

from __future__ import annotations

from . import rope
from .architecture import Architecture, describe, text_config


def _layers(indices) -> str:
    indices = list(indices)
    return (
        "layer " + str(indices[0])
        if len(indices) == 1
        else "layers " + ", ".join(map(str, indices[:6])) + (", ..." if len(indices) > 6 else "")
    )


def refusal(model, cache: str, compiled: bool = False) -> str | None:
    """Why a strategy of this cache kind (strategy.CACHE_KINDS), its step compiled or not, cannot give `model`
    Hugging Face's tokens, or None when it can."""
    arch = describe(model)
    if not arch.causal:
        return f"{arch.name} does not attend causally ({arch.causal_why}); generate needs a causal decoder"
    if cache in ("none", "fused"):
        return None  # no cache to hand over; the fused path checks its families itself (fused/layout.py: SUPPORTED,
        # and what each family's modules and config ask of its step)
    if arch.cache_keyword != "past_key_values":
        took = f"takes its cache as `{arch.cache_keyword}`" if arch.cache_keyword else "takes no cache"
        return f"{arch.name}'s forward {took}, not `past_key_values`, so a cache of ours would never be read"
    if arch.own_cache:
        return f"{arch.name} keeps its state in a cache class of its own ({arch.own_cache}) and refuses others"
    if arch.state_unknown_to_cache:
        return (
            f"{arch.name}'s {_layers(arch.state_unknown_to_cache)} hold a recurrent state ({arch.recurrent_from}) that "
            f"config.layer_types does not give a state-holding kind, so Hugging Face's caches have no place for it"
        )
    if cache == "dynamic":
        return None
    if cache == "static":
        if arch.static_unknown_kinds:
            return (
                f"{arch.name} has layer kinds Hugging Face's static cache has no layer for: "
                f"{', '.join(arch.static_unknown_kinds)}"
            )
        if not arch.mask_utils:
            return (
                f"{arch.name} builds its attention mask with its own code, which does not size it to a static "
                f"cache (models built on transformers' masking utilities do)"
            )
        if arch.local_unknown_to_cache:
            return (
                f"{arch.name}'s local attention {_layers(arch.local_unknown_to_cache)} ({arch.local_from}) need a "
                f"sliding-window cache, and Hugging Face's static cache keeps them as global layers "
                f"(config.layer_types does not mark them)"
            )
        if not arch.static_compiles:
            return (
                f"Hugging Face does not declare {arch.name} usable with its static cache "
                f"(_can_compile_fullgraph is False)"
            )
        if compiled and arch.rope:
            return _rope_refusal(model, arch)
    return None


def _rope_refusal(model, arch: Architecture) -> str | None:
    """Why the length-dependent rotary modules cannot run in a compiled step (rope.py), or None."""
    for mname, module in arch.rope_modules:
        why = rope.compiles(module)
        if why is not None:
            return f"{arch.name}'s {'/'.join(arch.rope)} RoPE ({mname}: {why}) recomputes its tables in Python"
        limit = rope.dynamic_limit(module)
        positions = getattr(text_config(model), "max_position_embeddings", None)
        if limit is not None and (not isinstance(positions, int) or positions > limit):
            return (
                f"{arch.name}'s dynamic RoPE rescales its table past {limit} positions, which a call may reach "
                f"(max_position_embeddings={positions}); a compiled step keeps the original table"
            )
    return None


def longrope_crossing(model, request) -> str | None:
    """Why a cache cannot serve this call: its LongRoPE table switches from the short factors to the long ones
    during the call (the keys already cached were rotated with the short ones). Hugging Face's answer is to
    recompute the whole cache at the switch (Phi-3's prepare_inputs_for_generation; in transformers 5.17 it then
    feeds the last token alone, without any cache); the no-cache loop recomputes every step, which is what the
    model means, so `baseline` serves such a call."""
    arch = describe(model)
    if "longrope" not in arch.rope:
        return None
    for _, module in arch.rope_modules:
        threshold = rope.longrope_threshold(module)
        if threshold is None:
            continue
        P = request.input_ids.shape[1]
        longest = int(request.attention_mask.sum(1).max())  # host sync (once per call, LongRoPE models only)
        last = P + request.max_new_tokens - 1  # the sequence length the last step sees (left padding included)
        if longest <= threshold < last:
            return (
                f"{arch.name}'s LongRoPE switches from its short to its long factors past {threshold} positions, "
                f"and this call crosses it (a prompt of {longest} + {request.max_new_tokens} new tokens): the "
                f"keys already cached keep the short factors' rotation, where the model means every position "
                f"rotated with the long ones (Hugging Face recomputes its cache there)"
            )
    return None
