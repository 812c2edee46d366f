"""The first launches of the sampled choice (kernels/sample.py): each row's maximum of the penalised logits and,
with top-k, its k-th largest penalised logit (the top-k threshold), with no sort and no host sync.

What it computes (the contract of `row_max_and_threshold_ref`), per row b of the (B, V) logits after the
repetition penalty:

    the row maximum      as (NBLK, B) partial maxima, one per column block, which the next kernels reduce
    kth[b]               torch.topk(penalised[b], k).values[-1], where top-k applies (k < V)

Why: the threshold came from one `torch.topk` over the vocabulary, a dozen or so launches for a few long rows
(PyTorch's multi-block radix select: per 8-bit digit a search and a count launch, prefix scans, a gather, then a
sort of the k values; its measured cost is in docs/KERNELS.md, "The sampled choice"), which every sampled call at
Hugging Face's defaults (top-k 50) paid.

How, two launches (without top-k the first alone):

    1. _max_kernel        over (BLOCK_M, BLOCK_V) tiles, grid (cdiv(V, BLOCK_V), cdiv(B, BLOCK_M)): the tile's
                          maximum per row; with top-k also the tile's own k largest values per row, as 32-bit
                          keys (`_keys`: the unsigned order of a key is the float order) into a (B, NBLK, k)
                          buffer. The tile's k-th largest key c is found bit by bit from the top (`_kth_key`: 32
                          masked counts, each keeping a bit when at least k keys are >= the prefix with it); the
                          keys above c, fewer than k, go to the first slots in column order (a prefix sum gives
                          each its slot), c fills the slots up to k. A tile of fewer than k logits stores them
                          all, its other slots 0 ("none", below every key).
    2. _threshold_kernel  one program per row: the same search over the row's NBLK x k candidate keys; the
                          k-th largest, back as a float32, into kth (B,).

Exact: each of a row's k largest values is among its own tile's k largest, so the union of the tiles' lists
holds the row's k largest (as a multiset) and its k-th largest is the row's. The value is what counts, not
which tokens hold it: the kernels that follow keep every token scored >= the threshold, scored as the tiles are
(monotone: the k-th largest score is the k-th largest logit's score), so ties at the threshold are all kept, as
Hugging Face's TopKLogitsWarper keeps them (it removes the scores < topk(scores, min(k, V))[..., -1]). -inf
logits are values like any other (with fewer than k finite logits the threshold is -inf and the top-k keeps
them all); -0.0 is keyed as +0.0 (they compare equal as floats). Top-k applies where k < V, as in sampling.py
(k >= V keeps every token).

Bound: k <= TOP_K_MAX. Each row's candidates are NBLK x k keys, held in one program's registers up to
RESIDENT_KEYS (at most 64 a thread) and read again from L2 in each of the 32 counts beyond (at k = 64 and the
tiles sample.default_block_v gives: a vocabulary above 262144 from 16 rows, above 524288 up to 8); a larger k
takes the threshold from `torch.topk` as before (`torch_threshold`, its launches added to the step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...sampling import SamplingParams, penalize
from .pdl import pdl_launch, pdl_release, pdl_start

TOP_K_MAX = 64  # the largest k whose threshold the kernels find; Hugging Face's default is 50
RESIDENT_KEYS = 32768  # a row's candidates (NBLK x k, to a power of two) the threshold kernel loads once
KEY_CHUNK = 8192  # the slots per load beyond that, each count reading the row's candidates again


@triton.jit
def penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY: tl.constexpr):
    """The (BLOCK_M, BLOCK_V) tile of float32 logits after the repetition penalty (-inf outside `ok`)."""
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * row_stride + cols[None, :], mask=ok, other=float("-inf"))
    if PENALTY:
        s = tl.load(seen_ptr + rows[:, None].to(tl.int64) * V + cols[None, :], mask=ok, other=0) != 0
        x = tl.where(s, tl.where(x < 0, x * rep, x / rep), x)
    return x


@triton.jit
def _keys(x, ok):
    """float32 -> uint32 keys in the floats' order (-0.0 as +0.0; the sign bit flipped, and every bit of a
    negative float); 0 outside `ok`, below every float's key but a NaN's with its sign bit set."""
    bits = (x + 0.0).to(tl.int32, bitcast=True)
    flip = tl.where(bits < 0, -1, -2147483648)
    return tl.where(ok, (bits ^ flip).to(tl.uint32, bitcast=True), 0)


@triton.jit
def _key_value(key):
    """A _keys key back to its float32."""
    s = key.to(tl.int32, bitcast=True)  # negative where the float was not
    return (s ^ tl.where(s < 0, -2147483648, -1)).to(tl.float32, bitcast=True)


@triton.jit
def _kth_key(keys, k):
    """keys (R, N) uint32 -> each row's largest c with at least k keys >= c: its k-th largest key, or 0 where
    fewer than k keys are above 0. Bit by bit from the top; each bit kept when the count allows it."""
    c = tl.zeros((keys.shape[0],), tl.uint32)
    bit = tl.full((keys.shape[0],), 2147483648, tl.uint32)
    for _ in range(32):
        cand = c | bit
        n = tl.sum((keys >= cand[:, None]).to(tl.int32), 1)
        c = tl.where(n >= k, cand, c)
        bit = bit >> 1
    return c


@triton.jit
def _store_tile_top_k(x, ok, rows, row_ok, pid_n, NBLK, part_ptr, k, W: tl.constexpr):
    """The tile's k largest values per row as keys into its (row, pid_n) entry of the (B, NBLK, k) buffer: the keys
    above the tile's k-th largest in column order, then that key up to slot k (W >= k: a power of two)."""
    keys = _keys(x, ok)
    c = _kth_key(keys, k)
    above = keys > c[:, None]
    ranks = tl.cumsum(above.to(tl.int32), 1)  # 1-based slot of each key above c
    base = (rows[:, None].to(tl.int64) * NBLK + pid_n) * k
    tl.store(part_ptr + base + ranks - 1, keys.to(tl.int32, bitcast=True), mask=above & row_ok[:, None])
    n_above = tl.max(ranks, 1)
    slots = tl.arange(0, W)[None, :]
    fill = (slots >= n_above[:, None]) & (slots < k) & row_ok[:, None]
    filler = (c[:, None] + tl.zeros((1, W), tl.uint32)).to(tl.int32, bitcast=True)
    tl.store(part_ptr + base + slots, filler, mask=fill)


