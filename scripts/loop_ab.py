"""The decode loop of `fused` around its step graph, timed on a GPU for the code on PYTHONPATH (run it once per
tree and alternate the trees, so that two versions of the loop are compared in one session; scripts/gpu_session9.sh).

Per case (gpt2-random and llama-1b-random, bfloat16, batch 1, prompt 32), per strategy (`fused`: ping-pong, lag 1;
the same step with the deferred check on one stream; with no per-step check): ms per token of the decode steps
alone ((a 208-token call - a 16-token call) / 192, median of ROUNDS after a first call that compiles), of a
whole 200-token call as the bench times it (TTFT included), and the time of a 1-token call (TTFT). EOS off:
every call runs all its steps.

    python3 scripts/loop_ab.py OUT.json LABEL [--ttft] [--models gpt2-random,llama-1b-random]

--ttft: only the time to first token of `fused` (a 1-token call), TTFT_CALLS calls per model after warm-up.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

import overlapdecode as od

ROUNDS = 7
TTFT_CALLS = 40
STRATEGIES = {
    "fused": "fused",
    "fused, deferred check": od.Strategy(cache="fused", compile=True, stop_check="deferred", lag=1),
    "fused, no per-step check": od.Strategy(cache="fused", compile=True, stop_check="end"),
}


def timed_call(model, ids, n: int, strategy) -> float:
    torch.cuda.synchronize()  # host sync: timing boundary
    t = time.perf_counter()
    od.generate(model, ids, max_new_tokens=n, strategy=strategy, eos_token_id=[])
    torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
    return time.perf_counter() - t


def main(out: str, label: str, ttft_only: bool = False, models: tuple = ("gpt2-random", "llama-1b-random")) -> None:
    res = {"label": label}
    for name in models:
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        ids = torch.randint(0, 1000, (1, 32), device="cuda")
        if ttft_only:
            for _ in range(3):
                timed_call(model, ids, 1, "fused")  # compiles, captures
            first = [timed_call(model, ids, 1, "fused") for _ in range(TTFT_CALLS)]
            res[f"{name} b1, fused TTFT ms"] = {"median": round(statistics.median(first) * 1e3, 3),
                                               "fastest": round(min(first) * 1e3, 3)}
            print(label, name, res[f"{name} b1, fused TTFT ms"], flush=True)
            del model
            torch.cuda.empty_cache()
            continue
        for sname, strategy in STRATEGIES.items():
            for n in (16, 208, 200):
                timed_call(model, ids, n, strategy)  # compiles, captures
            short, long, whole, first = [], [], [], []
            for _ in range(ROUNDS):
                first.append(timed_call(model, ids, 1, strategy))
                short.append(timed_call(model, ids, 16, strategy))
                long.append(timed_call(model, ids, 208, strategy))
                whole.append(timed_call(model, ids, 200, strategy))
            res[f"{name} b1, {sname}"] = {
                "decode ms/token": round((statistics.median(long) - statistics.median(short)) / 192 * 1e3, 4),
                "200-token call ms/token": round(statistics.median(whole) / 200 * 1e3, 4),
                "fastest 200-token call ms/token": round(min(whole) / 200 * 1e3, 4),
                "TTFT ms (a 1-token call)": round(statistics.median(first) * 1e3, 3),
            }
            print(label, name, sname, res[f"{name} b1, {sname}"], flush=True)
        del model
        torch.cuda.empty_cache()
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print("usage: python3 scripts/loop_ab.py OUT.json LABEL [--ttft] [--models a,b]", file=sys.stderr)
        sys.exit(2)
    if os.path.exists(sys.argv[1]):  # never overwrite an earlier run's results
        print(f"loop_ab.py: {sys.argv[1]} exists; give a new path", file=sys.stderr)
        sys.exit(2)
    args = sys.argv[3:]
    models = ("gpt2-random", "llama-1b-random")
    if "--models" in args:
        models = tuple(args[args.index("--models") + 1].split(","))
    main(sys.argv[1], sys.argv[2], "--ttft" in args, models)
