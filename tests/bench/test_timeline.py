"""timeline.analyze on a hand-made trace whose answer is known (the GPU path cannot run in CI)."""

from __future__ import annotations

import pytest

from overlapdecode.bench.timeline import analyze


def X(name, cat, ts, dur, corr=None):
    e = {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def trace():
    """Two decode steps: host launches at 10 and 110; step 1's graph runs two kernels 5 us apart, step 2
    starts 20 us after step 1 ends (waiting for its launch); one 30 us stream synchronize in the stop check."""
    return {
        "traceEvents": [
            X("decode_step", "user_annotation", 0, 50),
            X("cudaGraphLaunch", "cuda_runtime", 10, 5, corr=1),
            X("cudaMemcpyAsync", "cuda_runtime", 20, 3, corr=2),
            X("stop_check", "user_annotation", 60, 35),
            X("cudaStreamSynchronize", "cuda_runtime", 62, 30),
            X("decode_step", "user_annotation", 100, 50),
            X("cudaGraphLaunch", "cuda_runtime", 110, 5, corr=3),
            X("k1", "kernel", 20, 50, corr=1),
            X("k2", "kernel", 75, 25, corr=1),  # 5 us after k1, same graph launch: the GPU's own gap
            X("copy", "gpu_memcpy", 100, 0, corr=2),
            X("k3", "kernel", 120, 80, corr=3),
            X("unrelated", "kernel", 500, 10, corr=99),  # outside the loop: ignored
        ]
    }


def test_analyze_known_trace():
    s = analyze(trace())
    assert s["available"] and s["decode_steps"] == 2
    assert s["busy_fraction"] == pytest.approx(155 / 180)  # span 20..200, idle 70..75 and 100..120
    assert s["idle_in_launch_ms"] == pytest.approx(0.005)
    assert s["idle_between_launches_ms"] == pytest.approx(0.020)
    assert s["fed_fraction"] == pytest.approx(1 - 20 / 180)
    assert s["median_idle_gap_us"] == pytest.approx(20)
    assert s["host_sync_ms"] == pytest.approx(0.030)
    assert s["launches_per_step"] == pytest.approx(1.5)  # 2 graph launches + 1 copy over 2 steps
    assert s["kernels_per_step"] == pytest.approx(1.5)


def test_peer_trace_without_steps_uses_the_whole_call():
    t = {"traceEvents": [X("k", "kernel", 0, 10, corr=1), X("k", "kernel", 20, 10, corr=2)]}
    s = analyze(t)
    assert s["available"] and s["decode_steps"] is None and s["busy_fraction"] == pytest.approx(20 / 30)


def test_cpu_trace_is_unavailable_not_faked():
    t = {"traceEvents": [X("decode_step", "user_annotation", 0, 50), X("aten::mm", "cpu_op", 5, 10)]}
    s = analyze(t)
    assert s["available"] is False and "busy_fraction" not in s
