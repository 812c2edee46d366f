"""The residual add of a branch that is normalised first: residual + RMSNorm(branch), for the layers that norm
their attention and MLP outputs before adding them (OLMo2's post-norms; Gemma 2 and 3's post-attention and
post-feedforward norms).

Why a kernel of its own: the norm needs each row's sum of squares over the whole hidden size, and the output
projection that makes the branch (linear_residual) owns a block of columns per program, so it cannot normalise
its own output. One program per row reads the branch twice (its sum of squares, then the normalised add):
(B, H) values, a few KB, against the megabytes of weights around it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .linear_residual import require_contiguous
from .norm_prologue import STYLES, norm_ref
from .pdl import pdl_launch, pdl_release, pdl_start


def norm_residual_ref(x, norm_w, eps: float, residual, style: str = "rms"):
    """residual + RMSNorm(x) (norm_prologue.norm_ref's `style`: Llama's, Gemma's or OLMo2's rounding), the sum rounded
    to the dtype."""
    return residual + norm_ref(x, norm_w, None, eps, style)


@triton.jit
def _norm_residual_kernel(
    x_ptr,
    w_ptr,
    res_ptr,
    out_ptr,
    H,
    eps,
    STYLE: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    dtype = out_ptr.dtype.element_ty
    ss = tl.zeros((BLOCK,), dtype=tl.float32)
    for c0 in range(0, H, BLOCK):
        ok = c0 + cols < H
        xv = tl.load(x_ptr + row * H + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        ss += xv * xv
    rstd = (1.0 / tl.sqrt(tl.sum(ss, 0) / H + eps)).to(tl.float32)
    pdl_release(PDL)
    for c0 in range(0, H, BLOCK):
        ok = c0 + cols < H
        xv = tl.load(x_ptr + row * H + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        g = tl.load(w_ptr + c0 + cols, mask=ok, other=0.0)
        if STYLE == 1:  # Gemma: x * rstd * (1 + w) in float32, one rounding
            n = (xv * rstd * (g.to(tl.float32) + 1.0)).to(dtype)
        elif STYLE == 2:  # OLMo2: w * (x * rstd) in float32, one rounding
            n = (xv * rstd * g.to(tl.float32)).to(dtype)
        else:  # w * (x * rstd).to(dtype), the product in dtype
            n = (g * (xv * rstd).to(dtype)).to(dtype)
        res = tl.load(res_ptr + row * H + c0 + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * H + c0 + cols, (res + n.to(tl.float32)).to(dtype), mask=ok)


def norm_residual(x, norm_w, eps: float, residual, style: str = "rms", block: int = 1024, pdl: bool = False):
    """The Triton kernel of `norm_residual_ref`: x, residual (B, H) contiguous, norm_w (H,); `pdl`: programmatic
    dependent launch (pdl.py)."""
    require_contiguous(x=x, norm_w=norm_w, residual=residual)
    B, H = x.shape
    out = torch.empty_like(residual)
    _norm_residual_kernel[(B,)](
        x,
        norm_w,
        residual,
        out,
        H,
        eps,
        STYLE=STYLES.index(style),
        BLOCK=min(block, triton.next_power_of_2(H)),
        PDL=bool(pdl),
        num_warps=4,
        **pdl_launch(pdl),
    )
    return out
