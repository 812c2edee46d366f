"""On a real GPU: the bench's speculative rows and verify step (bench/speculative.py) for GPT-2 124M's shape with
random weights in float32 (in bfloat16 the draft's one-token forwards and the verify step's K + 1-token forward
round differently, and a near tie may be rejected), `kv` and `static`: the model as its own draft accepts every
draft, an unrelated draft about none; the verify step is timed with CUDA events for K + 1 = 1..9 tokens, the
captured presets' (`fused`, `compiled`) as replays of one CUDA graph per K + 1. No speed is asserted here: the
figures are what `overlapdecode bench` reports."""

from __future__ import annotations

import json
import os

import torch

import overlapdecode as od
from overlapdecode.bench.speculative import _Clock, captured_ms, captured_rows
from overlapdecode.bench.workloads import prompt
from overlapdecode.cli import main
from overlapdecode.hf.caches import static_length

N = 32


def test_the_bench_measures_speculation_on_the_gpu(tmp_path):
    out = str(tmp_path / "spec")
    common = ["bench", "--model", "gpt2-random", "--dtype-batch", "float32:1", "--strategies", "kv,static"]
    common += ["--peers", "none", "--lengths", str(N), "--warmup", "1", "--repeats", "3", "--no-profile", "--out", out]
    assert main([*common, "--assistant", "self", "--num-assistant-tokens", "1,4", "--prompt-lookup", "4"]) == 0
    assert main([*common, "--append", "--assistant", "random", "--num-assistant-tokens", "4"]) == 0
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    assert not [r for r in rows if "error" in r]
    spec = [r for r in rows if r["workload"] == "speculative"]
    assert len(spec) == 2 * 4 and all(r["device"].startswith("cuda") for r in spec)
    for r in spec:
        assert r["batch"] == 1 and r["new_tokens"] == N and r["speedup"] > 0
        assert r["drafts_accepted"] + r["row_rounds"] == N - 1  # each round: its accepted drafts and one token
        if r["assistant"] == "self":
            assert r["acceptance_rate"] == 1.0 and r["rounds"] == -(-(N - 1) // (r["k"] + 1))
        if r["assistant"] == "random":
            assert r["acceptance_rate"] < 0.2
    verify = [r for r in rows if r["workload"] == "verify"]
    assert sorted(r["strategy"] for r in verify) == ["kv", "static"]
    for r in verify:
        assert r["verify_tokens"] == list(range(1, 10)) and all(t > 0 for t in r["verify_ms"])
        assert r["verify_ratio"][0] == 1.0 and r["draft_ratio"] > 0
    assert os.path.getsize(os.path.join(out, "speculation.png")) > 0


def test_the_bench_times_the_fused_verify_step_in_cuda_graphs(tmp_path):
    """`fused` with prompt lookup and the model as its own draft: a verify row of positive times for K + 1 = 1..9,
    each a replay of a captured graph (K + 1 = 1: the fused decode step), and the draft's one-token forward."""
    out = str(tmp_path / "fused")
    flags = [
        "bench",
        "--model",
        "gpt2-random",
        "--dtype-batch",
        "float32:1",
        "--strategies",
        "fused",
        "--peers",
        "none",
    ]
    flags += ["--lengths", str(N), "--warmup", "1", "--repeats", "3", "--no-profile", "--out", out]
    assert main([*flags, "--prompt-lookup", "4", "--assistant", "self", "--num-assistant-tokens", "4"]) == 0
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    assert not [r for r in rows if "error" in r]
    (r,) = [r for r in rows if r["workload"] == "verify"]
    assert r["strategy"] == "fused" and r["device"].startswith("cuda") and r["verify_graph"] is True
    assert r["verify_tokens"] == list(range(1, 10)) and all(t > 0 for t in r["verify_ms"])
    assert r["verify_ratio"][0] == 1.0 and r["draft_step_ms"] > 0
    text = open(os.path.join(out, "report.md")).read()
    assert "| fused | float32 | 1 |" in text and "| graph |" in text


def test_the_compiled_verify_step_replays_its_graph_and_cuts_the_cache_back():
    """`compiled`: the StaticRows of its rounds, its forward compiled, captured once per T and replayed; the cache's
    counter back at the prompt's slots after the last replay."""
    model = od.load_model("gpt2-random", dtype="float32", device="cuda")
    ids = prompt(2, 16, model.config.vocab_size, "cuda")
    rows = captured_rows(model, od.resolve_strategy("compiled"), torch.ones_like(ids), 64)
    with torch.no_grad():
        ms, replayed = captured_ms(rows, ids, (1, 5), 2, 5, model.config.vocab_size, seed=0)
    assert replayed and len(ms) == 2 and all(t > 0 for t in ms)
    assert int(static_length(rows.cache)) == 16


def test_the_verify_clock_times_the_gpu_work():
    """CUDA events around work the GPU spends a known time on (a spin of about 10 ms) read about that."""
    clock = _Clock(torch.device("cuda"))
    torch.cuda._sleep(1000)  # start the device
    torch.cuda.synchronize()
    rate = 1 / clock(lambda: torch.cuda._sleep(10_000_000))  # spins per second, roughly: 1e7 cycles at ~1-2 GHz
    seconds = clock(lambda: torch.cuda._sleep(20_000_000))
    assert 1.5 < seconds * rate < 2.5  # twice the spin, twice the time: the events time the GPU's work
