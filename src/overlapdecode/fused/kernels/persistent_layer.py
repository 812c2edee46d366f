"""A whole decoder layer of the one-token step in one persistent launch: the work of the five per-layer kernels
(norm_qkv, decode_attention, linear_residual for O, norm_linear for gate/up, linear_residual for down) as the
tasks of one schedule (persistent_schedule.py), with dependency counters in global memory instead of four of
the five kernel boundaries.

Why: at decode each of the five kernels ramps up and drains on its own, 3-5 us per boundary over its weights'
time at full bandwidth (Llama-1B on an H200: 19 us of a layer's 48, docs/KERNELS.md "Where Llama-1B's time
goes"). A grid-wide barrier between phases does not remove that: every SM waits for the slowest (the MLP
attempt in docs/KERNELS.md). Here a task waits only for the tiles it reads: attention of KV head g for the QKV
tiles of group g, an O-projection K range for the attention of the heads in it, a down-projection K range for
the gate/up tiles of its columns, so programs run ahead into the next phase while the last tiles of the one
before are still being computed. Only the gate/up tasks wait for a whole phase (the O projection: the norm needs
whole rows).

Each task computes exactly what one program of the corresponding kernel computes, with the same tiles, splits,
roundings and order of sums (the same functions where the kernels have them: norm_stats, norm_tile, _qkv_finish,
last_of_split), so the layer's output equals the five kernels' bit for bit where the compiler makes the same
instructions of the same source (float32 in Triton's interpreter: tested).

The launch: P programs, each taking tasks in index order (a CLAIM ticket, one task ahead, or statically p, p+P,
...), waiting on the task's counter (`_wait`: an acquire spin, bounded: past `spin_limit` polls it records the
task in the error flag and goes on, so nothing can hang; `PersistentLayer.check` raises on it), running it, and
adding 1 with release semantics to the counters its output completes (`_signal`). The last program to leave
puts every counter back to 0 for the next launch (no memset kernel); the split tiles' tickets are in the same
buffer. Data written by other programs of this launch is read past L1 (`.cg`).

Triton's interpreter runs programs one after another: there one program runs every task in order (its waits are
met when it reaches them); a spin on a program that has not run yet ends at the spin limit and is reported.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from .decode_attention import LOG2E, MAX_HEAD_DIM, workspace_numel
from .linear_residual import last_of_split, require_32bit, require_contiguous
from .norm_linear import _ACT_CODE, NormSums, norm_stats, norm_tile
from .norm_qkv import _qkv_finish
from .pdl import pdl_launch, pdl_release, pdl_start
from .persistent_schedule import BLOCK_M, CLAIM, FIELDS, LayerPlan, build_schedule, check_schedule

CLAIMS = ("static", "dynamic")
SPIN_LIMIT_GPU = 1 << 20  # polls of a counter before a wait gives up (about a second on an H200)
SPIN_LIMIT_INTERPRETED = 2  # one program runs every task in order: a wait is met at once or never


@triton.jit
def _wait(cnt_ptr, err_ptr, counter, need, task, SPIN_LIMIT: tl.constexpr):
    """Spin until counter >= need, then a CTA barrier (one thread's acquire, the CTA's loads after it, as CUDA's
    cooperative groups wait). Past SPIN_LIMIT polls: record task + 1 in the error flag and go on."""
    if need > 0:
        seen = tl.atomic_add(cnt_ptr + counter, 0, sem="acquire", scope="gpu")
        polls = 0
        while (seen < need) & (polls < SPIN_LIMIT):
            seen = tl.atomic_add(cnt_ptr + counter, 0, sem="acquire", scope="gpu")
            polls += 1
        if seen < need:
            tl.atomic_max(err_ptr, task + 1)
        tl.debug_barrier()


@triton.jit
def _signal(cnt_ptr, first, n):
    """Add 1 to counters first .. first + n - 1, after every thread's stores (CTA barrier, release at GPU scope)."""
    tl.debug_barrier()
    for c in range(first, first + n):
        tl.atomic_add(cnt_ptr + c, 1, sem="release", scope="gpu")


