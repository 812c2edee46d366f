"""A call's speculation arguments, checked before any device work: what plan.py keeps as `Plan.spec`.

Hugging Face's names: `prompt_lookup_num_tokens=K` drafts K tokens by n-gram lookup in each row's own tokens;
`assistant_model=draft, num_assistant_tokens=K` drafts them with a smaller model of the same vocabulary. Each
refusal is one ValueError or TypeError whose message starts with the argument it is about (the command line maps
it onto its flag): a K that is no int >= 1, both kinds at once, a draft of another vocabulary or device, a strategy
no round loop runs (it names the presets that speculate), a model whose cache cannot be cut back to the accepted
tokens.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

from ..hf.architecture import describe
from ..hf.refusals import refusal
from ..inputs import check_model, model_device
from ..strategy import PRESETS, Strategy
from ..tp.shard import is_sharded

# Hugging Face's defaults where the call and the model's generation config give none
NUM_ASSISTANT_TOKENS = 20
MAX_MATCHING_NGRAM = 2


def reference_rounds(strategy: Strategy) -> bool:
    """Whether rounds.py's reference loop runs the strategy's speculation: eager steps on a dynamic or static Hugging
    Face cache, the stop read each round."""
    return strategy.cache in ("dynamic", "static") and not strategy.compile and strategy.stop_check == "sync"


def captured_rounds(strategy: Strategy) -> bool:
    """Whether loop/rounds.py's captured rounds run it: the fused cache, or a compiled static cache (any stop check)."""
    return strategy.cache == "fused" or (strategy.cache == "static" and strategy.compile)


# the presets that speculate: kv and static by the reference loop, compiled, interleaved and fused by captured rounds
SPEC_PRESETS = tuple(n for n, s in PRESETS.items() if reference_rounds(s) or captured_rounds(s))


@dataclass(frozen=True)
class Speculation:
    """What a call drafts: `kind` prompt_lookup | assistant, `k` tokens a round, `ngram` the longest n-gram
    prompt lookup matches, `assistant` the draft model (None for prompt lookup)."""

    kind: str
    k: int
    ngram: int = MAX_MATCHING_NGRAM
    assistant: object = field(default=None, compare=False, repr=False)


