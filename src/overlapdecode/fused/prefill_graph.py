"""PrefillGraph: the fused prefill of one (batch, prompt bucket), captured by hand into a CUDA graph.

Why: the prefill runs once per call, so its host time is the time to first token. Compiled with torch.compile's
CUDA graphs (mode="reduce-overhead") each call pays dynamo's guards and the graph tree's input checks and
copies; a profile of a 1-token call (H200, eae1736, `benchmarks/h200-prefetch-eae1736/ttft`) put about a
millisecond there of GPT-2's 3.0 ms TTFT, of which the GPU's own work was about 0.5 ms. Captured here, a call
costs three small copies into buffers this object owns (ids, positions, the last token's index) and one
`cudaGraphLaunch`, as `StepGraph` does for the decode step. The function captured is the prefill compiled
without CUDA graphs (inductor's kernels, launched during the capture).

The first run of each bucket is eager (it compiles and *is* that call's prefill); the graph is captured right
after it. The logits a replay returns live in the graph's memory and are overwritten by the next replay of
this or another prefill graph (they share one memory pool): the caller consumes them first, as the decode
loop does (the next call's stream waits for the end of this call: decode.Decoder). On CPU nothing is
captured: the function runs every time over the same buffers.

FusedModel uses it where `prefill_graph=True` (off by default until it is measured on a GPU).
"""

from __future__ import annotations

from typing import Callable

import torch

# prefill(ids (B, T) long, pos (B, T) long, last (1,) long) -> float32 logits (B, V)
Prefill = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class PrefillGraph:
    """The prefill `fn` of one (B, T) over buffers it owns; `run` copies a call's inputs in and returns the
    logits (B, V). `pool`: the CUDA graph memory pool shared by a FusedModel's prefill graphs (None on CPU)."""

    def __init__(self, fn: Prefill, batch: int, length: int, device: torch.device, pool=None):
        self.ids = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.pos = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.last = torch.zeros((1,), dtype=torch.long, device=device)
        self._fn = fn
        self._capture = device.type == "cuda"
        self._pool = pool
        self.graph: torch.cuda.CUDAGraph | None = None
        self.logits: torch.Tensor | None = None  # the captured run's output, rewritten by each replay
        self.eager_runs = 0

    def run(self, ids: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        if ids.shape != self.ids.shape or pos.shape != self.pos.shape:
            raise ValueError(f"PrefillGraph of shape {tuple(self.ids.shape)} got ids {tuple(ids.shape)}, "
                             f"positions {tuple(pos.shape)}")
        self.ids.copy_(ids)
        self.pos.copy_(pos)
        self.last.copy_(last)
        if self.graph is not None:
            self.graph.replay()  # one launch, ordered on the current stream like any kernel
            return self.logits
        logits = self._fn(self.ids, self.pos, self.last)  # eager: compiles, warms up, and is this call's prefill
        self.eager_runs += 1
        if self._capture:
            self._record()
        return logits

    def _record(self) -> None:
        graph = torch.cuda.CUDAGraph()
        device = self.ids.device
        # a stream of its own, "thread_local" capture mode, as StepGraph (step_graph.py) and for the same reasons
        stream = torch.cuda.Stream(device)
        # host sync (once per bucket): torch.cuda.graph synchronizes the device before it captures, so the eager
        # run above has finished; the capture only records (the cache it writes is left as the eager run left it)
        with torch.cuda.device(device), torch.cuda.graph(graph, pool=self._pool, stream=stream,
                                                         capture_error_mode="thread_local"):
            self.logits = self._fn(self.ids, self.pos, self.last)
        self.graph = graph
