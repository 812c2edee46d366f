"""The swapped GEMV tiles at serving row counts, on a GPU: each projection of the Llama-1B shape (QKV, gate/up, down,
O, LM head) at 64 and 128 rows, bfloat16, as the fused kernels run it (norm_qkv / norm_linear / linear_residual
swapped, their default tiles and a spread of others: `ours`, as the step runs them, with the rows normalised by a
launch beforehand where swap_ab.use_prenorm says; `ours-registers`, the norm kernels normalising in every K step)
beside cuBLAS (`x @ w.T`) and two plain Triton GEMMs of the same orientation with no prologue or epilogue (x read
transposed from memory, or read row-major and transposed in registers as the fused kernels do), so that what the
fused kernels lose to the GEMM itself, to their orientation and to their prologue and epilogue shows apart; and
`norm_rows`, the normalising launch alone (norm_prologue.normalized_rows: the part of `ours` that is not the GEMM);
`ours-norope`, QKV without its RoPE epilogue (the part of its gap that is the rotation); `ours-table`, QKV reading
the step's rotary table (kernels/rope.py rope_table) as the step does from 17 rows, not computing sin and cos.
Timed as CUDA-graph replays over weight copies 4x the L2 (kernel_sweep.rotated), median; writes
DIR/swap-sweep.json after every kernel.

    python3 scripts/swap_sweep.py --out DIR [--rows 64,128] [--kernels qkv,gate_up,...] [--budget S]

`python3 scripts/swap_sweep.py --out DIR` made the figures of docs/KERNELS.md, "Swapped tiles from 17 rows on" and
"Where the time goes" (results/h200/llama-1b-swap-tiles; its README names each file's commit and kernels).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl
from kernel_sweep import rotated, timed_row

DEV = "cuda"
H, I, QD, V = 2048, 8192, 2048, 128256  # Llama-3.2-1B: hidden, MLP width, query width, vocabulary
KVD, HEAD = 512, 64  # its key (and value) width and head size
# (N, K) of each weight; norm_rows: the (B, H) rows normalised alone, no weight (N is H, what it writes per row)
KERNELS = {
    "qkv": (QD + 2 * KVD, H),
    "gate_up": (2 * I, H),
    "down": (H, I),
    "o_proj": (H, QD),
    "lm_head": (V, H),
    "norm_rows": (H, H),
}
# (block_n, block_k, num_warps, num_stages, programs / SMs): a spread around the rule's tiles (block_n per
# accumulator: gate/up's and QKV's programs hold twice as many weight rows); programs 0: K not split (one program
# per output tile), as the plain GEMMs; 0.5: split to half the SMs
VARIANTS = [
    (32, 64, 4, 4, 1),
    (32, 64, 8, 4, 1),
    (64, 64, 4, 4, 1),
    (64, 64, 8, 4, 1),
    (16, 64, 4, 4, 1),
    (32, 128, 4, 3, 1),
    (128, 64, 8, 4, 1),
    (64, 64, 8, 3, 2),
    (32, 64, 4, 4, 0),
    (32, 64, 8, 4, 0),
    (64, 64, 4, 4, 0),
    (64, 64, 8, 4, 0),
    (32, 64, 8, 4, 0.5),
]
# tiles tried first for one kernel: the LM head's 128-row tiles at fewer stages or shorter K tiles, so that two
# programs fit per SM
FIRST = {"lm_head": [(128, 64, 8, 3, 1), (128, 32, 8, 4, 1)]}


@triton.jit
def _plain_swapped(
    x_ptr,
    w_ptr,
    out_ptr,
    B,
    N,
    K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    X_T: tl.constexpr,
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w = tl.load(w_ptr + cols[:, None] * K + (k0 + ks)[None, :])
        if X_T:  # x^T tile addressed directly
            xt = tl.load(x_ptr + rows[None, :] * K + (k0 + ks)[:, None], mask=(rows < B)[None, :], other=0.0)
        else:  # x tile row-major, transposed in registers
            xt = tl.trans(tl.load(x_ptr + rows[:, None] * K + (k0 + ks)[None, :], mask=(rows < B)[:, None], other=0.0))
        acc = tl.dot(w, xt, acc)
    tl.store(out_ptr + rows[None, :] * N + cols[:, None], acc.to(out_ptr.dtype.element_ty), mask=(rows < B)[None, :])


def plain(x, w, out, block_n, block_k, warps, stages, x_t):
    B, K = x.shape
    N = w.shape[0]
    bm = max(16, triton.next_power_of_2(B))
    _plain_swapped[(triton.cdiv(N, block_n),)](
        x, w, out, B, N, K, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=block_k, X_T=x_t, num_warps=warps, num_stages=stages
    )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="64,128")
    ap.add_argument("--kernels", default=",".join(KERNELS), help="default: %(default)s")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per kernel and row count")
    args = ap.parse_args(argv)
    chosen = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(chosen) - set(KERNELS))
    if unknown or not chosen:
        raise SystemExit(f"swap_sweep.py: --kernels takes some of {','.join(KERNELS)}, got {args.kernels!r}")
    try:
        rows = [int(v) for v in args.rows.split(",") if v]
    except ValueError:
        rows = []
    if not rows or min(rows) < 1:
        raise SystemExit(f"swap_sweep.py: --rows takes positive row counts, e.g. 64,128, got {args.rows!r}")
    if not torch.cuda.is_available():
        raise SystemExit("swap_sweep.py: needs a CUDA GPU")
    from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual
    from overlapdecode.fused.kernels.norm_linear import norm_linear
    from overlapdecode.fused.kernels.norm_prologue import normalized_rows, sums_args
    from overlapdecode.fused.kernels.norm_qkv import norm_qkv
    from overlapdecode.fused.kernels.rope import rope_table

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "swap-sweep.json")
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: choose a new --out")
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    dt = torch.bfloat16
    tk = Tickets(DEV)
    r = lambda *s: torch.randn(*s, device=DEV, dtype=dt) * 0.02  # noqa: E731
    rows_out = []
    for B in rows:
        for name in chosen:
            N, K = KERNELS[name]
            x, nw, res = r(B, K), r(K) + 1, r(B, N)
            sets = [(nw,)] if name == "norm_rows" else rotated(lambda N=N, K=K: (r(N, K),), N * K * 2)
            nbytes = N * K * 2
            n_out = N // 2 if name == "gate_up" else N
            out = torch.empty((B, N), device=DEV, dtype=dt)

            def ours(cfg, prenorm=None, rope=True, table=False):
                kw = (
                    {}
                    if cfg is None
                    else dict(
                        block_n=cfg[0],
                        block_k=cfg[1],
                        num_warps=cfg[2],
                        num_stages=cfg[3],
                        programs=max(1, int(cfg[4] * sms)),
                    )
                )
                if name in ("down", "o_proj"):
                    return lambda w: linear_residual(x, w, None, res, tickets=tk, swap=True, **kw)

                if name == "qkv":
                    kw = {("half" if k == "block_n" else k): v for k, v in kw.items()}
                    return lambda w: norm_qkv(
                        x,
                        nw,
                        None,
                        1e-5,
                        w,
                        None,
                        inv_freq if rope else None,
                        1.0,
                        pos,
                        slot,
                        kc,
                        vc,
                        QD // HEAD,
                        KVD // HEAD,
                        HEAD,
                        tickets=tk,
                        swap=True,  # the swapped GEMV, not the dense form (dense.use_dense)
                        prenorm=prenorm,
                        **(dict(rope_table=rt) if table else {}),
                        **kw,
                    )
                act, od_ = ("silu_mul", None) if name == "gate_up" else ("none", torch.float32)
                return lambda w: norm_linear(x, nw, None, 1e-5, w, None, act, od_, tickets=tk, prenorm=prenorm, **kw)

            if name == "qkv":
                inv_freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD, 2, device=DEV).float() / HEAD))
                pos = torch.full((B,), 40, device=DEV, dtype=torch.long)
                slot = pos.clone()
                kc = torch.zeros((B, KVD // HEAD, 64, HEAD), device=DEV, dtype=dt)
                vc = torch.zeros_like(kc)
                rt = rope_table(inv_freq, 1.0, pos, dt)  # the step's table, made once per step
            if name == "norm_rows":  # no weight: one launch over the rows, from x (no recorded sums)
                nbytes = 2 * B * K * 2  # what it reads and writes
                sums = sums_args(None, x, False)
                cands = [("ours", None, lambda w: normalized_rows(x, w, None, 1e-5, "rms", sums))]
            else:
                cands = [("cublas", None, lambda w: torch.mm(x, w.t(), out=out))]
                cands += [("ours", None, ours(None))]
            if name == "qkv":  # without its RoPE epilogue (K written unrotated): the rule's tile and the plain GEMM's
                cands += [("ours-norope", c, ours(c, rope=False)) for c in (None, (32, 64, 4, 4, 0))]
                cands += [("ours-table", None, ours(None, table=True))]
            cands += [("ours", c, ours(c)) for c in FIRST.get(name, [])]
            if name in ("qkv", "gate_up", "lm_head"):  # the norm in registers, in every K step
                cands += [("ours-registers", None, ours(None, False))]
            if name != "norm_rows":
                cands += [("ours", c, ours(c)) for c in VARIANTS]
            if N % 128 == 0 and name not in ("down", "norm_rows"):
                for xt in (True, False):
                    for c in ((64, 64, 8, 3), (128, 64, 8, 3), (64, 64, 4, 4)):
                        cands.append(
                            (f"plain-x{'T' if xt else 'row'}", c, lambda w, c=c, xt=xt: plain(x, w, out, *c, xt))
                        )
            t0 = time.time()
            for kind, cfg, fn in cands:
                if time.time() - t0 > args.budget and kind.startswith("ours") and cfg is not None:
                    continue
                row = dict(B=B, kernel=name, N=N, K=K, n_out=n_out, kind=kind, cfg=cfg)
                rows_out.append(timed_row(row, fn, sets, nbytes))
            del sets
            torch.cuda.empty_cache()
            json.dump(rows_out, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
