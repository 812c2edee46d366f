"""Where the fused preset's time to first token goes (one GPU): a `max_new_tokens=1` call, as the bench's
TTFT times it, at gpt2-random and llama-1b-random (bfloat16, batch 1, prompt 32): its wall time, the host's
Python profile of 20 such calls (cProfile, top functions), and the GPU's kernels of one call.

    python3 scripts/ttft_profile.py OUT_DIR
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

import overlapdecode as od


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    res = {}
    for name in ("gpt2-random", "llama-1b-random"):
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        ids = torch.randint(0, 1000, (1, 32), device="cuda")

        def call():
            od.generate(model, ids, max_new_tokens=1, strategy="fused", eos_token_id=[])
            torch.cuda.synchronize()  # host sync: the call's end, as the bench times it

        for _ in range(5):
            call()
        times = []
        for _ in range(20):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        times.sort()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            call()
        prof.disable()
        buf = io.StringIO()
        stats = pstats.Stats(prof, stream=buf)
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(25)
        open(os.path.join(out_dir, f"ttft-host-{name}.txt"), "w").write(buf.getvalue())
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as tp:
            call()
        open(os.path.join(out_dir, f"ttft-kernels-{name}.txt"), "w").write(
            tp.key_averages().table(sort_by="cuda_time_total", row_limit=40))
        res[name] = dict(ttft_ms_median=round(times[10] * 1e3, 3), ttft_ms_min=round(times[0] * 1e3, 3))
        print(name, res[name], flush=True)
        del model
        torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(out_dir, "ttft.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
