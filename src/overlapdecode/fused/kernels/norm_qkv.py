"""Norm + the fused QKV projection (+ bias) of one token per row, RoPE on Q and K, and the K/V write into
the cache at the row's slot: everything of the attention block before attention itself, in one launch.

Each program owns HALF first-half dimensions i of the heads (consecutive in the order Q heads, K heads, V heads,
head by head: a tile may span heads) together with the matching i + D/2 of their second halves, so that the
rotary pairs meet in its registers and the result is final: Q goes to a (B, Hq, D) buffer, K and V straight to
the cache. The grid is small (48 tiles of 32 at Llama-1B), so K is split when that leaves the GPU short of
programs; from 17 rows on the tiles are swapped (swap_ab.py: the weight rows as the MMA's M, all rows of the
batch as its N, the weights read once for up to 128 rows, HALF 64 or 128); the program that finishes a tile last (a ticket,
as in linear_residual) sums the float32 partials in a fixed order and runs the epilogue. The slot and position are device tensors (slot =
position + the row's left padding), so one CUDA graph serves every step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .linear_residual import Tickets, last_of_split, require_32bit, require_contiguous, split_k, take_tickets
from .norm_linear import NormSums, norm_ref, norm_stats, norm_tile, sums_args
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import ROW_TILE, acc_dot, acc_rows, acc_zeros, sm_count, split_limit, swap_tiles, use_swap


def rope_cos_sin(inv_freq, rope_scale: float, pos, dtype):
    """cos, sin (..., D) as Hugging Face computes them: float32 angles, scaled, rounded to `dtype`."""
    freqs = pos.float()[..., None] * inv_freq.float()
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rope_scale).to(dtype), (emb.sin() * rope_scale).to(dtype)


def apply_rope(x, cos, sin):
    """x (..., heads, D); cos/sin (..., D) broadcast over the heads."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(-2) + rot * sin.unsqueeze(-2)


