"""The finished mask and the stop checks: where the host learns that generation is over.

The finished mask lives on the device and a finished row's tokens become pad on the device, so the only
device-to-host read on the per-step path is the stop check itself. The checks differ in when the host
reads the "every row finished" flag of step j:

- `SyncCheck`     right after enqueuing step j, with `.item()`: the host waits for the GPU to drain, then
                  the GPU waits while the host launches step j+1 (the brief's step 6).
- `PingPongCheck` step j runs on stream j % 2 after an event wait on step j-1; its flag is copied without
                  blocking into pinned slot j % (lag+1) and that slot's event recorded; the host reads the
                  flag of step j-lag, which is done or nearly so, while step j is still queued (step 7).
- `DeferredCheck` the same late read on a single stream (the `lag=k` extension of DESIGN.md).
- `EndCheck`      no per-step read at all; one read after the last step, and the output is trimmed where
                  every row had finished. The upper bound for speed, and still token-exact.

A late check may enqueue up to `lag` steps past the one that finished; the loop drops their tokens, so
every check returns exactly what the sync loop returns. Without CUDA the streams and events are trivially
complete stand-ins, so CPU tests run the same control flow, late stops included.
"""

from __future__ import annotations

import contextlib

import torch

STOP_CHECKS = ("sync", "pingpong", "deferred", "end")

# The ping-pong streams are made once per device and reused by every call: a new stream per call would
# give each call fresh per-stream allocator pools (and library workspaces), raising reserved memory.
_STREAMS: dict = {}


def _side_streams(device: torch.device, n: int) -> list:
    key = (torch.cuda.current_device() if device.index is None else device.index, n)
    if key not in _STREAMS:
        _STREAMS[key] = [torch.cuda.Stream(device) for _ in range(n)]
    return _STREAMS[key]


def mark_finished(tokens: torch.Tensor, finished: torch.Tensor, eos_ids: torch.Tensor, pad_id: int):
    """(B,) tokens, (B,) finished -> tokens with pad on finished rows, updated finished, 0-d "all done"."""
    tokens = torch.where(finished, pad_id, tokens)
    finished = finished | torch.isin(tokens, eos_ids)
    return tokens, finished, finished.all()


class _NoEvent:
    """A CUDA event stand-in for CPU: always complete."""

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


class StopCheck:
    """Base: per-call state (streams, pinned slots, events) and the protocol the decode loop follows.

    Loop protocol, for step j = 0, 1, ...:  `with check.step(j): <enqueue step j>; check.publish(j, done, tokens)`
    then `check.poll(j - check.lag)` when that is >= 0; after the loop `check.finish()`.
    """

    name = "base"
    lag = 0
    n_streams = 1  # 1: everything on the caller's current stream

    def __init__(self, device: torch.device, batch_size: int, want_tokens: bool, lag: int | None = None):
        if lag is not None:
            self.lag = lag
        self.cuda = device.type == "cuda"
        self.want_tokens = want_tokens
        n_slots = self.lag + 1
        pin = self.cuda
        self.flags = torch.zeros(n_slots, dtype=torch.bool, pin_memory=pin)  # pinned host slots
        self.tokens = torch.zeros((n_slots, batch_size), dtype=torch.long, pin_memory=pin) if want_tokens else None
        self.events = [torch.cuda.Event() if self.cuda else _NoEvent() for _ in range(n_slots)]
        self.main = torch.cuda.current_stream(device) if self.cuda else None
        if self.cuda and self.n_streams > 1:
            self.streams = _side_streams(device, self.n_streams)
            # stream hand-off: every buffer made before the loop (prompt, mask, cache, output) is ready
            for s in self.streams:
                s.wait_stream(self.main)
        else:
            self.streams = [self.main]
        self.last = -1

    def slot(self, step: int) -> int:
        return step % (self.lag + 1)

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
                stream.wait_event(self.events[self.slot(j - 1)])
                yield

    def publish(self, j: int, done: torch.Tensor, tokens: torch.Tensor) -> None:
        """After step j is enqueued: copy its flag (and tokens) to pinned slot j, record the slot's event."""
        s = self.slot(j)
        self.flags[s].copy_(done, non_blocking=True)  # device -> pinned host, no sync
        if self.want_tokens:
            self.tokens[s].copy_(tokens, non_blocking=True)
        self.events[s].record()  # on the current (step j's) stream
        self.last = j

    def poll(self, j: int) -> tuple[bool, torch.Tensor | None]:
        """Host: wait until step j is complete, return its "every row finished" flag and its tokens."""
        s = self.slot(j)
        self.events[s].synchronize()  # host sync on step j only; later steps stay queued
        toks = self.tokens[s].clone() if self.want_tokens else None
        return bool(self.flags[s]), toks  # pinned host memory, complete after the event: no further sync

    def finish(self) -> None:
        """Stream hand-off back to the caller: its stream waits for the last step enqueued."""
        if self.cuda and self.last >= 0 and len(self.streams) > 1:
            self.main.wait_event(self.events[self.slot(self.last)])


class SyncCheck(StopCheck):
    """Read the flag of step j with `.item()` right after enqueuing it: one blocking sync per step."""

    name = "sync"
    lag = 0

    def publish(self, j, done, tokens):
        if self.want_tokens:
            self.tokens[0].copy_(tokens, non_blocking=True)  # ordered before the .item() below
        self._done = done
        self.last = j

    def poll(self, j):
        flag = bool(self._done.item())  # host sync: waits for every queued kernel
        return flag, (self.tokens[0].clone() if self.want_tokens else None)


class PingPongCheck(StopCheck):
    """Two streams in ping-pong; the flag of step j-lag is read while step j is queued."""

    name = "pingpong"
    lag = 1
    n_streams = 2


class DeferredCheck(StopCheck):
    """One stream; the flag of step j-lag is read while steps j-lag+1 .. j are queued."""

    name = "deferred"
    lag = 1
    n_streams = 1


class EndCheck(StopCheck):
    """No read during the loop; the caller trims the output after it (see `steps_until_all_finished`)."""

    name = "end"
    lag = None  # never polled during the loop

    def __init__(self, device, batch_size, want_tokens):
        self.want_tokens = want_tokens
        self.streams = [None]
        self.cuda = device.type == "cuda"
        self.last = -1

    def publish(self, j, done, tokens):
        self.last = j

    def poll(self, j):
        raise RuntimeError("EndCheck is never polled during the loop")


def steps_until_all_finished(generated: torch.Tensor, eos_ids: torch.Tensor) -> int:
    """(B, N) generated tokens -> the number of steps the sync loop would have run. One host sync."""
    N = generated.shape[1]
    is_eos = torch.isin(generated, eos_ids)  # (B, N)
    # first EOS per row, N if none (argmax of a bool row is its first True)
    first = torch.where(is_eos.any(dim=1), is_eos.to(torch.int8).argmax(dim=1), N)
    last = int(first.max().item())  # host sync (once, after the loop)
    return last + 1 if last < N else N


def make_check(name: str, device: torch.device, batch_size: int, want_tokens: bool, lag: int = 1) -> StopCheck:
    if name == "sync":
        return SyncCheck(device, batch_size, want_tokens)
    if name == "pingpong":
        return PingPongCheck(device, batch_size, want_tokens, lag)
    if name == "deferred":
        return DeferredCheck(device, batch_size, want_tokens, lag)
    if name == "end":
        return EndCheck(device, batch_size, want_tokens)
    raise ValueError(f"stop_check must be one of {STOP_CHECKS}, got {name!r}")