@triton.jit
def _prefetch(w_ptr, row0, N, K: tl.constexpr, k_lo, ROWS: tl.constexpr, COLS: tl.constexpr, LINE: tl.constexpr):
    """Ask L2 for COLS columns from k_lo of weight rows row0 .. row0 + ROWS - 1 of w (N, K), one request per
    LINE elements (128 bytes), addresses clamped inside w: a task's first weight tiles, requested before its wait
    (the weights do not depend on the inputs it waits for). sm_90 PTX; never in the interpreter."""
    rows = tl.minimum(row0 + tl.arange(0, ROWS), N - 1)
    cols = tl.minimum(k_lo + tl.arange(0, COLS // LINE) * LINE, K - 1)
    ptrs = w_ptr + rows[:, None] * K + cols[None, :]
    tl.inline_asm_elementwise(
        "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _norm_stats_cg(
    x_ptr,
    rows,
    row_ok,
    eps,
    K: tl.constexpr,
    LAYER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ss_ptr,
    B,
    NB,
    NB_PAD: tl.constexpr,
):
    """norm_stats (norm_linear.py) over x written in this launch: the same sums, x (or its writers' partial sums
    of squares, NB_PAD > 0) read past L1."""
    if NB_PAD > 0:
        nb = tl.arange(0, NB_PAD)
        part = tl.load(
            ss_ptr + nb[:, None] * B + rows[None, :],
            mask=(nb < NB)[:, None] & row_ok[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        rstd = (1.0 / tl.sqrt(tl.sum(part, 0) / K + eps)).to(tl.float32)
        return tl.zeros((BLOCK_M,), dtype=tl.float32), rstd
    ks = tl.arange(0, BLOCK_K)
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if LAYER:
        s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            m = row_ok[:, None] & (k0 + ks < K)[None, :]
            s += tl.sum(
                tl.load(x_ptr + rows[:, None] * K + k0 + ks[None, :], mask=m, other=0.0, cache_modifier=".cg").to(
                    tl.float32
                ),
                1,
            )
        mean = s / K
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m = row_ok[:, None] & (k0 + ks < K)[None, :]
        xv = tl.load(x_ptr + rows[:, None] * K + k0 + ks[None, :], mask=m, other=0.0, cache_modifier=".cg").to(
            tl.float32
        )
        d = tl.where(m, xv - mean[:, None], 0.0)
        ss += tl.sum(d * d, 1)
    rstd = (1.0 / tl.sqrt(ss / K + eps)).to(tl.float32)
    return mean, rstd


@triton.jit
def _norm_tile_cg(
    x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K: tl.constexpr, LAYER: tl.constexpr, dtype: tl.constexpr
):
    """norm_tile (norm_linear.py) of x written in this launch, read past L1."""
    xv = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=m, other=0.0, cache_modifier=".cg").to(tl.float32)
    g = tl.load(nw_ptr + kk, mask=k_ok, other=0.0)
    if LAYER:
        beta = tl.load(nb_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        xn = ((xv - mean[:, None]) * rstd[:, None] * g.to(tl.float32)[None, :] + beta[None, :]).to(dtype)
    else:
        xn = (g[None, :] * (xv * rstd[:, None]).to(dtype)).to(dtype)
    return tl.where(m, xn, 0.0).to(dtype)


@triton.jit
def _qkv_task(
    tile,
    s,
    r,
    signal,
    ticket,
    x_ptr,
    nw_ptr,
    nb_ptr,
    w_ptr,
    b_ptr,
    inv_ptr,
    pos_ptr,
    slot_ptr,
    q_ptr,
    k_ptr,
    v_ptr,
    part_ptr,
    cnt_ptr,
    ss_ptr,
    B,
    S,
    NB,
    pos_stride,
    slot_stride,
    eps,
    rope_scale,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    HALF: tl.constexpr,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    LAYER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
):
    """One program of _norm_qkv_kernel: tile = head x parts + part, K range s, row block r; with NB_PAD > 0 and
    NB > 0 (at run time: the first layer's input has none) the norm's sums of squares are the NB partial sums at
    ss_ptr its writer (the launch before) left."""
    PARTS: tl.constexpr = (D // 2 + HALF - 1) // HALF
    head = tile // PARTS
    part = tile % PARTS
    rows = r * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < B
    dim = part * HALF + tl.arange(0, HALF)
    dim_ok = dim < D // 2
    w1 = head * D + dim
    w2 = w1 + D // 2
    ks = tl.arange(0, BLOCK_K)
    dtype = w_ptr.dtype.element_ty
    # x and its sums are this launch's input (written before it started): read as norm_qkv reads them
    if NB_PAD > 0:
        if NB > 0:
            mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)
        else:
            mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, x_ptr, B, 0, 0)
    else:
        mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, x_ptr, B, 0, 0)
    k_lo = s * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        m = row_ok[:, None] & k_ok[None, :]
        xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        wm = dim_ok[:, None] & k_ok[None, :]
        wa = tl.load(w_ptr + w1[:, None] * K + kk[None, :], mask=wm, other=0.0)
        wb = tl.load(w_ptr + w2[:, None] * K + kk[None, :], mask=wm, other=0.0)
        acc1 += tl.dot(xn, tl.trans(wa), input_precision="ieee")
        acc2 += tl.dot(xn, tl.trans(wb), input_precision="ieee")
    finish = True
    if SPLIT > 1:
        n_rows = (HQ + 2 * HKV) * D
        ok = row_ok[:, None] & dim_ok[None, :]
        base = part_ptr + (s * B + rows[:, None]) * n_rows
        tl.store(base + w1[None, :], acc1, mask=ok)
        tl.store(base + w2[None, :], acc2, mask=ok)
        finish = last_of_split(cnt_ptr, ticket, SPLIT)
        if finish:
            acc1 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, HALF), dtype=tl.float32)
            for sp in range(SPLIT):  # fixed order, as norm_qkv
                base = part_ptr + (sp * B + rows[:, None]) * n_rows
                acc1 += tl.load(base + w1[None, :], mask=ok, other=0.0, cache_modifier=".cg")
                acc2 += tl.load(base + w2[None, :], mask=ok, other=0.0, cache_modifier=".cg")
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
            inv_ptr,
            pos_ptr,
            slot_ptr,
            pos_stride,
            slot_stride,
            q_ptr,
            k_ptr,
            v_ptr,
            S,
            HQ,
            HKV,
            rope_scale,
            HAS_BIAS,
            ROPE,
            D,
            None,  # no per-head Q/K norm, whole-head rotary
            None,
            0.0,
            False,
            False,
            D,
        )
        _signal(cnt_ptr, signal, 1)