@triton.jit
def _max_kernel(
    logits_ptr,
    seen_ptr,
    pmax_ptr,
    part_ptr,
    B,
    V,
    row_stride,
    rep,
    k,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
    W: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)  # before any load: the LM head's logits are final
    pid_n = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < B
    ok = row_ok[:, None] & (cols < V)[None, :]
    x = penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY)
    m = tl.max(x, 1)
    if TOP_K:
        _store_tile_top_k(x, ok, rows, row_ok, pid_n, tl.num_programs(0), part_ptr, k, W)
    pdl_release(PDL)
    tl.store(pmax_ptr + pid_n * B + rows, m, mask=row_ok)


@triton.jit
def _threshold_kernel(part_ptr, kth_ptr, NBLK, k, CHUNK: tl.constexpr, RESIDENT: tl.constexpr, PDL: tl.constexpr):
    """Row program_id(0)'s k-th largest of its NBLK x k candidate keys, as a float."""
    pdl_start(PDL)  # before any load: the tiles' lists are final
    row = tl.program_id(0)
    n = NBLK * k
    base = part_ptr + row.to(tl.int64) * n
    idx = tl.arange(0, CHUNK)
    if RESIDENT:  # every candidate in registers, loaded once
        keys = tl.load(base + idx, mask=idx < n, other=0).to(tl.uint32, bitcast=True)
        c = _kth_key(keys[None, :], k)
    else:  # read again for each of the 32 counts, CHUNK at a time
        c = tl.zeros((1,), tl.uint32)
        bit = tl.full((1,), 2147483648, tl.uint32)
        for _ in range(32):
            cand = c | bit
            count = tl.zeros((1,), tl.int32)
            for c0 in range(0, n, CHUNK):
                at = c0 + idx
                keys = tl.load(base + at, mask=at < n, other=0).to(tl.uint32, bitcast=True)
                count += tl.sum((keys[None, :] >= cand[:, None]).to(tl.int32), 1)
            c = tl.where(count >= k, cand, c)
            bit = bit >> 1
    pdl_release(PDL)
    tl.store(kth_ptr + row + tl.arange(0, 1), _key_value(c))


