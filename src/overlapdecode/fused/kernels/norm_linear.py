"""Norm in the prologue, a GEMV over all B rows, an activation in the epilogue: the MLP up-projection
(gate/up with SiLU(gate)*up, or GPT-2's fc with tanh GELU) and the final norm + LM head (float32 logits).

Why fused: at decode the activations are a few KB and the weights are megabytes; each kernel must read its
weight bytes exactly once, for every row of the batch, and nothing else of note. Normalising in the prologue
saves a launch and a round trip of the normalised activations; the activation in the epilogue saves one of
the (B, 2I) gate/up output. Each program owns BLOCK_N output columns and all of K (K is the hidden size,
short enough that the grid of N / BLOCK_N programs fills the GPU); rows of the batch are padded to 16 so
that the product is one `tl.dot` per K tile. From 17 rows on the tile is swapped (swap_ab.py: the weight rows
as the MMA's M, all rows of the batch as its N, the weights read once for up to 128 rows); its wider weight
tiles make fewer programs, so there K is split as in linear_residual where the grid would leave the GPU short
(float32 partials, the last program of a tile reduces them in a fixed order and runs the epilogue).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...quant.packed import dense_weight
from .linear_residual import Tickets, last_of_split, require_32bit, split_k, take_tickets
from .norm_prologue import (
    NormedRows,
    NormSums,
    norm_code,
    norm_ref,
    norm_stats,
    norm_tile,
    sums_args,
    swapped_operand,
)
from .packed_weights import check_block_k, weight_launch, weights_dot
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import (
    acc_rows,
    acc_zeros,
    fit_k,
    pair_rows,
    row_tile,
    sm_count,
    split_limit,
    swap_tiles,
    unpair,
    use_swap,
)

ACTS = ("none", "gelu_tanh", "silu_mul", "gelu_tanh_mul")
_ACT_CODE = {a: i for i, a in enumerate(ACTS)}


def gelu_tanh(y):
    """tanh GELU as the kernels compute it (float32 in, float32 out)."""
    return F.gelu(y, approximate="tanh")


def norm_linear_ref(
    x,
    norm_w,
    norm_b,
    eps: float,
    w,
    b,
    act: str,
    out_dtype=None,
    norm_style: str = "rms",
    logit_div: float | None = None,
    softcap: float | None = None,
):
    """(B, K) -> (B, N): act(norm(x) @ w.T + b); "silu_mul" / "gelu_tanh_mul" split w's rows into gate then up
    (act(gate) * up). `logit_div` (Granite's logits_scaling) divides the projection, `softcap` (Gemma 2's final
    logit soft-capping) makes it tanh(y / cap) * cap, each in the model dtype as Hugging Face's ops round."""
    y = F.linear(norm_ref(x, norm_w, norm_b, eps, norm_style), dense_weight(w), b)
    if act == "silu_mul":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    elif act == "gelu_tanh_mul":
        gate, up = y.chunk(2, dim=-1)
        y = gelu_tanh(gate) * up
    elif act == "gelu_tanh":
        y = gelu_tanh(y)
    if logit_div is not None:
        y = y / logit_div
    if softcap is not None:
        y = torch.tanh(y / softcap) * softcap
    return y if out_dtype is None else y.to(out_dtype)


@triton.jit
def tanh_f32(x):
    """tanh in float32 (1 - 2 / (e^2x + 1): exact at the limits, ~1e-7 absolute near 0)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def gelu_tanh_f32(y):
    """torch's tanh GELU of float32 y, in float32."""
    z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    return 0.5 * y * (1.0 + tanh_f32(z))


