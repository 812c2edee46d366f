"""Where a whole `fused` call's time goes beyond its decode steps, on a GPU: MODEL (default gpt2-random), DTYPE
(default bfloat16), BATCH rows (default 1), prompt 32, greedy or (--top-p P) sampled with a seed.

1. Unprofiled: wall time of calls of N = 1, 2, 3, 10, 200 tokens (EOS off), ROUNDS alternating rounds after
   warm-up, medians: a call of N tokens costs about fixed + (N - 1) x step, and the differences show whether the
   first decode steps of a call cost more than later ones.
2. One profiled 200-token call (torch.profiler, CPU and CUDA activity): from its Chrome trace, the host time before
   the GPU's first kernel, the prefill's GPU span (first kernel to the end of the first greedy choice kernel,
   which ends step 0; a sampled call's finish kernel), the gap to the first decode step's first kernel, each decode step's span (the end of one
   greedy choice kernel to the next's), the GPU's idle gaps, and the time from the last kernel to the call's end.
   The profiler adds host time per operation; the GPU spans are the kernels' own. "Decode step spans" run from
   the end of one greedy choice kernel to the next's, so the first includes the host's gap after the prefill.
3. From that trace, the decode steps' kernels (steps 50 to 149): per position in the step, the kernel's median
   duration; the step's median span (its first kernel's start to its last one's end); the median gap before each
   kernel (negative: it started before the one ahead ended, PDL), the first one being the gap from the previous
   step's last kernel (step-kernels.json). `--analyse TRACE.json.gz` runs this part alone on a saved trace.

    python3 scripts/call_timeline.py --out DIR [--model MODEL] [--batch B] [--top-p P] [--dtype D]   (on a GPU: timeline.json, step-kernels.json,
                                                                     trace.json.gz)
    python3 scripts/call_timeline.py --analyse TRACE.json.gz --out DIR   (anywhere: DIR/step-kernels.json)

The figures of docs/KERNELS.md, "Where the time goes" (results/h200/<the --out folder>):

    python3 scripts/call_timeline.py --out results/h200/llama-1b-call-timeline --model llama-1b-random
    python3 scripts/call_timeline.py --out results/h200/gpt2-call-timeline --model gpt2-random
    python3 scripts/call_timeline.py --out results/h200/llama-1b-timeline-64-rows --model llama-1b-random --batch 64
    python3 scripts/call_timeline.py --out results/h200/llama-1b-timeline-128-rows --model llama-1b-random --batch 128
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics

import torch
from ab import timed_call  # scripts/ is on the path when run as a script

import overlapdecode as od

ROUNDS = 15
LENGTHS = (1, 2, 3, 10, 200)


# the last kernel of each step: the greedy choice, or the sampled choice's finish (fused/kernels/sample.py)
STEP_END = ("greedy", "_finish_kernel")


def _ends_step(name: str) -> bool:
    return any(k in name for k in STEP_END)


def timed(model, ids, n: int, sampling: dict) -> float:
    """ms of one `fused` call of n tokens, EOS off (ab.timed_call)."""
    return timed_call(model, ids, n, "fused", **sampling) * 1e3


def analyse(trace: dict) -> dict:
    events = trace["traceEvents"]
    call = next(e for e in events if e.get("name") == "od_call" and e.get("ph") == "X")
    c0, c1 = call["ts"], call["ts"] + call["dur"]
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "kernel" and c0 <= e["ts"] <= c1
    )
    greedy_ends = [end for start, end, name in kernels if _ends_step(name)]
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
        "largest gaps (us, at us after the call's start, the kernel after)": [
            (us(g), us(t), n[:60]) for g, t, n in big
        ],
    }


def step_kernels(trace: dict, first: int = 50, last: int = 150) -> dict:
    """Per kernel of a decode step (steps first .. last - 1 of the profiled call), its median duration and the
    median gap before it; the step's median span and sums."""
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    ends = [i for i, k in enumerate(kernels) if _ends_step(k[2])]  # the last kernel of each step (step 0's: prefill)
    steps = [kernels[ends[i] + 1 : ends[i + 1] + 1] for i in range(first, min(last, len(ends) - 1))]
    n = len(steps[0])
    if any(len(st) != n for st in steps):
        raise SystemExit("the analysed steps do not all have the same kernels")
    prev_end = [kernels[ends[i]][1] for i in range(first, first + len(steps))]
    med = statistics.median
    rows = []
    for j in range(n):
        gaps = [st[j][0] - (st[j - 1][1] if j else prev_end[k]) for k, st in enumerate(steps)]
        rows.append(
            {
                "kernel": steps[0][j][2][:60],
                "median us": round(med([st[j][1] - st[j][0] for st in steps]), 2),
                "median gap before it us": round(med(gaps), 2),
            }
        )
    return {
        "steps analysed": len(steps),
        "kernels per step": n,
        "step span us (first kernel start to last kernel end), median": round(
            med([st[-1][1] - st[0][0] for st in steps]), 1
        ),
        "sum of the kernels' durations per step us, median": round(
            med([sum(e - b for b, e, _ in st) for st in steps]), 1
        ),
        "kernels": rows,
    }


