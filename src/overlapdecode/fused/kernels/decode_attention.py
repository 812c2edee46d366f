"""Decode attention (one new query token per row, grouped-query heads) as a Triton flash-decoding kernel,
beside its plain-PyTorch reference.

What it computes: for row b and query head h (kv head hk = h // G, G = Hq // Hkv),

    out[b, h] = softmax(scale * q[b, h] . K[b, hk, s]  for s in [start[b], length[b])) @ V[b, hk, s]

with the softmax in float32 and the output in q's dtype. Slots outside [start, length) are never read:
`start` is the left padding of the row, `length` the current slot + 1, both read from device memory. With
`cache_group` g, query row b reads K and V of cache row b // g: speculative decoding's verify step runs T tokens
of each cache row as T query rows, each with its own start and length (fused/forward.py verify_step). There one
program may take a cache row's g query rows together (the many-query form, `many_queries_tile`; asked for by
`many_queries=True`, MANY_QUERIES_BY_DEFAULT; timed in results/h100/llama-1b-verify-many-query): its g x G queries
share each K and V block it loads, so the verify step reads a row's cache once, not once per token; a query masks
the slots outside its own [start, length), and a piece holding none of them leaves its max at -inf. Slots that no
query of the program sees may hold anything, as above; a slot one query sees is multiplied by the others' zero
weights, so a NaN there (which makes that query's output NaN in any form) reaches the program's other queries.

Why split-K: at decode a (row, kv head) pair is one tiny matrix-vector product over a long cache, so one
program per pair leaves most of the 132 SMs of an H200 idle at small batch. The live range [start, length)
of each pair is cut into `num_splits` pieces of whole BLOCK_N-key blocks, and each piece runs on its own
program; the program that finishes a (row, kv head)'s last piece combines them (a ticket counter, as in
linear_residual): one launch per layer.

Grid and tiles:
- `_split_kernel`, grid (B * Hkv, num_splits). A program loads the G query heads of its kv head once, as a
  (GROUP_PAD, BLOCK_D) tile, and streams its blocks of BLOCK_N keys: scores = tl.dot(q, K^T) and
  acc += tl.dot(p, V), an online softmax in float32 (exp2, with log2(e) folded into the scale). K and V are
  so read once per kv-head group, not once per query head. It writes the unnormalised partial (max, sum,
  acc) of its piece to a float32 workspace; programs whose piece is empty (the row is shorter than the cache)
  return at once, so the work follows the current length, not S. Each live program then takes a ticket of
  its (row, kv head); the one that draws the last rescales the live pieces to a common max, divides by the
  summed denominator (pieces in the fixed order 0, 1, ...: deterministic) and resets the ticket to 0. (Until
  commit cacedb8 a second kernel, grid (B * Hq,), did this: 16 launches more per Llama-1B step.) With
  num_splits == 1 the program normalises and writes `out` itself (no workspace, no ticket).

Why tl.dot with the group padded to GROUP_PAD = max(16, next power of two of G) rows, and not a
broadcast-multiply-reduce: tl.dot needs 16 rows, so for G = 4 (Llama) three quarters and for G = 1 (GPT-2)
fifteen sixteenths of the dot work is on zero rows. That work is nearly free: decode attention is bound by
reading K and V. With 16 rows a cached key and value (4 * D bytes in bf16) cost 64 * D FLOPs, 16 FLOPs per
byte, against the H200's roughly 200 bf16 tensor-core FLOPs per byte of HBM bandwidth; a broadcast product
would instead hold G * BLOCK_N * D floats in registers and run on the CUDA cores. float32 inputs use
input_precision="ieee" (not TF32; 8 FLOPs per cache byte on the CUDA cores, still about memory speed), so
float32 results match the reference to float32 rounding; float32 is the checking dtype, the 16-bit dtypes
the fast path (p is rounded to V's dtype for the second dot, as flash attention does).

Tile sizes: BLOCK_D = next power of two >= max(D, 16), masked, so any head size D <= 256 works (D = 48 runs
as 64 with the last 16 lanes masked); D > 256 is refused with a ValueError (the tiles would not fit in
registers). D is a constexpr (a model constant), so the mask folds away when BLOCK_D == D and the loads stay
vectorised. BLOCK_N (keys per step) is 64 for D <= 64, and 32 (16-bit) or 16 (float32) for D = 128: the
largest that Triton 3.6 compiles for sm_90 without register spills (ptxas resource usage, not timed).
num_splits is picked from the shapes alone (so one CUDA graph serves every step of a call): a power of two of
pieces, as many as keep the grid within about two programs per SM of the GPU at hand (TARGET_PROGRAMS, an
H200's, in the interpreter), at most one per block of keys of the cache, at most MAX_SPLITS; a row shorter than
the cache spreads its live range over the same pieces, and pieces past it return at once. The pipeline is 3
stages deep where a piece spans at least 4 blocks of keys, else 2 (pipeline_stages). With one piece per (row, kv
head) (many rows) and heads up to 64 wide the blocks are 32 keys on 2 warps instead (direct_tiles). Both rules were timed
against other splits and depths at 1-128 rows and 96-32K keys (scripts/attention_sweep.py). The combine reads
every piece's max and sum in one load and each query head's accumulators in one more (G loads in all, not two
per piece: with 32 pieces a serial loop makes 64 dependent loads from L2; reasoned, not profiled).

CUDA graphs: the grids, constexprs and workspace size depend only on (B, Hq, Hkv, S, D, dtype); start and
length are only read by the kernels. There are no host syncs in this module (no .item(), no value-dependent
Python branch). `out` and `workspace`, when passed, are written in place, so a captured graph can own them.
So 0 <= start < length <= S is the caller's promise, not checked (checking values would be a host sync);
rows that break it get undefined output.

Testing on CPU: with TRITON_INTERPRET=1 set before triton is imported the kernels run in Triton's
interpreter (float32 and float16; Triton 3.6's interpreter gets tl.dot on bfloat16 wrong, so bfloat16 is
checked on CUDA only).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from .linear_residual import Tickets, last_of_split, require_cache_group, require_contiguous, take_tickets
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import sm_count

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256
TARGET_PROGRAMS = 2 * 132  # about two split programs per SM of an H200
MAX_SPLITS = 64  # bounds the combining program's loop over the pieces
MANY_QUERY_VALUES = 4096  # most (queries, padded to a power of two, at least 16) x BLOCK_D of one program's tile
MANY_QUERIES_BY_DEFAULT = False  # the many-query form where none is asked: slower at short caches (docs/KERNELS.md)
LOG2E = 1.4426950408889634


@triton.jit
def _split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    start_ptr,
    length_ptr,
    part_acc_ptr,
    part_m_ptr,
    part_l_ptr,
    out_ptr,
    ticket_ptr,
    sinks_ptr,
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
    SPLIT_PAD: tl.constexpr,
    DIRECT: tl.constexpr,
    IEEE: tl.constexpr,
    PDL: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CACHE_GROUP: tl.constexpr,
    T: tl.constexpr,
):
    pdl_start(PDL)
    # sinks_ptr (gpt-oss): a logit per query head that enters each head's max and denominator and no value; None
    # (a constexpr) where the model has none
    # T == 1: a program per (query row b, kv head); T == CACHE_GROUP (the many-query form): a program per (cache row
    # r, kv head) takes the T query rows r * T .. r * T + T - 1 together, so that it reads their cache once
    pid_bh = tl.program_id(0)  # b * HKV + kv head (T == 1), else r * HKV + kv head
    pid_s = tl.program_id(1)
    b = pid_bh // HKV
    hk = pid_bh % HKV
    if T == 1:
        row_start = tl.load(start_ptr + b).to(tl.int32)
        row_len = tl.load(length_ptr + b).to(tl.int32)
    else:  # each query's own range (query i: row b * T + i // G, head hk * G + i % G); the program streams their union
        offs_q = tl.arange(0, GROUP_PAD)
        qrow = b * T + offs_q // G
        q_start = tl.load(start_ptr + qrow, mask=offs_q < T * G, other=2**30).to(tl.int32)
        q_len = tl.load(length_ptr + qrow, mask=offs_q < T * G, other=0).to(tl.int32)
        row_start = tl.min(q_start, 0)
        row_len = tl.max(q_len, 0)

    # This split's blocks of the live range (n_live below counts the non-empty pieces the same way).
    n_blocks = tl.cdiv(row_len - row_start, BLOCK_N)
    per_split = tl.cdiv(n_blocks, NUM_SPLITS)
    blk_lo = pid_s * per_split
    blk_hi = tl.minimum(blk_lo + per_split, n_blocks)
    if blk_lo >= blk_hi:
        return  # past the row's length: nothing to read, no ticket (n_live below does not count it)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    mask_g = offs_g < T * G
    mask_d = offs_d < D  # all true when BLOCK_D == D (a constexpr compare the compiler folds)

    head0 = hk * G  # first query head of this kv head's group
    if T == 1:  # the G heads of row b, side by side
        q_blk = q_ptr + (b * HQ + head0).to(tl.int64) * D
        q = tl.load(q_blk + offs_g[:, None] * D + offs_d[None, :], mask=mask_g[:, None] & mask_d[None, :], other=0.0)
    else:
        heads = qrow * HQ + head0 + offs_g % G  # flat (query row, head) index of each query
        q_offs = heads.to(tl.int64)[:, None] * D + offs_d[None, :]
        q = tl.load(q_ptr + q_offs, mask=mask_g[:, None] & mask_d[None, :], other=0.0)

    # The (cache row, hk) slab of the (B / CACHE_GROUP, HKV, S, D) caches: a 64-bit base once, 32-bit offsets
    # inside it (S * D < 2**31, checked by the caller), so the per-element address math stays small. Query row b
    # reads cache row b // CACHE_GROUP (the verify step's tokens of one row); 1: its own, the slab pid_bh.
    if CACHE_GROUP == 1 or T > 1:
        kv_pair = pid_bh
    else:
        kv_pair = (b // CACHE_GROUP) * HKV + hk
    kv_base = kv_pair.to(tl.int64) * S * D
    k_slab = k_ptr + kv_base
    v_slab = v_ptr + kv_base
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for blk in range(blk_lo, blk_hi):
        slots = row_start + blk * BLOCK_N + offs_n
        live = slots < row_len  # slots >= row_start by construction
        kv_offs = slots[:, None] * D + offs_d[None, :]
        kv_mask = live[:, None] & mask_d[None, :]
        k = tl.load(k_slab + kv_offs, mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        # float32 whatever type the scale arrives as (torch.compile passes Python floats to user kernels as
        # fp64, which would make the loop-carried max fp64)
        if T == 1:
            seen = live[None, :]
        else:  # a query sees the slots of its own range
            seen = (slots[None, :] >= q_start[:, None]) & (slots[None, :] < q_len[:, None])
        if SOFTCAP is not None:  # Gemma 2: cap * tanh(scale * q.k / cap), qk_scale = scale / cap here
            s = (s * qk_scale).to(tl.float32)
            s = (1.0 - 2.0 / (tl.exp(2.0 * s) + 1.0)) * (SOFTCAP * 1.4426950408889634)
            s = tl.where(seen, s, float("-inf")).to(tl.float32)
        else:
            s = tl.where(seen, s * qk_scale, float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # T == 1: every block has a live slot, so m_new is finite and no -inf - -inf appears. T > 1: a query may
        # have seen no slot yet (this piece starts past its range): its max stays -inf, its p and alpha 0, not NaN
        if T == 1:
            alpha = tl.math.exp2(m_i - m_new)
            p = tl.math.exp2(s - m_new[:, None])
        else:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_use)
            p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if T > 1:  # only the slots some query sees: a gap between the queries' ranges may hold anything
            kv_mask = (tl.max(seen.to(tl.int32), 0) > 0)[:, None] & mask_d[None, :]
        v = tl.load(v_slab + kv_offs, mask=kv_mask, other=0.0)  # masked too: 0 * NaN would poison acc
        if IEEE:
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    pdl_release(PDL)
    if T == 1:
        heads = b * HQ + head0 + offs_g  # flat (b, h) index of each group row
    store_mask = mask_g[:, None] & mask_d[None, :]
    if sinks_ptr is not None:  # in the scores' log2 units
        if T == 1:
            sink = tl.load(sinks_ptr + head0 + offs_g, mask=mask_g, other=0.0).to(tl.float32) * 1.4426950408889634
        else:
            sink = tl.load(sinks_ptr + head0 + offs_g % G, mask=mask_g, other=0.0).to(tl.float32) * 1.4426950408889634
    if DIRECT:
        if sinks_ptr is not None:
            m_sink = tl.maximum(m_i, sink)
            acc = acc * tl.math.exp2(m_i - m_sink)[:, None]
            l_i = l_i * tl.math.exp2(m_i - m_sink) + tl.math.exp2(sink - m_sink)
        o = acc / l_i[:, None]
        o_offs = heads.to(tl.int64)[:, None] * D + offs_d[None, :]
        tl.store(out_ptr + o_offs, o.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        part = heads.to(tl.int64) * NUM_SPLITS + pid_s  # (b, h, split) index
        tl.store(part_m_ptr + part, m_i, mask=mask_g)
        tl.store(part_l_ptr + part, l_i, mask=mask_g)
        tl.store(part_acc_ptr + part[:, None] * D + offs_d[None, :], acc, mask=store_mask)
        # The program that stores the last of the n_live pieces of this (row, kv head) combines them (its
        # loads of the partials bypass L1, as last_of_split requires).
        n_live = tl.cdiv(n_blocks, per_split)  # the pieces that are not empty
        if last_of_split(ticket_ptr, pid_bh, n_live):
            # every piece's max and sum in one load of (GROUP_PAD, SPLIT_PAD), then per query head of the group
            # one load of its (SPLIT_PAD, BLOCK_D) accumulators: G loads from L2, not two per piece
            sp = tl.arange(0, SPLIT_PAD)
            sp_ok = sp < n_live
            first = heads.to(tl.int64) * NUM_SPLITS  # (b, h, 0) of each group row
            ml_ok = mask_g[:, None] & sp_ok[None, :]
            m_s = tl.load(
                part_m_ptr + first[:, None] + sp[None, :], mask=ml_ok, other=float("-inf"), cache_modifier=".cg"
            )
            l_s = tl.load(part_l_ptr + first[:, None] + sp[None, :], mask=ml_ok, other=0.0, cache_modifier=".cg")
            m_max = tl.max(m_s, 1)
            if sinks_ptr is not None:
                m_max = tl.maximum(m_max, sink)
            w = tl.where(ml_ok, tl.math.exp2(m_s - m_max[:, None]), 0.0)  # (GROUP_PAD, SPLIT_PAD)
            den = tl.sum(w * l_s, 1)
            if sinks_ptr is not None:
                den += tl.math.exp2(sink - m_max)
            # sums in a fixed order: deterministic, whichever program came last; the many-query form's queries in
            # a loop (unrolled, its combine spilled at 20 queries of 64 dims; sm_90 ptxas)
            if T == 1:
                for g in tl.static_range(G):
                    head = b * HQ + head0 + g
                    _combine_query(
                        part_acc_ptr, out_ptr, w, den, offs_g, offs_d, sp, sp_ok, mask_d, g, head, D, NUM_SPLITS
                    )
            else:
                for g in range(T * G):
                    head = (b * T + g // G) * HQ + head0 + g % G  # query g's row and head
                    _combine_query(
                        part_acc_ptr, out_ptr, w, den, offs_g, offs_d, sp, sp_ok, mask_d, g, head, D, NUM_SPLITS
                    )
            tl.store(ticket_ptr + pid_bh, 0)  # back to zero for the next launch


@triton.jit
def _combine_query(part_acc_ptr, out_ptr, w, den, offs_g, offs_d, sp, sp_ok, mask_d, g, head, D, NUM_SPLITS):
    """The split's combine of query g of a program, flat (row, head) index `head`: its pieces' accumulators
    weighted by row g of w (the pieces' rescaled sums), over its denominator, stored."""
    a_s = tl.load(
        part_acc_ptr + (head.to(tl.int64) * NUM_SPLITS + sp)[:, None] * D + offs_d[None, :],
        mask=sp_ok[:, None] & mask_d[None, :],
        other=0.0,
        cache_modifier=".cg",
    )
    w_g = tl.sum(tl.where(offs_g[:, None] == g, w, 0.0), 0)  # (SPLIT_PAD,): row g of w
    den_g = tl.sum(tl.where(offs_g == g, den, 0.0), 0)
    o = tl.sum(w_g[:, None] * a_s, 0) / den_g
    tl.store(out_ptr + head.to(tl.int64) * D + offs_d, o.to(out_ptr.dtype.element_ty), mask=mask_d)


# Compiled kernels need CUDA tensors; Triton's interpreter (slow, for tests) runs CPU tensors. Which one
# @triton.jit made is fixed when triton is first imported (TRITON_INTERPRET=1 then, for its own tl.* helpers
# too), so it is read from the kernel, not from the environment now.
_INTERPRETED = not isinstance(_split_kernel, JITFunction)


def _check(q, k_cache, v_cache, start, length, scale, cache_group=1):
    """Shape/dtype/device checks from tensor metadata only (no device reads). Returns (B, Hq, Hkv, S, D), B the
    query rows (cache_group x the cache's rows)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("start", start), ("length", length)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be (B, Hq, D), got shape {tuple(q.shape)}")
    if q.dtype not in DTYPES:
        raise ValueError(f"q must be float32, bfloat16 or float16, got {q.dtype}")
    B, Hq, D = q.shape
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache must be (B, Hkv, S, D), got shape {tuple(k_cache.shape)}")
    _, Hkv, S, _ = k_cache.shape
    if k_cache.shape[3] != D or (type(cache_group) is int and cache_group == 1 and k_cache.shape[0] != B):
        raise ValueError(
            f"k_cache shape {tuple(k_cache.shape)} does not match q shape {tuple(q.shape)} (want (B, Hkv, S, D))"
        )
    require_cache_group(cache_group, B, k_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name} dtype {t.dtype} must equal q dtype {q.dtype}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k_cache heads ({Hkv})")
    if S == 0 or D == 0 or B == 0:
        raise ValueError(f"empty shapes: q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    for name, t in (("start", start), ("length", length)):
        if t.shape != (B,):
            raise ValueError(f"{name} must have shape ({B},), got {tuple(t.shape)}")
        if t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} must be int32 or int64, got {t.dtype}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache), ("start", start), ("length", length)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}: all must be on one device")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise TypeError(f"scale must be a finite Python number, got {scale!r}")
    return B, Hq, Hkv, S, D


def decode_attention_ref(
    q, k_cache, v_cache, start, length, scale, softcap: float | None = None, sinks=None, cache_group: int = 1
):
    """Plain-PyTorch decode attention with the kernel's contract: slots outside [start, length) are masked
    (their keys may hold anything, even NaN), softmax in float32, output in q's dtype; `softcap`: scores
    cap * tanh(scores / cap); `sinks` (Hq,) (gpt-oss): a logit per head in the softmax, with no value;
    `cache_group`: query row b reads cache row b // cache_group."""
    B, Hq, Hkv, S, D = _check(q, k_cache, v_cache, start, length, scale, cache_group)
    G = Hq // Hkv
    if cache_group != 1:  # each query row's cache row, repeated
        k_cache = k_cache.repeat_interleave(cache_group, dim=0)
        v_cache = v_cache.repeat_interleave(cache_group, dim=0)
    slots = torch.arange(S, device=q.device)
    live = (slots >= start[:, None]) & (slots < length[:, None])  # (B, S)
    live_kv = live[:, None, :, None]  # against (B, Hkv, S, D)
    k = k_cache.float().masked_fill(~live_kv, 0.0)
    v = v_cache.float().masked_fill(~live_kv, 0.0)
    qg = q.float().reshape(B, Hkv, G, D)
    scores = torch.einsum("bkgd,bksd->bkgs", qg, k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~live[:, None, None, :], float("-inf"))
    probs = scores.softmax(-1) if sinks is None else with_sink_softmax(scores, sinks.float().view(1, Hkv, G, 1))
    out = torch.einsum("bkgs,bksd->bkgd", probs, v)
    return out.reshape(B, Hq, D).to(q.dtype)


def with_sink_softmax(scores, sinks):
    """The softmax over the last dim of `scores` with a sink logit (broadcast to scores[..., :1]) in its max and
    denominator, the sink's own column dropped, as Hugging Face's gpt-oss eager attention computes it."""
    both = torch.cat([scores, sinks.expand(*scores.shape[:-1], 1).to(scores.dtype)], dim=-1)
    both = both - both.max(dim=-1, keepdim=True).values
    return both.softmax(-1)[..., :-1]


def block_sizes(D: int, dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_D) for head size D: the largest BLOCK_N (at most 64) that Triton 3.6 compiles for
    sm_90 without register spills (read from ptxas's resource usage, not timed)."""
    block_d = max(16, triton.next_power_of_2(D))
    if block_d <= 64:
        return 64, block_d
    if dtype == torch.float32:
        return 16, block_d
    return (32 if block_d == 128 else 16), block_d


def choose_num_splits(B: int, Hkv: int, S: int, block_n: int, programs: int = TARGET_PROGRAMS) -> int:
    """Splits per (row, kv head), from shapes alone: the largest power of two that keeps the grid within
    `programs` (the fused step: 2 x the GPU's SMs), no more splits than blocks of keys of the cache, at most
    MAX_SPLITS. A power of two because the combine pads the pieces to one (SPLIT_PAD; docs/KERNELS.md, "Decode attention
    at long contexts")."""
    want = max(1, programs // (B * Hkv))
    return max(1, min(1 << (want.bit_length() - 1), triton.cdiv(S, block_n), MAX_SPLITS))


def direct_tiles(block_d: int, num_splits: int, pairs: int, programs: int) -> tuple[int, int] | None:
    """(BLOCK_N, num_warps) where one program per (row, kv head) reads its whole live range because the `pairs` =
    B x Hkv programs alone are past half the grid target `programs` (many rows: choose_num_splits gives 1 whatever
    the cache) and the heads are at most 64 wide: blocks of 32 keys on 2 warps, so that more programs share an SM.
    None elsewhere (a short cache at a few rows included): block_sizes's keys on 4 warps. The pipeline depth stays
    the one the 64-key blocks give (results/h200/llama-attention-sweep/many-rows; docs/KERNELS.md)."""
    return (32, 2) if num_splits == 1 and 2 * pairs > programs and block_d <= 64 else None


def pipeline_stages(S: int, block_n: int, num_splits: int) -> int:
    """The launch's num_stages: 3 where a piece of a full cache spans at least 4 blocks of keys, so that the
    next blocks' loads run under this one's dots; 2 for short pieces, where a deeper pipeline only adds its
    prologue (results/h200/llama-attention-sweep; docs/KERNELS.md, "Decode attention at long contexts")."""
    return 3 if triton.cdiv(triton.cdiv(S, block_n), num_splits) >= 4 else 2


def workspace_numel(B: int, Hq: int, D: int, num_splits: int) -> int:
    """float32 elements of the workspace: per (row, head, split) an accumulator of D, a max and a sum."""
    return 0 if num_splits == 1 else B * Hq * num_splits * (D + 2)


def default_programs(device) -> int:
    """The grid the split aims at: 2 x the SMs of a CUDA device, TARGET_PROGRAMS elsewhere (the interpreter)."""
    return 2 * sm_count(device) if torch.device(device).type == "cuda" else TARGET_PROGRAMS


def many_queries_tile(cache_group: int, G: int, block_d: int, many_queries: bool | None = None) -> int:
    """T, the query rows a program takes together: `cache_group` (the many-query form: their cache row read once, not
    once per token) where more than one query row shares a cache row and its cache_group x G queries, padded to a
    power of two of at least 16, times the head's BLOCK_D stay within MANY_QUERY_VALUES (the accumulator of 32 x 128
    or 64 x 64 compiles for sm_90 without spills; 64 x 128 spilled), else 1 (a program per query row).
    `many_queries`: False forces 1; True asks for the form and is a ValueError where it cannot serve; None: the form
    where it serves if MANY_QUERIES_BY_DEFAULT (False: faster at 8 rows of 8K keys, slower at one row of 160;
    results/h100/llama-1b-verify-many-query)."""
    if many_queries is not None and not isinstance(many_queries, bool):
        raise ValueError(f"many_queries must be None, True or False, got {many_queries!r}")
    rows = max(16, triton.next_power_of_2(cache_group * G))
    fits = cache_group > 1 and rows * block_d <= MANY_QUERY_VALUES
    if many_queries and not fits:
        raise ValueError(
            f"many_queries: needs cache_group > 1 and (cache_group x query heads per kv head, padded) x head tile <= "
            f"{MANY_QUERY_VALUES}, got {cache_group} x {G} queries of {block_d}"
        )
    wanted = MANY_QUERIES_BY_DEFAULT if many_queries is None else many_queries
    return cache_group if fits and wanted else 1


def make_workspace(
    q: torch.Tensor, k_cache: torch.Tensor, cache_group: int = 1, many_queries: bool | None = None
) -> torch.Tensor:
    """The float32 workspace `decode_attention(q, k_cache, ..., cache_group=cache_group, many_queries=many_queries)`
    uses with its default plan, for a caller (a CUDA graph) that keeps it across calls."""
    B, Hq, D = q.shape
    _, Hkv, S, _ = k_cache.shape
    T = many_queries_tile(cache_group, Hq // Hkv, block_sizes(D, q.dtype)[1], many_queries)
    splits = choose_num_splits(B // T, Hkv, S, block_sizes(D, q.dtype)[0], default_programs(q.device))
    return torch.empty(workspace_numel(B, Hq, D, splits), dtype=torch.float32, device=q.device)


def decode_attention(
    q,
    k_cache,
    v_cache,
    start,
    length,
    scale,
    out=None,
    workspace=None,
    *,
    num_splits=None,
    block_n=None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pdl: bool = False,
    tickets: Tickets | None = None,
    softcap: float | None = None,
    sinks=None,
    cache_group: int = 1,
    many_queries: bool | None = None,
):
    """Decode attention, (B, Hq, D) in q's dtype; see the module docstring.

    softcap: Gemma 2's attention soft-capping, scores cap * tanh(scale * q.k / cap) (a constexpr of the launch).
    sinks: gpt-oss's (Hq,) contiguous logits, one per query head, in each head's softmax max and denominator
      (also in the split's combine); None: none (the pointer a constexpr None, the kernel without them).

    out: optional (B, Hq, D) contiguous tensor of q's dtype, written in place and returned.
    workspace: optional contiguous float32 tensor of at least `workspace_numel(...)` elements, such as
      `make_workspace(q, k_cache)` (a captured graph can own it); allocated per call when None (its size
      depends on shapes only).
    num_splits, block_n: overrides of the shape-derived choices, for tuning and tests (static values);
      num_warps, num_stages: the launch's (None: 4 warps, or direct_tiles's where block_n is not given;
      num_stages pipeline_stages of block_sizes's keys; scripts/attention_sweep.py times them).
    pdl: launch with programmatic dependent launch (pdl.py; sm_90+).
    tickets: the ticket counters of the split (linear_residual.Tickets; default: fresh zeros, a fill per call).
    cache_group: query rows per cache row: query row b reads cache row b // cache_group (k_cache holds B /
      cache_group rows; the verify step's T tokens of a row, each with its own start and length); a constexpr. The
      split's workspace stays per (query row, head).
    many_queries: whether a program takes a cache row's cache_group query rows together, reading the cache row once
      for all of them (many_queries_tile; None: MANY_QUERIES_BY_DEFAULT); the tickets are then per (cache row, kv
      head).
    """
    B, Hq, Hkv, S, D = _check(q, k_cache, v_cache, start, length, scale, cache_group)
    if D > MAX_HEAD_DIM:
        raise ValueError(f"head size D={D} > {MAX_HEAD_DIM} is not supported by the Triton kernel")
    if S * D >= 2**31:
        raise ValueError(f"k_cache slots x head size ({S} x {D}) must stay below 2**31 (32-bit offsets)")
    require_contiguous(q=q, k_cache=k_cache, v_cache=v_cache, start=start, length=length)
    default_n, block_d = block_sizes(D, q.dtype)
    chosen = block_n is None
    if chosen:
        block_n = default_n
    elif not isinstance(block_n, int) or block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n!r}")
    programs = default_programs(q.device)
    G = Hq // Hkv
    T = many_queries_tile(cache_group, G, block_d, many_queries)
    pairs = B // T * Hkv  # the programs of one piece each
    if num_splits is None:
        num_splits = choose_num_splits(B // T, Hkv, S, block_n, programs)
    elif not isinstance(num_splits, int) or not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be an int in [1, {MAX_SPLITS}], got {num_splits!r}")
    if num_stages is None:
        num_stages = pipeline_stages(S, block_n, num_splits)
    direct_plan = direct_tiles(block_d, num_splits, pairs, programs) if chosen else None
    if direct_plan is not None:
        block_n = direct_plan[0]
        num_warps = num_warps or direct_plan[1]
    num_warps = num_warps or 4
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != q.shape
        or out.dtype != q.dtype
        or out.device != q.device
        or not out.is_contiguous()
    ):
        raise ValueError(f"out must be a contiguous {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}")
    need = workspace_numel(B, Hq, D, num_splits)
    if workspace is not None and (
        not isinstance(workspace, torch.Tensor)
        or workspace.dtype != torch.float32
        or workspace.device != q.device
        or not workspace.is_contiguous()
        or workspace.numel() < need
    ):
        raise ValueError(f"workspace must be a contiguous float32 tensor on {q.device} with at least {need} elements")
    if sinks is not None and (
        not isinstance(sinks, torch.Tensor)
        or sinks.shape != (Hq,)
        or sinks.device != q.device
        or not sinks.is_contiguous()
        or not sinks.is_floating_point()
    ):
        raise ValueError(f"sinks must be None or a contiguous float ({Hq},) tensor on {q.device} (one per q head)")
    if q.device.type != "cuda" and not _INTERPRETED:
        raise ValueError(
            f"q is on {q.device}: the Triton kernel needs CUDA tensors "
            "(or TRITON_INTERPRET=1 set before triton is imported, to run it on CPU)"
        )

    if out is None:
        out = torch.empty_like(q)
    if workspace is None:
        workspace = torch.empty(need, dtype=torch.float32, device=q.device)
    n_part = B * Hq * num_splits
    ws = workspace.view(-1)
    part_acc, part_m, part_l = ws[: n_part * D], ws[n_part * D : n_part * (D + 1)], ws[n_part * (D + 1) :]

    direct = num_splits == 1
    counters = out if direct else take_tickets(tickets, pairs, q.device)  # never touched when direct
    _split_kernel[(pairs, num_splits)](
        q,
        k_cache,
        v_cache,
        start,
        length,
        part_acc,
        part_m,
        part_l,
        out,
        counters,
        sinks,
        scale * LOG2E if softcap is None else scale / softcap,
        S,
        HQ=Hq,
        HKV=Hkv,
        G=G,
        GROUP_PAD=max(16, triton.next_power_of_2(T * G)),
        D=D,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        NUM_SPLITS=num_splits,
        SPLIT_PAD=triton.next_power_of_2(num_splits),
        DIRECT=direct,
        IEEE=q.dtype == torch.float32,
        PDL=bool(pdl),
        SOFTCAP=None if softcap is None else float(softcap),
        CACHE_GROUP=cache_group,
        T=T,
        num_warps=num_warps,
        num_stages=num_stages,
        **pdl_launch(pdl),
    )
    return out