@triton.jit
def _norm_linear_kernel(
    x_ptr,
    nw_ptr,
    nb_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    ss_ptr,
    part_ptr,
    ticket_ptr,
    B,
    N,
    NB,
    eps,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    LAYER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    ROUND_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
    PDL: tl.constexpr,
    SWAP: tl.constexpr,
    LOGIT_DIV: tl.constexpr,
    SOFTCAP: tl.constexpr,
    s_ptr=None,
    z_ptr=None,
    QUANT: tl.constexpr = 0,
    GROUP: tl.constexpr = 0,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # batch rows
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns
    row_ok = rows < B
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    if QUANT:  # packed_weights.py: the model dtype is the group numbers'
        dtype = s_ptr.dtype.element_ty
    else:
        dtype = w_ptr.dtype.element_ty

    # prologue: per-row statistics over all of K (x is tiny and stays in L1/L2)
    mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)

    k_lo = pid_k * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    PAIRED: tl.constexpr = SWAP and ACT >= 2  # gate and up rows in one swapped tile (swap_ab.pair_rows)
    if PAIRED:
        w_rows = pair_rows(cols, cols + N, BLOCK_N)
        w_ok = pair_rows(col_ok, col_ok, BLOCK_N)
        accp = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = acc_zeros(BLOCK_M, BLOCK_N, SWAP)
        acc2 = acc_zeros(BLOCK_M, BLOCK_N, SWAP)  # the up rows of gate/up
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        m = row_ok[:, None] & k_ok[None, :]
        xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        kt = k_lo + k0
        if PAIRED:
            accp = weights_dot(
                accp, xn, w_ptr, s_ptr, z_ptr, w_rows, w_ok, kt, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
            )
        else:
            acc = weights_dot(
                acc, xn, w_ptr, s_ptr, z_ptr, cols, col_ok, kt, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
            )
            if ACT >= 2:  # gate/up: the up rows too
                acc2 = weights_dot(
                    acc2, xn, w_ptr, s_ptr, z_ptr, cols + N, col_ok, kt, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
                )

    pdl_release(PDL)
    if PAIRED:
        acc, acc2 = unpair(accp, BLOCK_N, BLOCK_M)
    acc = acc_rows(acc, SWAP)  # (BLOCK_M, BLOCK_N) from here on
    acc2 = acc_rows(acc2, SWAP)
    if SPLIT > 1:  # partial sums (SPLIT, B, N or 2N) float32; the last program of the tile finishes it
        n_part = 2 * N if ACT >= 2 else N
        ok = row_ok[:, None] & col_ok[None, :]
        base = part_ptr + (pid_k * B + rows[:, None]) * n_part + cols[None, :]
        tl.store(base, acc, mask=ok)
        if ACT >= 2:
            tl.store(base + N, acc2, mask=ok)
        tile = tl.program_id(1) * tl.num_programs(0) + pid_n
        if last_of_split(ticket_ptr, tile, SPLIT):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT):  # fixed order: deterministic, whichever program came last
                base = part_ptr + (s * B + rows[:, None]) * n_part + cols[None, :]
                acc += tl.load(base, mask=ok, other=0.0, cache_modifier=".cg")
                if ACT >= 2:
                    acc2 += tl.load(base + N, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(ticket_ptr + tile, 0)  # back to zero for the next launch
            _norm_linear_finish(
                acc,
                acc2,
                rows,
                cols,
                row_ok,
                col_ok,
                b_ptr,
                out_ptr,
                N,
                HAS_BIAS,
                ACT,
                ROUND_OUT,
                dtype,
                LOGIT_DIV,
                SOFTCAP,
            )
    else:
        _norm_linear_finish(
            acc,
            acc2,
            rows,
            cols,
            row_ok,
            col_ok,
            b_ptr,
            out_ptr,
            N,
            HAS_BIAS,
            ACT,
            ROUND_OUT,
            dtype,
            LOGIT_DIV,
            SOFTCAP,
        )


@triton.jit
def _norm_linear_finish(
    acc,
    acc2,
    rows,
    cols,
    row_ok,
    col_ok,
    b_ptr,
    out_ptr,
    N,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    ROUND_OUT: tl.constexpr,
    dtype: tl.constexpr,
    LOGIT_DIV: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Bias, activation, rounding and the store of one (BLOCK_M, BLOCK_N) output tile. Without an activation,
    LOGIT_DIV (a float) divides the projection and SOFTCAP (a float) soft-caps it, tanh(y / cap) * cap, each op
    rounded to dtype as Hugging Face's ops round (None: neither)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ACT >= 2:
            acc2 += tl.load(b_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:  # tanh GELU, on the projection rounded to dtype as the unfused model has it
        y = acc.to(dtype).to(tl.float32)
        z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
        acc = 0.5 * y * (1.0 + t)
    elif ACT == 2:  # SiLU(gate) * up, each rounded to dtype as the unfused model has them
        gt = acc.to(dtype).to(tl.float32)
        up = acc2.to(dtype).to(tl.float32)
        acc = (gt * tl.sigmoid(gt)).to(dtype).to(tl.float32) * up
    elif ACT == 3:  # GeGLU: tanh GELU(gate) * up, each rounded to dtype as the unfused model has them
        gt = acc.to(dtype).to(tl.float32)
        up = acc2.to(dtype).to(tl.float32)
        acc = gelu_tanh_f32(gt).to(dtype).to(tl.float32) * up
    else:  # the projection in dtype, as the unfused model has it, even where the output is float32 (the logits)
        acc = acc.to(dtype).to(tl.float32)
        if LOGIT_DIV is not None:  # Granite's logits_scaling
            acc = (acc / LOGIT_DIV).to(dtype).to(tl.float32)
        if SOFTCAP is not None:  # Gemma 2's final soft-capping: each op in dtype
            acc = (acc / SOFTCAP).to(dtype).to(tl.float32)
            acc = tanh_f32(acc).to(dtype).to(tl.float32)
            acc = (acc * SOFTCAP).to(dtype).to(tl.float32)
    if ROUND_OUT:
        out = acc.to(out_ptr.dtype.element_ty)
    else:
        out = acc
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


def norm_linear(
    x,
    norm_w,
    norm_b,
    eps: float,
    w,
    b,
    act: str,
    out_dtype=None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pdl: bool = False,
    norm_sums: NormSums | None = None,
    swap: bool | None = None,
    programs: int | None = None,
    tickets: Tickets | None = None,
    norm_style: str = "rms",
    logit_div: float | None = None,
    softcap: float | None = None,
    prenorm: bool | None = None,
    normed_rows: NormedRows | None = None,
):
    """The Triton kernel of `norm_linear_ref` (`norm_w` None: no norm; `norm_style`, `logit_div`, `softcap`: as
    there, constexprs of the launch): x (B, K) contiguous, w (N or 2N, K) row-major. The default
    tile (32 x 256, 4 warps, 3 stages) is the one near the best at both Llama shapes of scripts/kernel_sweep.py
    (docs/KERNELS.md, "Tiles").
    `swap`: the swapped tile (swap_ab.py; default from 17 rows on), whose tile keywords left None are
    swap_ab.swap_tiles's, and whose K is split until the grid reaches `programs` (default swap_tiles's, one program
    per SM; the row-block tile never splits) with the counters of `tickets` (linear_residual.Tickets; default fresh zeros).
    `norm_sums`: where x's RMSNorm sums of squares may have been recorded by its writer (NormSums). `prenorm`: whether
    a swapped or quantized launch multiplies rows normalised beforehand (None: swap_ab.use_prenorm); `normed_rows`: where its
    writer may have recorded them (NormedRows). `w` may be a PackedWeight (quant/packed.py: int4, int8 or fp8,
    dequantized in registers after each load, packed_weights.py)."""
    w, packed = weight_launch(w)
    require_32bit(x=x, norm_w=norm_w, norm_b=norm_b, w=w, b=b)
    sums, nb, nb_pad = sums_args(norm_sums if norm_w is not None else None, x, norm_b is not None)
    B, K = x.shape
    gated = act in ("silu_mul", "gelu_tanh_mul")
    n_out = w.shape[0] // 2 if gated else w.shape[0]
    out = torch.empty((B, n_out), dtype=out_dtype or x.dtype, device=x.device)
    swapped = use_swap(B, swap)
    x, norm_w, norm_b, (sums, nb, nb_pad) = swapped_operand(
        x, norm_w, norm_b, eps, norm_style, (sums, nb, nb_pad), pdl, swapped, prenorm, normed_rows, packed["QUANT"] > 0
    )
    accs = 2 if gated else 1
    if swapped:
        tiles = swap_tiles(B, n_out, K, x.element_size(), accs, sm_count(x.device))
    else:
        block_m = row_tile(B, w.element_size())
        tiles = dict(block_m=block_m, block_n=32, block_k=fit_k(block_m, 32, 256), num_warps=4, num_stages=3)
    block_m = tiles["block_m"]
    block_n = block_n or tiles["block_n"]
    block_k = block_k or tiles["block_k"]
    check_block_k(packed, block_k, x)
    n_blocks, row_blocks = triton.cdiv(n_out, block_n), triton.cdiv(B, block_m)
    split = 1
    if swapped:
        if programs is None:
            programs = tiles["programs"] if x.is_cuda else 1
        split = min(split_k(n_blocks, K, block_k, programs), split_limit(B, K, x.element_size()))
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    if split > 1:
        part = torch.empty((split, B, accs * n_out), dtype=torch.float32, device=x.device)
        counters = take_tickets(tickets, n_blocks * row_blocks, x.device)
    else:  # never written with one split: pass read-only inputs
        part, counters = w, w
    dummy = norm_w if norm_w is not None else w
    _norm_linear_kernel[(n_blocks, row_blocks, split)](
        x,
        dummy,
        norm_b if norm_b is not None else dummy,
        w,
        b if b is not None else dummy,
        out,
        sums,
        part,
        counters,
        B,
        n_out,
        nb,
        eps,
        K,
        k_chunk,
        split,
        LAYER=norm_code(norm_w, norm_b, norm_style),
        HAS_BIAS=b is not None,
        ACT=_ACT_CODE[act],
        ROUND_OUT=out.dtype != torch.float32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NB_PAD=nb_pad,
        PDL=bool(pdl),
        SWAP=swapped,
        LOGIT_DIV=None if logit_div is None else float(logit_div),
        SOFTCAP=None if softcap is None else float(softcap),
        num_warps=num_warps or tiles["num_warps"],
        num_stages=num_stages or tiles["num_stages"],
        **packed,
        **pdl_launch(pdl),
    )
    return out
