"""StepGraph: the buffers of one decode step of a fixed shape, and that step captured by hand into a CUDA graph
(GraphCapture: the capture and replay alone, which a speculative round uses too: loop/rounds.py).

Why: torch.compile's CUDA graphs (mode="reduce-overhead") check guards and the addresses of every input on
each replay. For the fused step that host work took longer than the step's kernels (docs/KERNELS.md, "Graphs and
launches"). A graph captured here replays with one `cudaGraphLaunch`: the step reads and writes
only the buffers this object owns (`state`, `eos`, `noise`, `done`, `log`, `seen`) and tensors of fixed address
(the fused weights and cache), so nothing is copied in or checked per step. Its Triton kernels are launched
eagerly during the capture, with the launch options dynamo's tracing cannot pass (programmatic dependent launch).

What the step does is its owner's (fused/path.py): this module calls nothing of it. The owner runs its step
eagerly over these buffers once (that compiles and warms up everything the step launches, and *is* that step),
then again inside `capture()`, and from then on `replay()`s it. A replay recomputes exactly what the eager run
computed: the same kernels on the same inputs.
"""

from __future__ import annotations

import contextlib

import torch

from ..sampling import draw_noise

# Captured graphs kept per fused cache: its steps (one per width of the EOS tensor, pad id and sampling setting) and
# its speculative rounds (loop/rounds.py), the oldest dropped first.
KEEP_GRAPHS = 4


def kept_graph(graphs: dict, key, make):
    """The captured graph kept under `key` in `graphs` (an OrderedDict; `make()` when none is), now the newest; the
    oldest beyond KEEP_GRAPHS dropped. The caller has waited for whatever a dropped graph may still run."""
    entry = graphs.pop(key, None)
    if entry is None:
        entry = make()
    graphs[key] = entry
    while len(graphs) > KEEP_GRAPHS:
        graphs.popitem(last=False)
    return entry


class GraphCapture:
    """Something the owner runs again and again over buffers of fixed address, captured by hand into a CUDA graph:
    run eagerly once (that compiles and warms up what it launches, and *is* that run), then captured, then replayed
    (`run`). `generator` (when `sampled`): the generator its draws come from, registered with the graph, so that each
    replay advances its offset as an eager draw would. On a CPU device nothing is captured (`capturable` is False):
    the owner's function runs eagerly every time."""

    def __init__(self, device: torch.device, sampled: bool = False):
        self.device = device
        # the draws are made inside the graph, from this generator; a call copies its own generator's state into it
        self.generator = torch.Generator(device=device) if sampled else None
        self.capturable = device.type == "cuda"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_runs = 0  # runs made eagerly (1 before the capture when capturing)

    def seed_from(self, generator: torch.Generator) -> None:
        """Continue `generator`'s sequence in this graph's draws (its seed and offset copied; the state object
        the graph registered stays, so later replays read the new values)."""
        self.generator.set_state(generator.get_state())

    def run(self, fn, first=contextlib.nullcontext) -> None:
        """`fn()` by replay, or on the first call eagerly (inside the context `first()`: where it may compile)
        and then captured where CUDA is."""
        if self.replay():
            return
        with first():
            fn()
        self.eager_runs += 1
        if self.capturable:
            with self.capture():
                fn()

    def replay(self) -> bool:
        """Run the captured step (one launch, ordered on the current stream like any kernel); False when there is
        none yet (the owner then runs its step eagerly, and captures it)."""
        if self.graph is None:
            return False
        self.graph.replay()
        return True

    @contextlib.contextmanager
    def capture(self):
        """Record what runs inside into this graph (CUDA only: see `capturable`)."""
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        device = self.device
        # Captured on a stream of its own (not the process-wide default capture stream, which belongs to
        # whichever device first asked for it), in "thread_local" mode as torch.compile's graphs are: another
        # thread's CUDA calls (another decoder's) neither break this capture nor are broken by it.
        stream = torch.cuda.Stream(device)
        # host sync (once per graph): torch.cuda.graph synchronizes the device before it captures, so the
        # eager step before it has finished; nothing runs during the capture, it only records
        with torch.cuda.device(device), torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            yield
        self.graph = graph


class StepGraph(GraphCapture):
    """The buffers of a step of one shape: `state` (B, 3) long (last token, its position, finished), `eos` (E,)
    long (each call's EOS ids copied in: sampling.eos_tensor), `noise` (B, V) float32 when sampling (else None;
    `draw_noise` fills it from `generator`), `done` 0-d bool, `log` (the owner's step log, or None) and with
    `seen_vocab` > 0 a (B, V) bool `seen` (the repetition penalty's mask of seen tokens). The owner's step
    advances them in place; `capture()` records what runs inside it, `replay()` runs the recording. On a CPU device
    nothing is captured (`capturable` is False): the step runs eagerly every time over the same buffers."""

    def __init__(
        self,
        batch: int,
        eos_count: int,
        noise_shape: tuple | None,
        device: torch.device,
        log=None,
        seen_vocab: int = 0,
    ):
        super().__init__(device, sampled=noise_shape is not None)
        self.state = torch.zeros((batch, 3), dtype=torch.long, device=device)
        self.eos = torch.zeros((eos_count,), dtype=torch.long, device=device)
        self.noise = None if noise_shape is None else torch.zeros(noise_shape, dtype=torch.float32, device=device)
        self.done = torch.zeros((), dtype=torch.bool, device=device)
        self.log = log
        self.seen = torch.zeros((batch, seen_vocab), dtype=torch.bool, device=device) if seen_vocab > 0 else None

    def draw_noise(self) -> None:
        """This step's noise into `noise`, in place (nothing when greedy): the first thing a sampled step does."""
        if self.generator is not None:
            draw_noise(self.noise.shape, self.noise.device, self.generator, out=self.noise)
