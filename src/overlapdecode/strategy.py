"""How to decode: the `Strategy` dataclass, the presets (the progression baseline -> kv -> static -> compiled ->
interleaved, then fused) and the named variants.

A strategy composes three independent choices (the cache, whether the one-token step is compiled, the stop
check and its lag); the tokens never depend on it, only the speed does. This module imports nothing heavy,
so that the command line can list the strategies without importing torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

CACHE_KINDS = ("none", "dynamic", "static", "fused")  # fused: the project's own layout and step (fused/)
STOP_CHECKS = ("sync", "pingpong", "deferred", "end")
LATE_CHECKS = ("pingpong", "deferred")  # the checks whose lag the user chooses (loop/stopping.py defines lag)


@dataclass(frozen=True)
class Strategy:
    """How to decode. `cache`: none | dynamic | static | fused (the project's own model, cache layout and decode
    step, fused/: the families of fused/layout.py SUPPORTED); `compile`: torch.compile the one-token step
    (mode="reduce-overhead": CUDA graphs on CUDA), static or fused cache only (fused: its step is captured into
    a CUDA graph by the decoder itself, loop/step_graph.py, with only the token choice compiled); `stop_check`:
    sync | pingpong | deferred | end; `lag`: for pingpong and deferred, how many steps after enqueuing step j the
    host reads step j's flag (sync reads at lag 0, end after the last step; see loop/stopping.py). plan.py takes
    a strategy apart, once per call."""

    cache: str = "static"
    compile: bool = False
    stop_check: str = "sync"
    lag: int = 1

    def __post_init__(self):
        if self.cache not in CACHE_KINDS:
            raise ValueError(f"strategy.cache must be one of {CACHE_KINDS}, got {self.cache!r}")
        if not isinstance(self.compile, bool):
            raise TypeError(f"strategy.compile must be a bool, got {type(self.compile).__name__}")
        if self.compile and self.cache not in ("static", "fused"):
            raise ValueError(
                "strategy.compile needs cache='static' or 'fused': with a growing cache every step has a new shape"
            )
        if self.stop_check not in STOP_CHECKS:
            raise ValueError(f"strategy.stop_check must be one of {STOP_CHECKS}, got {self.stop_check!r}")
        if isinstance(self.lag, bool) or not isinstance(self.lag, int) or self.lag < 1:
            raise ValueError(f"strategy.lag must be an int >= 1, got {self.lag!r}")


PRESETS: dict[str, Strategy] = {
    "baseline": Strategy(cache="none", compile=False, stop_check="sync"),
    "kv": Strategy(cache="dynamic", compile=False, stop_check="sync"),
    "static": Strategy(cache="static", compile=False, stop_check="sync"),
    "compiled": Strategy(cache="static", compile=True, stop_check="sync"),
    "interleaved": Strategy(cache="static", compile=True, stop_check="pingpong", lag=1),
    "fused": Strategy(cache="fused", compile=True, stop_check="pingpong", lag=1),
}

# Not presets, but named so the benchmark and the command line can ask for them.
VARIANTS: dict[str, Strategy] = {
    "deferred": Strategy(cache="static", compile=True, stop_check="deferred", lag=1),
    "nocheck": Strategy(cache="static", compile=True, stop_check="end"),  # upper bound: no per-step read
}


# the presets and variants whose stop check reads the flag late, so that `NAME:K` chooses its lag
LAGGED = tuple(n for n, s in {**PRESETS, **VARIANTS}.items() if s.stop_check in LATE_CHECKS)
LAGGED_TEXT = ", ".join(LAGGED[:-1]) + f" and {LAGGED[-1]}"  # "interleaved, fused and deferred"


def resolve_strategy(strategy) -> Strategy:
    """A Strategy, a preset or variant name, or `NAME:K` for a late-check one read K steps late
    (`interleaved:2`, `deferred:3`), so that the command line can ask for any lag."""
    if isinstance(strategy, Strategy):
        return strategy
    if isinstance(strategy, str):
        name, _, lag = strategy.partition(":")
        known = PRESETS.get(name) or VARIANTS.get(name)
        if known is None:
            raise ValueError(
                f"unknown strategy {strategy!r}; presets: {', '.join(PRESETS)}; variants: {', '.join(VARIANTS)}"
            )
        if not lag:
            return known
        if known.stop_check not in LATE_CHECKS or not lag.isdigit() or int(lag) < 1:
            raise ValueError(
                f"strategy {strategy!r}: ':K' takes K >= 1, and only for the strategies that read the stop flag "
                f"late: {LAGGED_TEXT}"
            )
        return dataclasses.replace(known, lag=int(lag))
    raise TypeError(f"strategy must be a preset name or an overlapdecode.Strategy, got {type(strategy).__name__}")
