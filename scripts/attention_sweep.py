"""Decode attention (fused/kernels/decode_attention.py) at serving shapes, on a GPU: rows x attended length points of
the Llama-1B (D 64) and Llama-8B (D 128) heads, bfloat16, the shape rule's split against others, and pipeline
stages and warps. Timed as CUDA-graph replays over cache copies 4x the L2 (kernel_sweep.rotated), median; us and
GB/s of the live K and V bytes each call reads; DIR/attention-sweep.json after every point.

    python3 scripts/attention_sweep.py --out DIR [--points 1x4096,8x8192,...] [--budget S]

The figures of docs/KERNELS.md, "Decode attention at long contexts" (results/h200/llama-attention-sweep and its
many-rows/):

    python3 scripts/attention_sweep.py --out DIR --shapes llama-1b --budget 9
    python3 scripts/attention_sweep.py --out DIR --shapes llama-8b --points 1x4096,1x16384,8x8192 --budget 8
    python3 scripts/attention_sweep.py --out DIR --shapes llama-1b --points 64x96,128x96,64x160,128x160 --budget 20
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from kernel_sweep import rotated, timed_row

DEV = "cuda"
SHAPES = {"llama-1b": (32, 8, 64), "llama-8b": (32, 8, 128)}  # query heads, key/value heads, head size
POINTS = "1x96,64x96,128x96,1x4096,8x4096,1x16384,8x8192,1x32768"
SPLITS = (8, 16, 32, 64)
STAGES = (2, 3, 4)


def _points(text: str) -> list[tuple[int, int]]:
    try:
        pts = [tuple(int(v) for v in p.split("x")) for p in text.split(",") if p]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxLENGTH,..., got {text!r}") from None
    if not pts or any(len(p) != 2 or min(p) < 1 for p in pts):
        raise argparse.ArgumentTypeError(f"expected ROWSxLENGTH,..., got {text!r}")
    return pts


def candidates(S: int, block_n: int, rule: int) -> list[tuple[str, dict]]:
    """(label, decode_attention keywords) of one point, each launch once and its num_stages explicit (the kernel's
    default is pipeline_stages): `rule`, the shape rule's split and depth; `rule, N stages`, its split at the other
    depths; `splits N` (2 stages) and `splits N, M stages`, the other splits that fit the cache; `rule, 8 warps`; and
    for the many-row, short-cache launches (one program per row and key/value head), what lets more programs share an
    SM: `rule, 2 warps`, `rule, 1 stage`, `rule, keys of 32` and `rule, keys of 32, 2 warps` (BLOCK_N 32). Every
    candidate names its BLOCK_N (block_sizes's unless said), so none takes decode_attention.direct_tiles's; `direct`
    is the launch as the kernel chooses it where those apply."""
    from overlapdecode.fused.kernels.decode_attention import pipeline_stages

    own = pipeline_stages(S, block_n, rule)
    others = [s for s in SPLITS if s != rule and s <= -(-S // block_n)]
    cands = [("rule", dict(num_splits=rule, num_stages=own))]
    cands += [("direct", dict(num_splits=rule, num_stages=own, block_n=None))]
    cands += [(f"splits {s}", dict(num_splits=s, num_stages=2)) for s in others]
    cands += [(f"rule, {st} stages", dict(num_splits=rule, num_stages=st)) for st in STAGES if st != own]
    cands += [(f"splits {s}, {st} stages", dict(num_splits=s, num_stages=st)) for s in others for st in STAGES[1:]]
    cands += [("rule, 8 warps", dict(num_splits=rule, num_stages=own, num_warps=8))]
    cands += [("rule, 2 warps", dict(num_splits=rule, num_stages=own, num_warps=2))]
    cands += [("rule, 1 stage", dict(num_splits=rule, num_stages=1))]
    if block_n > 32:
        cands += [("rule, keys of 32", dict(num_splits=rule, num_stages=own, block_n=32))]
        cands += [("rule, keys of 32, 2 warps", dict(num_splits=rule, num_stages=own, block_n=32, num_warps=2))]
    return [(label, {"block_n": block_n, **kw}) for label, kw in cands]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", type=_points, default=_points(POINTS), help=f"default: {POINTS}")
    ap.add_argument("--shapes", default="llama-1b,llama-8b", help="default: %(default)s")
    ap.add_argument("--budget", type=float, default=15.0, help="seconds per point and shape")
    args = ap.parse_args(argv)
    shapes = [s for s in args.shapes.split(",") if s]
    if not shapes or set(shapes) - set(SHAPES):
        raise SystemExit(f"attention_sweep.py: --shapes takes some of {','.join(SHAPES)}, got {args.shapes!r}")
    if not torch.cuda.is_available():
        raise SystemExit("attention_sweep.py: needs a CUDA GPU")
    from overlapdecode.fused.kernels.decode_attention import (
        MAX_SPLITS,
        block_sizes,
        choose_num_splits,
        decode_attention,
        default_programs,
        workspace_numel,
    )
    from overlapdecode.fused.kernels.linear_residual import Tickets

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "attention-sweep.json")
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: choose a new --out")
    dt = torch.bfloat16
    tk = Tickets(DEV)
    rows_out = []
    for shape in shapes:
        Hq, Hkv, D = SHAPES[shape]
        for B, n in args.points:
            S = n + 64  # the cache sized to the call: the prompt and the new tokens
            q = torch.randn(B, Hq, D, device=DEV, dtype=dt)
            start = torch.zeros(B, dtype=torch.long, device=DEV)
            length = torch.full((B,), n, dtype=torch.long, device=DEV)
            kv_bytes = 2 * B * Hkv * n * D * 2
            cache = B * Hkv * S * D * 2
            sets = rotated(lambda: tuple(torch.randn(B, Hkv, S, D, device=DEV, dtype=dt) for _ in "kv"), 2 * cache)
            block_n = block_sizes(D, dt)[0]
            rule = choose_num_splits(B, Hkv, S, block_n, default_programs(DEV))
            ws = torch.empty(workspace_numel(B, Hq, D, MAX_SPLITS), dtype=torch.float32, device=DEV)
            out = torch.empty_like(q)
            cands = candidates(S, block_n, rule)
            t0 = time.time()
            for label, kw in cands:
                if time.time() - t0 > args.budget and label != "rule":
                    continue
                row = dict(shape=shape, B=B, length=n, variant=label, **kw)
                fn = lambda k, v, kw=kw: decode_attention(q, k, v, start, length, D**-0.5, out, ws, tickets=tk, **kw)  # noqa: E731
                rows_out.append(timed_row(row, fn, sets, kv_bytes))
            del sets
            torch.cuda.empty_cache()
            json.dump(rows_out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
