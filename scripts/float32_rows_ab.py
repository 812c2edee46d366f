"""The fused step with float32 weights at 1-48 rows (GPT-2 shape, random weights): its own rules against the
16-row tile of 16-bit weights (swap_ab.row_tile), against cuBLAS's product from 2 rows (dense.use_dense), and
against `interleaved`, decode ms/step as the difference of 16- and 144-token calls (medians of 3 after a warm-up),
in one process; bfloat16 at 1 and 8 rows as the control (its tiles do not change).

    python3 scripts/float32_rows_ab.py OUT.json

made the figures of docs/KERNELS.md, "Float32 weights" (results/h200/gpt2-float32-rows). Each variant swaps one
rule in the kernel modules for the call and puts it back.
"""

import json
import os
import statistics
import sys
import time

import torch

import overlapdecode as od
from overlapdecode.fused.kernels import dense, linear_residual, norm_linear, norm_qkv, swap_ab

ROW_TILE_USERS = (linear_residual, norm_linear, norm_qkv)


def step_ms(model, ids, mask, strategy: str, short: int = 16, long: int = 144, reps: int = 3) -> float:
    dec = od.Decoder(model)  # a fresh decoder: no graph captured under another variant's rule

    def call(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[], do_sample=False)
        torch.cuda.synchronize()  # host sync: the call's end, for the wall clock
        return time.perf_counter() - t

    call(short), call(long)
    a = statistics.median(call(short) for _ in range(reps))
    b = statistics.median(call(long) for _ in range(reps))
    return round((b - a) / (long - short) * 1e3, 4)


def with_rule(module, name, rule, fn):
    """fn() with module.name replaced by rule, put back after."""
    kept = getattr(module, name)
    setattr(module, name, rule)
    try:
        return fn()
    finally:
        setattr(module, name, kept)


def sixteen_row_tile(fn):
    """fn() with every row-block launch on ROW_TILE rows (the 16-bit weights' tile)."""
    kept = [m.row_tile for m in ROW_TILE_USERS]
    for m in ROW_TILE_USERS:
        m.row_tile = lambda rows, elt_bytes: swap_ab.ROW_TILE
    try:
        return fn()
    finally:
        for m, r in zip(ROW_TILE_USERS, kept):
            m.row_tile = r


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: float32_rows_ab.py OUT.json")
    if os.path.exists(argv[0]):
        raise SystemExit(f"float32_rows_ab.py: {argv[0]} exists: choose a new OUT.json")
    if not torch.cuda.is_available():
        raise SystemExit("float32_rows_ab.py: needs a CUDA GPU")
    sixteen_rows_dense = lambda rows, n, K, dense=None, swap=None, elt_bytes=2: dense_rule(rows, n, K, dense, swap)  # noqa: E731
    dense_rule = dense.use_dense
    out = {}
    for dtype, batches in (("float32", (1, 2, 4, 8, 16, 32, 48)), ("bfloat16", (1, 8))):
        model = od.load_model("gpt2-random", dtype=dtype, device="cuda")
        for B in batches:
            ids = torch.randint(0, model.config.vocab_size, (B, 32), device="cuda")
            mask = torch.ones_like(ids)
            row = {"fused": step_ms(model, ids, mask, "fused")}
            row["fused, 16-row tile"] = sixteen_row_tile(lambda: step_ms(model, ids, mask, "fused"))
            if dtype == "float32" and 1 < B <= 16:  # the rows where the float32 rule chooses cuBLAS
                row["fused, dense from 17 rows"] = with_rule(
                    dense, "use_dense", sixteen_rows_dense, lambda: step_ms(model, ids, mask, "fused")
                )
            if B in (1, 8, 16, 48):
                row["interleaved"] = step_ms(model, ids, mask, "interleaved")
            out[f"{dtype}:{B}"] = row
            print(dtype, B, json.dumps(row), flush=True)
        model = None  # its weights freed before the next dtype
        torch.cuda.empty_cache()
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
