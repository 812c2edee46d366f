"""One `generate()` call resolved once into a frozen `Plan`: the request checked, the model's generation defaults
applied as Hugging Face generate() applies them, and the strategy taken apart into what the loop runs.

Why one place: a strategy composes a cache, a way of running the step and a stop check, and each of those asks
something of the model and of the call (hf/refusals.py says what a model's layers need). Resolving them here,
before any device work, means every refusal is one clear error up front, and nothing downstream reads the
strategy again: decode.py, the steps (loop/, hf/, fused/) and the stop checks read the plan's fields.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from .hf.refusals import longrope_crossing, refusal
from .inputs import Request, check_request
from .sampling import SamplingParams, check_sampling
from .spec.options import Speculation, check_speculation
from .strategy import LAGGED_TEXT, LATE_CHECKS, PRESETS, Strategy, resolve_strategy
from .tp.shard import is_sharded

# Round the static cache length up, so that nearby prompt lengths share one compiled graph.
STATIC_ROUND = 64
# generation_config values that Hugging Face's greedy search applies and overlapdecode does not:
# (attribute, value that changes nothing)
GREEDY_PROCESSORS = (
    ("forced_bos_token_id", None),
    ("forced_eos_token_id", None),
    ("no_repeat_ngram_size", 0),
    ("encoder_no_repeat_ngram_size", 0),
    ("bad_words_ids", None),
    ("suppress_tokens", None),
    ("begin_suppress_tokens", None),
    ("sequence_bias", None),
    ("min_length", 0),
    ("min_new_tokens", None),
    ("exponential_decay_length_penalty", None),
)
# generation_config values that od.generate applies as Hugging Face does, where its own argument is not given:
# (attribute, value that changes nothing)
APPLIED_DEFAULTS = (("repetition_penalty", 1.0),)
# the sampling warpers Hugging Face generate() reads from generation_config where a call gives none, and its own
# defaults where the generation config sets none either (GenerationConfig._get_default_generation_params)
SAMPLING_DEFAULTS = (("temperature", 1.0), ("top_k", 50), ("top_p", 1.0), ("min_p", None))


@dataclass(frozen=True)
class Plan:
    """What one call runs. `cache`: none | dynamic | static (Hugging Face's caches, hf/caches.py) | fused (the
    fused path's own model, cache and step, fused/); `step`: eager | compiled (torch.compile, CUDA graphs: the
    static cache) | captured (the fused step in its own CUDA graph, loop/step_graph.py); `stop_check`: sync |
    pingpong | deferred | end, read `lag` steps late (0 for sync, max_new_tokens for end: loop/stopping.py);
    `cache_len`: the slots of a static or fused cache, every position a step (also a late one) writes; `spec`: the
    speculative decoding asked for (spec/options.py; spec/rounds.py then runs the call), or None."""

    request: Request
    sampling: SamplingParams
    seed: int | None
    cache: str
    step: str
    stop_check: str
    lag: int
    cache_len: int
    spec: Speculation | None = None

    @property
    def fused(self) -> bool:
        return self.cache == "fused"

    @property
    def slots(self) -> int:
        """Pinned host slots of the stop flags: lag + 1 for a late check, none for sync and end."""
        return self.lag + 1 if self.stop_check in LATE_CHECKS else 0

    @property
    def side_streams(self) -> bool:
        """Whether the decode steps run on two side streams in ping-pong (CUDA only)."""
        return self.stop_check == "pingpong"


def static_cache_len(prompt_len: int, max_new_tokens: int) -> int:
    """Cache slots for a call: every position that any step (also a late-stop extra step) writes."""
    need = prompt_len + max_new_tokens
    return -(-need // STATIC_ROUND) * STATIC_ROUND


def make_plan(
    model,
    input_ids,
    attention_mask,
    max_new_tokens,
    strategy,
    eos_token_id,
    pad_token_id,
    *,
    do_sample,
    temperature,
    top_k,
    top_p,
    min_p,
    repetition_penalty,
    seed,
    prompt_lookup_num_tokens=None,
    assistant_model=None,
    num_assistant_tokens=None,
) -> Plan:
    """The plan of one call of `Decoder.generate` (its arguments, after the model), or the ValueError/TypeError
    naming the argument, the strategy or what the model lacks, before any device work."""
    strat = resolve_strategy(strategy)
    req = check_request(model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)
    if repetition_penalty is None:  # the model's generation_config's, as Hugging Face generate() reads it
        repetition_penalty = generation_defaults(model).get("repetition_penalty")
    if do_sample is None:  # the model's generation_config's, as Hugging Face generate() reads it (default False)
        do_sample = sampling_defaults(model)["do_sample"]
    if do_sample is True:  # a warper not given: the generation config's, else Hugging Face's default
        defaults = sampling_defaults(model)
        temperature = defaults["temperature"] if temperature is None else temperature
        top_k = defaults["top_k"] if top_k is None else top_k
        top_p = defaults["top_p"] if top_p is None else top_p
        min_p = defaults["min_p"] if min_p is None else min_p
    params = check_sampling(do_sample, temperature, top_k, top_p, seed, min_p, repetition_penalty)
    check_strategy(model, strat, strategy, req)  # what the model's layers need of the strategy
    spec = check_speculation(
        model, strat, _label(strat, strategy), prompt_lookup_num_tokens, assistant_model, num_assistant_tokens
    )
    if strat.lag > req.max_new_tokens and strat.stop_check in LATE_CHECKS:
        raise ValueError(
            f"strategy: a stop check {strat.lag} steps late cannot be used with max_new_tokens="
            f"{req.max_new_tokens}; use a lag <= max_new_tokens (the lag of {LAGGED_TEXT})"
        )
    if params.do_sample and seed is None and is_sharded(model):
        raise ValueError(
            "seed: sampling under tensor parallelism needs an explicit seed, so that every rank draws the "
            "same noise and picks the same token (each rank's global generator may differ)"
        )
    if not strat.compile:
        step = "eager"
    else:
        step = "captured" if strat.cache == "fused" else "compiled"
    lag = {"sync": 0, "end": req.max_new_tokens}.get(strat.stop_check, strat.lag)
    P = req.input_ids.shape[1]
    cache_len = static_cache_len(P, req.max_new_tokens)
    return Plan(req, params, seed, strat.cache, step, strat.stop_check, lag, cache_len, spec)


def _label(strategy: Strategy, given) -> str:
    """The strategy as the caller named it, for a message: 'kv', or the preset it equals, or its fields."""
    name = given if isinstance(given, str) else next((n for n, s in PRESETS.items() if s == strategy), None)
    return repr(name) if name else str(strategy)


def check_strategy(model, strategy: Strategy, given=None, request: Request | None = None) -> None:
    """ValueError, naming the strategy and what the model has or lacks, if `strategy` cannot give `model` Hugging
    Face's tokens; the presets that can are suggested. `given`: the strategy as the caller named it; `request`:
    the call, for what depends on its length. A UserWarning for generation_config settings Hugging Face would
    apply and overlapdecode does not."""
    procs = greedy_processors(model)
    if procs:
        listed = ", ".join(f"{k}={v!r}" for k, v in procs.items())
        warnings.warn(
            f"{type(model).__name__}'s generation_config asks Hugging Face generate() for {listed}, which "
            f"overlapdecode does not apply: these are greedy search's tokens without them (set them to None "
            f"in model.generation_config to silence this)",
            UserWarning,
            stacklevel=4,  # check_strategy <- make_plan <- Decoder.generate <- its caller
        )
    why = refusal(model, strategy.cache, strategy.compile)
    crossing = None
    if why is None and request is not None and strategy.cache not in ("none", "fused"):
        why = crossing = longrope_crossing(model, request)
    if why is None:
        return
    label = f"strategy {_label(strategy, given)}"
    ok = [n for n, s in PRESETS.items() if s.cache != "fused" and refusal(model, s.cache, s.compile) is None]
    ok = ["baseline"] if crossing else ok[::-1][:2]
    hint = f"; use strategy={' or '.join(repr(n) for n in ok)}" if ok else ""
    raise ValueError(f"{label}: {why}{hint}")


def _set_values(model, table) -> dict:
    gen = getattr(model, "generation_config", None)
    if gen is None:
        return {}
    out = {}
    for attr, neutral in table:
        value = getattr(gen, attr, neutral)
        if value is not None and value != neutral and value != [] and value != {}:
            out[attr] = value
    return out


def greedy_processors(model) -> dict:
    """generation_config values with which Hugging Face's greedy search changes the argmax token, and which
    overlapdecode does not apply (a UserWarning names them: check_strategy)."""
    return _set_values(model, GREEDY_PROCESSORS)


def generation_defaults(model) -> dict:
    """generation_config values that od.generate applies where the call does not give its own argument, as
    Hugging Face generate() does (a call's argument wins)."""
    return _set_values(model, APPLIED_DEFAULTS)


def sampling_defaults(model) -> dict:
    """The temperature, top_k, top_p and min_p that Hugging Face generate(do_sample=True) applies where the call
    does not give its own: the model's generation_config's, else Hugging Face's defaults (top-k 50); and whether it
    samples at all where the call does not say (`do_sample`: the generation config's, else False)."""
    gen = getattr(model, "generation_config", None)
    out = {"do_sample": bool(getattr(gen, "do_sample", False)) if gen is not None else False}
    for attr, default in SAMPLING_DEFAULTS:
        value = getattr(gen, attr, None) if gen is not None else None
        out[attr] = default if value is None else value
    return out