def _count(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1 or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1 (the tokens drafted each round), got {value}")


def check_spec_strategy(strategy: Strategy, label: str, what: str) -> None:
    """ValueError naming the strategy unless a round loop runs it (`label`: the strategy as the caller named it;
    `what`: the speculation argument)."""
    if reference_rounds(strategy) or captured_rounds(strategy):
        return
    names = ", ".join(repr(n) for n in SPEC_PRESETS[:-1]) + f" and {SPEC_PRESETS[-1]!r}"
    raise ValueError(
        f"strategy {label}: speculative decoding ({what}) runs on the presets {names} (a cache that keeps every "
        f"token: eager steps reading the stop each round, or a compiled static or fused cache); use one of them"
    )


def spec_refusal(model) -> str | None:
    """Why the round loop cannot give `model` its tokens without speculation, or None: it writes K + 1 slots a round
    and keeps each row's accepted ones, so a layer's state must be a cache of keys that can be cut back, and each
    token's position must be given."""
    arch = describe(model)
    if arch.recurrent_layers:
        return f"{arch.name} has recurrent layers, whose state a rejected draft token has already changed"
    if arch.local_layers:
        return f"{arch.name} has local attention layers, whose window counts cache slots, holes included"
    if not arch.takes_position_ids:
        return f"{arch.name}'s forward takes no position_ids, and the rows' positions differ after a round"
    if arch.rope:
        return f"{arch.name}'s {'/'.join(arch.rope)} RoPE recomputes its table from the positions of each forward"
    if _shifts_lone_token(model):
        return (
            f"{arch.name}'s forward adds the cache length to the position_ids of a one-token step alone (this "
            "transformers' GIT), so a token verified among K + 1 would take another position than generate() gives it"
        )
    return None


def _shifts_lone_token(model) -> bool:
    """Whether the model's forward moves the positions of a one-token step by the cache length and those of a longer
    step not: GIT's text decoder on some transformers (5.17: `if pixel_values is None and past_key_values is not None
    and seq_len == 1: position_ids = position_ids + past_key_values_length`), read from the source of its class."""
    if getattr(model.config, "model_type", None) != "git":
        return False
    from transformers.models.git import modeling_git

    source = inspect.getsource(modeling_git.GitModel.forward)
    return "seq_len == 1" in source and "position_ids = position_ids +" in source


def _generation_value(model, attr: str, default: int) -> int:
    value = getattr(getattr(model, "generation_config", None), attr, None)
    return default if value is None else value


def check_speculation(
    model, strategy: Strategy, label: str, prompt_lookup_num_tokens, assistant_model, num_assistant_tokens
) -> Speculation | None:
    """The call's Speculation, None when it asks for none, or the error naming the argument."""
    _count("prompt_lookup_num_tokens", prompt_lookup_num_tokens)
    _count("num_assistant_tokens", num_assistant_tokens)
    if num_assistant_tokens is not None and assistant_model is None:
        raise ValueError("num_assistant_tokens is given without assistant_model: it counts the draft model's tokens")
    if prompt_lookup_num_tokens is not None and assistant_model is not None:
        raise ValueError(
            "prompt_lookup_num_tokens and assistant_model both given: a call drafts by prompt lookup or by a draft "
            "model, not both"
        )
    if prompt_lookup_num_tokens is None and assistant_model is None:
        return None
    what = "prompt_lookup_num_tokens" if assistant_model is None else "assistant_model"
    check_spec_strategy(strategy, label, what)
    if is_sharded(model):
        raise ValueError(f"{what}: speculative decoding does not run on tensor-parallel shards yet")
    why = spec_refusal(model)
    if why is not None:
        raise ValueError(f"{what}: {why}; generate without speculation")
    if assistant_model is None:
        ngram = _generation_value(model, "max_matching_ngram_size", MAX_MATCHING_NGRAM)
        _count("max_matching_ngram_size", ngram)
        return Speculation("prompt_lookup", prompt_lookup_num_tokens, ngram=ngram)
    check_assistant(model, assistant_model, strategy)
    k = num_assistant_tokens
    k = _generation_value(model, "num_assistant_tokens", NUM_ASSISTANT_TOKENS) if k is None else k
    _count("num_assistant_tokens", k)
    return Speculation("assistant", k, assistant=assistant_model)


def check_assistant(model, draft, strategy: Strategy) -> None:
    """The draft model: a causal LM in eval mode on the model's device, with the model's vocabulary (its LM head
    scores the same ids), whose cache the strategy's kind can hold and the round loop can cut back (under `fused`, a
    draft of a family the fused path lacks runs on a compiled static cache)."""
    try:
        check_model(draft)
    except (ValueError, TypeError) as err:
        raise type(err)(f"assistant_model: {err}") from None
    if model_device(draft) != model_device(model):
        raise ValueError(f"assistant_model is on {model_device(draft)} but the model is on {model_device(model)}")
    ours, theirs = (m.get_output_embeddings().weight.shape[0] for m in (model, draft))
    if ours != theirs:
        raise ValueError(
            f"assistant_model scores {theirs} token ids and the model {ours}: the draft must share the model's "
            f"vocabulary (the same tokenizer)"
        )
    if is_sharded(draft):
        raise ValueError("assistant_model: speculative decoding does not run on tensor-parallel shards yet")
    fused = strategy.cache == "fused"
    why = refusal(draft, "static" if fused else strategy.cache, strategy.compile or fused) or spec_refusal(draft)
    if why is not None:
        raise ValueError(f"assistant_model: {why}")
