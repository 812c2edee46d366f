"""Where the fused preset's time to first token goes (one GPU): a `max_new_tokens=1` call, as the bench's
TTFT times it, at gpt2-random and llama-1b-random (bfloat16, batch 1, prompt 32), for each prefill setting in SETTINGS
(today only the default, torch.compile's CUDA graphs per bucket): its wall time (median and fastest of 3
alternating rounds of 20 calls per setting), the host's Python profile of
20 such calls (cProfile, top functions), and the GPU's kernels of one call; and the whole 200-token call's
ms per token per setting (as the bench's ms/token).

    python3 scripts/ttft_profile.py --out DIR     (ttft.json, the host's and the GPU's tables per model and setting)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch

import overlapdecode as od

SETTINGS = {"default": {}}  # fused_options per setting, timed in alternation


def timed(fn) -> float:
    torch.cuda.synchronize()  # host sync: timing boundary
    t = time.perf_counter()
    fn()
    torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for ttft.json and the profiles (made if needed)")
    out_dir = ap.parse_args(argv).out
    if os.path.exists(os.path.join(out_dir, "ttft.json")):
        ap.error(f"{out_dir}/ttft.json exists: choose a new --out (no run overwrites an earlier one)")
    os.makedirs(out_dir, exist_ok=True)
    res = {}
    for name in ("gpt2-random", "llama-1b-random"):
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        ids = torch.randint(0, 1000, (1, 32), device="cuda")
        mask = torch.ones_like(ids)  # unpadded: never a mask inferred from a pad id among random ids
        decs = {s: od.Decoder(model, fused_options=opts) for s, opts in SETTINGS.items()}

        def call(setting, n=1, decs=decs):
            decs[setting].generate(ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

        for setting in SETTINGS:
            for _ in range(5):  # compiles, captures, warms up
                call(setting)
            call(setting, 200)
        ttft = {s: [] for s in SETTINGS}
        whole = {s: [] for s in SETTINGS}
        for _ in range(3):  # alternating rounds: both settings see the same machine state
            for setting in SETTINGS:
                ttft[setting] += [timed(lambda: call(setting)) for _ in range(20)]
                whole[setting].append(timed(lambda: call(setting, 200)))
        res[name] = {
            s: dict(
                ttft_ms_median=round(statistics.median(ttft[s]) * 1e3, 3),
                ttft_ms_min=round(min(ttft[s]) * 1e3, 3),
                ms_per_token_200=round(statistics.median(whole[s]) / 200 * 1e3, 4),
            )
            for s in SETTINGS
        }
        print(name, res[name], flush=True)
        for setting in SETTINGS:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(20):
                call(setting)
            torch.cuda.synchronize()  # host sync: end of the profiled calls
            prof.disable()
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            stats.sort_stats("cumulative").print_stats(45)
            stats.sort_stats("tottime").print_stats(25)
            open(os.path.join(out_dir, f"ttft-host-{name}-{setting}.txt"), "w").write(buf.getvalue())
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as tp:
                call(setting)
                torch.cuda.synchronize()  # host sync: end of the profiled call
            open(os.path.join(out_dir, f"ttft-kernels-{name}-{setting}.txt"), "w").write(
                tp.key_averages().table(sort_by="cuda_time_total", row_limit=40)
            )
        del model, decs
        torch.cuda.empty_cache()
        json.dump(res, open(os.path.join(out_dir, "ttft.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
