"""The `fused` cache kind as the decode loop sees it: the FusedModel a decoder keeps, and the step objects
(steps.py) of a fused call, with the captured steps kept per fused cache.

The fused package (fused/) imports Triton, an optional and heavy dependency, so it is imported here on first
use only: a decoder that never runs the fused path never imports it.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from . import caches
from .inputs import Request
from .sampling import SamplingParams, mark_seen
from .step_graph import StepGraph
from .steps import CapturedGreedySteps, CapturedSteps, EagerSteps, StepInputs, Steps, choose_next, new_output
from .strategy import Strategy

# Captured fused steps kept per fused cache (one per count of EOS ids, pad id and sampling setting).
KEEP_GRAPHS = 4


class FusedPath:
    """One decoder's fused decode: its FusedModel options (`options`, FusedModel's keywords: their names and
    values are checked now, what depends on the device when the fused model is made) and the FusedModel,
    made on the first fused call and made again when the model was moved or cast."""

    def __init__(self, options: dict | None = None):
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"fused_options must be a dict of FusedModel options or None, got {type(options).__name__}")
        self.options = dict(options or {})
        if self.options:
            try:
                from .fused.model import check_option_values  # Triton: a heavy import, only where options are
            except ImportError:
                pass  # no Triton: the first fused call says so (model_for)
            else:
                check_option_values(**self.options)
        self.fused = None  # the FusedModel (re-laid weights, fused caches)

    def model_for(self, model, wait_last_call) -> object:
        """The FusedModel of `model` (fused/): its weights are re-laid out once, on first use, and the Hugging
        Face model's parameters become views of them (it keeps working). ValueError if the model's family is not
        supported. `wait_last_call()` runs before the caches of an earlier FusedModel are freed (the decoder's
        host wait for its last call's steps)."""
        embed = model.get_input_embeddings().weight
        if self.fused is None or self.fused.weights.embed.data_ptr() != embed.data_ptr():
            # first use, or the model was moved or cast since (`.to` breaks the views): fuse again
            try:
                from .fused.model import FusedModel  # imported on first use: Triton is a heavy import
            except ImportError as err:
                raise ValueError(
                    f"strategy: 'fused' needs Triton ({err}); it comes with CUDA builds of torch, and on CPU "
                    "`pip install triton` provides the module its torch reference lives beside"
                ) from None
            if self.fused is not None:
                wait_last_call()
                self.fused.clear_caches()  # the old weights' caches and graphs go now, with the old weights
            self.fused = FusedModel(model, **self.options)
        return self.fused

    def clear(self) -> None:
        """Free the fused caches and their captured steps; the fused weights stay."""
        if self.fused is not None:
            self.fused.clear_caches()

    def steps(self, req: Request, strat: Strategy, inputs: StepInputs) -> Steps:
        """The step objects of one fused call (after `model_for`): the cache for this call's shape, and with
        `strat.compile` the captured step kept with it."""
        from .fused.cache import FusedKV  # imported on first use: Triton is a heavy import

        fused = self.fused
        B, P = req.input_ids.shape
        N = req.max_new_tokens
        cache = FusedKV(
            fused,
            req.input_ids,
            req.attention_mask,
            caches.static_cache_len(P, N),
            caches.position_ids_for_prompt(req.attention_mask),
            max_new_tokens=N,
        )
        if not strat.compile:
            out = new_output(B, P + N, req.input_ids, inputs.device)
            state = torch.zeros((B, 3), dtype=torch.long, device=inputs.device)
            return EagerSteps(fused, cache, out, state, inputs)  # the fused step replaces the Hugging Face forward
        # the fused step is captured by StepGraph (step_graph.py), not by torch.compile's CUDA graphs
        graph = self._step_graph(cache.cache, B, inputs)
        graph.eos.copy_(inputs.eos_ids)
        if inputs.seen is not None:  # the graph's step reads and updates its own seen mask
            inputs = dataclasses.replace(inputs, seen=graph.seen.copy_(inputs.seen))
        # with a log, the graph's steps write their tokens into it, which is this call's output (returned as a
        # copy: the next call writes it again), and their flags into its pinned slots, at column P + j
        out = new_output(B, P + N, req.input_ids, inputs.device, graph.log)
        params = inputs.params
        if params.do_sample:
            cls = CapturedSampledSteps
        else:
            cls = CapturedSteps if params.uses_seen else CapturedGreedySteps
        return cls(fused, cache, out, graph, inputs)

    def _step_graph(self, fused_cache, batch: int, inputs: StepInputs) -> StepGraph:
        """The captured fused step of this cache for these stop and sampling settings, kept with the cache
        (a few per cache) so that later calls replay it."""
        params, pad_id = inputs.params, inputs.pad_id
        key = (len(inputs.eos_ids), pad_id, params)
        graph = fused_cache.graphs.pop(key, None)
        if graph is None:
            from .fused.cache import decode_kwargs  # the fused package is imported on first fused use (Triton)

            plain_greedy = not (params.do_sample or params.uses_seen)
            if plain_greedy:  # one kernel chooses the token and updates state and flag (fused/kernels/greedy.py)
                step = functools.partial(_fused_greedy_step, self.fused, fused_cache, pad_id)
            else:  # the sampled choice (fused/kernels/sample.py), or greedy after the repetition penalty
                step = functools.partial(_fused_step, self.fused, decode_kwargs(fused_cache), pad_id, params)
            noise = inputs.noise_shape if params.do_sample else None
            # greedy and sampled steps write each step's tokens and flag where the loop reads them (StepLog): one
            # column per position of a call, as many as the cache has slots; greedy with a penalty does not
            writes = (plain_greedy or params.do_sample) and self.fused.writes_step_log
            log = fused_cache.length if writes else 0
            graph = StepGraph(
                step,
                batch,
                len(inputs.eos_ids),
                noise,
                inputs.device,
                log_length=log,
                seen_vocab=inputs.noise_shape[1] if params.uses_seen else 0,
            )
        fused_cache.graphs[key] = graph
        while len(fused_cache.graphs) > KEEP_GRAPHS:
            fused_cache.graphs.popitem(last=False)
        return graph


class CapturedSampledSteps(CapturedSteps):
    """Fused and compiled, sampling: step 0 (the prefill) chooses its token with the same sampled choice as the
    captured steps (fused/kernels/sample.py: five launches, where the decode loop's `choose_next` is a few
    hundred eager kernels at a 128K vocabulary), then every later step a run of the graph."""

    def prefill(self) -> torch.Tensor:
        i, graph = self.inputs, self.graph
        kwargs = self.cache.model_kwargs(0)
        self._noise(graph.noise)
        logits = self.model(**kwargs).logits[:, -1, :]  # (B, V)
        # the choice advances the state from the position of each row's last prompt token (the state was zeroed
        # when these steps were made: no row is finished)
        self.state[:, 1] = kwargs["position_ids"][:, -1]
        _sampled_choice(
            logits, graph.noise, i.params, i.seen, self.state, i.eos_ids, i.pad_id, graph.done, pdl=self.model.pdl
        )
        self._emit(0)
        return graph.done


def _sampled_choice(
    logits, noise, params: SamplingParams, seen, state, eos_ids, pad_id: int, done, log=None, pdl: bool = False
):
    """fused/kernels/sample.py's sampled choice on (B, V) logits: its kernels on CUDA (with the fused step's
    programmatic dependent launch where `pdl`), its torch twin elsewhere; advances state, done, `seen` and the step
    log in place."""
    from .fused.kernels.sample import sample_choice, sample_finish_ref  # Triton: imported with the fused path

    if logits.is_cuda:
        sample_choice(logits.float(), noise, params, seen, state, eos_ids, pad_id, done, log, pdl=pdl)
    else:
        sample_finish_ref(logits.float(), noise, params, seen, state, eos_ids, pad_id, done, log)


def _fused_step(
    fused, kwargs: dict, pad_id: int, params: SamplingParams, state, eos_ids, noise, done, log=None, seen=None
):
    """The sampling (or penalised greedy) fused decode step StepGraph captures: the FusedModel's kernels (`kwargs`:
    its cache), then the token choice, which advances state, done, `seen` and the step log in place. A sampled
    choice is fused/kernels/sample.py's: its kernels on CUDA, its torch twin elsewhere; greedy decoding with a
    repetition penalty is the decode loop's own choice (no step log)."""
    kwargs = dict(kwargs, input_ids=state[:, 0:1], position_ids=state[:, 1:2])  # (B, 1) each
    logits = fused(**kwargs).logits[:, -1, :]  # (B, V)
    if params.do_sample:
        _sampled_choice(logits, noise, params, seen, state, eos_ids, pad_id, done, log, pdl=fused.pdl)
        return
    if log is not None:
        raise ValueError("log: the penalised greedy step does not write a step log; make its StepGraph without one")
    new_state, all_done = choose_next(logits, state[:, 1], state, eos_ids, pad_id, noise, params, seen)
    state.copy_(new_state)
    done.copy_(all_done)
    if seen is not None:
        mark_seen(seen, state[:, 0])


def _fused_greedy_step(fused, cache, pad_id: int, state, eos_ids, noise, done, log=None):
    """The greedy fused decode step StepGraph captures: FusedModel.greedy_step, which advances state, done and
    the step log in place (one kernel after the head chooses: no inductor choice kernels, no copies)."""
    fused.greedy_step(cache, state, eos_ids, pad_id, done, log)
