"""Time the fused step's token choice alone on a GPU: the greedy kernel against the sampled choice's launches
(fused/kernels/sample.py) at each setting, over logits per program (`block_v`), and the cost of the step's
noise draw, launched eagerly and inside a graph (the generator registered with it, as StepGraph draws it).

Each case is captured in one CUDA graph of REPEAT consecutive choices (PDL as the fused step launches them);
its replays are timed with events, median of ROUNDS after warm-up, in us per choice. The logits are fixed
random rows (normal, scale 3: top-p 0.9 keeps about 4% of a 128K vocabulary). With fixed noise every choice of a
graph takes the same branches; the rows with the noise drawn in the graph before each choice (as the fused step
does) take the rare ones (a second check, the finish's chain) as often as a real step, and are the ones to read.

    python3 scripts/sample_sweep.py --out DIR [--batch 1,8] [--vocab 128256]      -> DIR/sample-sweep.json

`python3 scripts/sample_sweep.py --out DIR` made the figures of docs/KERNELS.md, "The sampled choice"
(results/h200/llama-1b-sample-sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from overlapdecode.fused.kernels.greedy import GreedyFinish, block_v_for, greedy_choice
from overlapdecode.fused.kernels.sample import default_block_v, sample_choice
from overlapdecode.fused.model import pdl_supported
from overlapdecode.sampling import SamplingParams

DEV = "cuda"
REPEAT = 20
ROUNDS = 15
SETTINGS = {
    "temperature=0.8": dict(temperature=0.8),
    "top_p=0.9": dict(top_p=0.9),
    "top_k=50": dict(top_k=50),  # Hugging Face's default sampling
    "top_k=50,top_p=0.9": dict(top_k=50, top_p=0.9),
    "all": dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.2),
}


def median_us(run, calls: int) -> float:
    """us per call: `run()` (which makes `calls` calls) timed with events, median of ROUNDS."""
    times = []
    for _ in range(ROUNDS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()  # host sync: timing only
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def timed_graph(body, generator=None) -> float:
    """us per call of `body` in a graph of REPEAT calls (the generator registered with it, if given)."""
    body()  # compile, warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    if generator is not None:
        graph.register_generator_state(generator)
    stream = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(REPEAT):
            body()
    for _ in range(3):
        graph.replay()
    return median_us(graph.replay, REPEAT)


def timed_eager(body) -> float:
    """us per call of `body` launched eagerly REPEAT times between two events."""
    body()
    torch.cuda.synchronize()

    def run():
        for _ in range(REPEAT):
            body()

    return median_us(run, REPEAT)


def buffers(B: int, V: int):
    g = torch.Generator(device=DEV)
    g.manual_seed(0)
    logits = torch.randn((B, V), device=DEV, generator=g) * 3
    state = torch.zeros((B, 3), dtype=torch.long, device=DEV)
    eos = torch.zeros((0,), dtype=torch.long, device=DEV)
    done = torch.zeros((), dtype=torch.bool, device=DEV)
    return logits, state, eos, done


def sweep(B: int, V: int, pdl: bool) -> list[dict]:
    rows = []
    logits, state, eos, done = buffers(B, V)
    finish = GreedyFinish(state, eos, 0, done)
    for block_v in sorted({512, 1024, block_v_for(B), 2048}):
        us = timed_graph(lambda bv=block_v: greedy_choice(logits, finish, pdl=pdl, block_v=bv))
        rows.append(dict(batch=B, vocab=V, setting="greedy", block_v=block_v, us=round(us, 2)))
        print(rows[-1], flush=True)
    gen = torch.Generator(device=DEV)
    gen.manual_seed(1)
    noise = torch.empty((B, V), device=DEV).exponential_(generator=gen)
    rows.append(
        dict(
            batch=B,
            vocab=V,
            setting="noise",
            where="eager",
            us=round(timed_eager(lambda: noise.exponential_(generator=gen)), 2),
        )
    )
    rows.append(
        dict(
            batch=B,
            vocab=V,
            setting="noise",
            where="graph",
            us=round(timed_graph(lambda: noise.exponential_(generator=gen), gen), 2),
        )
    )
    print(rows[-2:], flush=True)
    for name, kw in SETTINGS.items():
        params = SamplingParams(do_sample=True, **kw)
        seen = torch.zeros((B, V), dtype=torch.bool, device=DEV) if params.uses_seen else None
        for block_v in sorted({512, 1024, default_block_v(B)}):

            def choose(bv=block_v):
                sample_choice(logits, noise, params, seen, state, eos, 0, done, pdl=pdl, block_v=bv)

            rows.append(dict(batch=B, vocab=V, setting=name, block_v=block_v, us=round(timed_graph(choose), 2)))
            print(rows[-1], flush=True)

        def noise_and_choose():
            noise.exponential_(generator=gen)
            sample_choice(logits, noise, params, seen, state, eos, 0, done, pdl=pdl)

        rows.append(
            dict(
                batch=B,
                vocab=V,
                setting=name,
                block_v=default_block_v(B),
                noise="in graph",
                us=round(timed_graph(noise_and_choose, gen), 2),
            )
        )
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="directory for sample-sweep.json (created; an existing file is kept)")
    p.add_argument("--batch", default="1,8", help="comma-separated rows (default 1,8)")
    p.add_argument("--vocab", type=int, default=128256, help="vocabulary (default 128256, Llama-3's)")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    try:
        batches = [int(b) for b in a.batch.split(",")]
    except ValueError:
        p.error(f"--batch takes comma-separated integers, got {a.batch!r}")
    if any(b < 1 for b in batches) or a.vocab < 2:
        p.error("--batch values must be >= 1 and --vocab >= 2")
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "sample-sweep.json")
    if os.path.exists(path):
        p.error(f"{path} exists: choose a new --out")
    pdl = pdl_supported(torch.device(DEV))
    rows = []
    for B in batches:
        rows += sweep(B, a.vocab, pdl)
        with open(path, "w") as f:  # after each batch: a run cut short keeps what it measured
            json.dump(
                dict(gpu=torch.cuda.get_device_name(), pdl=pdl, repeat=REPEAT, rounds=ROUNDS, rows=rows), f, indent=1
            )


if __name__ == "__main__":
    main()
