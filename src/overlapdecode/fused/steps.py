"""The step objects of a fused call (loop/steps.py's interface), and the captured step kept with a fused cache.

- `GraphStep`: one fused decode step over the buffers of a StepGraph (loop/step_graph.py), kept with the fused
  cache per stop and sampling setting: run eagerly once, then captured, then replayed by every later step of
  every later call of that shape;
- `CapturedSteps` (sampling, or greedy with a repetition penalty), `CapturedGreedySteps`, `CapturedSampledSteps`:
  one call's steps: its prefill eager, every later step a run of the kept GraphStep.

Greedy steps choose with one kernel after the LM head (kernels/greedy.py), sampled ones with three to six
(kernels/sample.py); both write each step's tokens and flag where the loop reads them (kernels/greedy.StepLog).
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..loop.compiling import recompile_limits
from ..loop.step_graph import StepGraph
from ..loop.steps import StepInputs, Steps
from ..sampling import SamplingParams
from .cache import FusedCache, decode_kwargs
from .kernels.greedy import StepLog
from .kernels.sample import sample_choice, sample_finish_ref


class GraphStep:
    """The fused decode step of `cache` for one stop and sampling setting, over the buffers of `graph`: the
    greedy step (FusedModel.greedy_step: the model, then one kernel chooses the token and advances state, flag
    and step log) or the sampled one (the model, then kernels/sample.py's choice, which also advances the seen
    mask; greedy with a repetition penalty: its torch twin, without a step log)."""

    def __init__(self, fused, cache: FusedCache, pad_id: int, params: SamplingParams, graph: StepGraph):
        self.fused, self.cache, self.pad_id, self.params, self.graph = fused, cache, pad_id, params, graph
        self.greedy = not (params.do_sample or params.uses_seen)
        if graph.log is not None and not (self.greedy or params.do_sample):
            raise ValueError("log: the penalised greedy step does not write a step log; make its StepGraph without one")

    @classmethod
    def make(cls, fused, cache: FusedCache, inputs: StepInputs) -> GraphStep:
        """The step of `cache` for the stop and sampling settings of `inputs`, with its buffers: a step log (one
        column per position of a call, as many as the cache has slots) where its choice writes one."""
        params, batch = inputs.params, inputs.noise_shape[0]
        greedy = not (params.do_sample or params.uses_seen)
        writes = (greedy or params.do_sample) and fused.writes_step_log
        graph = StepGraph(
            batch,
            len(inputs.eos_ids),
            inputs.noise_shape if params.do_sample else None,
            inputs.device,
            log=StepLog.empty(batch, cache.length, inputs.device) if writes else None,
            seen_vocab=inputs.noise_shape[1] if params.uses_seen else 0,
        )
        return cls(fused, cache, inputs.pad_id, params, graph)

    def run(self) -> None:
        """One step: the captured graph's replay, or the first runs (eager, then captured where CUDA is)."""
        self.graph.run(self._step)  # the first eager: compiles, warms up, and is this step

    def _step(self) -> None:
        g = self.graph
        g.draw_noise()  # this step's noise, in place (sampling only)
        if self.greedy:
            self.fused.greedy_step(self.cache, g.state, g.eos, self.pad_id, g.done, g.log)
            return
        kwargs = dict(decode_kwargs(self.cache), input_ids=g.state[:, 0:1], position_ids=g.state[:, 1:2])  # (B, 1)
        logits = self.fused(**kwargs).logits[:, -1, :]  # (B, V)
        choose(self.fused, logits, g.noise, self.params, g.seen, g.state, g.eos, self.pad_id, g.done, g.log)


def choose(fused, logits, noise, params: SamplingParams, seen, state, eos_ids, pad_id: int, done, log=None) -> None:
    """The sampled choice on (B, V) logits (kernels/sample.py's kernels on CUDA, with the fused step's programmatic
    dependent launch where `fused.pdl`; its torch twin elsewhere and for greedy with a repetition penalty): advances
    state, done, `seen` and the step log in place."""
    if logits.is_cuda and params.do_sample:
        sample_choice(logits.float(), noise, params, seen, state, eos_ids, pad_id, done, log, pdl=fused.pdl)
    else:
        sample_finish_ref(logits.float(), noise, params, seen, state, eos_ids, pad_id, done, log)


class CapturedSteps(Steps):
    """Fused and compiled, greedy with a repetition penalty (the base of the others): the prefill eager on the
    fused model, every later step a run of `kept` (a GraphStep), which reads its noise from its own buffer and
    advances the graph's state (ours), flag, seen mask and step log in place."""

    def __init__(self, model, cache, out, kept: GraphStep, inputs: StepInputs):
        graph = kept.graph
        if inputs.generator is not None:  # every draw of the call, the prefill's too, from the graph's generator
            graph.seed_from(inputs.generator)
            inputs = dataclasses.replace(inputs, generator=graph.generator)
        super().__init__(model, cache, out, graph.state, inputs)
        self.kept, self.graph = kept, graph
        self.out_is_kept = graph.log is not None  # then `out` is the log's: the next call writes it again
        self.state.zero_()  # the graph reads and advances it in place

    def prefill(self) -> torch.Tensor:
        return self._eager(0, noise_out=self.graph.noise)

    def step(self, j: int) -> torch.Tensor:
        # a graph's first run is eager (and may compile what its step compiles)
        with recompile_limits() if self.graph.eager_runs == 0 else contextlib.nullcontext():
            self.kept.run()  # advances state and graph.done in place
        if self.graph.log is None:
            self._emit(j)
        return self.graph.done

    def host_flag(self, j: int) -> torch.Tensor | None:
        log = self.graph.log
        return None if log is None or j == 0 else log.flags[self.inputs.prompt_len + j]


class CapturedGreedySteps(CapturedSteps):
    """Fused and compiled, greedy: the prefill then the step's own choice kernel (FusedModel.greedy_prefill);
    every later step a run of the graph, whose kernel chooses the token and, with a step log, writes the tokens
    into `out` (the log's) and its flag into pinned host memory itself."""

    def prefill(self) -> torch.Tensor:
        kwargs = self.cache.model_kwargs(0)
        i = self.inputs
        self.model.greedy_prefill(
            self.cache.cache,
            kwargs["input_ids"],
            kwargs["attention_mask"],
            kwargs["position_ids"],
            self.state,
            i.eos_ids,
            i.pad_id,
            self.graph.done,
        )
        self._emit(0)
        return self.graph.done


class CapturedSampledSteps(CapturedSteps):
    """Fused and compiled, sampling: step 0 (the prefill) chooses its token with the same sampled choice as the
    captured steps (kernels/sample.py: three to six launches, where the decode loop's `choose_next` is a few hundred eager
    kernels at a 128K vocabulary), then every later step a run of the graph."""

    def prefill(self) -> torch.Tensor:
        i, graph = self.inputs, self.graph
        kwargs = self.cache.model_kwargs(0)
        self._noise(graph.noise)
        logits = self.model(**kwargs).logits[:, -1, :]  # (B, V)
        # the choice advances the state from the position of each row's last prompt token (the state was zeroed
        # when these steps were made: no row is finished)
        self.state[:, 1] = kwargs["position_ids"][:, -1]
        choose(self.model, logits, graph.noise, i.params, i.seen, self.state, i.eos_ids, i.pad_id, graph.done)
        self._emit(0)
        return graph.done
