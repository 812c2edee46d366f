"""The decode loop, the `Strategy` that configures it, and the presets of the brief.

One loop serves every strategy: step 0 is the (eager) prefill, step j >= 1 feeds token j-1 through one
model forward, picks token j, replaces it by pad on finished rows and updates the finished mask, all on the
device. A strategy chooses the cache (caches.py), whether the one-token step is compiled, and the stop
check (stopping.py). The tokens do not depend on the strategy: the tests compare every preset with Hugging
Face `generate()` and with the no-cache loop.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch

from . import caches, markers
from .inputs import Request, check_request, model_device
from .sampling import SamplingParams, check_sampling, draw_noise, make_generator, pick_next
from .stopping import STOP_CHECKS, EndCheck, make_check, mark_finished, steps_until_all_finished


@dataclass(frozen=True)
class Strategy:
    """How to decode. `cache`: none | dynamic | static; `compile`: torch.compile the one-token step
    (mode="reduce-overhead": CUDA graphs on CUDA), static cache only; `stop_check`: sync | pingpong |
    deferred | end; `lag`: how many steps late pingpong/deferred read the stop flag."""

    cache: str = "static"
    compile: bool = False
    stop_check: str = "sync"
    lag: int = 1

    def __post_init__(self):
        if self.cache not in caches.CACHE_KINDS:
            raise ValueError(f"strategy.cache must be one of {caches.CACHE_KINDS}, got {self.cache!r}")
        if not isinstance(self.compile, bool):
            raise TypeError(f"strategy.compile must be a bool, got {type(self.compile).__name__}")
        if self.compile and self.cache not in ("static", "fused"):
            raise ValueError(
                "strategy.compile needs cache='static': with a growing cache every step has a new shape"
            )
        if self.stop_check not in STOP_CHECKS:
            raise ValueError(f"strategy.stop_check must be one of {STOP_CHECKS}, got {self.stop_check!r}")
        if isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 1:
            raise ValueError(f"strategy.lag must be an int >= 1, got {self.lag!r}")

    @property
    def check_lag(self) -> int:
        return self.lag if self.stop_check in ("pingpong", "deferred") else 0


PRESETS: dict[str, Strategy] = {
    "baseline": Strategy(cache="none", compile=False, stop_check="sync"),
    "kv": Strategy(cache="dynamic", compile=False, stop_check="sync"),
    "static": Strategy(cache="static", compile=False, stop_check="sync"),
    "compiled": Strategy(cache="static", compile=True, stop_check="sync"),
    "interleaved": Strategy(cache="static", compile=True, stop_check="pingpong", lag=1),
    "fused": Strategy(cache="fused", compile=True, stop_check="pingpong"),
}

# Not presets of the brief, but named so the benchmark and the command line can ask for them.
VARIANTS: dict[str, Strategy] = {
    "deferred": Strategy(cache="static", compile=True, stop_check="deferred", lag=1),
    "nocheck": Strategy(cache="static", compile=True, stop_check="end"),  # upper bound: no per-step read
}


def resolve_strategy(strategy) -> Strategy:
    """A Strategy, a preset or variant name, or `NAME:K` for a late-check one read K steps late
    (`interleaved:2`, `deferred:3`), so that the command line can ask for any lag."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        name, _, lag = strategy.partition(":")
        known = PRESETS.get(name) or VARIANTS.get(name)
        if known is None:
            raise ValueError(
                f"unknown strategy {strategy!r}; presets: {', '.join(PRESETS)}; variants: {', '.join(VARIANTS)}"
            )
        if not lag:
            return known
        if known.check_lag == 0 or not lag.isdigit() or int(lag) < 1:
            raise ValueError(f"strategy {strategy!r}: ':K' (K >= 1) applies to interleaved and deferred only")
        return dataclasses.replace(known, lag=int(lag))
    raise TypeError(f"strategy must be a preset name or an overlapdecode.Strategy, got {type(strategy).__name__}")


def decode_step(model, model_kwargs: dict, state, eos_ids, pad_id: int, noise, params: SamplingParams):
    """One forward and token choice, all on the device.

    `state` (B, 3) long holds, per row, the last token, its position and the finished flag. A decode step
    (no `input_ids` in `model_kwargs`) feeds the token at its position; the prefill passes the prompt.
    -> the new state (B, 3) and the all-finished flag (0-d bool).
    """
    if "input_ids" not in model_kwargs:
        model_kwargs = dict(model_kwargs, input_ids=state[:, 0:1], position_ids=state[:, 1:2])  # (B, 1) each
    logits = model(**model_kwargs).logits[:, -1, :]  # (B, V)
    tokens = pick_next(logits, noise, params)
    tokens, finished, done = mark_finished(tokens, state[:, 2].bool(), eos_ids, pad_id)
    next_pos = model_kwargs["position_ids"][:, -1] + 1  # (B,)
    return torch.stack([tokens, next_pos, finished.long()], dim=1), done


