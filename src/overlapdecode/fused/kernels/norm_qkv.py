"""Norm + the fused QKV projection (+ bias) of one token per row, RoPE on Q and K, and the K/V write into
the cache at the row's slot: everything of the attention block before attention itself, in one launch.

Each program owns HALF first-half dimensions i of the heads (consecutive in the order Q heads, K heads, V heads,
head by head: a tile may span heads) together with the matching i + D/2 of their second halves, so that the
rotary pairs meet in its registers and the result is final: Q goes to a (B, Hq, D) buffer, K and V straight to
the cache. The grid is small (48 tiles of 32 at Llama-1B), so K is split when that leaves the GPU short of
programs; from 17 rows on the step runs it in dense form (dense.py: cuBLAS's product, this kernel's epilogue),
and asked for (`swap=True`) the tiles are swapped (swap_ab.py: the weight rows as the MMA's M, all rows of the
batch as its N, the weights read once for up to 128 rows, HALF 64 or 128); the program that finishes a tile last (a ticket,
as in linear_residual) sums the float32 partials in a fixed order and runs the epilogue. The slot and position are device tensors (slot =
position + the row's left padding), so one CUDA graph serves every step. With `cache_group` g, row b writes cache
row b // g: speculative decoding's verify step runs the T tokens of each cache row as T rows, at their own slots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...quant.packed import dense_weight
from . import dense as dense_gemm
from .linear_residual import (
    Tickets,
    last_of_split,
    require_32bit,
    require_cache_group,
    require_contiguous,
    split_k,
    take_tickets,
)
from .norm_prologue import NormedRows, NormSums, norm_code, norm_ref, norm_stats, norm_tile, sums_args, swapped_operand
from .packed_weights import check_block_k, load_weights, refuse_dense, weight_launch, weights_dot
from .pdl import pdl_launch, pdl_release, pdl_start
from .rope import apply_rope, rope_cos_sin, rope_cos_sin_tile
from .swap_ab import (
    acc_dot,
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


def qk_norm_ref(q, k, q_norm, k_norm, eps: float, style: str = "rms"):
    """RMSNorms of q (..., Hq, D) and k (..., Hkv, D) before RoPE (norm_ref's `style`): per head where the weights
    are (D,) (Qwen3, Gemma 3), over the whole projection where they are (Hq * D,) and (Hkv * D,) (OLMo2); None
    weights: q and k unchanged."""
    if q_norm is None:
        return q, k
    if q_norm.numel() == q.shape[-1]:
        return norm_ref(q, q_norm, None, eps, style), norm_ref(k, k_norm, None, eps, style)
    return (
        norm_ref(q.flatten(-2), q_norm, None, eps, style).view(q.shape),
        norm_ref(k.flatten(-2), k_norm, None, eps, style).view(k.shape),
    )


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
    q_norm=None,
    k_norm=None,
    norm_style: str = "rms",
    rope_table=None,
    cache_group: int = 1,
):
    """x (B, H), pos/slot (B,) -> q (B, Hq, D); writes K and V (B, Hkv, D) at `slot` of each row's cache
    (`cache_group`: row b's is cache row b // cache_group; k_cache holds B / cache_group rows).
    `norm_w` None: no norm; `q_norm`, `k_norm` (D,): per-head RMSNorms of Q and K before RoPE; `norm_style`: the
    RMSNorms' rounding (norm_prologue.norm_ref); inv_freq of R/2 < D/2 frequencies: partial rotary (the first R dims).
    `rope_table` (the kernel's precomputed cos and sin, rope_table_ref's): not read; the same values are computed
    here from inv_freq and pos."""
    B = x.shape[0]
    require_cache_group(cache_group, B, k_cache)
    qkv = torch.nn.functional.linear(norm_ref(x, norm_w, norm_b, eps, norm_style), dense_weight(w), b)
    q, k, v = qkv.split([n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], dim=-1)
    q = q.view(B, n_heads, head_dim)
    k = k.view(B, n_kv, head_dim)
    v = v.view(B, n_kv, head_dim)
    q, k = qk_norm_ref(q, k, q_norm, k_norm, eps, norm_style)
    if inv_freq is not None:
        cos, sin = rope_cos_sin(inv_freq, rope_scale, pos, x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rows = torch.arange(B, device=x.device) // cache_group
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
    qn_ptr,
    kn_ptr,
    eps,
    QK_NORM: tl.constexpr,
    NORM_OFFSET: tl.constexpr,
    ROT: tl.constexpr,
    rt_ptr=None,
    TABLE: tl.constexpr = False,
    CACHE_GROUP: tl.constexpr = 1,
):
    """Bias, rounding, RoPE and the stores of one (rows, HALF pairs) tile; `head` and `dim` (HALF,) are each
    column's head (Q, then K, then V heads) and pair: dims `dim` and `dim + D/2` of the head, or with partial
    rotary (ROT < D rotated dims) pair p < ROT/2 is dims (p, p + ROT/2) and the others pair the dims past ROT.
    QK_NORM: the tile is one whole head (HALF >= D/2); its Q and K heads are RMS-normalised over their D dims
    (weights at qn_ptr / kn_ptr, (D,); NORM_OFFSET: Gemma's (1 + w)) before RoPE, as Qwen3 and Gemma 3 do.
    TABLE: cos and sin read from rope_table's (B, ROT) table at rt_ptr instead of computed here. K and V of row r
    go to cache row r // CACHE_GROUP."""
    dtype = q_ptr.dtype.element_ty
    if ROT == D:
        off1 = dim  # the first dim of each column's pair, and the distance to its second
        gap = D // 2
        turns = dim_ok  # the pairs RoPE rotates
    else:
        low = dim < ROT // 2
        off1 = tl.where(low, dim, dim + ROT // 2)
        gap = tl.where(low, ROT // 2, D // 2 - ROT // 2)
        turns = dim_ok & low
    if HAS_BIAS:
        acc1 += tl.load(b_ptr + w1, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
        acc2 += tl.load(b_ptr + w2, mask=dim_ok, other=0.0).to(tl.float32)[None, :]
    y1 = acc1.to(dtype).to(tl.float32)  # the projection rounded to dtype, as the unfused model has it
    y2 = acc2.to(dtype).to(tl.float32)
    if QK_NORM:  # per-head RMSNorm of Q and K (the tile is one head: a row's sum is the head's)
        sq = tl.where(dim_ok[None, :], y1 * y1 + y2 * y2, 0.0)
        rstd = (1.0 / tl.sqrt(tl.sum(sq, 1) / D + eps)).to(tl.float32)
        is_q = (head < n_heads)[None, :]
        g1 = tl.where(
            is_q,
            tl.load(qn_ptr + off1, mask=dim_ok, other=0.0)[None, :],
            tl.load(kn_ptr + off1, mask=dim_ok, other=0.0)[None, :],
        )
        g2 = tl.where(
            is_q,
            tl.load(qn_ptr + off1 + gap, mask=dim_ok, other=0.0)[None, :],
            tl.load(kn_ptr + off1 + gap, mask=dim_ok, other=0.0)[None, :],
        )
        if NORM_OFFSET:  # Gemma: x * rstd * (1 + w) in float32, one rounding
            n1 = (y1 * rstd[:, None] * (g1.to(tl.float32) + 1.0)).to(dtype).to(tl.float32)
            n2 = (y2 * rstd[:, None] * (g2.to(tl.float32) + 1.0)).to(dtype).to(tl.float32)
        else:  # w * (x * rstd).to(dtype), the product in dtype
            n1 = (g1 * (y1 * rstd[:, None]).to(dtype)).to(dtype).to(tl.float32)
            n2 = (g2 * (y2 * rstd[:, None]).to(dtype)).to(dtype).to(tl.float32)
        normed = (head < n_heads + n_kv)[None, :]
        y1, y2 = tl.where(normed, n1, y1), tl.where(normed, n2, y2)
    if ROPE:
        if TABLE:  # the step's table (rope_table): the same values, computed once per step
            tb = rt_ptr + rows[:, None] * ROT + dim[None, :]
            tm = row_ok[:, None] & turns[None, :]
            c = tl.load(tb, mask=tm, other=0.0)
            sn = tl.load(tb + ROT // 2, mask=tm, other=0.0)
        else:
            pos = tl.load(pos_ptr + rows * pos_stride, mask=row_ok, other=0).to(tl.float32)
            inv = tl.load(inv_freq_ptr + dim, mask=turns, other=0.0)
            c, sn = rope_cos_sin_tile(pos, inv, rope_scale, dtype)
        if ROT == D:
            rotated = (head < n_heads + n_kv)[None, :]  # Q and K heads; V is not rotated
        else:
            rotated = ((head < n_heads + n_kv) & turns)[None, :]  # and only the first ROT dims
        # x * cos + rotate_half(x) * sin with Hugging Face's roundings: each product in dtype, then their sum
        # (stored in dtype below); in float32 these conversions change nothing
        r1 = (y1 * c).to(dtype).to(tl.float32) - (y2 * sn).to(dtype).to(tl.float32)
        r2 = (y2 * c).to(dtype).to(tl.float32) + (y1 * sn).to(dtype).to(tl.float32)
        y1, y2 = tl.where(rotated, r1, y1), tl.where(rotated, r2, y2)
    out_ok = row_ok[:, None] & dim_ok[None, :]
    is_q = head < n_heads
    is_k = (head >= n_heads) & (head < n_heads + n_kv)
    is_v = head >= n_heads + n_kv
    if ROT == D:
        second = D // 2
    else:
        second = gap[None, :]
    q_off = (rows[:, None] * n_heads + head[None, :]) * D + off1[None, :]
    tl.store(q_ptr + q_off, y1.to(dtype), mask=out_ok & is_q[None, :])
    tl.store(q_ptr + q_off + second, y2.to(dtype), mask=out_ok & is_q[None, :])
    slot = tl.load(slot_ptr + rows * slot_stride, mask=row_ok, other=0).to(tl.int64)
    kv_head = tl.where(is_q, 0, (head - n_heads) % n_kv)
    cache_row = (rows // CACHE_GROUP).to(tl.int64)  # rows // 1 folds away: the one-token step's own row
    kv_off = ((cache_row[:, None] * n_kv + kv_head[None, :]) * S + slot[:, None]) * D + off1[None, :]
    tl.store(k_ptr + kv_off, y1.to(dtype), mask=out_ok & is_k[None, :])
    tl.store(k_ptr + kv_off + second, y2.to(dtype), mask=out_ok & is_k[None, :])
    tl.store(v_ptr + kv_off, y1.to(dtype), mask=out_ok & is_v[None, :])
    tl.store(v_ptr + kv_off + second, y2.to(dtype), mask=out_ok & is_v[None, :])


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
    qn_ptr,
    kn_ptr,
    QK_NORM: tl.constexpr,
    NORM_OFFSET: tl.constexpr,
    ROT: tl.constexpr,
    rt_ptr,
    TABLE: tl.constexpr,
    PRODUCT: tl.constexpr = 0,
    s_ptr=None,
    z_ptr=None,
    QUANT: tl.constexpr = 0,
    GROUP: tl.constexpr = 0,
    CACHE_GROUP: tl.constexpr = 1,
):
    pdl_start(PDL)
    if QK_NORM:  # one head per program, its D/2 pairs in the first lanes of HALF
        pid_k = tl.program_id(1)
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < B
        lane = tl.arange(0, HALF)
        head = tl.program_id(0) + 0 * lane
        dim = lane
        dim_ok = lane < D // 2
    else:
        # the tile's first-half dimensions, numbered over the Hq + 2 Hkv heads (Q, then K, then V) head by head
        i = tl.program_id(0) * HALF + tl.arange(0, HALF)
        pid_k = tl.program_id(1)
        rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < B
        head = i // (D // 2)
        dim = i % (D // 2)  # dimensions i of the first half; their partners are i + D/2
        dim_ok = i < (n_heads + 2 * n_kv) * (D // 2)
    if ROT == D:
        w1 = head * D + dim  # weight rows
        w2 = w1 + D // 2
    else:  # partial rotary: pair p < ROT/2 is rows (p, p + ROT/2) of the head, the others pair the rows past ROT
        w1 = head * D + tl.where(dim < ROT // 2, dim, dim + ROT // 2)
        w2 = head * D + tl.where(dim < ROT // 2, dim + ROT // 2, dim + D // 2)
    finish = True
    n_rows = (n_heads + 2 * n_kv) * D  # the row length of the product or of the split's partial sums
    ok = row_ok[:, None] & dim_ok[None, :]
    if PRODUCT:  # dense.py: the float32 product (B, N), in PRODUCT pieces, is at part_ptr; only the epilogue is left
        acc1 = dense_gemm.product_tile(part_ptr, rows[:, None] * n_rows + w1[None, :], ok, B * n_rows, PRODUCT)
        acc2 = dense_gemm.product_tile(part_ptr, rows[:, None] * n_rows + w2[None, :], ok, B * n_rows, PRODUCT)
        pdl_release(PDL)
    else:
        ks = tl.arange(0, BLOCK_K)
        if QUANT:  # packed_weights.py: the model dtype is the group numbers'
            dtype = s_ptr.dtype.element_ty
        else:
            dtype = w_ptr.dtype.element_ty

        # prologue: the norm's statistics over all of K (also in a split-K program: they scale its K range), from x
        # or from the partial sums of squares its writer left (NB_PAD > 0: NormSums)
        mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)

        k_lo = pid_k * K_CHUNK
        k_hi = tl.minimum(k_lo + K_CHUNK, K)
        if SWAP:  # each pair's two rows in one tile (swap_ab.pair_rows)
            w_rows = pair_rows(w1, w2, HALF)
            w_ok = pair_rows(dim_ok, dim_ok, HALF)
            accp = tl.zeros((2 * HALF, BLOCK_M), dtype=tl.float32)
        else:
            acc1 = acc_zeros(BLOCK_M, HALF, SWAP)
            acc2 = acc_zeros(BLOCK_M, HALF, SWAP)
        for k0 in range(0, K_CHUNK, BLOCK_K):
            kk = k_lo + k0 + ks
            k_ok = kk < k_hi
            m = row_ok[:, None] & k_ok[None, :]
            xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
            if SWAP:
                accp = weights_dot(
                    accp, xn, w_ptr, s_ptr, z_ptr, w_rows, w_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
                )
            elif QUANT == 2:  # int4: each half by weights_dot (as two planes of codes where it takes them)
                acc1 = weights_dot(
                    acc1, xn, w_ptr, s_ptr, z_ptr, w1, dim_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
                )
                acc2 = weights_dot(
                    acc2, xn, w_ptr, s_ptr, z_ptr, w2, dim_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
                )
            else:  # both halves' tiles loaded before either product
                wa = load_weights(w_ptr, s_ptr, z_ptr, w1, dim_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype)
                wb = load_weights(w_ptr, s_ptr, z_ptr, w2, dim_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype)
                acc1 = acc_dot(acc1, xn, wa, SWAP)
                acc2 = acc_dot(acc2, xn, wb, SWAP)

        pdl_release(PDL)
        if SWAP:
            acc1, acc2 = unpair(accp, HALF, BLOCK_M)
        acc1 = acc_rows(acc1, SWAP)  # (BLOCK_M, HALF) from here on
        acc2 = acc_rows(acc2, SWAP)
        if SPLIT > 1:  # partial sums (SPLIT, B, N) float32; the last program of the tile finishes it
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
            qn_ptr,
            kn_ptr,
            eps,
            QK_NORM,
            NORM_OFFSET,
            ROT,
            rt_ptr,
            TABLE,
            CACHE_GROUP,
        )


def swapped_qkv_tiles(rows: int, halves: int, K: int, elt_bytes: int, sms: int) -> dict:
    """swap_ab.swap_tiles's tiles for QKV's `halves` rotary pairs (two weight rows each), with 8 warps from 64 batch
    rows: the RoPE epilogue holds both halves of the tile and their cos and sin at once (docs/KERNELS.md, "Where
    the time goes")."""
    plan = swap_tiles(rows, halves, K, elt_bytes, 2, sms)
    if rows >= 64:  # measured at 64 and 128 rows; 33-63 rows keep swap_tiles's 4 (not timed)
        plan["num_warps"] = 8
    return plan


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
    programs: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tickets: Tickets | None = None,
    pdl: bool = False,
    norm_sums: NormSums | None = None,
    swap: bool | None = None,
    q_norm=None,
    k_norm=None,
    norm_style: str = "rms",
    prenorm: bool | None = None,
    rope_table: torch.Tensor | None = None,
    dense: bool | None = None,
    normed_rows: NormedRows | None = None,
    cache_group: int = 1,
):
    """The Triton kernel of `norm_qkv_ref`; k_cache/v_cache (B / cache_group, Hkv, S, D) contiguous, row b's K and V
    written to cache row b // cache_group (a constexpr: 1 is the one-token step's, row b's own); pos and slot (B,) of any
    stride (the decode loop's positions are a column of its (B, 3) state). A program owns `half`
    first-half dimensions and their partners (default: up to 32, one head's at most; swapped, swap_ab.swap_tiles's);
    with fewer tiles than `programs` (default: 1, no split; swapped, swap_tiles's one per SM), K is split as in
    linear_residual (`tickets`: the counters, as there).
    `swap`: the swapped tile (swap_ab.py; default from 17 rows on where not dense); the tile keywords left None are
    the row-block kernel's (K tiles of 256, 4 warps, 3 stages) or swap_ab.swap_tiles's. `norm_sums`: where x's RMSNorm sums of
    squares may have been recorded by its writer (NormSums). `norm_w` None (no norm), `q_norm`, `k_norm`,
    `norm_style` and a partial rotary inv_freq: as in norm_qkv_ref; with `q_norm` a program owns one whole head
    (`half` at least D/2). `prenorm`: whether a swapped or quantized launch multiplies rows normalised beforehand (None:
    swap_ab.use_prenorm). `rope_table`: rope_table's (B, rotary dims) cos and sin for these rows' positions, read
    instead of computed (None: computed in the epilogue from inv_freq, rope_scale and pos, which a table replaces:
    it must have been made from the same ones, in x's dtype). `dense`: the product by cuBLAS on the normalised
    rows and this kernel's epilogue alone (dense.py; None: dense.use_dense's rule). `normed_rows`: where x's writer
    may have recorded x normalised by this norm (NormedRows), taken instead of normalising it again. `w` may be a
    PackedWeight (quant/packed.py: dequantized in registers after each load, packed_weights.py), which never takes
    the dense form: from 17 rows it runs swapped tiles."""
    w, packed = weight_launch(w)
    require_32bit(x=x, norm_w=norm_w, norm_b=norm_b, w=w, b=b, inv_freq=inv_freq, q_norm=q_norm, k_norm=k_norm)
    require_contiguous(k_cache=k_cache, v_cache=v_cache)  # 64-bit offsets there
    B, K = x.shape
    require_cache_group(cache_group, B, k_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    sums, nb, nb_pad = sums_args(norm_sums if norm_w is not None else None, x, norm_b is not None)
    halves = (n_heads + 2 * n_kv) * (head_dim // 2)  # first-half dimensions over all heads
    rot = head_dim if inv_freq is None else 2 * inv_freq.numel()
    if head_dim % 2 or rot % 2 or rot > head_dim:
        raise ValueError(f"head_dim ({head_dim}) and the rotary dims ({rot}) must be even, rotary <= head_dim")
    if rope_table is not None:
        if inv_freq is None:
            raise ValueError("rope_table: given without inv_freq (no RoPE to apply)")
        if (
            rope_table.shape != (B, rot)
            or rope_table.dtype != torch.float32
            or not rope_table.is_contiguous()
            or rope_table.device != x.device
        ):
            raise ValueError(
                f"rope_table must be a contiguous ({B}, {rot}) float32 tensor on {x.device} (rope_table's), got "
                f"{tuple(rope_table.shape)} {rope_table.dtype} on {rope_table.device}"
            )
    qk_norm = q_norm is not None
    if qk_norm != (k_norm is not None):
        raise ValueError("q_norm and k_norm must be given together")
    if qk_norm and (q_norm.numel() != head_dim or norm_style == "rms_f32"):
        raise ValueError(
            "q_norm: the kernel normalises per head ((D,) weights) in the rms or rms_offset style; whole-projection "
            "norms are qk_norm_rope's"
        )
    swapped = use_swap(B, swap)
    product = dense_gemm.use_dense(B, w.shape[0], K, dense, swap, x.element_size())
    if packed["QUANT"]:
        refuse_dense(dense)
        product = False
    if product:  # cuBLAS multiplies normalised rows; the kernel runs the epilogue over (16-row) tiles of the product
        swapped, prenorm = False, True
        half = block_k = programs = num_warps = num_stages = None  # tile keywords are the GEMV's, not the epilogue's
    x, norm_w, norm_b, (sums, nb, nb_pad) = swapped_operand(
        x,
        norm_w,
        norm_b,
        eps,
        norm_style,
        (sums, nb, nb_pad),
        pdl,
        swapped or product,
        prenorm,
        normed_rows,
        packed["QUANT"] > 0,
    )
    if swapped:
        plan = swapped_qkv_tiles(B, halves, K, x.element_size(), sm_count(x.device))
    else:
        block_m, block_n = row_tile(B, w.element_size()), min(32, triton.next_power_of_2(max(head_dim // 2, 1)))
        plan = dict(
            block_m=block_m,
            block_n=block_n,
            block_k=fit_k(block_m, block_n, 256),
            num_warps=4,
            num_stages=3,
        )
    block_m = plan["block_m"]
    if qk_norm:  # a program per head: its pairs in the first lanes
        whole = max(16, triton.next_power_of_2(head_dim // 2))
        if half is not None and half < head_dim // 2:
            raise ValueError(f"half: with q_norm a program owns a whole head, at least {head_dim // 2}, got {half}")
        half = half or whole
        tiles = n_heads + 2 * n_kv
        # the plan's weight tile elements per K tile, not more: its shared memory (float32 at HALF 128 and K tiles
        # of 256 would need 575 KB of an H200's 227 per program; sm_90 PTX's `shared`, tests/fused/test_kernel_compile.py)
        block_k = block_k or max(16, min(plan["block_k"], plan["block_n"] * plan["block_k"] // half))
    else:
        half = half or plan["block_n"]
        tiles = triton.cdiv(halves, half)
    block_k = block_k or plan["block_k"]
    check_block_k(packed, block_k, x)
    q = torch.empty((B, n_heads, head_dim), dtype=x.dtype, device=x.device)
    if programs is None:  # row-block: no split; swapped: swap_tiles's target
        programs = plan["programs"] if swapped and x.is_cuda else 1
    split = 1 if product else split_k(tiles, K, block_k, programs)
    if swapped:
        split = min(split, split_limit(B, K, x.element_size()))
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    dummy = w
    row_blocks = triton.cdiv(B, block_m)
    if product:
        part, pieces = dense_gemm.dense_product(x, w)
        counters = dummy
    elif split > 1:
        part = torch.empty((split, B, w.shape[0]), dtype=torch.float32, device=x.device)
        counters = take_tickets(tickets, tiles * row_blocks, x.device)
    else:  # never written with one split: pass read-only inputs
        part, counters = dummy, dummy
    b_arg = b if b is not None else dummy
    inv_arg = inv_freq if inv_freq is not None else dummy
    S = k_cache.shape[2]
    _norm_qkv_kernel[(tiles, split, row_blocks)](
        x,
        norm_w if norm_w is not None else dummy,
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
        LAYER=norm_code(norm_w, norm_b, norm_style),
        HAS_BIAS=b is not None,
        ROPE=inv_freq is not None,
        D=head_dim,
        HALF=half,
        BLOCK_M=block_m,
        BLOCK_K=block_k,
        NB_PAD=nb_pad,
        PDL=bool(pdl),
        SWAP=swapped,
        qn_ptr=q_norm,  # None without (a constexpr None: no parameter)
        kn_ptr=k_norm,
        QK_NORM=qk_norm,
        NORM_OFFSET=norm_style == "rms_offset",
        ROT=rot,
        rt_ptr=rope_table,  # None without (a constexpr None: no parameter)
        TABLE=rope_table is not None,
        PRODUCT=pieces if product else 0,
        CACHE_GROUP=cache_group,
        num_warps=num_warps or plan["num_warps"],
        num_stages=num_stages or plan["num_stages"],
        **packed,
        **pdl_launch(pdl),
    )
    return q
