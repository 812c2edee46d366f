"""Where the fused preset's time per token goes beyond its decode step, on a GPU (llama-1b-random, bfloat16,
batch 1): ms per token of the decode steps alone ((a 144-token call - a 16-token call) / 128, best of 2) for
`fused`, for the same step with no per-step stop check (Strategy(cache="fused", compile=True,
stop_check="end")), and `interleaved`; the model step alone replayed from one manually captured CUDA graph;
a Chrome trace of one 32-token `fused` call; and inductor's code for the compiled step (TORCH_LOGS
output_code, to OUT_DIR/output_code.log).

    python3 scripts/fused_gap.py OUT_DIR
"""

from __future__ import annotations

import json
import logging
import os
import sys

import torch
import triton.testing

import overlapdecode as od
from kernel_sweep import captured_step, per_token_ms  # scripts/ is on the path when run as a script

DEV = "cuda"


def graph_step_ms(model, B: int) -> float:
    g, _keep = captured_step(model, B)
    return round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    handler = logging.FileHandler(os.path.join(out_dir, "output_code.log"))
    logging.getLogger("torch._inductor").addHandler(handler)
    torch._logging.set_logs(output_code=True)
    model = od.load_model("llama-1b-random", dtype="bfloat16", device=DEV)
    ids = torch.randint(0, 1000, (1, 32), device=DEV)
    res = {"graph step ms": graph_step_ms(model, 1)}
    print(res, flush=True)
    res["fused ms/token"] = per_token_ms(model, ids, "fused")
    torch._logging.set_logs(output_code=False)
    print(res, flush=True)
    res["fused, no stop check, ms/token"] = per_token_ms(
        model, ids, od.Strategy(cache="fused", compile=True, stop_check="end"))
    print(res, flush=True)
    res["interleaved ms/token"] = per_token_ms(model, ids, "interleaved")
    print(res, flush=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        od.generate(model, ids, max_new_tokens=32, strategy="fused", eos_token_id=[])
        torch.cuda.synchronize()
    prof.export_chrome_trace(os.path.join(out_dir, "fused-generate-trace.json"))
    open(os.path.join(out_dir, "fused-generate-kernels.txt"), "w").write(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=80))
    json.dump(res, open(os.path.join(out_dir, "fused-gap.json"), "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
