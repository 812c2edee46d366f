"""Where the GPU waits: read a PyTorch-profiler (Chrome) trace of one generation and measure its decode loop.

The decode loop is found by the `decode_step` ranges that `generate()` marks (markers.py); every runtime
call made inside one (kernel launch, graph launch, copy) is tied by its correlation id to the GPU work it
caused, so a step's GPU work is known even when it runs long after the host has moved on. From that:

- busy fraction: time covered by GPU work / span from the first to the last GPU work of the loop;
- the idle time split in two: gaps between kernels of one launch (one CUDA graph: the GPU's own launch
  latency, the same for every stop check) and gaps before the work of the next launch (the GPU had nothing
  submitted: it waited for the host or a stream hand-off). `fed_fraction` = 1 - the latter / span is the
  share of the loop in which the GPU had work queued: what a stop check can change;
- idle gap between steps: first GPU work of step k+1 minus last GPU work of step k (0 when they overlap);
- host time blocked: runtime calls named *Synchronize* (`.item()` ends in one) during the loop;
- launches per step: runtime calls that launch work; kernels per step: GPU kernels (graph kernels counted).

The bench and the profile command both use `analyze`; neither fakes a figure without CUDA.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import statistics
import sys
import tempfile

import torch

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _idle_split(work: list[tuple[float, float, int | None]]) -> tuple[float, float]:
    """Idle GPU time (us) inside one launch (same correlation id as the work before the gap) and between
    launches (the work after the gap came from another runtime call)."""
    work = sorted(work)
    end, corr = work[0][1], work[0][2]
    inside = between = 0.0
    for s, e, c in work[1:]:
        if s > end:
            if c is not None and c == corr:
                inside += s - end
            else:
                between += s - end
        if e >= end:
            end, corr = e, c
    return inside, between


def _ranges(events, name):
    return sorted(
        (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("name") == name and e.get("cat") in ("user_annotation", "cpu_op")
    )


@contextlib.contextmanager
def _kineto_lines_dropped():
    """The profiler's tracing library (kineto) writes `USDT:... profiler_start` / `profiler_stop` lines of its
    own to the process's stderr (file descriptor 2, below Python) as each trace starts and stops. Its log level
    (KINETO_LOG_LEVEL) cannot drop them without dropping its errors too, so stderr is held in a file while a
    trace starts and stops, and every other line is written back after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held:
                if not line.startswith(b"USDT:"):
                    os.write(2, line)


def trace_call(fn, device, path: str) -> dict:
    """Run `fn()` once under the PyTorch profiler (CPU, and CUDA when there), write its Chrome trace to `path`
    (gzipped if it ends in .gz: Perfetto reads that) and return the trace. Used by the bench and by profile."""
    cuda = torch.device(device).type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()  # host sync: earlier work stays out of the trace
    with _kineto_lines_dropped(), torch.profiler.profile(activities=activities) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()  # host sync: the traced call's GPU work ends inside the trace
    prof.export_chrome_trace(path)
    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        return json.load(f)