def uses_kernel_threshold(params: SamplingParams, vocab: int) -> bool:
    """Whether the kernels find the top-k threshold (else there is none, or torch.topk finds it)."""
    return params.top_k is not None and params.top_k < vocab and params.top_k <= TOP_K_MAX


def torch_threshold(logits, seen, params: SamplingParams):
    """The k-th largest penalised logit of each row (B,) by torch.topk, or None without top-k (k >= V)."""
    if params.top_k is None or params.top_k >= logits.shape[1]:
        return None
    x = penalize(logits.float(), seen, params.repetition_penalty)
    return torch.topk(x, params.top_k, dim=-1).values[:, -1].contiguous()


def row_max_and_threshold_ref(logits, seen, params: SamplingParams):
    """-> (each row's maximum of the penalised logits (B,), the k-th largest of them (B,) or None without top-k)."""
    return penalize(logits.float(), seen, params.repetition_penalty).amax(dim=-1), torch_threshold(logits, seen, params)


def row_max_and_threshold(
    logits: torch.Tensor,
    seen,
    params: SamplingParams,
    block_m: int,
    block_v: int,
    num_warps: int,
    pdl: bool = False,
):
    """Launches 1 and 2 of the sampled choice on logits (B, V) float32 with contiguous rows, `seen` the (B, V)
    bool mask when the repetition penalty is on (else None): -> (the (NBLK, B) partial row maxima over column
    blocks of `block_v`, NBLK = cdiv(V, block_v); the (B,) float32 threshold, or None without top-k). One launch
    without top-k; with k > TOP_K_MAX the threshold from torch.topk."""
    B, V = logits.shape
    grid = (triton.cdiv(V, block_v), triton.cdiv(B, block_m))
    pmax = torch.empty((grid[0], B), dtype=torch.float32, device=logits.device)
    seen_arg = seen.view(torch.uint8) if seen is not None else logits  # never read without the penalty
    rep = params.repetition_penalty or 1.0
    in_kernel = uses_kernel_threshold(params, V)
    k = params.top_k if in_kernel else 1
    w = triton.next_power_of_2(k)
    parts = torch.empty((B, grid[0], k), dtype=torch.int32, device=logits.device) if in_kernel else pmax
    _max_kernel[grid](
        logits,
        seen_arg,
        pmax,
        parts,
        B,
        V,
        logits.stride(0),
        rep,
        k,
        BLOCK_M=block_m,
        BLOCK_V=block_v,
        PENALTY=seen is not None,
        TOP_K=in_kernel,
        W=w,
        PDL=bool(pdl),
        num_warps=num_warps,
        **pdl_launch(pdl),
    )
    if not in_kernel:
        return pmax, torch_threshold(logits, seen, params)  # None, or torch.topk's beyond TOP_K_MAX
    kth = torch.empty(B, dtype=torch.float32, device=logits.device)
    slots = triton.next_power_of_2(grid[0] * k)
    resident = slots <= RESIDENT_KEYS
    _threshold_kernel[(B,)](
        parts,
        kth,
        grid[0],
        k,
        CHUNK=slots if resident else KEY_CHUNK,
        RESIDENT=resident,
        PDL=bool(pdl),
        num_warps=max(4, min(16, slots // 1024)),  # 64 keys a thread at most
        **pdl_launch(pdl),
    )
    return pmax, kth
