"""Where the fused preset's time per token goes, on a GPU, per shape (llama-1b-random batch 1 and 8, gpt2-random
batch 1, bfloat16): the model step alone replayed from one manually captured CUDA graph, in each programmatic
dependent launch mode (kernels/pdl.py: off, WAIT, EARLY, LATE) and, in the default mode, with the step's
embedding by torch ops instead of the Triton kernel of kernels/embed.py; ms per token of `generate`'s decode steps alone
((a 144-token call - a 16-token call) / 128, best of 2) for `fused` (its step captured by StepGraph), the
same with no per-step stop check (Strategy(cache="fused", compile=True, stop_check="end")) and `interleaved`; and a Chrome
trace plus kernel table of one 32-token `fused` call at Llama-1B batch 1.

    python3 scripts/fused_gap.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

import torch
import triton.testing

import overlapdecode as od
from kernel_sweep import captured_step, per_token_ms  # scripts/ is on the path when run as a script

DEV = "cuda"
CASES = (("llama-1b-random", 1), ("llama-1b-random", 8), ("gpt2-random", 1))


def graph_step_ms(model, B: int, pdl: int | None = None, embed_torch: bool = False) -> float:
    g, _keep = captured_step(model, B, pdl=pdl, embed_torch=embed_torch)
    return round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    results = {}
    for name, B in CASES:
        model = od.load_model(name, dtype="bfloat16", device=DEV)
        ids = torch.randint(0, 1000, (B, 32), device=DEV)
        res = results[f"{name} b{B}"] = {}
        for pdl in (0, 1, 2, 3):  # kernels/pdl.py: off, wait, early, late
            res[f"graph step ms, pdl {pdl}"] = graph_step_ms(model, B, pdl)
        res["graph step ms, embedding by torch ops"] = graph_step_ms(model, B, embed_torch=True)
        res["fused ms/token"] = per_token_ms(model, ids, "fused")
        res["fused, no stop check, ms/token"] = per_token_ms(model, ids, od.Strategy(cache="fused", compile=True,
                                                                                     stop_check="end"))
        res["interleaved ms/token"] = per_token_ms(model, ids, "interleaved")
        print(name, B, res, flush=True)
        if (name, B) == CASES[0]:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                od.generate(model, ids, max_new_tokens=32, strategy="fused", eos_token_id=[])
                torch.cuda.synchronize()  # host sync: end of the profiled call
            prof.export_chrome_trace(os.path.join(out_dir, "fused-generate-trace.json"))
            open(os.path.join(out_dir, "fused-generate-kernels.txt"), "w").write(
                prof.key_averages().table(sort_by="cuda_time_total", row_limit=60))
        json.dump(results, open(os.path.join(out_dir, "fused-gap.json"), "w"), indent=1)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1])
