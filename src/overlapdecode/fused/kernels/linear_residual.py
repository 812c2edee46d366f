"""A GEMV over all B rows with the residual add (and bias) in its epilogue: the attention output
projection and the MLP down-projection, which both end a residual branch.

K is long here (the MLP's intermediate size: 8192 at 1B, 14336 at 8B) and N short (the hidden size), so
N / BLOCK_N programs alone would leave most SMs idle; split-K gives each of SPLIT programs per column block
one K range. Partial sums go to a small float32 buffer (SPLIT, B, N), and a second, tiny kernel sums them in
a fixed order (deterministic, unlike atomics), adds the bias and the residual. With SPLIT = 1 the first
kernel finishes the job itself.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def linear_residual_ref(x, w, b, residual):
    """residual + (x @ w.T + b), the branch rounded to the residual's dtype first as the unfused model has it."""
    return residual + torch.nn.functional.linear(x, w, b)


def split_k(n_blocks: int, K: int, block_k: int, programs: int) -> int:
    """How many K ranges: enough programs to fill `programs` slots, each range at least 4 K tiles long."""
    split = 1
    while n_blocks * split < programs and K // (2 * split) >= 4 * block_k:
        split *= 2
    return split


@triton.jit
def _linear_partial_kernel(
    x_ptr, w_ptr, b_ptr, res_ptr, out_ptr, part_ptr,
    B, N, K: tl.constexpr, K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rows = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < B
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    k_lo = pid_k * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_CHUNK, BLOCK_K):  # constant trip count (K is a compile-time constant per matrix)
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        xv = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_ptr + cols[:, None] * K + kk[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(xv, tl.trans(wt), input_precision="ieee")
    out_ok = row_ok[:, None] & col_ok[None, :]
    if SPLIT == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        dtype = out_ptr.dtype.element_ty
        res = tl.load(res_ptr + rows[:, None] * N + cols[None, :], mask=out_ok, other=0.0).to(tl.float32)
        tl.store(out_ptr + rows[:, None] * N + cols[None, :], (res + acc.to(dtype).to(tl.float32)).to(dtype),
                 mask=out_ok)
    else:
        tl.store(part_ptr + (pid_k * B + rows[:, None]) * N + cols[None, :], acc, mask=out_ok)


@triton.jit
def _reduce_residual_kernel(
    part_ptr, b_ptr, res_ptr, out_ptr, B, N,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # over B * N
    ok = offs < B * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT):  # fixed order: deterministic
        acc += tl.load(part_ptr + s * B * N + offs, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs % N, mask=ok, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    res = tl.load(res_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs, (res + acc.to(dtype).to(tl.float32)).to(dtype), mask=ok)


def linear_residual(x, w, b, residual, block_n: int = 32, block_k: int = 128, programs: int | None = None,
                    num_warps: int = 4, num_stages: int = 3):
    """The Triton kernels of `linear_residual_ref`: x (B, K), w (N, K) row-major, residual (B, N)."""
    B, K = x.shape
    N = w.shape[0]
    out = torch.empty_like(residual)
    n_blocks = triton.cdiv(N, block_n)
    if programs is None:
        programs = 4 * torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 1
    split = split_k(n_blocks, K, block_k, programs)
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    # with one split the partial buffer is never written: pass a read-only input, not an alias of `out`
    part = torch.empty((split, B, N), dtype=torch.float32, device=x.device) if split > 1 else residual
    dummy_b = b if b is not None else w
    _linear_partial_kernel[(n_blocks, split, triton.cdiv(B, 16))](
        x, w, dummy_b, residual, out, part, B, N, K, k_chunk,
        SPLIT=split, HAS_BIAS=b is not None, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    if split > 1:
        block = 1024
        _reduce_residual_kernel[(triton.cdiv(B * N, block),)](
            part, dummy_b, residual, out, B, N, SPLIT=split, HAS_BIAS=b is not None, BLOCK=block,
        )
    return out
