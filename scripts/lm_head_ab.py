"""GPT-2's LM head (norm + GEMV, 50257 x 768) and greedy choice: their launch configurations in the step, on a GPU.

In the GPT-2 step (H200, bfloat16, batch 1, 33aecf9, benchmarks/h200-session10-timeline) the LM head's kernel takes
28.4 us of the step's 297 (77 MB, 2.7 TB/s), while Llama-1B's reaches 4.1 TB/s; scripts/kernel_sweep.py never
swept it at GPT-2. Per candidate (tile keywords of norm_linear for ("norm_linear", 50257, 768), in TILES; or
the greedy choice's logits per program): the step alone replayed from one CUDA graph (kernel_sweep.captured_step,
do_bench median), ROUNDS rounds with the candidates alternating; and the kernel alone, replayed over weight copies
that do not fit the L2 (kernel_sweep.time_rotated).

    python3 scripts/lm_head_ab.py OUT.json [BATCH]
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys

import torch
import triton.testing

import overlapdecode as od
from kernel_sweep import captured_step, rotated, time_rotated  # scripts/ is on the path when run as a script
from overlapdecode.fused.model import TILES

ROUNDS = 3
KEY = ("norm_linear", 50257, 768)
# (block_n, block_k, num_warps, num_stages); the first is norm_linear's default; the first sweep (0512676) had
# (32, 256, 4, 3), (64, 256, 4, 3), (64, 256, 8, 3), (64, 128, 4, 4), (128, 128, 8, 3), (128, 64, 4, 4), (16, 256, 4, 3),
# (32, 128, 4, 4), (32, 256, 4, 2), (64, 256, 8, 2), (128, 256, 8, 2), (64, 128, 8, 4); its best, (128, 64, 4, 4), is
# TILES' entry since; this second sweep looks around it
HEADS = [(32, 256, 4, 3), (128, 64, 4, 4), (256, 64, 4, 4), (256, 32, 4, 4), (128, 32, 4, 5), (128, 64, 4, 5),
         (128, 64, 8, 4), (128, 64, 4, 3), (256, 64, 8, 4), (128, 128, 4, 4)]
BLOCK_VS = (8192,)  # the greedy choice's logits per program (its default for one row: 2048)


def cfg(t):
    return dict(block_n=t[0], block_k=t[1], num_warps=t[2], num_stages=t[3])


def main(out: str, B: int) -> None:
    if os.path.exists(out):
        raise SystemExit(f"{out} exists: choose a new path (no run overwrites an earlier one)")
    from overlapdecode.fused.kernels.norm_linear import norm_linear

    model = od.load_model("gpt2-random", dtype="bfloat16", device="cuda")
    res = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "batch": B}
    graphs = {}
    for t in HEADS:
        try:
            graphs[f"head {t}"] = captured_step(model, B, tiles={**TILES, KEY: cfg(t)})
        except Exception as e:  # a configuration that does not compile (shared memory, registers) is recorded
            res[f"head {t} error"] = str(e)[:200]
    for bv in BLOCK_VS:
        edit = lambda ops, bv=bv: ops._replace(greedy=functools.partial(ops.greedy, block_v=bv))  # noqa: E731
        graphs[f"greedy block_v {bv}"] = captured_step(model, B, edit_ops=edit)
    times = {k: [] for k in graphs}
    for _ in range(ROUNDS):
        for k, (g, _keep) in graphs.items():
            times[k].append(triton.testing.do_bench(g.replay, rep=200, return_mode="median"))
    res["step ms, median of rounds"] = {k: round(statistics.median(v), 4) for k, v in times.items()}
    res["step ms, rounds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
    del graphs
    torch.cuda.empty_cache()
    x = torch.randn(B, 768, device="cuda", dtype=torch.bfloat16)
    nw, nb = torch.ones(768, device="cuda", dtype=torch.bfloat16), torch.zeros(768, device="cuda", dtype=torch.bfloat16)
    sets = rotated(lambda: (torch.randn(50257, 768, device="cuda", dtype=torch.bfloat16) * 0.02,), 50257 * 768 * 2)
    alone = {}
    for t in HEADS:
        if f"head {t} error" in res:
            continue
        fn = lambda w, t=t: norm_linear(x, nw, nb, 1e-5, w, None, "none", torch.float32, **cfg(t))  # noqa: E731
        us = time_rotated(fn, sets)
        alone[str(t)] = {"us": round(us, 2), "GB/s": round(50257 * 768 * 2 / us / 1e3, 1)}
    res["LM head alone (cold L2)"] = alone
    print(json.dumps(res, indent=1), flush=True)
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python3 scripts/lm_head_ab.py OUT.json [BATCH]")
    if len(sys.argv) == 3 and not sys.argv[2].isdigit():
        raise SystemExit(f"BATCH must be a positive integer, got {sys.argv[2]!r}")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 1)
