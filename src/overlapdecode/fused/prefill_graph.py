"""PrefillGraph: the fused prefill of one (batch, prompt bucket), captured by hand into a CUDA graph.

Why: the prefill runs once per call, so its host time is the time to first token. Compiled with torch.compile's
CUDA graphs (mode="reduce-overhead") each call pays dynamo's guards and the graph tree's input checks and
copies; a profile of a 1-token call (H200, eae1736, `benchmarks/h200-prefetch-eae1736/ttft`) put about a
millisecond there of GPT-2's 3.0 ms TTFT, of which the GPU's own work was about 0.5 ms. Captured here, a call
costs three small copies into buffers this object owns (ids, positions, the last token's index) and one
`cudaGraphLaunch`, as `StepGraph` does for the decode step. The function captured is the prefill compiled
without CUDA graphs (inductor's kernels, launched during the capture).

The first run of each bucket is eager (it compiles and *is* that call's prefill); the graph is captured right
after it, on a capture stream the FusedModel's prefill graphs share (with their memory pool). The logits a
replay returns live in the graph's memory and are overwritten by the next replay of this or another prefill
graph: the caller consumes them first, as the decode loop does (the next call's stream waits for the end of
this call: decode.Decoder). If the capture fails, the eager result stands, a warning says so, and the bucket
runs without a graph from then on. On CPU nothing is captured: the function runs every time over the same
buffers.

FusedModel uses it where `prefill_graph=True` (off by default until it is measured on a GPU).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

# prefill(ids (B, T) long, pos (B, T) long, last (1,) long) -> float32 logits (B, V)
Prefill = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class PrefillGraph:
    """The prefill `fn` of one (B, T) over buffers it owns; `run` copies a call's inputs in and returns the
    logits (B, V). `pool`: the CUDA graph memory pool and `stream` the capture stream, both shared by a
    FusedModel's prefill graphs (None on CPU): the caching allocator reuses a freed block only on the stream it
    was allocated on, so the bucket graphs share their activations' memory only if they are captured on one
    stream, and the eager first run happens there too (what it allocates, cuBLAS's workspace included, is
    then the capture's)."""

    def __init__(self, fn: Prefill, batch: int, length: int, device: torch.device, pool=None,
                 stream: torch.cuda.Stream | None = None):
        self.ids = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.pos = torch.zeros((batch, length), dtype=torch.long, device=device)
        self.last = torch.zeros((1,), dtype=torch.long, device=device)
        self._fn = fn
        self._pool, self._stream = pool, stream
        self._capture = device.type == "cuda"
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
        self.eager_runs += 1
        if not self._capture:
            return self._fn(self.ids, self.pos, self.last)  # CPU: every call runs the function
        main = torch.cuda.current_stream(self.ids.device)
        # stream hand-off: the capture stream starts after the copies above, and the caller's stream reads the
        # logits after it; the logits' block, made on the capture stream, is marked as used by the caller's
        self._stream.wait_stream(main)
        with torch.cuda.stream(self._stream):
            logits = self._fn(self.ids, self.pos, self.last)  # eager: compiles, warms up, is this call's prefill
        main.wait_stream(self._stream)
        logits.record_stream(main)
        try:
            self._record()
        except RuntimeError as err:  # the eager result stands; later calls run eagerly (compiled, no graph)
            self._capture = False
            warnings.warn(f"the fused prefill could not be captured in a CUDA graph ({err}); it runs without one",
                          RuntimeWarning, stacklevel=2)
        return logits

    def _record(self) -> None:
        graph = torch.cuda.CUDAGraph()
        # "thread_local" capture mode, as StepGraph's (step_graph.py), on the shared capture stream.
        # host sync (once per bucket): torch.cuda.graph synchronizes the device before it captures, so the eager
        # run above has finished; the capture only records (the cache it writes is left as the eager run left it)
        with torch.cuda.device(self.ids.device), torch.cuda.graph(graph, pool=self._pool, stream=self._stream,
                                                                  capture_error_mode="thread_local"):
            self.logits = self._fn(self.ids, self.pos, self.last)
        self.graph = graph