@triton.jit
def _attention_task(
    hk,
    sp,
    b,
    signal,
    n_signal,
    ticket,
    q_ptr,
    k_ptr,
    v_ptr,
    start_ptr,
    len_ptr,
    acc_ptr,
    am_ptr,
    al_ptr,
    out_ptr,
    cnt_ptr,
    qk_scale,
    S,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    G: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One program of decode_attention's _split_kernel: row b, KV head hk, piece sp of the live slots; q and the
    cache (its slot of this step written by a QKV task) read past L1."""
    pid_bh = b * HKV + hk
    row_start = tl.load(start_ptr + b).to(tl.int32)
    row_len = tl.load(len_ptr + b).to(tl.int32)
    n_blocks = tl.cdiv(row_len - row_start, BLOCK_N)
    per_split = tl.cdiv(n_blocks, NUM_SPLITS)
    blk_lo = sp * per_split
    blk_hi = tl.minimum(blk_lo + per_split, n_blocks)
    if blk_lo < blk_hi:  # an empty piece (past the row's length): nothing to read, no ticket, no signal
        offs_g = tl.arange(0, GROUP_PAD)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        mask_g = offs_g < G
        mask_d = offs_d < D
        head0 = hk * G
        q_blk = q_ptr + (b * HQ + head0).to(tl.int64) * D
        q = tl.load(
            q_blk + offs_g[:, None] * D + offs_d[None, :],
            mask=mask_g[:, None] & mask_d[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        kv_base = pid_bh.to(tl.int64) * S * D
        k_slab = k_ptr + kv_base
        v_slab = v_ptr + kv_base
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([GROUP_PAD], tl.float32)
        acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
        for blk in range(blk_lo, blk_hi):
            slots = row_start + blk * BLOCK_N + offs_n
            live = slots < row_len
            kv_offs = slots[:, None] * D + offs_d[None, :]
            kv_mask = live[:, None] & mask_d[None, :]
            k = tl.load(k_slab + kv_offs, mask=kv_mask, other=0.0, cache_modifier=".cg")
            if IEEE:
                sc = tl.dot(q, tl.trans(k), input_precision="ieee")
            else:
                sc = tl.dot(q, tl.trans(k))
            sc = tl.where(live[None, :], sc * qk_scale, float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_i, tl.max(sc, 1))
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(sc - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_slab + kv_offs, mask=kv_mask, other=0.0, cache_modifier=".cg")
            if IEEE:
                pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
            else:
                pv = tl.dot(p.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        heads = b * HQ + head0 + offs_g
        store_mask = mask_g[:, None] & mask_d[None, :]
        o_offs = heads.to(tl.int64)[:, None] * D + offs_d[None, :]
        if NUM_SPLITS == 1:
            tl.store(out_ptr + o_offs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=store_mask)
            _signal(cnt_ptr, signal, n_signal)
        else:
            part = heads.to(tl.int64) * NUM_SPLITS + sp
            tl.store(am_ptr + part, m_i, mask=mask_g)
            tl.store(al_ptr + part, l_i, mask=mask_g)
            tl.store(acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=store_mask)
            n_live = tl.cdiv(n_blocks, per_split)
            if last_of_split(cnt_ptr, ticket, n_live):
                first = heads.to(tl.int64) * NUM_SPLITS
                m_max = tl.full([GROUP_PAD], float("-inf"), tl.float32)
                for s in range(NUM_SPLITS):
                    ok = mask_g & (s < n_live)
                    m_max = tl.maximum(
                        m_max, tl.load(am_ptr + first + s, mask=ok, other=float("-inf"), cache_modifier=".cg")
                    )
                den = tl.zeros([GROUP_PAD], tl.float32)
                o = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
                for s in range(NUM_SPLITS):  # fixed order, as decode_attention
                    ok = mask_g & (s < n_live)
                    m_s = tl.load(am_ptr + first + s, mask=ok, other=float("-inf"), cache_modifier=".cg")
                    l_s = tl.load(al_ptr + first + s, mask=ok, other=0.0, cache_modifier=".cg")
                    w = tl.where(ok, tl.math.exp2(m_s - m_max), 0.0)
                    den += w * l_s
                    a_s = tl.load(
                        acc_ptr + (first + s)[:, None] * D + offs_d[None, :],
                        mask=ok[:, None] & mask_d[None, :],
                        other=0.0,
                        cache_modifier=".cg",
                    )
                    o += w[:, None] * a_s
                tl.store(out_ptr + o_offs, (o / den[:, None]).to(out_ptr.dtype.element_ty), mask=store_mask)
                _signal(cnt_ptr, signal, n_signal)


@triton.jit
def _linear_task(
    j,
    s,
    r,
    signal,
    n_signal,
    ticket,
    x_ptr,
    w_ptr,
    b_ptr,
    res_ptr,
    out_ptr,
    part_ptr,
    cnt_ptr,
    ss_ptr,
    B,
    N: tl.constexpr,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SUMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One program of linear_residual's _linear_split_kernel: column block j, K range s, row block r; x and the
    residual read past L1 (written in this launch, the residual of the O projection excepted); SUMS: the output
    rows' sums of squares over the block to ss_ptr (NB, B), as linear_residual records them (NormSums)."""
    rows = r * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < B
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    k_lo = s * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        xv = tl.load(
            x_ptr + rows[:, None] * K + kk[None, :],
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
            cache_modifier=".cg",
        )
        wt = tl.load(w_ptr + cols[:, None] * K + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(xv, tl.trans(wt), input_precision="ieee")
    out_ok = row_ok[:, None] & col_ok[None, :]
    finish = True
    if SPLIT > 1:
        tl.store(part_ptr + (s * B + rows[:, None]) * N + cols[None, :], acc, mask=out_ok)
        finish = last_of_split(cnt_ptr, ticket, SPLIT)
        if finish:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for sp in range(SPLIT):  # fixed order, as linear_residual
                acc += tl.load(
                    part_ptr + (sp * B + rows[:, None]) * N + cols[None, :],
                    mask=out_ok,
                    other=0.0,
                    cache_modifier=".cg",
                )
    if finish:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dtype = out_ptr.dtype.element_ty
        res = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=out_ok, other=0.0, cache_modifier=".cg").to(
            tl.float32
        )
        y = (res + acc.to(dtype).to(tl.float32)).to(dtype)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=out_ok)
        if SUMS:
            yf = tl.where(out_ok, y.to(tl.float32), 0.0)
            tl.store(ss_ptr + j * B + rows, tl.sum(yf * yf, 1), mask=row_ok)
        if n_signal > 0:
            _signal(cnt_ptr, signal, n_signal)


