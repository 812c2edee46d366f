"""A projection's product through cuBLAS, its epilogue still the fused kernel's: the "dense" form of a swapped launch.

Why: from a few dozen rows a swapped Triton GEMV (swap_ab.py) reads its weights once, but each of its programs
also reads every row of x for its K range, and its main loop is a plain pipelined `tl.dot`; at 64-128 rows the
small projections (QKV, O) took a multiple of cuBLAS's time for the same product alone (docs/KERNELS.md, "Dense
form"). In dense form the launch becomes two: `torch.mm` writes the float32 product x @ w.T (B, N) (cuBLAS, 16-bit
operands accumulated in float32: the accumulator a Triton program holds), and the kernel of the same launch runs
with PRODUCT set: it loads its tile of that product instead of computing it, and runs its own epilogue unchanged
(bias, rounding, RoPE and the cache write, the residual add, the norm sums), so every family the kernel serves is
served the same way.

Which launches take it (`use_dense`): every QKV and every linear_residual launch (O, down) from DENSE_ROWS rows
on; gate/up and the LM head keep their fused GEMVs (their float32 products, 2 x the intermediate size or the
vocabulary wide, would cost more to write and read back than cuBLAS saves; not measured). DENSE_ROWS is 17,
wherever the launch would swap: in the step dense was as fast or faster from 17 rows at the Llama-1B shape, and at
64 rows at Llama-3-8B's, the shapes measured (docs/KERNELS.md, "Dense form"; results/h200/llama-1b-dense-rows). A
caller that names the GEMV's tile form (`swap`) gets it, not the dense form. Float32 weights take it from 2 rows:
the kernels multiply float32 on the CUDA cores (no tensor cores at "ieee" precision), where cuBLAS's float32 GEMM
is faster from 2 rows on (GPT-2 shape, the step at 2, 4, 8 and 16 rows: docs/KERNELS.md, "Float32 weights"); at one
row the kernels' broadcast product (swap_ab.row_tile) reads the weights at less cost. The rows reach cuBLAS normalised
(norm_prologue.normalized_rows, one launch, as every swapped launch's rows already are, or handed over normalised by
the O or down epilogue before it: residual_norm.py).

The product in pieces of K (`pieces_for`): cuBLAS tiles a product of 64-128 rows into few output tiles where
the weight has few rows, fewer than the SMs; with K cut in two, `torch.bmm` writes two float32 partial products
(2, B, N) and the epilogue adds them in a fixed order (`product_tile`). The rule comes from those products timed
alone and in the step at the Llama-1B and Llama-3-8B shapes (docs/KERNELS.md, "Dense form";
results/h200/llama-dense-pieces).

Host syncs: none (no value-dependent Python branch); torch.mm is captured into the step's CUDA graph like the
kernels. A kernel launched after it under PDL waits for it whole (cuBLAS kernels trigger nothing early), so the
product is complete before any program loads it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .swap_ab import ROW_TILE, sm_count

DENSE_ROWS = 17  # from this many rows the QKV and linear_residual launches run dense (use_dense)
PIECE_COLUMNS = 32  # weight rows per SM below which K is cut in two (pieces_for)
MIN_PIECE = 1024  # the shortest K piece


def use_dense(
    rows: int, n_out: int, K: int, dense: bool | None = None, swap: bool | None = None, elt_bytes: int = 2
) -> bool:
    """Whether a launch over `rows` rows of a (n_out, K) weight of `elt_bytes`-byte elements computes its product
    with cuBLAS (dense_product) and runs only its epilogue: `dense` if given; else not where the caller chose the
    GEMV's tile form (`swap` given); else the rule: from DENSE_ROWS rows, or from 2 rows for 4-byte weights."""
    if dense is not None:
        return bool(dense)
    if swap is not None:
        return False
    if elt_bytes >= 4:
        return rows > 1
    return rows > ROW_TILE and rows >= DENSE_ROWS


def pieces_for(n_out: int, K: int, sms: int) -> int:
    """Pieces of K the dense product of a (n_out, K) weight is computed in: 2 where the weight has at most
    PIECE_COLUMNS rows per SM (cuBLAS's few output tiles leave SMs idle) and each piece is at least MIN_PIECE long,
    else 1 (see the module docstring)."""
    return 2 if n_out <= PIECE_COLUMNS * sms and K % 2 == 0 and K // 2 >= MIN_PIECE else 1


def dense_product(x: torch.Tensor, w: torch.Tensor, pieces: int | None = None) -> tuple[torch.Tensor, int]:
    """x (B, K) @ w.T for w (N, K), as float32 contiguous, and the pieces of K it is in: `pieces` if given, else
    pieces_for's on x's device. With one piece the product (B, N), with more (K divisible by them) the partial
    products over its K pieces, (pieces, B, N), which product_tile adds. On CUDA one cuBLAS call that accumulates
    16-bit operands in float32 and writes float32 (`out_dtype`), elsewhere in float32 (CPU's mm has no
    out_dtype)."""
    (B, K), N = x.shape, w.shape[0]
    if pieces is None:
        pieces = pieces_for(N, K, sm_count(x.device))
    if not x.is_cuda or x.dtype == torch.float32:
        x, w, kw = x.float(), w.float(), {}
    else:
        kw = dict(out_dtype=torch.float32)
    if pieces == 1:
        return torch.mm(x, w.t(), **kw), 1
    if K % pieces:
        raise ValueError(f"pieces ({pieces}) must divide K ({K})")
    k = K // pieces
    return torch.bmm(x.view(B, pieces, k).permute(1, 0, 2), w.view(N, pieces, k).permute(1, 2, 0), **kw), pieces


@triton.jit
def product_tile(part_ptr, offs, mask, plane, PIECES: tl.constexpr):
    """A tile of the dense product at offsets `offs` of its (B, N) plane: the sum of its PIECES partial products
    (planes `plane` = B * N elements apart), in the order 0, 1, ... (deterministic)."""
    acc = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for p in tl.static_range(1, PIECES):
        acc += tl.load(part_ptr + p * plane + offs, mask=mask, other=0.0)
    return acc
