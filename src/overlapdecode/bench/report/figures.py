"""The figures the report reads from results.json's rows: the timed rows by configuration and strategy, the
time-vs-length exponents, the spread of a row's timed calls, MBU, the decode time per step and the per-layer toll
(bench/scale.py's sweep uses the same toll), and the first-call overheads. An exponent or overhead that the timed
calls do not resolve is WITHIN_NOISE, never a number that reads as a finding.

Nothing here measures or formats: claims.py, report.py and plots.py turn these into text and figures.
"""

from __future__ import annotations

import math
from collections import defaultdict

# a figure the timed calls do not resolve (a negative exponent or first-call overhead among them): printed so
WITHIN_NOISE = "within noise"

# the progression's order (presets, then the named variants, then the Hugging Face peers): tables and plots
ORDER = [
    "baseline",
    "kv",
    "static",
    "compiled",
    "deferred",
    "interleaved",
    "nocheck",
    "hf-dynamic",
    "hf-static",
    "hf-compiled",
]


def order(names) -> list:
    """The distinct `names` in ORDER's order, others after them by name."""
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def timed(rows, workload="fixed"):
    return [r for r in rows if r.get("workload") == workload and "seq_s" in r]


def fit_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(time) against log(N): about 1 for O(N), 2 for O(N^2)."""
    pts = [(math.log(n), math.log(t)) for n, t in points if n > 0 and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def series(rows) -> dict:
    """(allocator, dtype, batch) -> strategy -> sorted [(length, row)] for the fixed workload."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in timed(rows):
        out[(r["allocator"], r["dtype"], r["batch"])][r["strategy"]].append((r["max_new_tokens"], r))
    for per in out.values():
        for s in per:
            per[s].sort(key=lambda p: p[0])
    return out


def exponents(points) -> tuple[float | str | None, float | str | None]:
    """(over all lengths, over the two longest lengths), each as `exponent` gives it."""
    return exponent(points), exponent(points[-2:])


def exponent(points) -> float | str | None:
    """The time-vs-length exponent fitted to `points` [(length, row)]; WITHIN_NOISE where the timed calls do not
    resolve it: a negative fit (a call cannot take less time for more tokens: the machine's noise made it) or
    timed calls that allow an exponent of 0 or below (no growth with length at all); None below two lengths."""
    e = fit_exponent([(n, r["seq_s"]) for n, r in points])
    if e is None:
        return None
    allowed = exponent_range(points)
    return WITHIN_NOISE if e < 0 or (allowed is not None and allowed[0] <= 0) else e


def at(points, n):
    """The row of length `n` among `points` [(length, row)], or None."""
    for m, r in points:
        if m == n:
            return r
    return None


def nearest(lengths, target):
    return min(lengths, key=lambda n: abs(n - target)) if lengths else None


def mbu(row) -> float | None:
    """Model-bandwidth utilisation: weight bytes / the device's measured bandwidth / time per step (None
    without both figures, e.g. on CPU)."""
    if not row.get("weight_bytes") or not row.get("bandwidth_gbs") or not row.get("ms_per_token"):
        return None
    return row["weight_bytes"] / (row["bandwidth_gbs"] * 1e9) / (row["ms_per_token"] / 1e3)


def decode_ms_per_step(call_ms: float, one_token_ms: float, new_tokens: int) -> float | None:
    """ms per decode step with the prefill excluded, measured: (a call of `new_tokens` - a call of one token)
    / (new_tokens - 1). The one-token call is the prefill and the first token, so what is left is the
    `new_tokens` - 1 decode steps; None below 2 tokens (no decode step)."""
    if new_tokens < 2:
        return None
    return (call_ms - one_token_ms) / (new_tokens - 1)


def row_decode_ms(row) -> float | None:
    """A timed row's decode ms/step: (its median call - its median one-token call, the TTFT) / (new tokens - 1);
    None for a row without those figures."""
    if any(row.get(k) is None for k in ("seq_s", "ttft_ms", "new_tokens")):
        return None
    return decode_ms_per_step(row["seq_s"] * 1e3, row["ttft_ms"], row["new_tokens"])


def read_ms(nbytes: float, bandwidth_gbs: float) -> float:
    """ms to read `nbytes` once at `bandwidth_gbs` (the device copy's measured bandwidth): a step's floor."""
    return nbytes / (bandwidth_gbs * 1e9) * 1e3


def toll_us_per_layer(
    decode_ms: float | None, bytes_per_step: float, bandwidth_gbs: float | None, layers: int | None
) -> float | None:
    """What a decode step costs beyond reading its bytes once at the measured bandwidth, per layer, in us:
    (decode ms/step - bytes_per_step / bandwidth) / layers. None without a measured bandwidth (CPU), a decode
    time or a layer count: never a made-up figure."""
    if decode_ms is None or not bandwidth_gbs or not layers:
        return None
    return (decode_ms - read_ms(bytes_per_step, bandwidth_gbs)) / layers * 1e3


def step_toll(row, layers: int | None) -> dict:
    """The figures a timed bench row carries beside MBU: `layers`, `decode_ms_per_step` (row_decode_ms) and
    `toll_us_per_layer` over the row's weight bytes (None where a figure is missing)."""
    ms = row_decode_ms(row)
    weights = row.get("weight_bytes")
    toll = toll_us_per_layer(ms, weights, row.get("bandwidth_gbs"), layers) if weights else None
    return dict(layers=layers, decode_ms_per_step=ms, toll_us_per_layer=toll)


def spread(row) -> float:
    """(slowest - fastest) / median of a row's timed calls: how far apart two medians must be to mean anything."""
    times = row.get("seq_s_all") or [row["seq_s"]]
    return (max(times) - min(times)) / row["seq_s"]


def repeats(row) -> int:
    """How many timed calls a row's median rests on."""
    return len(row.get("seq_s_all") or [row["seq_s"]])


def exponent_range(points) -> tuple[float, float] | None:
    """(lowest, highest) exponent between the shortest and the longest length that the timed calls allow."""
    (n0, r0), (n1, r1) = points[0], points[-1]
    if n1 <= n0:
        return None
    t0, t1 = r0.get("seq_s_all") or [r0["seq_s"]], r1.get("seq_s_all") or [r1["seq_s"]]
    span = math.log(n1 / n0)
    return math.log(min(t1) / max(t0)) / span, math.log(max(t1) / min(t0)) / span


def first_call_overhead(row) -> float | str:
    """first call - median timed call, in seconds; WITHIN_NOISE where that is no more than the spread of the
    timed calls (max - min), negative figures among them: the first call cost nothing that the timed calls'
    own differences do not."""
    over = row["first_call_s"] - row["seq_s"]
    times = row.get("seq_s_all") or [row["seq_s"]]
    return over if over > max(times) - min(times) else WITHIN_NOISE


def first_call_overheads(per: dict) -> dict:
    """strategy -> [(length, first call - median timed call)]: compile, CUDA-graph recording and warm-up.

    A process compiles a shape once, at the first configuration that meets it, so the overhead shows at one
    length and not at the others; the largest of them is the strategy's compile time in this run."""
    return {s: [(n, first_call_overhead(r)) for n, r in pts] for s, pts in per.items()}


def largest_overhead(overheads: list) -> float | str:
    """The largest resolved figure of a strategy's [(length, first_call_overhead)], else WITHIN_NOISE."""
    resolved = [v for _, v in overheads if v != WITHIN_NOISE]
    return max(resolved) if resolved else WITHIN_NOISE