def measure(
    out_dir: str, name: str = "gpt2-random", batch: int = 1, top_p: float | None = None, dtype: str = "bfloat16"
) -> None:
    os.makedirs(out_dir, exist_ok=True)
    model = od.load_model(name, dtype=dtype, device="cuda")
    ids = torch.randint(0, 1000, (batch, 32), device="cuda")
    mask = torch.ones_like(ids)  # unpadded: never a mask inferred from a pad id among random ids
    # top-p alone: top_k=0, not the generation config's or Hugging Face's default of 50
    sampling = dict(do_sample=True, top_p=top_p, top_k=0, seed=0) if top_p is not None else {}
    for n in LENGTHS:
        timed(model, ids, n, sampling)  # compiles, captures
    times = {n: [] for n in LENGTHS}
    for _ in range(ROUNDS):
        for n in LENGTHS:
            times[n].append(timed(model, ids, n, sampling))
    med = {n: statistics.median(t) for n, t in times.items()}
    res = {
        "model": name,
        "batch": batch,
        "dtype": dtype,
        "sampling": sampling or "greedy",
        "device": torch.cuda.get_device_name(),
        "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
        "call ms, median": {n: round(v, 4) for n, v in med.items()},
        "call ms, fastest": {n: round(min(t), 4) for n, t in times.items()},
        "step ms from 10 -> 200": round((med[200] - med[10]) / 190, 4),
        "ms of 1 -> 2, 2 -> 3, 3 -> 10 per step": [
            round(med[2] - med[1], 4),
            round(med[3] - med[2], 4),
            round((med[10] - med[3]) / 7, 4),
        ],
    }
    res["fixed ms (200-token call - 199 steps of 10 -> 200)"] = round(med[200] - 199 * res["step ms from 10 -> 200"], 4)
    print(json.dumps(res), flush=True)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        with torch.profiler.record_function("od_call"):
            od.generate(
                model, ids, attention_mask=mask, max_new_tokens=200, strategy="fused", eos_token_id=[], **sampling
            )
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
    json.dump(step_kernels(trace), open(os.path.join(out_dir, "step-kernels.json"), "w"), indent=1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the results (must be empty or new)")
    ap.add_argument("--model", default="gpt2-random", help="default: %(default)s")
    ap.add_argument("--batch", type=int, default=1, help="rows; default: %(default)s")
    ap.add_argument("--dtype", default="bfloat16", help="default: %(default)s")
    ap.add_argument("--top-p", type=float, default=None, help="sample with this top_p (seed 0); default: greedy")
    ap.add_argument("--analyse", metavar="TRACE.json.gz", help="only analyse a saved trace's decode steps")
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        ap.error(f"--out {args.out} is not an empty directory (no run overwrites an earlier one)")
    if args.analyse:
        with gzip.open(args.analyse, "rt") as f:
            result = step_kernels(json.load(f))
        os.makedirs(args.out, exist_ok=True)
        json.dump(result, open(os.path.join(args.out, "step-kernels.json"), "w"), indent=1)
    else:
        measure(args.out, args.model, args.batch, args.top_p, args.dtype)


if __name__ == "__main__":
    main()
