"""The finished mask and the stop checks: where the host learns that generation is over.

The finished mask lives on the device and a finished row's tokens become pad on the device, so the only
device-to-host read on the per-step path is the stop check itself. The checks differ in when the host
reads the "every row finished" flag of step j, its *lag* (the one definition of lag in the project: the
number of steps enqueued after step j before the host reads step j's flag):

- `SyncCheck`     lag 0: right after enqueuing step j, with `.item()`: the host waits for the GPU to drain,
                  then the GPU waits while the host launches step j+1.
- `PingPongCheck` lag k >= 1: step j runs on side stream j % 2 after an event wait on step j-1; its flag is
                  copied without blocking into pinned slot j % (k+1) and that slot's event recorded; the host
                  reads the flag of step j-k, which is done or nearly so, while step j is queued.
- `DeferredCheck` the same late read with every step on the caller's stream.
- `EndCheck`      no read during the loop (lag = max_new_tokens); one read after the last step, and the
                  output is trimmed where every row had finished. The upper bound for speed, still exact.

A late check may enqueue up to `lag` steps past the one where every row finished; the loop drops their
tokens, so every check returns exactly what the sync loop returns. Without CUDA the streams and events are
trivially complete stand-ins, so CPU tests run the same control flow, late stops included.

The loop follows one protocol for every check (see `StopCheck`); the streams and pinned slots it uses are
owned by the caller (`overlapdecode.Decoder`), made once and reused by every call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from ..strategy import STOP_CHECKS


def steps_until_all_finished(generated: torch.Tensor, eos_ids: torch.Tensor) -> int:
    """(B, N) generated tokens -> the number of steps the sync loop would have run. One host sync."""
    N = generated.shape[1]
    is_eos = torch.isin(generated, eos_ids)  # (B, N)
    # first EOS per row, N if none (argmax of a bool row is its first True)
    first = torch.where(is_eos.any(dim=1), is_eos.to(torch.int8).argmax(dim=1), N)
    last = int(first.max().item())  # host sync (once, after the loop)
    return last + 1 if last < N else N


class _NoEvent:
    """A CUDA event stand-in for CPU: always complete."""

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class Slots:
    """Pinned host slots for the flags (and tokens) of the last `n` steps, each guarded by an event.

    Owned by the decoder and reused call after call (pinned allocations are slow and pin host pages).
    """

    def __init__(self, n: int, batch_size: int, device: torch.device):
        cuda = device.type == "cuda"
        self.n = n
        self.flags = torch.zeros(n, dtype=torch.bool, pin_memory=cuda)  # (n,) pinned host
        self.tokens = torch.zeros((n, batch_size), dtype=torch.long, pin_memory=cuda)  # (n, B) pinned host
        self.events = [torch.cuda.Event() if cuda else _NoEvent() for _ in range(n)]


OnTokens = Callable[[torch.Tensor], None]  # receives one step's (B,) tokens on the host


class StopCheck:
    """One call's stop check. The decode loop follows this protocol, whatever the check:

        for j in range(N):
            with check.step(j):
                <enqueue step j>
                check.publish(j, done, tokens)      # done: 0-d bool on the device, tokens: (B,)
                                                    # (or the pinned host flag step j wrote itself)
            n = check.after_step(j)                 # the host reads the flag owed now, if any
            if n is not None: break                 # n: the steps the sync loop would have run
        else:
            n = check.drain()                       # the flags still owed after the last step
        (finally) check.finish()                    # the caller's stream waits for every step enqueued

    `on_tokens`, when given, receives each step's (B,) host tokens in order, exactly the steps kept.
    """

    name = "base"

    def __init__(self, lag: int, max_steps: int, main, streams: list, slots: Slots | None, on_tokens: OnTokens | None):
        self.lag = lag
        self.max_steps = max_steps
        self.main = main  # the caller's stream (None on CPU)
        self.streams = streams  # where the decode steps run: [main] for one stream, two side streams for ping-pong
        self.slots = slots
        self.on_tokens = on_tokens
        self.last = -1  # the last step enqueued
        # per slot, the pinned host flag its step's value is read from: the slot's own, or where the step wrote it
        self._flags: list = [None] * slots.n if slots is not None else []
        if len(streams) > 1 and main is not None:
            for s in streams:
                s.wait_stream(main)  # stream hand-off: every buffer made before the loop is ready

    def _slot(self, step: int) -> int:
        return step % self.slots.n

    @contextlib.contextmanager
    def step(self, j: int):
        """Run step j's enqueueing on its stream, ordered after step j-1.

        The prefill (step 0) stays on the caller's stream, so that its activations come from the same
        allocator pool as in the sync loop; the decode steps alternate between the side streams.
        """
        if len(self.streams) == 1 or j == 0:
            yield  # one stream (the caller's; None on CPU), or the prefill: program order orders it
        else:
            stream = self.streams[j % len(self.streams)]
            with torch.cuda.stream(stream):
                # stream hand-off: step j reads step j-1's token, position, finished mask and cache
                stream.wait_event(self.slots.events[self._slot(j - 1)])
                yield

    def publish(self, j: int, done: torch.Tensor, tokens: torch.Tensor, host_flag: torch.Tensor | None = None) -> None:
        """After step j is enqueued: copy its flag (and tokens) to pinned slot j, record the slot's event.
        `host_flag`: a 0-d view of pinned host memory where step j has written its flag itself
        (step_graph.StepLog); then only the tokens are copied, if any."""
        s = self._slot(j)
        if host_flag is None:
            self.slots.flags[s].copy_(done, non_blocking=True)  # device -> pinned host, no sync
            host_flag = self.slots.flags[s]
        self._flags[s] = host_flag
        if self.on_tokens is not None:
            self.slots.tokens[s].copy_(tokens, non_blocking=True)
        self.slots.events[s].record()  # on the current (step j's) stream
        self.last = j

    def _read(self, k: int) -> bool:
        """Host: wait for step k only, hand its tokens on, return its "every row finished" flag."""
        s = self._slot(k)
        self.slots.events[s].synchronize()  # host sync on step k only; later steps stay queued
        if self.on_tokens is not None:
            self.on_tokens(self.slots.tokens[s].clone())  # pinned, complete after the event: no further sync
        return bool(self._flags[s])  # written by step k (a copy, or the step itself) before its event

    def after_step(self, j: int) -> int | None:
        """After enqueuing step j: read the flag of step j - lag; the step count if every row finished."""
        k = j - self.lag
        if k < 0:
            return None
        return k + 1 if self._read(k) else None  # steps k+1 .. j ran late: the loop drops their tokens

    def drain(self) -> int:
        """After the last step: read the flags still owed; the number of steps the sync loop would have run."""
        for k in range(max(self.max_steps - self.lag, 0), self.max_steps):
            if self._read(k):
                return k + 1
        return self.max_steps

    def finish(self) -> None:
        """Stream hand-off back to the caller: its stream waits for the last step enqueued."""
        if self.main is not None and self.last >= 0 and len(self.streams) > 1:
            self.main.wait_event(self.slots.events[self._slot(self.last)])


class SyncCheck(StopCheck):
    """Read the flag of step j with `.item()` right after enqueuing it: one blocking sync per step."""

    name = "sync"

    def publish(self, j, done, tokens, host_flag=None):
        self._done = done  # read on the device by .item() below; a host flag is not needed
        self._tokens = tokens
        self.last = j

    def after_step(self, j):
        flag = bool(self._done.item())  # host sync: waits for every queued kernel
        if self.on_tokens is not None:
            self.on_tokens(self._tokens.to("cpu", copy=True))  # complete after the sync above: a plain copy
        return j + 1 if flag else None

    def drain(self):
        return self.max_steps  # nothing owed: every flag was read at its step


class PingPongCheck(StopCheck):
    """Two side streams in ping-pong; the flag of step j-lag is read while step j is queued."""

    name = "pingpong"


class DeferredCheck(StopCheck):
    """One stream; the flag of step j-lag is read while steps j-lag+1 .. j are queued."""

    name = "deferred"


class EndCheck(StopCheck):
    """No read during the loop; after it, one read finds where every row had finished and trims there."""

    name = "end"

    def __init__(
        self, max_steps: int, main, generated: torch.Tensor, eos_ids: torch.Tensor | None, on_tokens: OnTokens | None
    ):
        super().__init__(max_steps, max_steps, main, [main], None, on_tokens)
        self.generated = generated  # (B, N) view of the output, filled by the loop
        self.eos_ids = eos_ids  # (E,), or None: no row stops early

    def publish(self, j, done, tokens, host_flag=None):
        self.last = j

    def after_step(self, j):
        return None

    def drain(self):
        n = self.max_steps if self.eos_ids is None else steps_until_all_finished(self.generated, self.eos_ids)
        if self.on_tokens is not None:
            for row in self.generated[:, :n].T.cpu():  # host sync (once, after the loop)
                self.on_tokens(row.clone())
        return n


def make_check(
    name: str,
    lag: int,
    max_steps: int,
    main,
    side_streams: list | None,
    slots: Slots | None,
    generated: torch.Tensor,
    eos_ids: torch.Tensor | None,
    on_tokens: OnTokens | None,
) -> StopCheck:
    """The check of one call. `side_streams` (two, CUDA only) serve the ping-pong; `slots` hold lag + 1."""
    if name == "sync":
        return SyncCheck(0, max_steps, main, [main], None, on_tokens)
    if name == "pingpong":
        return PingPongCheck(lag, max_steps, main, side_streams or [main], slots, on_tokens)
    if name == "deferred":
        return DeferredCheck(lag, max_steps, main, [main], slots, on_tokens)
    if name == "end":
        return EndCheck(max_steps, main, generated, eos_ids, on_tokens)
    raise ValueError(f"stop_check must be one of {STOP_CHECKS}, got {name!r}")