def norm_qkv_ref(
    x,
    norm_w,
    norm_b,
    eps,
    w,
    b,
    inv_freq,
    rope_scale,
    pos,
    slot,
    k_cache,
    v_cache,
    n_heads: int,
    n_kv: int,
    head_dim: int,
):
    """x (B, H), pos/slot (B,) -> q (B, Hq, D); writes K and V (B, Hkv, D) at `slot` of each row's cache."""
    B = x.shape[0]
    qkv = torch.nn.functional.linear(norm_ref(x, norm_w, norm_b, eps), w, b)
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    q = q.view(B, n_heads, head_dim)
    k = k.view(B, n_kv, head_dim)
    v = v.view(B, n_kv, head_dim)
    if inv_freq is not None:
        cos, sin = rope_cos_sin(inv_freq, rope_scale, pos, x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rows = torch.arange(B, device=x.device)
    k_cache[rows, :, slot] = k
    v_cache[rows, :, slot] = v
    return q


@triton.jit
def _qkv_finish(
    acc1,
    acc2,
    head,
    rows,
    dim,
    row_ok,
    dim_ok,
    w1,
    w2,
    b_ptr,
    inv_freq_ptr,
    pos_ptr,
    slot_ptr,
    pos_stride,
    slot_stride,
    q_ptr,
    k_ptr,
    v_ptr,
    S,
    n_heads,
    n_kv,
    rope_scale,
    HAS_BIAS: tl.constexpr,
    ROPE: tl.constexpr,
    D: tl.constexpr,
):
    """Bias, rounding, RoPE and the stores of one (rows, HALF first-half dims) tile; `head` and `dim` (HALF,)
    are each column's head (Q, then K, then V heads) and dimension."""
    dtype = q_ptr.dtype.element_ty
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + w1, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + w2, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
    y1 = acc1.to(dtype).to(tl.float32)  # the projection rounded to dtype, as the unfused model has it
    y2 = acc2.to(dtype).to(tl.float32)
    if ROPE:
        pos = tl.load(pos_ptr + rows * pos_stride, mask=row_ok, other=0).to(tl.float32)
        inv = tl.load(inv_freq_ptr + dim, mask=dim_ok, other=0.0)
        ang = pos[:, None] * inv[None, :]
        c = (tl.cos(ang) * rope_scale).to(dtype).to(tl.float32)
        sn = (tl.sin(ang) * rope_scale).to(dtype).to(tl.float32)
        rotated = (head < n_heads + n_kv)[None, :]  # Q and K heads; V is not rotated
        # x * cos + rotate_half(x) * sin with Hugging Face's roundings: each product in dtype, then their sum
        # (stored in dtype below); in float32 these conversions change nothing
        r1 = (y1 * c).to(dtype).to(tl.float32) - (y2 * sn).to(dtype).to(tl.float32)
        r2 = (y2 * c).to(dtype).to(tl.float32) + (y1 * sn).to(dtype).to(tl.float32)
        y1, y2 = tl.where(rotated, r1, y1), tl.where(rotated, r2, y2)
    out_ok = row_ok[:, None] & dim_ok[None, :]
    is_q = head < n_heads
    is_k = (head >= n_heads) & (head < n_heads + n_kv)
    is_v = head >= n_heads + n_kv
    q_off = (rows[:, None] * n_heads + head[None, :]) * D + dim[None, :]
    tl.store(q_ptr + q_off, y1.to(dtype), mask=out_ok & is_q[None, :])
    tl.store(q_ptr + q_off + D // 2, y2.to(dtype), mask=out_ok & is_q[None, :])
    slot = tl.load(slot_ptr + rows * slot_stride, mask=row_ok, other=0).to(tl.int64)
    kv_head = tl.where(is_q, 0, (head - n_heads) % n_kv)
    kv_off = ((rows.to(tl.int64)[:, None] * n_kv + kv_head[None, :]) * S + slot[:, None]) * D + dim[None, :]
    tl.store(k_ptr + kv_off, y1.to(dtype), mask=out_ok & is_k[None, :])
    tl.store(k_ptr + kv_off + D // 2, y2.to(dtype), mask=out_ok & is_k[None, :])
    tl.store(v_ptr + kv_off, y1.to(dtype), mask=out_ok & is_v[None, :])
    tl.store(v_ptr + kv_off + D // 2, y2.to(dtype), mask=out_ok & is_v[None, :])


@triton.jit
def _norm_qkv_kernel(
    x_ptr,
    nw_ptr,
    nb_ptr,
    w_ptr,
    b_ptr,
    inv_freq_ptr,
    pos_ptr,
    slot_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    part_ptr,
    ticket_ptr,
    ss_ptr,
    B,
    S,
    n_heads,
    n_kv,
    pos_stride,
    slot_stride,
    NB,
    eps,
    rope_scale,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    LAYER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROPE: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
    PDL: tl.constexpr,
    SWAP: tl.constexpr,
):
    pdl_start(PDL)
    # the tile's first-half dimensions, numbered over the Hq + 2 Hkv heads (Q, then K, then V) head by head
    i = tl.program_id(0) * HALF + tl.arange(0, HALF)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < B
    head = i // (D // 2)
    dim = i % (D // 2)  # dimensions i of the first half; their partners are i + D/2
    dim_ok = i < (n_heads + 2 * n_kv) * (D // 2)
    w1 = head * D + dim  # weight rows
    w2 = w1 + D // 2
    ks = tl.arange(0, BLOCK_K)
    dtype = w_ptr.dtype.element_ty

    # prologue: the norm's statistics over all of K (also in a split-K program: they scale its K range), from x
    # or from the partial sums of squares its writer left (NB_PAD > 0: NormSums)
    mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)

    k_lo = pid_k * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc1 = acc_zeros(BLOCK_M, HALF, SWAP)
    acc2 = acc_zeros(BLOCK_M, HALF, SWAP)
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        m = row_ok[:, None] & k_ok[None, :]
        xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        wm = dim_ok[:, None] & k_ok[None, :]
        wa = tl.load(w_ptr + w1[:, None] * K + kk[None, :], mask=wm, other=0.0)
        wb = tl.load(w_ptr + w2[:, None] * K + kk[None, :], mask=wm, other=0.0)
        acc1 = acc_dot(acc1, xn, wa, SWAP)
        acc2 = acc_dot(acc2, xn, wb, SWAP)

    pdl_release(PDL)
    acc1 = acc_rows(acc1, SWAP)  # (BLOCK_M, HALF) from here on
    acc2 = acc_rows(acc2, SWAP)
    finish = True
    if SPLIT > 1:  # partial sums (SPLIT, B, N) float32; the last program of the tile finishes it
        n_rows = (n_heads + 2 * n_kv) * D
        ok = row_ok[:, None] & dim_ok[None, :]
        base = part_ptr + (pid_k * B + rows[:, None]) * n_rows
        tl.store(base + w1[None, :], acc1, mask=ok)
        tl.store(base + w2[None, :], acc2, mask=ok)
        tile = tl.program_id(2) * tl.num_programs(0) + tl.program_id(0)
        finish = last_of_split(ticket_ptr, tile, SPLIT)
        if finish:
            acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            for s in range(SPLIT):  # fixed order: deterministic, whichever program came last
                base = part_ptr + (s * B + rows[:, None]) * n_rows
                acc1 += tl.load(base + w1[None, :], mask=ok, other=0.0, cache_modifier=".cg")
                acc2 += tl.load(base + w2[None, :], mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(ticket_ptr + tile, 0)  # back to zero for the next launch
    if finish:
        _qkv_finish(
            acc1,
            acc2,
            head,
            rows,
            dim,
            row_ok,
            dim_ok,
            w1,
            w2,
            b_ptr,
            inv_freq_ptr,
            pos_ptr,
            slot_ptr,
            pos_stride,
            slot_stride,
            q_ptr,
            k_ptr,
            v_ptr,
            S,
            n_heads,
            n_kv,
            rope_scale,
            HAS_BIAS,
            ROPE,
            D,
        )


def norm_qkv(
    x,
    norm_w,
    norm_b,
    eps,
    w,
    b,
    inv_freq,
    rope_scale,
    pos,
    slot,
    k_cache,
    v_cache,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    half: int | None = None,
    block_k: int | None = None,
    programs: int = 1,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tickets: Tickets | None = None,
    pdl: int = 0,
    norm_sums: NormSums | None = None,
    swap: bool | None = None,
):
    """The Triton kernel of `norm_qkv_ref`; k_cache/v_cache (B, Hkv, S, D) contiguous; pos and slot (B,) of any
    stride (the decode loop's positions are a column of its (B, 3) state). A program owns `half`
    first-half dimensions and their partners (default: up to 32, one head's at most; swapped, swap_ab.swap_tiles's);
    with fewer tiles than `programs`, K is split as in linear_residual (`tickets`: the counters, as there).
    `swap`: the swapped tile (swap_ab.py; default from 17 rows on); the tile keywords left None are the row-block
    kernel's (K tiles of 256, 4 warps, 3 stages) or swap_ab.swap_tiles's. `norm_sums`: where x's RMSNorm sums of
    squares may have been recorded by its writer (NormSums)."""
    require_32bit(x=x, norm_w=norm_w, norm_b=norm_b, w=w, b=b, inv_freq=inv_freq)
    require_contiguous(k_cache=k_cache, v_cache=v_cache)  # 64-bit offsets there
    B, K = x.shape
    sums, nb, nb_pad = sums_args(norm_sums, x, norm_b is not None)
    halves = (n_heads + 2 * n_kv) * (head_dim // 2)  # first-half dimensions over all heads
    swapped = use_swap(B, swap)
    if swapped:
        plan = swap_tiles(B, halves, K, w.element_size(), 2, sm_count(x.device))
    else:
        plan = dict(
            block_m=ROW_TILE,
            block_n=min(32, triton.next_power_of_2(max(head_dim // 2, 1))),
            block_k=256,
            num_warps=4,
            num_stages=3,
        )
    block_m = plan["block_m"]
    half = half or plan["block_n"]
    block_k = block_k or plan["block_k"]
    q = torch.empty((B, n_heads, head_dim), dtype=x.dtype, device=x.device)
    tiles = triton.cdiv(halves, half)
    split = split_k(tiles, K, block_k, programs)
    if swapped:
        split = min(split, split_limit(B, K, w.element_size()))
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    dummy = norm_w
    row_blocks = triton.cdiv(B, block_m)
    if split > 1:
        part = torch.empty((split, B, w.shape[0]), dtype=torch.float32, device=x.device)
        counters = take_tickets(tickets, tiles * row_blocks, x.device)
    else:  # never written with one split: pass read-only inputs
        part, counters = dummy, dummy
    b_arg = b if b is not None else dummy
    inv_arg = inv_freq if inv_freq is not None else dummy
    S = k_cache.shape[2]
    _norm_qkv_kernel[(tiles, split, row_blocks)](
        x,
        norm_w,
        norm_b if norm_b is not None else dummy,
        w,
        b_arg,
        inv_arg,
        pos,
        slot,
        q,
        k_cache,
        v_cache,
        part,
        counters,
        sums,
        B,
        S,
        n_heads,
        n_kv,
        pos.stride(0),
        slot.stride(0),
        nb,
        eps,
        rope_scale,
        K,
        k_chunk,
        split,
        LAYER=norm_b is not None,
        HAS_BIAS=b is not None,
        ROPE=inv_freq is not None,
        D=head_dim,
        HALF=half,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        NB_PAD=nb_pad,
        PDL=int(pdl),
        SWAP=swapped,
        num_warps=num_warps or plan["num_warps"],
        num_stages=num_stages or plan["num_stages"],
        **pdl_launch(pdl),
    )
    return q
