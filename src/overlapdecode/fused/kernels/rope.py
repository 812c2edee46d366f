"""The rotary embedding of the decode step: its torch math (`rope_cos_sin`, rounded as Hugging Face rounds it, and
`apply_rope`, which the twins and the prefill use), the cos and sin of a tile of positions inside a kernel
(`rope_cos_sin_tile`, in norm_qkv.py's epilogue), and the step's table (`rope_table`): one launch that
computes each row's cos and sin once per rotary table, read by every QKV launch of the step instead of each
computing its own. Grid (cdiv(B, BLOCK_M),); its torch twin `rope_table_ref`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import pdl_launch, pdl_release, pdl_start


def rope_cos_sin(inv_freq, rope_scale: float, pos, dtype):
    """cos, sin (..., D) as Hugging Face computes them: float32 angles, scaled, rounded to `dtype`."""
    freqs = pos.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rope_scale).to(dtype), (emb.sin() * rope_scale).to(dtype)


def apply_rope(x, cos, sin):
    """x (..., heads, D); cos/sin (..., R) broadcast over the heads: the first R dims of each head rotated (R < D:
    partial rotary, the other dims passed through, as Hugging Face's apply_rotary_pos_emb does)."""
    R = cos.shape[-1]
    if R < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :R], cos, sin), x[..., R:]), dim=-1)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-2) + rot * sin.unsqueeze(-2)


@triton.jit
def rope_cos_sin_tile(pos, inv, rope_scale, dtype: tl.constexpr):
    """cos and sin of pos (M,) float32 x inv (R,) as Hugging Face rounds them (rope_cos_sin): (M, R) float32 each."""
    ang = pos[:, None] * inv[None, :]
    c = (tl.cos(ang) * rope_scale).to(dtype).to(tl.float32)
    sn = (tl.sin(ang) * rope_scale).to(dtype).to(tl.float32)
    return c, sn


@triton.jit
def _rope_table_kernel(
    inv_ptr,
    pos_ptr,
    out_ptr,
    B,
    pos_stride,
    rope_scale,
    R2: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_R: tl.constexpr,
    DT: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    rows = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    dim = tl.arange(0, BLOCK_R)
    row_ok = rows < B
    dim_ok = dim < R2
    pos = tl.load(pos_ptr + rows * pos_stride, mask=row_ok, other=0).to(tl.float32)
    inv = tl.load(inv_ptr + dim, mask=dim_ok, other=0.0)
    pdl_release(PDL)
    c, sn = rope_cos_sin_tile(pos, inv, rope_scale, DT)
    ok = row_ok[:, None] & dim_ok[None, :]
    base = out_ptr + rows[:, None] * (2 * R2) + dim[None, :]
    tl.store(base, c, mask=ok)
    tl.store(base + R2, sn, mask=ok)


def rope_table_ref(inv_freq, rope_scale: float, pos, dtype) -> torch.Tensor:
    """The rotary cos and sin of each row's position, rounded to `dtype` as Hugging Face has them (rope_cos_sin)
    and stored as float32: (B, R) for R/2 frequencies, cos in [:, :R/2], sin in [:, R/2:]."""
    cos, sin = rope_cos_sin(inv_freq, rope_scale, pos, dtype)  # (B, R): each frequency twice
    half = inv_freq.numel()
    return torch.cat((cos[:, :half], sin[:, :half]), dim=1).float()


_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


def rope_table(inv_freq, rope_scale: float, pos, dtype, pdl: bool = False) -> torch.Tensor:
    """The Triton kernel of `rope_table_ref`, one launch per step and rotary table: computed once, read by every
    layer's norm_qkv (`rope_table=`) instead of each program evaluating sin and cos for its tile. Why: at 128 rows a
    swapped QKV program holds 128 rows x 32 pairs, and the precise sin and cos of each (libdevice, as torch's) were a
    large share of the launch's time (docs/KERNELS.md, "norm_qkv")."""
    if dtype not in _TL_DTYPES:
        raise ValueError(f"dtype must be one of {tuple(_TL_DTYPES)}, got {dtype}")
    if inv_freq.dim() != 1 or not inv_freq.is_floating_point() or not inv_freq.is_contiguous():
        raise ValueError(
            f"inv_freq must be a contiguous 1-d float tensor, got {tuple(inv_freq.shape)} {inv_freq.dtype}"
        )
    if pos.dim() != 1:
        raise ValueError(f"pos must be 1-d (one position per row), got shape {tuple(pos.shape)}")
    B, R2 = pos.shape[0], inv_freq.numel()
    out = torch.empty((B, 2 * R2), dtype=torch.float32, device=pos.device)
    block_b = min(16, triton.next_power_of_2(B))
    _rope_table_kernel[(triton.cdiv(B, block_b),)](
        inv_freq,
        pos,
        out,
        B,
        pos.stride(0),
        float(rope_scale),
        R2=R2,
        BLOCK_B=block_b,
        BLOCK_R=triton.next_power_of_2(R2),
        DT=_TL_DTYPES[dtype],
        PDL=bool(pdl),
        num_warps=4,
        **pdl_launch(pdl),
    )
    return out