@functools.cache
def compiled_decode_step():
    """`decode_step` compiled once per process; dynamo specialises per model and shape.

    The static cache tensors are marked static addresses by Hugging Face, so the CUDA graph of a shape is
    recorded once and replayed on every later call of that shape.
    """
    # Each (model, batch, cache length, sampling) is one specialisation; the default limit of 8 would make
    # a benchmark sweep fall back to eager silently.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)
    return torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)


def compile_count() -> int:
    """How many graphs dynamo has compiled in this process (for the no-recompilation checks)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def generate(
    model,
    input_ids,
    attention_mask=None,
    max_new_tokens: int = 64,
    strategy="interleaved",
    eos_token_id=None,
    pad_token_id=None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    streamer=None,
) -> torch.Tensor:
    """Generate up to `max_new_tokens` tokens after each prompt; see DESIGN.md for the contract.

    Returns (B, P + n) ids: the prompt, then the generated tokens (pad after a row's EOS); n is the number
    of steps until every row emitted EOS, or max_new_tokens.
    """
    strat = resolve_strategy(strategy)
    req = check_request(model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)
    params = check_sampling(do_sample, temperature, top_k, top_p, seed)
    if streamer is not None and not callable(streamer):
        raise TypeError(f"streamer must be callable or None, got {type(streamer).__name__}")
    with torch.no_grad():
        return _decode(model, req, strat, params, seed, streamer)


def _decode(model, req: Request, strat: Strategy, params: SamplingParams, seed, streamer) -> torch.Tensor:
    device = model_device(model)
    cuda = device.type == "cuda"
    B, P = req.input_ids.shape
    N = req.max_new_tokens

    # 1) buffers made once on the caller's stream, before the loop
    out = torch.empty((B, P + N), dtype=torch.long, device=device)  # (B, P + N)
    out[:, :P] = req.input_ids
    cache = caches.make_cache(strat.cache, model, req.input_ids, req.attention_mask, out, N, strat.compile)
    eos_ids = torch.tensor(req.eos_ids, dtype=torch.long, device=device)  # (E,), E = 0: never stop
    # (B, 3): last token, its position, finished. Our own copy of each step's result: a CUDA graph's
    # outputs are overwritten by its next replay, so they are copied here before the next step runs.
    state = torch.zeros((B, 3), dtype=torch.long, device=device)
    generator = make_generator(params, seed, device)
    vocab_out = model.get_output_embeddings().weight.shape[0]
    check = make_check(strat.stop_check, device, B, want_tokens=streamer is not None, lag=strat.lag)
    lag = strat.check_lag
    step_fn = compiled_decode_step() if strat.compile else decode_step
    step_model = cache.model if strat.cache == "fused" else model  # the fused step replaces the HF forward

    try:
        # 2) the loop: step j enqueues token j; the stop flag of step j - lag is read after it
        n = N
        stopped = False
        for j in range(N):
            with check.step(j), markers.phase(markers.PREFILL if j == 0 else markers.DECODE_STEP, cuda):
                kwargs = cache.model_kwargs(j)
                noise = draw_noise((B, vocab_out), device, generator)
                if j == 0 or not strat.compile:
                    new_state, done = decode_step(step_model, kwargs, state, eos_ids, req.pad_id, noise, params)
                else:
                    torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are consumed
                    new_state, done = step_fn(step_model, kwargs, state, eos_ids, req.pad_id, noise, params)
                state.copy_(new_state)  # before the next replay overwrites new_state
                out[:, P + j] = state[:, 0]
                check.publish(j, done, state[:, 0])
            if isinstance(check, EndCheck) or j - lag < 0:
                continue
            with markers.phase(markers.STOP_CHECK, cuda):
                flag, host_tokens = check.poll(j - lag)
            if streamer is not None:
                streamer(host_tokens)
            if flag:
                n, stopped = j - lag + 1, True  # steps j-lag+1 .. j ran late: their tokens are dropped below
                break

        # 3) late checks still owe the flags of the last `lag` steps
        if not stopped and not isinstance(check, EndCheck):
            for k in range(max(N - lag, 0), N):
                with markers.phase(markers.STOP_CHECK, cuda):
                    flag, host_tokens = check.poll(k)
                if streamer is not None:
                    streamer(host_tokens)
                if flag:
                    n = k + 1
                    break
    finally:
        check.finish()  # the caller's stream waits for every step enqueued, also if a streamer raised

    if isinstance(check, EndCheck):
        n = steps_until_all_finished(out[:, P:], eos_ids) if len(req.eos_ids) else N
        if streamer is not None:
            for row in out[:, P : P + n].T.cpu():  # host sync (once, after the loop)
                streamer(row.clone())
    return out if n == N else out[:, : P + n].clone()
