"""The greedy token choice by one kernel after the LM head (fused/kernels/greedy.py, what FusedModel.greedy_step
runs) against the choice by torch ops (`choose_next` compiled by inductor, then two copies: the fused greedy
step before session 8),
measured as the decode loop runs them: the whole StepGraph (model step, choice, state and flag update) replayed
from its CUDA graph, bfloat16, at gpt2-random batch 1 and llama-1b-random batch 1 and 8.

Per variant and shape: ms per replay (median over rounds of 64 replays from position 100 of a 300-slot cache,
the two variants alternating round by round) and kernels per replay (PyTorch profiler over 8 replays).

    python3 scripts/finish_ab.py OUT_DIR
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys

import torch

import overlapdecode as od
from overlapdecode import fused_path
from overlapdecode.fused.cache import decode_kwargs
from overlapdecode.fused.model import FusedModel
from overlapdecode.sampling import SamplingParams
from overlapdecode.step_graph import StepGraph

DEV = torch.device("cuda")
CASES = (("gpt2-random", 1), ("llama-1b-random", 1), ("llama-1b-random", 8))
REPLAYS, ROUNDS, START = 64, 15, 100


def graphs(fm: FusedModel, cache, B: int) -> dict:
    before = functools.partial(fused_path._fused_step, fm, decode_kwargs(cache), 0, SamplingParams(),
                               fused_path.compiled_choose_next())
    now = functools.partial(fused_path._fused_greedy_step, fm, cache, 0)
    return {"choose after the head": StepGraph(before, B, 1, None, DEV),
            "greedy kernel": StepGraph(now, B, 1, None, DEV)}


def reset(g: StepGraph, init: torch.Tensor) -> None:
    g.state.copy_(init)
    g.eos.fill_(-1)  # never met: every replay runs the whole step


def timed_round(g: StepGraph, init: torch.Tensor) -> float:
    reset(g, init)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        g.run()
    end.record()
    end.synchronize()  # host sync: timing boundary
    return start.elapsed_time(end) / REPLAYS


def kernels_per_replay(g: StepGraph, init: torch.Tensor) -> float:
    reset(g, init)
    torch.cuda.synchronize()  # host sync: profile boundary
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(8):
            g.run()
        torch.cuda.synchronize()  # host sync: profile boundary
    kinds = ("kernel", "gpu_op")
    n = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and not e.name.startswith(("Memcpy", "Memset")) and getattr(e, "kind", "kernel") in kinds)
    return n / 8


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    res = {}
    for name, B in CASES:
        model = od.load_model(name, dtype="bfloat16", device=DEV)
        fm = FusedModel(model)
        cache = fm.cache_for(B, 300)
        init = torch.stack([torch.randint(0, 1000, (B,)), torch.full((B,), START), torch.zeros(B, dtype=torch.long)],
                           1).to(DEV)
        gs = graphs(fm, cache, B)
        tokens = {}
        for label, g in gs.items():  # eager step, capture, and a check that both choose the same tokens
            reset(g, init)
            for _ in range(4):
                g.run()
            tokens[label] = g.state.clone()
        same = torch.equal(*tokens.values())
        times = {label: [] for label in gs}
        for _ in range(ROUNDS):
            for label, g in gs.items():
                times[label].append(timed_round(g, init))
        res[f"{name} b{B}"] = {label: dict(ms_per_replay=round(statistics.median(t), 4),
                                           fastest=round(min(t), 4), kernels=kernels_per_replay(gs[label], init))
                               for label, t in times.items()}
        res[f"{name} b{B}"]["same tokens after 4 steps"] = same
        print(name, B, json.dumps(res[f"{name} b{B}"]), flush=True)
        json.dump(res, open(os.path.join(out_dir, "finish_ab.json"), "w"), indent=1)
        del gs, cache, fm, model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
