"""A preset's whole calls, timed on a GPU for the code on PYTHONPATH: run it once per tree and alternate the trees, so
that two versions are compared on one machine in one session (the bench's figures for host-bound presets move with
the machine). Wall time of `od.generate(model, ids, max_new_tokens=N, strategy=..., eos_token_id=[])` (bfloat16,
batch 1, prompt 32, EOS off) after WARMUP calls: median and every call, ms per token, and per call the time Python's
garbage collector paused it (gc.callbacks) and its collections per generation, to tell a collector's pause from
other noise. Uses only the API every version since session 5 has (od.load_model, od.generate).

    python3 scripts/preset_ab.py OUT.json LABEL [--model gpt2-random] [--strategy interleaved] [--tokens 200]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

import torch

import overlapdecode as od

WARMUP, CALLS = 3, 9


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block and error
        raise SystemExit(f"preset_ab.py: {message} (usage: python3 scripts/preset_ab.py OUT.json LABEL [--model M] "
                         "[--strategy S] [--tokens N])")


def main() -> None:
    ap = _Parser()
    ap.add_argument("out")
    ap.add_argument("label")
    ap.add_argument("--model", default="gpt2-random")
    ap.add_argument("--strategy", default="interleaved")
    ap.add_argument("--tokens", type=int, default=200)
    a = ap.parse_args()
    if os.path.exists(a.out):
        raise SystemExit(f"{a.out} exists: choose a new path (no run overwrites an earlier one)")
    model = od.load_model(a.model, dtype="bfloat16", device="cuda")
    ids = torch.randint(0, 1000, (1, 32), device="cuda")
    pauses: list = []  # (generation, seconds) of the collections during the current call
    started: dict = {}

    def on_gc(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            pauses.append((info["generation"], time.perf_counter() - started.pop("t")))

    gc.callbacks.append(on_gc)
    times, gc_ms, gc_counts = [], [], []
    for i in range(WARMUP + CALLS):
        pauses.clear()
        torch.cuda.synchronize()  # host sync: timing boundary
        t = time.perf_counter()
        od.generate(model, ids, max_new_tokens=a.tokens, strategy=a.strategy, eos_token_id=[])
        torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
        if i >= WARMUP:
            times.append((time.perf_counter() - t) * 1e3 / a.tokens)
            gc_ms.append(round(sum(p for _, p in pauses) * 1e3, 3))
            gc_counts.append([sum(1 for g, _ in pauses if g == gen) for gen in range(3)])
    gc.callbacks.remove(on_gc)
    res = {"label": a.label, "model": a.model, "strategy": a.strategy, "tokens": a.tokens,
           "device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "ms/token median": round(statistics.median(times), 4), "ms/token calls": [round(x, 4) for x in times],
           "gc pause ms per call": gc_ms, "gc collections per call (gen 0, 1, 2)": gc_counts,
           "source": od.__file__}
    print(json.dumps(res), flush=True)
    json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
