"""StepGraph: one decode step of a fixed shape, captured by hand into a CUDA graph and replayed per step.

Why: torch.compile's CUDA graphs (mode="reduce-overhead") check guards and the addresses of every input on
each replay. For the fused step that host work took longer than the step's kernels (docs/KERNELS.md, "Graphs and
launches"). A graph captured here replays with one `cudaGraphLaunch`: the step reads and writes
only the buffers this object owns (`state`, `eos`, `noise`, `done`, `log`) and tensors of fixed address (the
fused weights and cache), so nothing is copied in or checked per step. Its Triton kernels are launched eagerly
during the capture, with the launch options dynamo's tracing cannot pass (programmatic dependent launch).

The first run of a StepGraph is eager: it compiles and warms up everything the step launches and *is* that
step (its results are kept); the graph is captured right after it and replayed from the next step on. A
replay recomputes exactly what the eager run computed: the same kernels on the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from .sampling import draw_noise


class StepLog(NamedTuple):
    """What each step writes where the decode loop reads it, so that no copy follows the step: the step writes
    its tokens into column `count` of `tokens` and its all-finished flag into `flags[count]`, then advances
    `count`.

    `tokens` (B, L) long on the device: the call's output (the decoder writes the prompt into its first columns
    and sets `count` to the prompt length + 1 before the call's first graph step). `flags` (L,) bool: pinned
    host memory on CUDA, which the GPU writes directly (with unified addressing a pinned allocation is mapped
    into the device's address space); the host reads a step's slot once the event recorded after that step
    has completed (stopping.StopCheck). `count` (1,) int32 on the device. Why: the copy of the token into the
    output and of the flag to pinned memory after each replay were two more operations on the GPU's queue per
    token (docs/KERNELS.md, "Graphs and launches")."""

    tokens: torch.Tensor
    flags: torch.Tensor
    count: torch.Tensor

    @classmethod
    def empty(cls, batch: int, length: int, device: torch.device) -> StepLog:
        cuda = device.type == "cuda"
        return cls(
            torch.zeros((batch, length), dtype=torch.long, device=device),
            torch.zeros(length, dtype=torch.bool, pin_memory=cuda),
            torch.zeros(1, dtype=torch.int32, device=device),
        )


# step(state, eos, noise, done, log): advances state (B, 3) long and done (0-d bool: all rows finished) in place,
# and when `log` (a StepLog) is given writes the tokens and done into its column log.count and advances it; see
# fused_path._fused_greedy_step
Step = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", torch.Tensor, "StepLog | None"], None]


class StepGraph:
    """The step `step` over buffers of one shape: `state` (B, 3) long (last token, its position, finished),
    `eos` (E,) long, `noise` (B, V) float32 when sampling (else None; each run draws it first, from `generator`),
    `done` 0-d bool, and with `log_length` > 0
    a StepLog `log` of that many columns (the step must write it), and with `seen_vocab` > 0 a (B, V) bool `seen`
    passed to the step as a keyword. `run()` advances `state` and `done` (and the
    log) by one step, in place, on the current stream. On a CPU device nothing is captured: the step runs
    eagerly every time over the same buffers."""

    def __init__(
        self,
        step: Step,
        batch: int,
        eos_count: int,
        noise_shape: tuple | None,
        device: torch.device,
        log_length: int = 0,
        seen_vocab: int = 0,
    ):
        self.state = torch.zeros((batch, 3), dtype=torch.long, device=device)
        self.eos = torch.zeros((eos_count,), dtype=torch.long, device=device)
        self.noise = None if noise_shape is None else torch.zeros(noise_shape, dtype=torch.float32, device=device)
        # the step's noise is drawn inside the graph, from this generator (registered with the graph, so that each
        # replay advances its offset as an eager draw would); a call copies its own generator's state into it
        self.generator = None if noise_shape is None else torch.Generator(device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.log = StepLog.empty(batch, log_length, device) if log_length > 0 else None
        # the repetition penalty's (B, V) mask of seen tokens, which the step reads and updates (keyword `seen`)
        self.seen = torch.zeros((batch, seen_vocab), dtype=torch.bool, device=device) if seen_vocab > 0 else None
        self._step = step
        self._capture = device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_runs = 0  # steps run eagerly (1 before the capture when capturing)

    def seed_from(self, generator: torch.Generator) -> None:
        """Continue `generator`'s sequence in this graph's draws (its seed and offset copied; the state object
        the graph registered stays, so later replays read the new values)."""
        self.generator.set_state(generator.get_state())

    def _body(self) -> None:
        # in place: the next step (or replay) reads the same addresses
        if self.generator is not None:
            draw_noise(self.noise.shape, self.noise.device, self.generator, out=self.noise)  # this step's noise
        extra = {} if self.seen is None else {"seen": self.seen}
        self._step(self.state, self.eos, self.noise, self.done, self.log, **extra)

    def run(self) -> None:
        if self.graph is not None:
            self.graph.replay()  # one launch; ordered on the current stream like any kernel
            return
        self._body()  # eager: compiles, warms up, and is this step
        self.eager_runs += 1
        if self._capture:
            self._record()

    def _record(self) -> None:
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        device = self.state.device
        # Captured on a stream of its own (not the process-wide default capture stream, which belongs to
        # whichever device first asked for it), in "thread_local" mode as torch.compile's graphs are: another
        # thread's CUDA calls (another decoder's) neither break this capture nor are broken by it.
        stream = torch.cuda.Stream(device)
        # host sync (once per graph): torch.cuda.graph synchronizes the device before it captures, so the
        # eager step above has finished; nothing runs during the capture, it only records
        with torch.cuda.device(device), torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            self._body()
        self.graph = graph
