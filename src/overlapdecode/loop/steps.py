"""The decode steps one call of the loop runs: one object per way of running them, behind one interface.

The loop (decode.py) calls `prefill()` for step 0 and `step(j)` for every later step, then hands the step's
flag to the stop check. What a step is, is the plan's `step` (plan.py), and only the step objects know it:

- `EagerSteps`: every step an eager forward (the Hugging Face model with any cache, or the fused model
  uncompiled), then `choose_next`;
- `CompiledSteps`: static cache + compile: the prefill eager, every later step `decode_step` compiled
  (CUDA graphs on CUDA);
- the fused path's captured steps (fused/path.py) subclass `Steps`: every later step replayed from the
  StepGraph kept with the fused cache (step_graph.py).

`hf_steps` makes a call's steps on the Hugging Face model, with its cache (hf/caches.py). Every step object
chooses its tokens through sampling.choose_next (compiled or not), except the fused greedy captured steps, whose
kernel does the same choice and bookkeeping on the device (fused/kernels/greedy.py). Nothing here reads a
device value on the host.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch

from ..hf import caches
from ..hf.sliding_cache import decode_masks
from ..sampling import SamplingParams, choose_next, draw_noise, mark_seen
from .compiling import recompile_limits


def decode_step(
    model, model_kwargs: dict, state, eos_ids, pad_id: int, noise, params: SamplingParams, choose=None, seen=None
):
    """One forward and token choice, all on the device.

    `state` (B, 3) long holds, per row, the last token, its position and the finished flag. A decode step
    (no `input_ids` in `model_kwargs`) feeds the token at its position; the prefill passes the prompt.
    `choose`: `choose_next` or a compiled copy of it. `seen`: the (B, V) mask of the tokens each row has seen,
    for the repetition penalty (read here; the step objects add each step's tokens). -> the new state (B, 3) and
    the all-finished flag (0-d bool).
    """
    if "input_ids" not in model_kwargs:
        model_kwargs = dict(model_kwargs, input_ids=state[:, 0:1], position_ids=state[:, 1:2])  # (B, 1) each
        model_kwargs = decode_masks(model_kwargs)  # a ring cache's masks, built here (sliding_cache.py)
    logits = model(**model_kwargs).logits[:, -1, :]  # (B, V)
    position = model_kwargs["position_ids"][:, -1]  # (B,)
    return (choose or choose_next)(logits, position, state, eos_ids, pad_id, noise, params, seen)


@functools.cache
def compiled_decode_step():
    """`decode_step` compiled once per process; dynamo specialises per model and shape. Called under
    `recompile_limits()` where it may compile (a call's first step).

    The static cache tensors are marked static addresses by Hugging Face, so the CUDA graph of a shape is
    recorded once and replayed on every later call of that shape.
    """
    return torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)


@dataclass(frozen=True)
class StepInputs:
    """What every step of one call reads besides its state: the prompt length P, the stop ids (W,) long on the
    device (padded with -1: sampling.eos_tensor), the pad id, the sampling setting, the noise generator (None for
    greedy), the (B, V) shape of each step's noise, and for the repetition penalty the (B, V) bool mask of the
    tokens each row has seen (else None), which every step updates in place."""

    prompt_len: int
    eos_ids: torch.Tensor
    pad_id: int
    params: SamplingParams
    generator: torch.Generator | None
    noise_shape: tuple
    device: torch.device
    seen: torch.Tensor | None = None


class Steps:
    """The steps of one call. `prefill()` enqueues step 0 and `step(j)` step j >= 1, on the current stream;
    each leaves the step's tokens in `state[:, 0]` and in column P + j of `out` and returns its all-finished
    flag (0-d bool on the device). `host_flag(j)`: the pinned host flag that step j wrote itself (a StepLog's),
    or None when the stop check copies the flag. `out` (B, P + N) holds the prompt in its first P columns;
    `state` (B, 3) long holds, per row, the last token, its position and the finished flag."""

    out_is_kept = False  # whether `out` outlives the call (a kept graph's log): the call returns a copy

    def __init__(self, model, cache, out: torch.Tensor, state: torch.Tensor, inputs: StepInputs):
        self.model = model  # what a step calls: the Hugging Face model or the FusedModel
        self.cache = cache  # caches.py's or fused/cache.py's FusedKV: each step's model keyword arguments
        self.out = out
        self.state = state
        self.inputs = inputs

    def prefill(self) -> torch.Tensor:
        raise NotImplementedError

    def step(self, j: int) -> torch.Tensor:
        raise NotImplementedError

    def host_flag(self, j: int) -> torch.Tensor | None:
        return None

    def used_on(self, streams: list) -> None:
        """The prefill's cache tensors are read by later steps on `streams` (see caches.py)."""
        self.cache.used_on(streams)

    def _noise(self, out: torch.Tensor | None = None):
        i = self.inputs
        return draw_noise(i.noise_shape, i.device, i.generator, out=out)

    def _emit(self, j: int) -> None:
        self.out[:, self.inputs.prompt_len + j] = self.state[:, 0]

    def _eager(self, j: int, noise_out: torch.Tensor | None = None) -> torch.Tensor:
        """Step j as one eager call of `decode_step`; its new state copied into ours."""
        i = self.inputs
        kwargs = self.cache.model_kwargs(j)
        new_state, done = decode_step(
            self.model, kwargs, self.state, i.eos_ids, i.pad_id, self._noise(noise_out), i.params, seen=i.seen
        )
        self.state.copy_(new_state)
        self._mark_seen()
        self._emit(j)
        return done

    def _mark_seen(self) -> None:
        if self.inputs.seen is not None:
            mark_seen(self.inputs.seen, self.state[:, 0])


class EagerSteps(Steps):
    """Every step one eager forward of the model (`baseline`, `kv`, `static`, and `fused` uncompiled)."""

    def prefill(self) -> torch.Tensor:
        return self._eager(0)

    def step(self, j: int) -> torch.Tensor:
        return self._eager(j)


class CompiledSteps(EagerSteps):
    """Static cache, compiled: the prefill eager, every later step `decode_step` compiled with CUDA graphs
    (mode="reduce-overhead"), whose outputs the next replay overwrites: the state is copied out at once."""

    def __init__(self, model, cache, out, state, inputs: StepInputs):
        super().__init__(model, cache, out, state, inputs)
        self._compiled = compiled_decode_step()

    def step(self, j: int) -> torch.Tensor:
        i = self.inputs
        kwargs = self.cache.model_kwargs(j)
        noise = self._noise()
        torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are consumed
        # a call's first compiled step is where dynamo may compile (a new model, shape or setting)
        with recompile_limits() if j == 1 else contextlib.nullcontext():
            new_state, done = self._compiled(
                self.model, kwargs, self.state, i.eos_ids, i.pad_id, noise, i.params, seen=i.seen
            )
        self.state.copy_(new_state)  # before the next replay overwrites new_state
        self._mark_seen()  # outside the graph: its inputs stay unmutated
        self._emit(j)
        return done


def new_output(batch: int, length: int, input_ids, device, log=None) -> torch.Tensor:
    """A call's (B, P + N) output buffer, the prompt in its first columns: the first P + N columns of a StepGraph's
    `log` (whose steps write their tokens there; its count set to the first graph step's column), or a new one."""
    P = input_ids.shape[1]
    if log is None:
        out = torch.empty((batch, length), dtype=torch.long, device=device)
    else:
        if length > log.tokens.shape[1]:  # the log has a column per cache slot, and the cache holds P + N
            raise RuntimeError(f"internal: a step log of {log.tokens.shape[1]} columns for a call of {length}")
        out = log.tokens[:, :length]
        log.count.fill_(P + 1)  # step 1 is the graph's first
    out[:, :P] = input_ids
    return out


def hf_steps(model, plan, inputs: StepInputs, store: caches.StaticCaches) -> Steps:
    """The step objects of one call (plan.Plan) on the Hugging Face model: its cache (static ones from the
    decoder's `store`), compiled or not."""
    req = plan.request
    B, P = req.input_ids.shape
    out = new_output(B, P + req.max_new_tokens, req.input_ids, inputs.device)
    cache = caches.make_cache(model, plan, out, store)  # the no-cache step reads `out`
    # (B, 3): last token, its position, finished. Our own copy of each step's result: a CUDA graph's outputs are
    # overwritten by its next replay, so they are copied here before the next step runs.
    state = torch.zeros((B, 3), dtype=torch.long, device=inputs.device)
    return (CompiledSteps if plan.step == "compiled" else EagerSteps)(model, cache, out, state, inputs)