def loop_events(trace: dict) -> dict:
    """Split a trace into the decode loop's steps: per step its runtime calls and the GPU work they caused."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    steps = _ranges(events, "decode_step")
    checks = _ranges(events, "stop_check")
    runtime = sorted((e for e in events if e.get("cat") in RUNTIME_CATS), key=lambda e: e["ts"])
    gpu_by_corr: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") in GPU_CATS:
            corr = e.get("args", {}).get("correlation")
            if corr is not None:
                gpu_by_corr.setdefault(corr, []).append(e)
    per_step = []
    for s, t in steps:
        calls = [r for r in runtime if s <= r["ts"] <= t]
        work = [g for r in calls for g in gpu_by_corr.get(r.get("args", {}).get("correlation"), [])]
        per_step.append(dict(start=s, end=t, calls=calls, gpu=work))
    return dict(steps=per_step, checks=checks, runtime=runtime)


def analyze(trace: dict) -> dict:
    """Summary of the decode loop of one traced generation (see the module docstring)."""
    loop = loop_events(trace)
    steps = loop["steps"]
    n = len(steps)
    if n == 0:
        return whole_call(trace)
    loop_start = steps[0]["start"]
    loop_end = max([steps[-1]["end"]] + [e for _, e in loop["checks"]])
    sync_us = sum(
        r.get("dur", 0) for r in loop["runtime"] if "Synchronize" in r["name"] and loop_start <= r["ts"] <= loop_end
    )
    launch_calls = sum(1 for st in steps for r in st["calls"] if "Launch" in r["name"] or "Memcpy" in r["name"])
    summary = dict(decode_steps=n, host_sync_ms=sync_us / 1e3, launches_per_step=launch_calls / n)
    gpu = [(g["ts"], g["ts"] + g.get("dur", 0)) for st in steps for g in st["gpu"]]
    if not gpu:
        summary.update(available=False, reason="no GPU activity in the trace (CPU run): busy fraction unavailable")
        return summary
    span_start = min(s for s, _ in gpu)
    span_end = max(e for _, e in gpu)
    busy = _union_length(gpu)
    in_launch, between = _idle_split(
        [(g["ts"], g["ts"] + g.get("dur", 0), g.get("args", {}).get("correlation")) for st in steps for g in st["gpu"]]
    )
    gaps = []
    bounds = [
        (min(g["ts"] for g in st["gpu"]), max(g["ts"] + g.get("dur", 0) for g in st["gpu"]))
        for st in steps
        if st["gpu"]
    ]
    for (_, prev_end), (next_start, _) in zip(bounds, bounds[1:]):
        gaps.append(max(0.0, next_start - prev_end))
    kernels = sum(1 for st in steps for g in st["gpu"] if g.get("cat") == "kernel")
    span = span_end - span_start
    summary.update(
        available=True,
        busy_fraction=busy / span if span > 0 else 1.0,
        fed_fraction=1 - between / span if span > 0 else 1.0,
        idle_in_launch_ms=in_launch / 1e3,
        idle_between_launches_ms=between / 1e3,
        gpu_span_ms=(span_end - span_start) / 1e3,
        gpu_busy_ms=busy / 1e3,
        median_idle_gap_us=statistics.median(gaps) if gaps else 0.0,
        kernels_per_step=kernels / n,
    )
    return summary


def whole_call(trace: dict) -> dict:
    """For a call without our step ranges (a Hugging Face peer): busy fraction over all its GPU work."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in GPU_CATS]
    sync_us = sum(e.get("dur", 0) for e in events if e.get("cat") in RUNTIME_CATS and "Synchronize" in e["name"])
    summary = dict(
        scope="whole call (no decode_step ranges: prefill included)", decode_steps=None, host_sync_ms=sync_us / 1e3
    )
    if not gpu:
        summary.update(available=False, reason="no GPU activity in the trace (CPU run): busy fraction unavailable")
        return summary
    start, end = min(s for s, _ in gpu), max(e for _, e in gpu)
    busy = _union_length(gpu)
    summary.update(
        available=True,
        busy_fraction=busy / (end - start) if end > start else 1.0,
        gpu_span_ms=(end - start) / 1e3,
        gpu_busy_ms=busy / 1e3,
    )
    return summary


def plot_timeline(trace: dict, path: str, title: str, first_step: int = 3, n_steps: int = 4) -> None:
    """PNG of a few decode steps: host lane (launches, syncs) over GPU lane (work), idle GPU gaps labelled."""
    import matplotlib  # optional and slow to import: only when a picture is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loop = loop_events(trace)
    steps = loop["steps"][first_step : first_step + n_steps] or loop["steps"][:n_steps]
    fig, ax = plt.subplots(figsize=(12, 3.2))
    if not steps:
        ax.text(0.5, 0.5, "no decode steps in trace", ha="center")
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return
    gpu = sorted([(g["ts"], g["ts"] + g.get("dur", 0)) for st in steps for g in st["gpu"]])
    t0 = min([steps[0]["start"]] + [s for s, _ in gpu])
    t1 = max([steps[-1]["end"]] + [e for _, e in gpu])
    ms = lambda t: (t - t0) / 1e3  # noqa: E731
    for k, st in enumerate(steps):
        ax.broken_barh([(ms(st["start"]), (st["end"] - st["start"]) / 1e3)], (2.1, 0.8), color="#c6dbef")
        ax.text(ms(st["start"]), 3.0, f"decode_step {first_step + k}", fontsize=7, va="bottom")
    for r in loop["runtime"]:
        if t0 <= r["ts"] <= t1:
            color = "#d62728" if "Synchronize" in r["name"] else "#1f77b4"
            ax.broken_barh([(ms(r["ts"]), max(r.get("dur", 0), 1) / 1e3)], (2.2, 0.6), color=color)
    for c0, c1 in loop["checks"]:
        if t0 <= c0 <= t1:
            ax.broken_barh([(ms(c0), (c1 - c0) / 1e3)], (1.6, 0.4), color="#ff9896")
    ax.broken_barh([(ms(s), (e - s) / 1e3) for s, e in gpu], (0.2, 0.8), color="#2ca02c")
    end = None
    for s, e in gpu:
        if end is not None and s - end > 5:  # a visible gap: > 5 us with the GPU idle
            ax.axvspan(ms(end), ms(s), ymin=0.0, ymax=0.3, color="#ffbb78", alpha=0.7)
            ax.text(ms(end), 1.05, f"idle {(s - end):.0f} us", fontsize=6, color="#d62728")
        end = e if end is None else max(end, e)
    ax.set_yticks([0.6, 1.8, 2.5], ["GPU work", "stop check", "host: launches (blue), syncs (red)"])
    ax.set_xlabel("ms")
    ax.set_ylim(0, 3.5)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
