"""Why did `interleaved` run 42% slower than `nocheck` in one benchmark row? A controlled repeat.

One process, one GPU. For each dtype:batch pair, `interleaved` and `nocheck` are timed `--pairs` times,
alternating which goes first; each timing is the median of `--calls` calls of `od.generate` after warm-up.
The same is then done while `--burn` processes spin on the host's cores, as the three other benchmark
workers did in `benchmarks/h200-full`: if the slow runs come from a contended host (the ping-pong's host
work per step - event record, stream switch, pinned copy, event wait - must keep ahead of the GPU, and at
GPT-2 bfloat16 batch 1 a step is only ~0.45 ms of GPU work), the gap shows up under the burners and not alone.

    python scripts/stopcheck_pairs.py --out DIR [--dtype-batch bfloat16:1,bfloat16:8] [--burn 12]

Writes DIR/pairs.json (every timing, in order, with the condition) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time

import torch

import overlapdecode as od


def _spin(stop):
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def timed(model, ids, strategy, n, calls):
    times = []
    for _ in range(calls):
        torch.cuda.synchronize()  # host sync: timing boundary
        t0 = time.perf_counter()
        od.generate(model, ids, max_new_tokens=n, strategy=strategy, eos_token_id=[])
        torch.cuda.synchronize()  # host sync: timing boundary
        times.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(times)


def measure(model, ids, n, pairs, calls, condition):
    rows = []
    for i in range(pairs):
        order = ("interleaved", "nocheck") if i % 2 == 0 else ("nocheck", "interleaved")
        for s in order:
            rows.append(dict(condition=condition, pair=i, strategy=s, first=order[0],
                             ms_per_token=timed(model, ids, s, n, calls)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for pairs.json")
    ap.add_argument("--model", default="gpt2-random")
    ap.add_argument("--dtype-batch", default="bfloat16:1,bfloat16:8")
    ap.add_argument("--new-tokens", type=int, default=400)
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--burn", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                    help="host processes spinning in the contended condition (0: skip it)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for pair in args.dtype_batch.split(","):
        dtype, batch = pair.split(":")
        model = od.load_model(args.model, dtype=dtype, device="cuda")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size - 1, (int(batch), 32), generator=g).cuda()
        for s in ("interleaved", "nocheck"):  # compile and record the graphs before any timing
            for _ in range(2):
                od.generate(model, ids, max_new_tokens=args.new_tokens, strategy=s, eos_token_id=[])
        conds = [("alone", 0)] + ([("burn", args.burn)] if args.burn else [])
        for cond, nburn in conds:
            stop = mp.Event()
            procs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(nburn)]
            for p in procs:
                p.start()
            try:
                got = measure(model, ids, args.new_tokens, args.pairs, args.calls, cond)
            finally:
                stop.set()
                for p in procs:
                    p.join(timeout=10)
            for r in got:
                r.update(dtype=dtype, batch=int(batch), burners=nburn)
            rows += got
            inter = [r["ms_per_token"] for r in got if r["strategy"] == "interleaved"]
            noch = [r["ms_per_token"] for r in got if r["strategy"] == "nocheck"]
            ratios = [a / b for a, b in zip(inter, noch)]
            print(f"{dtype} b{batch} {cond:5s}: interleaved median {statistics.median(inter):.3f} "
                  f"[{min(inter):.3f}-{max(inter):.3f}] nocheck {statistics.median(noch):.3f} "
                  f"[{min(noch):.3f}-{max(noch):.3f}] ms/token; ratio per pair median "
                  f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]", flush=True)
        del model
        torch.cuda.empty_cache()
    env = dict(torch=torch.__version__, gpu=torch.cuda.get_device_name(), cpus=os.cpu_count(),
               commit=os.environ.get("OVERLAPDECODE_COMMIT", "unknown"), args=vars(args))
    with open(os.path.join(args.out, "pairs.json"), "w") as f:
        json.dump(dict(environment=env, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
