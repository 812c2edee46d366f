"""A preset's whole calls, timed on a GPU for the code on PYTHONPATH: run it once per tree and alternate the trees, so
that two versions are compared on one machine in one session (the bench's figures for host-bound presets move with
the machine). Wall time of `od.generate(model, ids, max_new_tokens=N, strategy=..., eos_token_id=[])` (bfloat16,
batch 1, prompt 32, EOS off) after WARMUP calls: median and every call, ms per token. Uses only the API every
version since session 5 has (od.load_model, od.generate).

    python3 scripts/preset_ab.py OUT.json LABEL [--model gpt2-random] [--strategy interleaved] [--tokens 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import overlapdecode as od

WARMUP, CALLS = 3, 9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("label")
    ap.add_argument("--model", default="gpt2-random")
    ap.add_argument("--strategy", default="interleaved")
    ap.add_argument("--tokens", type=int, default=200)
    a = ap.parse_args()
    if os.path.exists(a.out):
        ap.error(f"{a.out} exists: choose a new path (no run overwrites an earlier one)")
    model = od.load_model(a.model, dtype="bfloat16", device="cuda")
    ids = torch.randint(0, 1000, (1, 32), device="cuda")
    times = []
    for i in range(WARMUP + CALLS):
        torch.cuda.synchronize()  # host sync: timing boundary
        t = time.perf_counter()
        od.generate(model, ids, max_new_tokens=a.tokens, strategy=a.strategy, eos_token_id=[])
        torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
        if i >= WARMUP:
            times.append((time.perf_counter() - t) * 1e3 / a.tokens)
    res = {"label": a.label, "model": a.model, "strategy": a.strategy, "tokens": a.tokens,
           "ms/token median": round(statistics.median(times), 4), "ms/token calls": [round(x, 4) for x in times],
           "source": od.__file__}
    print(json.dumps(res), flush=True)
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
