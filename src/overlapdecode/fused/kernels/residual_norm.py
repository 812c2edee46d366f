"""The dense epilogue of a residual projection that also normalises its output rows for the next projection.

What it computes: for rows of the float32 product P = x @ w.T (B, N) (dense.py), with `then_norm` the norm that
reads the output next (the MLP's norm after the O projection, the next layer's or the final norm after down):

    h = linear_residual_ref's epilogue of P  (bias, rounding, Granite's residual scale, + residual)
    xn = norm(h)                              as norm_prologue.normalized_rows computes it, rounded as HF's norms

and writes both; `xn` is recorded in a NormedRows for the launch that multiplies it (norm_prologue.swapped_operand),
which then skips its own `normalized_rows` launch.

Why: from DENSE_ROWS rows a layer ran eleven launches, five of them a few microseconds of row-wise work each (two
normalising launches, three epilogues; docs/KERNELS.md, "Where the time goes"). A program of this kernel holds whole rows (N up to MAX_N in registers), so the residual add
and the norm of the same rows are one launch: two launches fewer per layer.

Grid: one program per row (B programs, num_warps from N). The row's statistics come from the values as stored
(in the model dtype), summed in float32 over the whole row at once: another order than normalized_rows's K tiles
or NormSums's column blocks, a float32 ulp apart. The sum of squares is also stored as a one-block NormSums
(RMSNorm), for a reader that normalises in its own prologue instead.

Host syncs: none; the launch is captured into the step's CUDA graph like the others. Under PDL it waits for
torch.mm's product whole (cuBLAS triggers nothing early).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import dense as dense_gemm
from .linear_residual import linear_residual, require_32bit, residual_finish
from .norm_prologue import NormedRows, NormSums, norm_code, norm_values
from .packed_weights import is_packed
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import ROW_TILE

ENABLED = True  # False: every dense O and down epilogue leaves the next norm to its own launch (fits)
MAX_N = 8192  # widest row a program holds (float32 in registers, 16 warps: 16 values per thread per tensor)
NORMS = (0, 1, 2, 4)  # norm_code's LAYER values this kernel computes (not 3: no norm)


@triton.jit
def _residual_norm_kernel(
    part_ptr,
    b_ptr,
    res_ptr,
    out_ptr,
    nw_ptr,
    nb_ptr,
    xn_ptr,
    ss_ptr,
    B,
    N,
    eps,
    N_PAD: tl.constexpr,
    PIECES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    RES_SCALE: tl.constexpr,
    LAYER: tl.constexpr,
    SUMS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    rows = tl.program_id(0) + tl.arange(0, 1)
    cols = tl.arange(0, N_PAD)
    col_ok = cols < N
    out_ok = (rows >= 0)[:, None] & col_ok[None, :]
    acc = dense_gemm.product_tile(part_ptr, rows[:, None] * N + cols[None, :], out_ok, B * N, PIECES)
    pdl_release(PDL)
    dtype = out_ptr.dtype.element_ty
    y = residual_finish(acc, rows, cols, col_ok, out_ok, b_ptr, res_ptr, N, dtype, HAS_BIAS, True, RES_SCALE)
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=out_ok)
    yf = tl.where(out_ok, y.to(tl.float32), 0.0)
    if LAYER == 1:  # LayerNorm: the mean, then the squares about it
        mean = tl.sum(yf, 1) / N
        d = tl.where(out_ok, yf - mean[:, None], 0.0)
        ss = tl.sum(d * d, 1)
    else:
        mean = tl.zeros((1,), dtype=tl.float32)
        ss = tl.sum(yf * yf, 1)
    rstd = (1.0 / tl.sqrt(ss / N + eps)).to(tl.float32)
    xn = norm_values(yf, nw_ptr, nb_ptr, cols, col_ok, out_ok, mean, rstd, LAYER, dtype)
    tl.store(xn_ptr + rows[:, None] * N + cols[None, :], xn, mask=out_ok)
    if SUMS:  # one block of NormSums: the row's whole sum of squares
        tl.store(ss_ptr + rows, ss)


def warps_for(n_pad: int) -> int:
    """The launch's warps for rows of n_pad (a power of two) columns: 4 per 512 columns, 4 to 16 (16 float32
    values per thread per whole-row tensor at 8192; no spill for sm_90, tests/fused/test_kernel_compile.py)."""
    return max(4, min(16, n_pad // 512))


def fits(N: int, then_norm, residual) -> bool:
    """Whether residual_norm's kernel serves this launch: ENABLED, a residual, a norm it computes, rows no wider
    than MAX_N."""
    if not ENABLED or then_norm is None or residual is None or N > MAX_N:
        return False
    norm_w, norm_b, _, style = then_norm
    return norm_w is not None and norm_code(norm_w, norm_b, style) in NORMS


def residual_norm(
    x, w, b, residual, then_norm: tuple, normed_rows: NormedRows, res_scale=None, norm_sums=None, pdl=False
):
    """linear_residual's dense form, h = residual + x @ w.T (+ bias, Granite's scale), with h normalised by
    `then_norm` = (norm_w, norm_b, eps, norm_style) in the same launch and recorded in `normed_rows` (see the
    module docstring); `norm_sums` (RMSNorm): h's sum of squares recorded there as one block. Returns h."""
    norm_w, norm_b, eps, style = then_norm
    require_32bit(x=x, w=w, b=b, residual=residual, norm_w=norm_w, norm_b=norm_b)
    B, N = residual.shape
    layer = norm_code(norm_w, norm_b, style)
    part, pieces = dense_gemm.dense_product(x, w)
    out = torch.empty_like(residual)
    xn = torch.empty_like(residual)
    sums = norm_sums.buffer(1, B, x.device, out) if norm_sums is not None and layer != 1 else None
    n_pad = triton.next_power_of_2(N)
    _residual_norm_kernel[(B,)](
        part,
        b if b is not None else part,
        residual,
        out,
        norm_w,
        norm_b if norm_b is not None else norm_w,
        xn,
        sums if sums is not None else part,
        B,
        N,
        eps,
        N_PAD=n_pad,
        PIECES=pieces,
        HAS_BIAS=b is not None,
        RES_SCALE=None if res_scale is None else float(res_scale),
        LAYER=layer,
        SUMS=sums is not None,
        PDL=bool(pdl),
        num_warps=warps_for(n_pad),
        **pdl_launch(pdl),
    )
    if sums is not None:
        norm_sums.record(out, sums)
    normed_rows.record(out, NormedRows.key(*then_norm), xn)
    return out


def linear_residual_norm(
    x,
    w,
    b,
    residual,
    *args,
    then_norm: tuple | None = None,
    normed_rows: NormedRows | None = None,
    dense: bool | None = None,
    res_scale: float | None = None,
    norm_sums: NormSums | None = None,
    pdl: bool = False,
    **kwargs,
):
    """The step's linear_residual: residual_norm where the launch is dense (dense.use_dense), `then_norm` names
    the norm that reads its output and the kernel computes it (fits), else linear_residual with every keyword."""
    B, K = x.shape
    N = w.shape[0]
    if (
        normed_rows is not None
        and not is_packed(w)  # quantized: no dense form (packed_weights.py)
        and B > ROW_TILE
        and dense_gemm.use_dense(B, N, K, dense, kwargs.get("swap"), w.element_size())
        and fits(N, then_norm, residual)
        and kwargs.get("out") is None
    ):
        return residual_norm(x, w, b, residual, then_norm, normed_rows, res_scale, norm_sums, pdl)
    return linear_residual(
        x, w, b, residual, *args, dense=dense, res_scale=res_scale, norm_sums=norm_sums, pdl=pdl, **kwargs
    )