@triton.jit
def _up_task(
    j,
    r,
    signal,
    n_signal,
    x_ptr,
    nw_ptr,
    nb_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    cnt_ptr,
    ss_ptr,
    B,
    NB,
    eps,
    N: tl.constexpr,
    K: tl.constexpr,
    LAYER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
):
    """One program of norm_linear's _norm_linear_kernel (gate/up with SiLU(gate) * up, or fc with tanh GELU):
    column block j, row block r; x (h after attention, written in this launch) read past L1."""
    rows = r * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < B
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    dtype = w_ptr.dtype.element_ty
    mean, rstd = _norm_stats_cg(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        m = row_ok[:, None] & k_ok[None, :]
        xn = _norm_tile_cg(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        wm = col_ok[:, None] & k_ok[None, :]
        wt = tl.load(w_ptr + cols[:, None] * K + kk[None, :], mask=wm, other=0.0)
        acc += tl.dot(xn, tl.trans(wt), input_precision="ieee")
        if ACT == 2:
            wu = tl.load(w_ptr + (cols + N)[:, None] * K + kk[None, :], mask=wm, other=0.0)
            acc2 += tl.dot(xn, tl.trans(wu), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ACT == 2:
            acc2 += tl.load(b_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:  # tanh GELU, as norm_linear
        y = acc.to(dtype).to(tl.float32)
        z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
        acc = 0.5 * y * (1.0 + t)
    else:  # SiLU(gate) * up, as norm_linear
        gt = acc.to(dtype).to(tl.float32)
        up = acc2.to(dtype).to(tl.float32)
        acc = (gt * tl.sigmoid(gt)).to(dtype).to(tl.float32) * up
    tl.store(
        out_ptr + rows[:, None] * N + cols[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & col_ok[None, :],
    )
    _signal(cnt_ptr, signal, n_signal)


@triton.jit
def _persistent_layer_kernel(
    x_ptr,
    out_ptr,
    h1_ptr,
    q_ptr,
    a_ptr,
    m_ptr,
    nw1_ptr,
    nb1_ptr,
    wqkv_ptr,
    bqkv_ptr,
    inv_ptr,
    wo_ptr,
    bo_ptr,
    nw2_ptr,
    nb2_ptr,
    wup_ptr,
    bup_ptr,
    wdn_ptr,
    bdn_ptr,
    pos_ptr,
    slot_ptr,
    start_ptr,
    len_ptr,
    k_ptr,
    v_ptr,
    pqkv_ptr,
    po_ptr,
    pdn_ptr,
    att_acc_ptr,
    att_m_ptr,
    att_l_ptr,
    table_ptr,
    cnt_ptr,
    err_ptr,
    ss_in_ptr,
    ss_mid_ptr,
    ss_out_ptr,
    B,
    S,
    n_tasks,
    n_counters,
    pos_stride,
    slot_stride,
    nb_in,
    eps,
    rope_scale,
    qk_scale,
    H: tl.constexpr,
    I: tl.constexpr,
    HQ: tl.constexpr,
    HKV: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    LAYER: tl.constexpr,
    QKV_BIAS: tl.constexpr,
    ROPE: tl.constexpr,
    O_BIAS: tl.constexpr,
    UP_BIAS: tl.constexpr,
    DOWN_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    HALF: tl.constexpr,
    BK_QKV: tl.constexpr,
    KC_QKV: tl.constexpr,
    SPLIT_QKV: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BN_ATT: tl.constexpr,
    BD_ATT: tl.constexpr,
    SPLIT_ATT: tl.constexpr,
    IEEE: tl.constexpr,
    BN_O: tl.constexpr,
    BK_O: tl.constexpr,
    KC_O: tl.constexpr,
    SPLIT_O: tl.constexpr,
    BN_UP: tl.constexpr,
    BK_UP: tl.constexpr,
    BN_DN: tl.constexpr,
    BK_DN: tl.constexpr,
    KC_DN: tl.constexpr,
    SPLIT_DN: tl.constexpr,
    NF: tl.constexpr,
    CLAIM_NEXT: tl.constexpr,
    SPIN_LIMIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    PREFETCH: tl.constexpr,
    LINE: tl.constexpr,
    IN_SUMS: tl.constexpr,
    MID_SUMS: tl.constexpr,
    OUT_SUMS: tl.constexpr,
    RESET: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    programs = tl.num_programs(0)
    if CLAIM_NEXT:
        task = tl.atomic_add(cnt_ptr + 0, 1, sem="relaxed", scope="gpu")
    else:
        task = tl.program_id(0)
    while task < n_tasks:
        if CLAIM_NEXT:  # the next task, claimed now so that the claim's latency hides under this one
            nxt = tl.atomic_add(cnt_ptr + 0, 1, sem="relaxed", scope="gpu")
        else:
            nxt = task + programs
        row = table_ptr + task * NF
        op = tl.load(row + 0)
        tile = tl.load(row + 1)
        split = tl.load(row + 2)
        rb = tl.load(row + 3)
        wait = tl.load(row + 4)
        need = tl.load(row + 5)
        signal = tl.load(row + 6)
        n_signal = tl.load(row + 7)
        ticket = tl.load(row + 8)
        if PREFETCH > 0:  # this task's first weight columns on their way to L2 while it waits
            if need > 0:
                if op == 2:
                    _prefetch(wo_ptr, tile * BN_O, H, HQ * D, split * KC_O, BN_O, PREFETCH, LINE)
                elif op == 3:
                    _prefetch(wup_ptr, tile * BN_UP, I, H, 0, BN_UP, PREFETCH, LINE)
                    if ACT == 2:
                        _prefetch(wup_ptr + I * H, tile * BN_UP, I, H, 0, BN_UP, PREFETCH, LINE)
                elif op == 4:
                    _prefetch(wdn_ptr, tile * BN_DN, H, I, split * KC_DN, BN_DN, PREFETCH, LINE)
        _wait(cnt_ptr, err_ptr, wait, need, task, SPIN_LIMIT)
        if op == 0:
            _qkv_task(
                tile,
                split,
                rb,
                signal,
                ticket,
                x_ptr,
                nw1_ptr,
                nb1_ptr,
                wqkv_ptr,
                bqkv_ptr,
                inv_ptr,
                pos_ptr,
                slot_ptr,
                q_ptr,
                k_ptr,
                v_ptr,
                pqkv_ptr,
                cnt_ptr,
                ss_in_ptr,
                B,
                S,
                nb_in,
                pos_stride,
                slot_stride,
                eps,
                rope_scale,
                HQ,
                HKV,
                D,
                HALF,
                H,
                KC_QKV,
                SPLIT_QKV,
                LAYER,
                QKV_BIAS,
                ROPE,
                BLOCK_M,
                BK_QKV,
                IN_SUMS,
            )
        elif op == 1:
            _attention_task(
                tile,
                split,
                rb,
                signal,
                n_signal,
                ticket,
                q_ptr,
                k_ptr,
                v_ptr,
                start_ptr,
                len_ptr,
                att_acc_ptr,
                att_m_ptr,
                att_l_ptr,
                a_ptr,
                cnt_ptr,
                qk_scale,
                S,
                HQ,
                HKV,
                G,
                GROUP_PAD,
                D,
                BN_ATT,
                BD_ATT,
                SPLIT_ATT,
                IEEE,
            )
        elif op == 2:
            _linear_task(
                tile,
                split,
                rb,
                signal,
                n_signal,
                ticket,
                a_ptr,
                wo_ptr,
                bo_ptr,
                x_ptr,
                h1_ptr,
                po_ptr,
                cnt_ptr,
                ss_mid_ptr,
                B,
                H,
                HQ * D,
                KC_O,
                SPLIT_O,
                O_BIAS,
                MID_SUMS > 0,
                BLOCK_M,
                BN_O,
                BK_O,
            )
        elif op == 3:
            _up_task(
                tile,
                rb,
                signal,
                n_signal,
                h1_ptr,
                nw2_ptr,
                nb2_ptr,
                wup_ptr,
                bup_ptr,
                m_ptr,
                cnt_ptr,
                ss_mid_ptr,
                B,
                (H + BN_O - 1) // BN_O,
                eps,
                I,
                H,
                LAYER,
                UP_BIAS,
                ACT,
                BLOCK_M,
                BN_UP,
                BK_UP,
                MID_SUMS,
            )
        else:
            _linear_task(
                tile,
                split,
                rb,
                signal,
                n_signal,
                ticket,
                m_ptr,
                wdn_ptr,
                bdn_ptr,
                h1_ptr,
                out_ptr,
                pdn_ptr,
                cnt_ptr,
                ss_out_ptr,
                B,
                H,
                I,
                KC_DN,
                SPLIT_DN,
                DOWN_BIAS,
                OUT_SUMS,
                BLOCK_M,
                BN_DN,
                BK_DN,
            )
        task = nxt
    pdl_release(PDL)
    # the last program to leave puts every counter (claim, exit, dependencies, tickets) back to 0: every other
    # program has left its loop (its exit ticket came before), so none reads a counter any more
    tl.debug_barrier()
    if (tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu") == programs - 1) & RESET:
        for c0 in range(0, n_counters, 1024):
            offs = c0 + tl.arange(0, 1024)
            tl.store(cnt_ptr + offs, 0, mask=offs < n_counters)


# As decode_attention: which kernel @triton.jit made is fixed when triton is first imported.
_INTERPRETED = not isinstance(_persistent_layer_kernel, JITFunction)


def _occupancy(compiled, num_warps: int, device) -> int:
    """Programs of `compiled` that fit on one SM at once (registers, shared memory, threads)."""
    props = torch.cuda.get_device_properties(device)
    if hasattr(compiled, "_init_handles"):
        compiled._init_handles()
    regs_per_warp = -(-int(compiled.n_regs) * 32 // 256) * 256  # allocated per warp in units of 256
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // max(regs_per_warp * num_warps, 1)
    shared = int(compiled.metadata.shared) + 1024  # 1 KB the system reserves per program (sm_80+)
    by_smem = getattr(props, "shared_memory_per_multiprocessor", 233472) // shared
    by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * num_warps)
    return max(0, min(by_regs, by_smem, by_threads, 32))


class PersistentLayer:
    """The persistent layer of one LayerPlan (shapes, batch, cache length, tiles) on one device: its schedule (a
    task table on the device), counters, error flag, partial-sum buffers and the layer's intermediates (q, the
    attention output, h after attention, the MLP activations), all made once, so that a CUDA graph replays its
    launch unchanged. Its launches on one stream share the counters in turn (two streams need two of them).

    `programs`: the persistent grid (default: on CUDA `per_sm` x the SMs, per_sm at most what fits on an SM; 1 in
    the interpreter). `claim`: "dynamic" (tasks handed out by a CLAIM ticket: no residency needed) or "static"
    (program p runs p, p + P, ...: every program must be resident, so `programs` is refused above what fits).
    `spin_limit`: polls before a wait gives up and records an error (check). `pdl`: kernels/pdl.py's mode.
    `prefetch`: weight columns per row that an O, gate/up or down task asks L2 for before its wait (0: none).
    `norm_sums` (RMSNorm models): the O and down finishers store their output rows' sums of squares per column
    block, as linear_residual does for NormSums, and the gate/up tasks (and the next layer's QKV tasks, where
    its input is this layer's output) read those instead of a pass over the row: a gate/up task's first load
    after its wait, on the path from the O projection to the MLP. `self.sums` (NormSums) links an output to its
    sums, so that the next call finds them (matching_ops takes the same NormSums to give the same roundings).
    `per_sm`, `num_warps`, `num_stages`: the default grid's programs per SM and the kernel's launch options.
    `keep_counters` (tests): the last program leaves the counters as the launch left them, for comparing with
    persistent_schedule.final_counters; the next launch then needs `counters.zero_()` first."""

    def __init__(
        self,
        plan: LayerPlan,
        device,
        dtype: torch.dtype,
        programs: int | None = None,
        claim: str = "dynamic",
        spin_limit: int | None = None,
        pdl: int = 0,
        per_sm: int = 2,
        num_warps: int = 4,
        num_stages: int = 3,
        prefetch: int = 0,
        norm_sums: bool = True,
        keep_counters: bool = False,
    ):
        if claim not in CLAIMS:
            raise ValueError(f"claim must be one of {CLAIMS}, got {claim!r}")
        for name, v in (("programs", programs), ("spin_limit", spin_limit)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int or None, got {v!r}")
        if isinstance(pdl, bool) or pdl not in (0, 1, 2, 3):
            raise ValueError(f"pdl must be 0, 1, 2 or 3 (kernels/pdl.py), got {pdl!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0 or prefetch & (prefetch - 1):
            raise ValueError(f"prefetch must be 0 or a power of two (weight columns per row), got {prefetch!r}")
        line = 128 // torch.empty(0, dtype=dtype).element_size()
        if prefetch and prefetch < line:
            raise ValueError(
                f"prefetch must be 0 or at least {line} columns (one 128-byte line of {dtype}), got {prefetch}"
            )
        if prefetch and _INTERPRETED:
            raise ValueError("prefetch needs a CUDA GPU (its L2 prefetch is PTX, which the interpreter does not run)")
        if claim == "static" and pdl == 2:  # EARLY: the next launch's programs may hold SMs this grid still needs
            raise ValueError(
                "claim='static' needs every program resident, which pdl=2 (EARLY) does not leave; use "
                "claim='dynamic' or another pdl mode"
            )
        if plan.head_dim > MAX_HEAD_DIM:
            raise ValueError(f"head size {plan.head_dim} > {MAX_HEAD_DIM} is not supported")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # "cuda" names the current device: compare as cuda:N
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type != "cuda" and not _INTERPRETED:
            raise ValueError(
                f"device {device}: the persistent layer needs a CUDA device (or TRITON_INTERPRET=1 set "
                "before triton is imported, to run it on CPU)"
            )
        if device.type == "cuda" and pdl and torch.cuda.get_device_capability(device) < (9, 0):
            raise ValueError("pdl needs a CUDA GPU of compute capability 9.0 or later")
        self.plan, self.device, self.dtype, self.claim = plan, device, dtype, claim
        self.pdl, self.per_sm, self.num_warps, self.num_stages = int(pdl), per_sm, num_warps, num_stages
        self.prefetch, self.keep_counters = prefetch, bool(keep_counters)
        if not isinstance(norm_sums, bool):
            raise ValueError(f"norm_sums must be a bool, got {norm_sums!r}")
        self.norm_sums = norm_sums
        self.sums = NormSums(min_rows=1)  # this layer's outputs -> their sums, for the next call's QKV
        self.spin_limit = spin_limit or (SPIN_LIMIT_GPU if device.type == "cuda" else SPIN_LIMIT_INTERPRETED)
        self.schedule = build_schedule(plan)
        check_schedule(self.schedule)  # host-side, once: every wait on smaller tasks, every count matched
        self.table = self.schedule.table.to(device).contiguous()
        self.counters = torch.zeros(self.schedule.n_counters, dtype=torch.int32, device=device)
        self.error = torch.zeros(1, dtype=torch.int32, device=device)
        self.requested_programs = programs
        self.programs: int | None = None  # resolved at the first launch (needs the compiled kernel on CUDA)
        B, H, Hq, D, I = plan.batch, plan.hidden, plan.n_heads, plan.head_dim, plan.inter
        n_qkv = (Hq + 2 * plan.n_kv) * D

        def f32(*shape):
            return torch.empty(shape, dtype=torch.float32, device=device)

        self.q = torch.empty((B, Hq, D), dtype=dtype, device=device)
        self.attn = torch.empty((B, Hq, D), dtype=dtype, device=device)
        self.h1 = torch.empty((B, H), dtype=dtype, device=device)
        self.m = torch.empty((B, I), dtype=dtype, device=device)
        self.part_qkv = f32(plan.qkv_split, B, n_qkv) if plan.qkv_split > 1 else f32(1)
        self.part_o = f32(plan.o_split, B, H) if plan.o_split > 1 else f32(1)
        self.part_down = f32(plan.down_split, B, H) if plan.down_split > 1 else f32(1)
        # sums of squares per column block: h after attention (the O blocks), the outputs (the down blocks, two
        # buffers in turn: a call reads the one the call before wrote)
        self.ss_mid = f32(plan.o_blocks, B)
        self.ss_out = [f32(plan.down_blocks, B), f32(plan.down_blocks, B)]
        self._turn = 0
        n_att = B * Hq * plan.att_splits
        ws = f32(max(workspace_numel(B, Hq, D, plan.att_splits), 1))
        self.att_acc, self.att_m, self.att_l = ws[: n_att * D], ws[n_att * D : n_att * (D + 1)], ws[n_att * (D + 1) :]
        for t in (
            self.table,
            self.counters,
            self.error,
            self.q,
            self.attn,
            self.h1,
            self.m,
            self.part_qkv,
            self.part_o,
            self.part_down,
            ws,
            self.ss_mid,
            *self.ss_out,
        ):
            torch._dynamo.mark_static_address(t)  # a CUDA graph reads them in place

    def check(self, reset: bool = True) -> None:
        """RuntimeError if a wait of an earlier launch gave up (its spin limit): the task it waited at. Reads
        the device's error flag: a host sync, never on the step's path."""
        bad = int(self.error.item())  # host sync
        if bad:
            if reset:
                self.error.zero_()
            task = self.schedule.table[bad - 1].tolist()
            raise RuntimeError(
                f"persistent layer: task {bad - 1} ({dict(zip(FIELDS, task))}) waited past the spin "
                f"limit ({self.spin_limit} polls) for its inputs; its output and the layer's are wrong"
            )

    def _resolve_programs(self, launch) -> int:
        if self.device.type != "cuda":
            return self.requested_programs or 1
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        fit = _occupancy(launch(warmup=True), self.num_warps, self.device)
        if fit < 1:
            raise ValueError("the persistent layer's kernel does not fit on an SM (registers or shared memory)")
        if self.requested_programs is None:
            return sms * min(fit, self.per_sm)
        if self.claim == "static" and self.requested_programs > sms * fit:
            raise ValueError(
                f"programs={self.requested_programs}: with claim='static' every program must be "
                f"resident, and {fit} fit on each of the {sms} SMs"
            )
        return self.requested_programs

    def __call__(self, W, layer, h, k_cache, v_cache, pos, slot, start, length, out=None):
        """The layer of `reference.decode_layer`: h (B, H) -> its output (B, H) (`out`, or a new tensor); writes
        K/V at `slot` of the layer's cache; row b attends to slots [start[b], length[b]), never empty. W: the
        model's FusedWeights (eps, RoPE, heads, norm, activation), unsharded; layer: its LayerWeights."""
        extras = W.extras()
        if extras:
            raise ValueError(f"W: the persistent layer runs the Llama family's and GPT-2's layer; this has {extras}")
        p = self.plan
        if W.tp is not None:
            raise ValueError("W: the persistent layer runs an unsharded model (W.tp is set)")
        if W.act not in ("silu_mul", "gelu_tanh"):
            raise ValueError(f"W.act must be 'silu_mul' or 'gelu_tanh', got {W.act!r}")
        B, H = h.shape
        S = k_cache.shape[2]
        shapes = dict(
            batch=(B, p.batch),
            hidden=(H, p.hidden),
            n_heads=(W.n_heads, p.n_heads),
            n_kv=(W.n_kv_heads, p.n_kv),
            head_dim=(W.head_dim, p.head_dim),
            inter=(layer.w_down.shape[1], p.inter),
            cache_len=(S, p.cache_len),
        )
        for name, (got, want) in shapes.items():
            if got != want:
                raise ValueError(f"{name}: the plan was made for {want}, got {got}")
        if h.dtype != self.dtype or h.device != self.device:
            raise ValueError(f"h must be {self.dtype} on {self.device}, got {h.dtype} on {h.device}")
        if k_cache.shape != (B, p.n_kv, S, p.head_dim) or v_cache.shape != k_cache.shape:
            raise ValueError(
                f"k_cache and v_cache must be (B, Hkv, S, D) = {(B, p.n_kv, S, p.head_dim)}, got "
                f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
            )
        if S * p.head_dim >= 2**31:
            raise ValueError(f"k_cache slots x head size ({S} x {p.head_dim}) must stay below 2**31")
        require_32bit(
            h=h,
            norm1_w=layer.norm1_w,
            norm1_b=layer.norm1_b,
            w_qkv=layer.w_qkv,
            b_qkv=layer.b_qkv,
            w_o=layer.w_o,
            b_o=layer.b_o,
            norm2_w=layer.norm2_w,
            norm2_b=layer.norm2_b,
            w_up=layer.w_up,
            b_up=layer.b_up,
            w_down=layer.w_down,
            b_down=layer.b_down,
            inv_freq=W.inv_freq,
        )
        require_contiguous(k_cache=k_cache, v_cache=v_cache, start=start, length=length)
        if out is None:
            out = torch.empty_like(h)
        elif out.shape != h.shape or out.dtype != h.dtype or not out.is_contiguous() or out.data_ptr() == h.data_ptr():
            raise ValueError(f"out must be a contiguous {h.dtype} tensor of shape {tuple(h.shape)}, not h itself")
        layer_norm = layer.norm1_b is not None
        dummy = layer.norm1_w
        sums = self.norm_sums and not layer_norm  # RMSNorm only: LayerNorm needs the mean first
        ss_in = self.sums.of(h) if sums else None  # h is this layer's last output: its down blocks' sums
        ss_out = self.ss_out[self._turn]

        def launch(warmup: bool = False):
            args = (
                h,
                out,
                self.h1,
                self.q,
                self.attn,
                self.m,
                layer.norm1_w,
                layer.norm1_b if layer_norm else dummy,
                layer.w_qkv,
                layer.b_qkv if layer.b_qkv is not None else dummy,
                W.inv_freq if W.inv_freq is not None else dummy,
                layer.w_o,
                layer.b_o if layer.b_o is not None else dummy,
                layer.norm2_w,
                layer.norm2_b if layer_norm else dummy,
                layer.w_up,
                layer.b_up if layer.b_up is not None else dummy,
                layer.w_down,
                layer.b_down if layer.b_down is not None else dummy,
                pos,
                slot,
                start,
                length,
                k_cache,
                v_cache,
                self.part_qkv,
                self.part_o,
                self.part_down,
                self.att_acc,
                self.att_m,
                self.att_l,
                self.table,
                self.counters,
                self.error,
                ss_in if ss_in is not None else self.ss_mid,
                self.ss_mid,
                ss_out,
                B,
                S,
                self.schedule.n_tasks,
                self.schedule.n_counters,
                pos.stride(0),
                slot.stride(0),
                p.down_blocks if ss_in is not None else 0,
                W.eps,
                W.rope_scale,
                layer.scale * LOG2E,
            )
            kw = dict(
                H=H,
                I=p.inter,
                HQ=p.n_heads,
                HKV=p.n_kv,
                D=p.head_dim,
                G=p.group,
                LAYER=layer_norm,
                QKV_BIAS=layer.b_qkv is not None,
                ROPE=W.inv_freq is not None,
                O_BIAS=layer.b_o is not None,
                UP_BIAS=layer.b_up is not None,
                DOWN_BIAS=layer.b_down is not None,
                ACT=_ACT_CODE[W.act],
                HALF=p.half,
                BK_QKV=p.qkv_block_k,
                KC_QKV=p.qkv_chunk,
                SPLIT_QKV=p.qkv_split,
                GROUP_PAD=max(16, triton.next_power_of_2(p.group)),
                BN_ATT=p.att_block_n,
                BD_ATT=p.att_block_d,
                SPLIT_ATT=p.att_splits,
                IEEE=h.dtype == torch.float32,
                BN_O=p.o_block_n,
                BK_O=p.o_block_k,
                KC_O=p.o_chunk,
                SPLIT_O=p.o_split,
                BN_UP=p.up_block_n,
                BK_UP=p.up_block_k,
                BN_DN=p.down_block_n,
                BK_DN=p.down_block_k,
                KC_DN=p.down_chunk,
                SPLIT_DN=p.down_split,
                NF=len(FIELDS),
                CLAIM_NEXT=self.claim == "dynamic",
                SPIN_LIMIT=self.spin_limit,
                BLOCK_M=BLOCK_M,
                PREFETCH=self.prefetch,
                LINE=128 // h.element_size(),
                IN_SUMS=triton.next_power_of_2(p.down_blocks) if sums else 0,  # used where nb_in > 0
                MID_SUMS=triton.next_power_of_2(p.o_blocks) if sums else 0,
                OUT_SUMS=sums,
                RESET=not self.keep_counters,
                PDL=self.pdl,
                num_warps=self.num_warps,
                num_stages=self.num_stages,
            )
            if warmup:  # compiled (the same variant as the launch: launch_pdl is one of its options), not run
                return _persistent_layer_kernel.warmup(*args, grid=(1,), **kw, **pdl_launch(self.pdl))
            _persistent_layer_kernel[(self.programs,)](*args, **kw, **pdl_launch(self.pdl))
            return None

        if self.programs is None:
            self.programs = self._resolve_programs(launch)
        launch()
        if sums:  # host-side bookkeeping of which tensor the sums belong to (at capture time under a graph)
            self.sums.record(out, ss_out)
            self._turn ^= 1
        else:
            self.sums.forget(out)
        if self.device.type != "cuda":
            self.check()  # the interpreter: no device to sync with
        return out


def matching_ops(plan: LayerPlan, pdl: int = 0, tickets=None, norm_sums: NormSums | None = None):
    """The five kernels with `plan`'s tiles and splits, as a model.StepOps for reference.decode_layer: the
    launches the persistent layer equals (the same partial sums in the same order). `tickets`: their split
    counters (linear_residual.Tickets; default fresh zeros per launch). `norm_sums`: the RMSNorm sums handed from
    the O and down projections to the norms that read their outputs, as a PersistentLayer with norm_sums hands
    them (a NormSums(min_rows=1); None: every norm reads its whole row, as with norm_sums=False). The norms run in
    the kernels' prologues (prenorm=False), as the persistent layer's do."""
    import functools

    from ..model import StepOps  # the model module imports the kernels, not this one: no cycle
    from .decode_attention import decode_attention
    from .linear_residual import linear_residual
    from .norm_linear import norm_linear
    from .norm_qkv import norm_qkv

    o_tiles = (plan.o_block_n, plan.o_block_k, plan.o_split)
    if plan.n_heads * plan.head_dim == plan.inter and o_tiles != (
        plan.down_block_n,
        plan.down_block_k,
        plan.down_split,
    ):
        raise ValueError(
            "plan: the O and down projections have the same K and different tiles; the five kernels' "
            "calls cannot be told apart by shape"
        )

    def linear(x, w, b, residual, res_scale=None, then_norm=None):  # then_norm: left to the reader
        o = w.shape[1] == plan.n_heads * plan.head_dim
        block_n, block_k, split = (
            (plan.o_block_n, plan.o_block_k, plan.o_split)
            if o
            else (plan.down_block_n, plan.down_block_k, plan.down_split)
        )
        # split_k doubles the split until blocks x split reaches `programs`: this target gives the plan's split
        programs = -(-plan.hidden // block_n) * split
        return linear_residual(
            x,
            w,
            b,
            residual,
            block_n=block_n,
            block_k=block_k,
            programs=programs,
            tickets=tickets,
            pdl=pdl,
            norm_sums=norm_sums,
            res_scale=res_scale,
            dense=False,  # the GEMV the persistent layer's tasks run, at any row count
        )

    qkv_programs = plan.qkv_tiles * plan.qkv_split
    return StepOps(
        functools.partial(
            norm_qkv,
            half=plan.half,
            block_k=plan.qkv_block_k,
            programs=qkv_programs,
            tickets=tickets,
            pdl=pdl,
            norm_sums=norm_sums,
            prenorm=False,
            dense=False,
        ),
        functools.partial(
            decode_attention, num_splits=plan.att_splits, block_n=plan.att_block_n, pdl=pdl, tickets=tickets
        ),
        linear,
        functools.partial(
            norm_linear,
            block_n=plan.up_block_n,
            block_k=plan.up_block_k,
            pdl=pdl,
            norm_sums=norm_sums,
            prenorm=False,
        ),
        None,
        None,
    )


__all__ = ["CLAIM", "CLAIMS", "PersistentLayer", "matching_ops"]
