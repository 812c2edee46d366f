"""A projection's product through cuBLAS, its epilogue still the fused kernel's: the "dense" form of a swapped launch.

Why: from a few dozen rows a swapped Triton GEMV (swap_ab.py) reads its weights once, but each of its programs
also reads every row of x for its K range, and its main loop is a plain pipelined `tl.dot`; at 64-128 rows the
small projections (QKV, O) took 2-2.5x cuBLAS's time for the same product alone (scripts/swap_sweep.py, H200,
Llama-1B shape: QKV at 128 rows 16.7 us against 6.8). In dense form the launch becomes two: `torch.mm` writes the
float32 product x @ w.T (B, N) (cuBLAS, 16-bit operands accumulated in float32: the accumulator a Triton program
holds), and the kernel of the same launch runs with PRODUCT set: it loads its tile of that product instead of
computing it, and runs its own epilogue unchanged (bias, rounding, RoPE and the cache write, the residual add, the
norm sums), so every family the kernel serves is served the same way.

Which launches take it (`use_dense`): every QKV and every linear_residual launch (O, down) from DENSE_ROWS rows
on; gate/up and the LM head keep their fused GEMVs (their float32 products, 2 x the intermediate size or the
vocabulary wide, would cost more to write and read back than cuBLAS saves; not measured). Measured in one process
(scripts/scale_sweep.py --variants, H200, bfloat16, ms/step, two rounds each; results/h200/llama-1b-dense-rows and
llama-8b-dense-64-rows): at the Llama-1B shape, fused launches against all three dense, 32 rows 1.060 / 1.100
against 1.155 / 1.138 (dense loses), 48 rows 1.221 / 1.211 against 1.191 / 1.186, 64 rows 1.263 / 1.265 against
1.215 / 1.212, 96 rows 1.482 / 1.474 against 1.330 / 1.322, 128 rows 1.597 / 1.599 against 1.431 / 1.443 (QKV
alone dense 1.531 / 1.530, QKV and O 1.458 / 1.481); at the Llama-3-8B shape, 64 rows 5.656 / 5.580 against 5.141
/ 5.162. That was with the dense launches of the time; with the products in pieces (below), the next norm in the
O and down epilogues (residual_norm.py) and the direct attention tiles, dense wins from 24 rows too (24 rows 1.084 /
1.088 -> 0.892 / 1.011, 32 rows 1.120 / 1.123 -> 0.971 / 1.036, 40 rows 1.217 / 1.221 -> 1.074 / 1.075; f51e95f,
results/h200/llama-1b-dense-rows/rule-from-17), so DENSE_ROWS is 17, wherever the launch would swap (then at 17
rows 1.062 / 1.133 -> 1.004 / 0.998, at 20 rows 1.089 / 1.036 -> 1.033 / 1.036: rule-17-20); other shapes were
not measured below 64 rows. A caller that names the GEMV's tile form (`swap`) gets it, not
the dense form. The rows reach cuBLAS normalised
(norm_linear.normalized_rows, one launch, as every swapped launch's rows already are, or handed over normalised by
the O or down epilogue before it: residual_norm.py).

The product in pieces of K (`pieces_for`): cuBLAS tiles a product of 64-128 rows into few output tiles where
the weight has few rows (H200: 64 x 32 and 24 x 64 tiles at the Llama-1B shape), fewer than the SMs; with K cut
in two, `torch.bmm` writes two float32 partial products (2, B, N) and the epilogue adds them in a fixed order
(`product_tile`). Measured alone on an H200 (bfloat16, whole K against two pieces, us; scripts/dense_pieces_sweep.py,
results/h200/llama-dense-pieces): Llama-1B shape at 64 rows
QKV 6.68 -> 6.26, O 6.17 -> 5.37, down 14.33 -> 11.67 (cuBLAS's own split-K reduction launch gone); at 128 rows
7.03 -> 6.24, 6.69 -> 5.41, 17.19 -> 14.33; Llama-3-8B shape at 64 / 128 rows O 11.68 -> 11.79 / 14.03 -> 12.37,
down 36.64 -> 34.35 / 39.89 -> 36.61, and QKV (6144 rows) 16.46 -> 16.48 / 17.54 -> 18.17, which the rule leaves
whole.

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


def use_dense(rows: int, n_out: int, K: int, dense: bool | None = None, swap: bool | None = None) -> bool:
    """Whether a launch over `rows` rows of a (n_out, K) weight computes its product with cuBLAS (dense_product) and
    runs only its epilogue: `dense` if given; else not where the caller chose the GEMV's tile form (`swap` given);
    else the rule, from DENSE_ROWS rows."""
    if dense is not None:
        return bool(dense)
    return swap is None and rows > ROW_TILE and rows >= DENSE_ROWS


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
