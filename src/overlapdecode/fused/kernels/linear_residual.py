"""A GEMV over all B rows with the residual add (and bias) in its epilogue: the attention output
projection and the MLP down-projection, which both end a residual branch.

K is long here (the MLP's intermediate size: 8192 at 1B, 14336 at 8B) and N short (the hidden size), so
N / BLOCK_N programs alone would leave most SMs idle; split-K gives each of SPLIT programs per column block
one K range. Partial sums go to a small float32 buffer (SPLIT, B, N); the program that finishes its column
block last (a ticket counter, `Tickets`) sums them in a fixed order (deterministic, unlike atomic adds of
floats), adds the bias and the residual, and resets the counter: one launch, no second kernel. With
SPLIT = 1 the one program of a column block finishes the job itself. From 17 rows on the step runs it in dense
form (dense.py: cuBLAS's product, this kernel's epilogue); asked for (`swap=True`) the tile is swapped (the weight
rows as the MMA's M, every row of the batch as its N: swap_ab.py), so the weights are read once for up to 128 rows
instead of once per 16.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...quant.packed import dense_weight
from . import dense as dense_gemm
from .packed_weights import check_block_k, refuse_dense, weight_launch, weights_dot
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import (
    ROW_TILE,
    acc_rows,
    acc_zeros,
    fit_k,
    row_tile,
    sm_count,
    split_k,
    split_limit,
    swap_tiles,
    use_swap,
)


def linear_residual_ref(x, w, b, residual, res_scale: float | None = None, then_norm: tuple | None = None):
    """residual + (x @ w.T + b), the branch rounded to the residual's dtype first as the unfused model has it;
    `res_scale` (Granite's residual_multiplier): the branch times it (rounded) before the add; `residual` None: the
    branch alone (a layer that normalises it before adding it, kernels/norm_residual.py). `then_norm`: the norm
    that reads the result next, which the kernels may apply in the same launch (kernels/residual_norm.py); the
    reference leaves it to the reader."""
    y = torch.nn.functional.linear(x, dense_weight(w), b)
    if res_scale is not None:
        y = y * res_scale
    return y if residual is None else residual + y


class Tickets:
    """The ticket counters of the split-K kernels of one device: int32 zeros, one per output tile. A split
    program takes a ticket after storing its partial sums; the program that draws the last one reduces the
    tile and puts the counter back to 0, so the buffer is all zeros between launches and one buffer serves
    every launch of a stream in turn: kernels of one stream do not overlap, and under programmatic dependent
    launch (pdl.py) a kernel that starts early touches nothing before its `gdc_wait`, i.e. before the kernel
    ahead has finished. Owned by whoever owns the stream's steps (a FusedModel): two streams must not share
    one."""

    SIZE = 1 << 16

    def __init__(self, device):
        self.counters = torch.zeros(self.SIZE, dtype=torch.int32, device=device)
        torch._dynamo.mark_static_address(self.counters)  # a CUDA graph reads it in place

    def take(self, n: int) -> torch.Tensor:
        if n > self.SIZE:
            raise ValueError(f"a launch needs {n} ticket counters, more than the {self.SIZE} a Tickets holds")
        return self.counters


def require_contiguous(**tensors) -> None:
    """The kernels index these row-major from their first element: a strided view would be read wrong,
    silently, so it is refused (ValueError naming it). Host-side only: a replayed graph never runs it."""
    for name, t in tensors.items():
        if t is not None and not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (shape {tuple(t.shape)}, strides {t.stride()})")


def require_cache_group(cache_group, rows: int, k_cache) -> None:
    """A launch over `rows` query rows that address the KV cache by row (norm_qkv, qk_norm_rope, decode attention):
    row r reads and writes cache row r // cache_group, so k_cache must hold rows / cache_group rows (the verify
    step's T tokens per cache row; 1: a row each); else a ValueError naming cache_group. Host-side only."""
    if isinstance(cache_group, bool) or not isinstance(cache_group, int) or cache_group < 1:
        raise ValueError(f"cache_group must be an int >= 1 (query rows per cache row), got {cache_group!r}")
    if k_cache.shape[0] * cache_group != rows:
        raise ValueError(
            f"cache_group: {rows} query rows need k_cache rows x cache_group = {rows}, got {k_cache.shape[0]} x "
            f"{cache_group} (k_cache shape {tuple(k_cache.shape)})"
        )


def require_32bit(**tensors) -> None:
    """Contiguous (require_contiguous) and indexed with 32-bit offsets: fewer than 2**31 elements (the largest
    matrix of a supported model, Llama-3-405B's LM head, has 2.10e9), else a ValueError naming it."""
    require_contiguous(**tensors)
    for name, t in tensors.items():
        if t is not None and t.numel() >= 2**31:
            raise ValueError(f"{name} has {t.numel()} elements: the kernels' 32-bit offsets reach 2**31 - 1")


def take_tickets(tickets: Tickets | None, n: int, device) -> torch.Tensor:
    """`n` zeroed counters: from `tickets`, or fresh zeros (one fill kernel more) without."""
    return tickets.take(n) if tickets is not None else torch.zeros(n, dtype=torch.int32, device=device)


@triton.jit
def last_of_split(ticket_ptr, tile, n):
    """True in the program that finishes a split tile last, of the `n` programs that take a ticket for it
    (a constexpr split count, or a count known only at run time), after storing its own partial sums. The
    barrier makes every thread's stores precede the ticket, and acq_rel makes the other programs' stores
    visible to the last one; its loads of the partials must bypass L1 (cache_modifier=".cg")."""
    tl.debug_barrier()
    ticket = tl.atomic_add(ticket_ptr + tile, 1, sem="acq_rel", scope="gpu")
    return ticket == n - 1


@triton.jit
def residual_finish(
    acc,
    rows,
    cols,
    col_ok,
    out_ok,
    b_ptr,
    res_ptr,
    N,
    dtype: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    RES_SCALE: tl.constexpr,
):
    """The epilogue of a (rows, cols) tile of the float32 product: bias, the branch rounded to `dtype` (times
    Granite's residual scale, rounded again), plus the residual (or the branch alone), rounded: what
    linear_residual_ref computes, in `dtype`."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RES and RES_SCALE is None:
        res = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=out_ok, other=0.0).to(tl.float32)
        y = (res + acc.to(dtype).to(tl.float32)).to(dtype)
    else:
        branch = acc.to(dtype).to(tl.float32)
        if RES_SCALE is not None:  # Granite's residual_multiplier, the product rounded as the unfused model has it
            branch = (branch * RES_SCALE).to(dtype).to(tl.float32)
        if HAS_RES:
            res = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=out_ok, other=0.0).to(tl.float32)
            y = (res + branch).to(dtype)
        else:
            y = branch.to(dtype)
    return y


@triton.jit
def _linear_split_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    res_ptr,
    out_ptr,
    part_ptr,
    ticket_ptr,
    ss_ptr,
    B,
    N,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SUMS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    SWAP: tl.constexpr,
    HAS_RES: tl.constexpr,
    RES_SCALE: tl.constexpr,
    PRODUCT: tl.constexpr = 0,
    s_ptr=None,
    z_ptr=None,
    QUANT: tl.constexpr = 0,
    GROUP: tl.constexpr = 0,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < B
    col_ok = cols < N
    out_ok = row_ok[:, None] & col_ok[None, :]
    if PRODUCT:  # dense.py: the float32 product (B, N), in PRODUCT pieces, is at part_ptr; only the epilogue is left
        acc = dense_gemm.product_tile(part_ptr, rows[:, None] * N + cols[None, :], out_ok, B * N, PRODUCT)
        pdl_release(PDL)
    else:
        ks = tl.arange(0, BLOCK_K)
        k_lo = pid_k * K_CHUNK
        k_hi = tl.minimum(k_lo + K_CHUNK, K)
        acc = acc_zeros(BLOCK_M, BLOCK_N, SWAP)
        dtype = x_ptr.dtype.element_ty  # a packed weight's tile is dequantized to it (packed_weights.py)
        for k0 in range(0, K_CHUNK, BLOCK_K):  # constant trip count (K is a compile-time constant per matrix)
            kk = k_lo + k0 + ks
            k_ok = kk < k_hi
            xv = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            acc = weights_dot(
                acc, xv, w_ptr, s_ptr, z_ptr, cols, col_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype, SWAP
            )
        pdl_release(PDL)
        acc = acc_rows(acc, SWAP)  # (BLOCK_M, BLOCK_N) from here on
    finish = True
    if SPLIT > 1:
        tl.store(part_ptr + (pid_k * B + rows[:, None]) * N + cols[None, :], acc, mask=out_ok)
        tile = tl.program_id(2) * tl.num_programs(0) + pid_n
        finish = last_of_split(ticket_ptr, tile, SPLIT)
        if finish:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT):  # fixed order: deterministic, whichever program came last
                acc += tl.load(
                    part_ptr + (s * B + rows[:, None]) * N + cols[None, :], mask=out_ok, other=0.0, cache_modifier=".cg"
                )
            tl.store(ticket_ptr + tile, 0)  # back to zero for the next launch
    if finish:
        y = residual_finish(
            acc, rows, cols, col_ok, out_ok, b_ptr, res_ptr, N, out_ptr.dtype.element_ty, HAS_BIAS, HAS_RES, RES_SCALE
        )
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], y, mask=out_ok)
        if SUMS:  # the rows' sums of squares over this column block, of the values as stored (NormSums)
            yf = tl.where(out_ok, y.to(tl.float32), 0.0)
            tl.store(ss_ptr + pid_n * B + rows, tl.sum(yf * yf, 1), mask=row_ok)


def linear_residual(
    x,
    w,
    b,
    residual,
    block_n: int | None = None,
    block_k: int | None = None,
    programs: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    tickets: Tickets | None = None,
    pdl: bool = False,
    out: torch.Tensor | None = None,
    norm_sums=None,
    swap: bool | None = None,
    res_scale: float | None = None,
    dense: bool | None = None,
    then_norm: tuple | None = None,
):
    """The Triton kernel of `linear_residual_ref`: x (B, K), w (N, K) row-major, residual (B, N) or None (the
    branch alone, which records no norm sums); `res_scale`: as there, a constexpr of the launch.
    `swap`: the swapped tile (swap_ab.py; default from 17 rows on where not dense); the tile keywords left None are
    the row-block kernel's defaults (32 x 128, 4 warps, 3 stages) or, swapped, swap_ab.swap_tiles's.
    `programs`: the grid size split-K aims at (default 2 x the SMs, or swapped swap_tiles's: one per SM); `tickets`: the counters of the split
    (default: fresh zeros, which costs a fill per call; the fused step passes its own); `pdl`: programmatic
    dependent launch (pdl.py; sm_90+); `out`: a contiguous tensor like `residual` to write the
    result into (a symmetric-memory buffer under tp), returned. `norm_sums` (norm_prologue.NormSums): record the
    output rows' sums of squares per column block there, for the RMSNorm that reads the output next. `dense`: the
    product by cuBLAS and this kernel's epilogue alone (dense.py; None: dense.use_dense's rule). `then_norm`: the norm
    that reads the output next, as for linear_residual_ref: not applied here (residual_norm.linear_residual_norm, the
    step's launch, applies it in the same launch where it can). `w` may be a PackedWeight (quant/packed.py:
    dequantized in registers after each load, packed_weights.py), which never takes the dense form: from 17 rows
    it runs swapped tiles."""
    w, packed = weight_launch(w)
    require_32bit(x=x, w=w, b=b, residual=residual)
    B, K = x.shape
    N = w.shape[0]
    has_res = residual is not None
    if not has_res:
        residual, norm_sums = torch.empty((B, N), dtype=x.dtype, device=x.device), None  # never read
    swapped = use_swap(B, swap)
    product = dense_gemm.use_dense(B, N, K, dense, swap, x.element_size())
    if packed["QUANT"]:
        refuse_dense(dense)
        product = False
    if product:  # the epilogue over the product's (16 x 64) tiles: no K loop, no split
        tiles = dict(block_m=ROW_TILE, block_n=64, block_k=16, num_warps=4, num_stages=1, programs=1)
        swapped = False
        block_n = block_k = programs = num_warps = num_stages = None  # tile keywords are the GEMV's, not the epilogue's
    elif swapped:
        tiles = swap_tiles(B, N, K, x.element_size(), 1, sm_count(x.device))
    else:
        block_m = row_tile(B, w.element_size())
        tiles = dict(
            block_m=block_m,
            block_n=32,
            block_k=fit_k(block_m, 32, 128),
            num_warps=4,
            num_stages=3,
            programs=2 * sm_count(x.device),
        )
    if programs is None:
        programs = tiles["programs"] if x.is_cuda else 1
    block_m = tiles["block_m"]
    block_n = block_n or tiles["block_n"]
    block_k = block_k or tiles["block_k"]
    check_block_k(packed, block_k, x)
    num_warps = num_warps or tiles["num_warps"]
    num_stages = num_stages or tiles["num_stages"]
    n_blocks = triton.cdiv(N, block_n)
    sums = norm_sums.buffer(n_blocks, B, x.device, out) if norm_sums is not None else None
    if out is None:
        out = torch.empty_like(residual)
    elif out.shape != residual.shape or out.dtype != residual.dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {residual.dtype} tensor of shape {tuple(residual.shape)}")
    split = 1 if product else split_k(n_blocks, K, block_k, programs)
    if swapped:
        split = min(split, split_limit(B, K, x.element_size()))
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    row_blocks = triton.cdiv(B, block_m)
    if product:
        part, pieces = dense_gemm.dense_product(x, w)
        counters = residual
    elif split > 1:
        part = torch.empty((split, B, N), dtype=torch.float32, device=x.device)
        counters = take_tickets(tickets, n_blocks * row_blocks, x.device)
    else:  # never written with one split: pass read-only inputs, not aliases of `out`
        part, counters = residual, residual
    _linear_split_kernel[(n_blocks, split, row_blocks)](
        x,
        w,
        b if b is not None else w,
        residual,
        out,
        part,
        counters,
        sums if sums is not None else part,
        B,
        N,
        K,
        k_chunk,
        SPLIT=split,
        HAS_BIAS=b is not None,
        SUMS=sums is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        PDL=bool(pdl),
        SWAP=swapped,
        HAS_RES=has_res,
        RES_SCALE=None if res_scale is None else float(res_scale),
        PRODUCT=pieces if product else 0,
        num_warps=num_warps,
        num_stages=num_stages,
        **packed,
        **pdl_launch(pdl),
    )
    if sums is not None:
        norm_sums.record(out, sums)
    return out
