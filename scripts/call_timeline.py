"""Where a whole `fused` call's time goes beyond its decode steps, on a GPU: gpt2-random, bfloat16, batch 1, prompt 32.

1. Unprofiled: wall time of calls of N = 1, 2, 3, 10, 200 tokens (EOS off), ROUNDS alternating rounds after
   warm-up, medians: a call of N tokens costs about fixed + (N - 1) x step, and the differences show whether the
   first decode steps of a call cost more than later ones.
2. One profiled 200-token call (torch.profiler, CPU and CUDA activity): from its Chrome trace, the host time before
   the GPU's first kernel, the prefill's GPU span (first kernel to the end of the first greedy choice kernel,
   which ends step 0), the gap to the first decode step's first kernel, each decode step's span (the end of one
   greedy choice kernel to the next's), the GPU's idle gaps, and the time from the last kernel to the call's end.
   The profiler adds host time per operation; the GPU spans are the kernels' own.

    python3 scripts/call_timeline.py OUT_DIR [MODEL]
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import time

import torch

import overlapdecode as od

ROUNDS = 15
LENGTHS = (1, 2, 3, 10, 200)


def timed(model, ids, n: int) -> float:
    torch.cuda.synchronize()  # host sync: timing boundary
    t = time.perf_counter()
    od.generate(model, ids, max_new_tokens=n, strategy="fused", eos_token_id=[])
    torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
    return (time.perf_counter() - t) * 1e3


def analyse(trace: dict) -> dict:
    events = trace["traceEvents"]
    call = next(e for e in events if e.get("name") == "od_call" and e.get("ph") == "X")
    c0, c1 = call["ts"], call["ts"] + call["dur"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
                     if e.get("cat") == "kernel" and c0 <= e["ts"] <= c1)
    greedy_ends = [end for start, end, name in kernels if "greedy" in name]
    steps = [b - a for a, b in zip(greedy_ends, greedy_ends[1:])]
    after_prefill = next(start for start, end, name in kernels if start >= greedy_ends[0])
    gaps, busy_to = [], kernels[0][1]
    for start, end, name in kernels[1:]:
        if start > busy_to:
            gaps.append((start - busy_to, start - c0, name))
        busy_to = max(busy_to, end)
    big = sorted(gaps, reverse=True)[:12]
    us = lambda v: round(v, 1)  # noqa: E731
    return {
        "call us (profiled)": us(c1 - c0),
        "kernels": len(kernels),
        "greedy choice kernels (steps incl. step 0)": len(greedy_ends),
        "host before the first kernel us": us(kernels[0][0] - c0),
        "prefill GPU span us (first kernel to the end of step 0's choice)": us(greedy_ends[0] - kernels[0][0]),
        "gap from step 0's choice to the first decode kernel us": us(after_prefill - greedy_ends[0]),
        "decode step spans us: first 5": [us(s) for s in steps[:5]],
        "decode step spans us: median": us(statistics.median(steps)) if steps else None,
        "decode step spans us: max": us(max(steps)) if steps else None,
        "decode step spans us: last 3": [us(s) for s in steps[-3:]],
        "last kernel end to the call's end us": us(c1 - busy_to),
        "GPU idle inside the call us (sum of gaps between kernels)": us(sum(g for g, _, _ in gaps)),
        "largest gaps (us, at us after the call's start, the kernel after)": [(us(g), us(t), n[:60]) for g, t, n in big],
    }


def main(out_dir: str, name: str = "gpt2-random") -> None:
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise SystemExit(f"{out_dir} is not empty: choose a new directory (no run overwrites an earlier one)")
    os.makedirs(out_dir, exist_ok=True)
    model = od.load_model(name, dtype="bfloat16", device="cuda")
    ids = torch.randint(0, 1000, (1, 32), device="cuda")
    for n in LENGTHS:
        timed(model, ids, n)  # compiles, captures
    times = {n: [] for n in LENGTHS}
    for _ in range(ROUNDS):
        for n in LENGTHS:
            times[n].append(timed(model, ids, n))
    med = {n: statistics.median(t) for n, t in times.items()}
    res = {"model": name, "device": torch.cuda.get_device_name(),
           "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "call ms, median": {n: round(v, 4) for n, v in med.items()},
           "call ms, fastest": {n: round(min(t), 4) for n, t in times.items()},
           "step ms from 10 -> 200": round((med[200] - med[10]) / 190, 4),
           "ms of 1 -> 2, 2 -> 3, 3 -> 10 per step": [round(med[2] - med[1], 4), round(med[3] - med[2], 4),
                                                      round((med[10] - med[3]) / 7, 4)]}
    res["fixed ms (200-token call - 199 steps of 10 -> 200)"] = round(med[200] - 199 * res["step ms from 10 -> 200"], 4)
    print(json.dumps(res), flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("od_call"):
            od.generate(model, ids, max_new_tokens=200, strategy="fused", eos_token_id=[])
            torch.cuda.synchronize()  # host sync: the call's end, inside the annotated range
    path = os.path.join(out_dir, "trace.json")
    prof.export_chrome_trace(path)
    trace = json.load(open(path))
    with gzip.open(path + ".gz", "wt") as f:
        json.dump(trace, f)
    os.remove(path)
    res["profiled 200-token call"] = analyse(trace)
    print(json.dumps(res["profiled 200-token call"], indent=1), flush=True)
    json.dump(res, open(os.path.join(out_dir, "timeline.json"), "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python3 scripts/call_timeline.py OUT_DIR [MODEL]")
    main(*sys.argv[1:])
