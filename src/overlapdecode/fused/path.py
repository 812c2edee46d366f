"""The fused path as a decoder sees it: the FusedModel it keeps (made on the first fused call, again when the
model was moved or cast), and the steps of one fused call (steps.py), with the captured step kept per fused cache.

The fused package imports Triton, an optional and heavy dependency, so this module imports the rest of it on
first use only: a decoder that never runs the fused path never imports it. `spec_rows` is the fused model as the
target or the draft of a speculative call (speculation.py).
"""

from __future__ import annotations

import dataclasses

import torch

from ..inputs import position_ids_for_prompt
from ..loop.step_graph import kept_graph
from ..loop.steps import EagerSteps, StepInputs, Steps, new_output


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
                from .model import check_option_values  # Triton: a heavy import, only where options are
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
                from .model import FusedModel  # imported on first use: Triton is a heavy import
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

    def steps(self, plan, inputs: StepInputs) -> Steps:
        """The step objects of one fused call (plan.Plan; after `model_for`): the cache for this call's shape, and
        with a captured step the GraphStep kept with it."""
        from .cache import FusedKV  # imported on first use: Triton is a heavy import
        from .steps import CapturedGreedySteps, CapturedSampledSteps, CapturedSteps

        fused, req = self.fused, plan.request
        B, P = req.input_ids.shape
        N = req.max_new_tokens
        cache = FusedKV(
            fused,
            req.input_ids,
            req.attention_mask,
            plan.cache_len,
            position_ids_for_prompt(req.attention_mask),
            max_new_tokens=N,
        )
        if plan.step == "eager":
            out = new_output(B, P + N, req.input_ids, inputs.device)
            state = torch.zeros((B, 3), dtype=torch.long, device=inputs.device)
            return EagerSteps(fused, cache, out, state, inputs)  # the fused step replaces the Hugging Face forward
        # the fused step is captured by StepGraph (loop/step_graph.py), not by torch.compile's CUDA graphs
        kept = self._kept_step(cache.cache, inputs)
        graph = kept.graph
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
        return cls(fused, cache, out, kept, inputs)

    def _kept_step(self, fused_cache, inputs: StepInputs):
        """The captured fused step of this cache for these stop and sampling settings (steps.GraphStep), kept with
        the cache (a few per cache) so that later calls replay it."""
        from .steps import GraphStep

        key = (len(inputs.eos_ids), inputs.pad_id, inputs.params)
        return kept_graph(fused_cache.graphs, key, lambda: GraphStep.make(self.fused, fused_cache, inputs))


def spec_rows(fused, batch: int, length: int, tag: str = ""):
    """A FusedModel (`model_for`'s) with a kept cache of `length` slots, as speculative rounds read and write it
    (speculation.FusedRows); `tag`: a second cache of the same shape."""
    from .speculation import FusedRows  # imported on first use: Triton is a heavy import

    return FusedRows(fused, batch, length, tag)
