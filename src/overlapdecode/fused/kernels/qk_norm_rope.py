"""Whole-projection Q/K norms (OLMo2): a second launch after norm_qkv (run without RoPE there), which normalises
each row's Q and its K at the slot over the whole projection, then rotates them. Grid (B, 2): one program per row
for its Q heads, one for its K; each reads its heads twice (the sum of squares, then the values, written in
place). Its torch twin `qk_norm_rope_ref`. With `cache_group` g, row b's K is in cache row b // g (speculative
decoding's verify step: T tokens per cache row, at their own slots; two rows at one slot of a cache row, which only a
token no row keeps shares, leave that slot's K undefined: each normalises it in place).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .linear_residual import require_cache_group, require_contiguous
from .norm_qkv import qk_norm_ref
from .pdl import pdl_launch, pdl_release, pdl_start
from .rope import apply_rope, rope_cos_sin


def qk_norm_rope_ref(
    q, k_cache, slot, q_norm, k_norm, eps: float, inv_freq, rope_scale, pos, style: str = "rms", cache_group: int = 1
):
    """After a norm_qkv without RoPE: q (B, Hq, D) and each row's K at `slot` of k_cache (B / cache_group, Hkv, S, D;
    row b's is cache row b // cache_group) normalised over the whole projection (weights (Hq * D,) and (Hkv * D,),
    norm_prologue.norm_ref's `style`: OLMo2's "rms_f32"), then rotated; q is returned, K rewritten in place."""
    B, Hq, D = q.shape
    require_cache_group(cache_group, B, k_cache)
    rows = torch.arange(B, device=q.device) // cache_group
    k = k_cache[rows, :, slot]  # (B, Hkv, D)
    q, k = qk_norm_ref(q, k, q_norm, k_norm, eps, style)
    if inv_freq is not None:
        cos, sin = rope_cos_sin(inv_freq, rope_scale, pos, q.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    k_cache[rows, :, slot] = k
    return q


@triton.jit
def _norm_rope_heads(
    base,
    head_stride,
    heads,
    w_ptr,
    inv_ptr,
    p,
    eps,
    rope_scale,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    ROPE: tl.constexpr,
    dtype: tl.constexpr,
):
    """RMSNorm over `heads` heads of D values (head h at base + h * head_stride) with weights w_ptr (heads * D,),
    OLMo2's rounding (weight times the float32 normalised x, once), then RoPE at position p, in place."""
    n = heads * (D // 2)
    idx = tl.arange(0, BLOCK)
    ss = tl.zeros((BLOCK,), dtype=tl.float32)
    for i0 in range(0, n, BLOCK):
        i = i0 + idx
        ok = i < n
        off = (i // (D // 2)) * head_stride + i % (D // 2)
        a = tl.load(base + off, mask=ok, other=0.0).to(tl.float32)
        c = tl.load(base + off + D // 2, mask=ok, other=0.0).to(tl.float32)
        ss += a * a + c * c
    rstd = (1.0 / tl.sqrt(tl.sum(ss, 0) / (heads * D) + eps)).to(tl.float32)
    for i0 in range(0, n, BLOCK):
        i = i0 + idx
        ok = i < n
        h = i // (D // 2)
        d = i % (D // 2)
        off = h * head_stride + d
        a = tl.load(base + off, mask=ok, other=0.0).to(tl.float32)
        c = tl.load(base + off + D // 2, mask=ok, other=0.0).to(tl.float32)
        wa = tl.load(w_ptr + h * D + d, mask=ok, other=0.0).to(tl.float32)
        wc = tl.load(w_ptr + h * D + d + D // 2, mask=ok, other=0.0).to(tl.float32)
        y1 = (a * rstd * wa).to(dtype).to(tl.float32)
        y2 = (c * rstd * wc).to(dtype).to(tl.float32)
        if ROPE:  # as _qkv_finish: each product in dtype, then their sum
            ang = p * tl.load(inv_ptr + d, mask=ok, other=0.0)
            cs = (tl.cos(ang) * rope_scale).to(dtype).to(tl.float32)
            sn = (tl.sin(ang) * rope_scale).to(dtype).to(tl.float32)
            r1 = (y1 * cs).to(dtype).to(tl.float32) - (y2 * sn).to(dtype).to(tl.float32)
            r2 = (y2 * cs).to(dtype).to(tl.float32) + (y1 * sn).to(dtype).to(tl.float32)
            y1, y2 = r1, r2
        tl.store(base + off, y1.to(dtype), mask=ok)
        tl.store(base + off + D // 2, y2.to(dtype), mask=ok)


@triton.jit
def _qk_norm_rope_kernel(
    q_ptr,
    k_ptr,
    qn_ptr,
    kn_ptr,
    inv_freq_ptr,
    pos_ptr,
    slot_ptr,
    pos_stride,
    slot_stride,
    S,
    n_heads,
    n_kv,
    eps,
    rope_scale,
    D: tl.constexpr,
    BLOCK: tl.constexpr,
    ROPE: tl.constexpr,
    PDL: tl.constexpr,
    CACHE_GROUP: tl.constexpr,
):
    pdl_start(PDL)
    b = tl.program_id(0).to(tl.int64)
    dtype = q_ptr.dtype.element_ty
    p = tl.load(pos_ptr + b * pos_stride).to(tl.float32)
    slot = tl.load(slot_ptr + b * slot_stride).to(tl.int64)
    pdl_release(PDL)
    if tl.program_id(1) == 0:  # the row's Q heads, (Hq, D) back to back
        _norm_rope_heads(
            q_ptr + b * n_heads * D, D, n_heads, qn_ptr, inv_freq_ptr, p, eps, rope_scale, D, BLOCK, ROPE, dtype
        )
    else:  # its K heads at the slot: (cache row, h, slot) rows of the cache, S * D apart
        base = k_ptr + ((b // CACHE_GROUP) * n_kv * S + slot) * D
        _norm_rope_heads(base, S * D, n_kv, kn_ptr, inv_freq_ptr, p, eps, rope_scale, D, BLOCK, ROPE, dtype)


def qk_norm_rope(
    q,
    k_cache,
    slot,
    q_norm,
    k_norm,
    eps: float,
    inv_freq,
    rope_scale,
    pos,
    style: str = "rms_f32",
    block: int = 1024,
    pdl: bool = False,
    cache_group: int = 1,
):
    """The Triton kernel of `qk_norm_rope_ref` (OLMo2's "rms_f32" style only, whole-head rotary): grid (B, 2), one
    program per row for its Q heads and one for its K at the slot, each reading its heads twice (the sum of
    squares, then the normalised and rotated values, written in place); q is returned. `cache_group`: row b's K is
    in cache row b // cache_group (a constexpr)."""
    if style != "rms_f32":
        raise ValueError(f"style: the whole-projection Q/K norm kernel has OLMo2's rms_f32 rounding, got {style!r}")
    B, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    require_cache_group(cache_group, B, k_cache)
    if q_norm.numel() != Hq * D or k_norm.numel() != Hkv * D:
        raise ValueError(f"q_norm and k_norm must be ({Hq * D},) and ({Hkv * D},) (whole projections)")
    if inv_freq is not None and 2 * inv_freq.numel() != D:
        raise ValueError("inv_freq: the whole-projection Q/K norm kernel rotates whole heads")
    require_contiguous(q=q, k_cache=k_cache, q_norm=q_norm, k_norm=k_norm)
    _qk_norm_rope_kernel[(B, 2)](
        q,
        k_cache,
        q_norm,
        k_norm,
        inv_freq if inv_freq is not None else q_norm,
        pos,
        slot,
        pos.stride(0),
        slot.stride(0),
        S,
        Hq,
        Hkv,
        eps,
        rope_scale,
        D=D,
        BLOCK=min(block, triton.next_power_of_2(Hq * D // 2)),
        ROPE=inv_freq is not None,
        PDL=bool(pdl),
        CACHE_GROUP=cache_group,
        num_warps=4,
        **pdl_launch(pdl),
    )
    return q
