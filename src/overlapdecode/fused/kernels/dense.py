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
/ 5.162. 33-47 rows are not measured. The rows reach cuBLAS normalised
(norm_linear.normalized_rows, one launch, as every swapped launch's rows already are, or handed over normalised by
the O or down epilogue before it: residual_norm.py).

Host syncs: none (no value-dependent Python branch); torch.mm is captured into the step's CUDA graph like the
kernels. A kernel launched after it under PDL waits for it whole (cuBLAS kernels trigger nothing early), so the
product is complete before any program loads it.
"""

from __future__ import annotations

import torch

from .swap_ab import ROW_TILE

DENSE_ROWS = 48  # from this many rows the QKV and linear_residual launches run dense (use_dense)


def use_dense(rows: int, n_out: int, K: int, dense: bool | None = None) -> bool:
    """Whether a swapped launch over `rows` rows of a (n_out, K) weight computes its product with cuBLAS
    (dense_product) and runs only its epilogue: `dense` if given, else the rule."""
    if dense is not None:
        return bool(dense)
    return rows > ROW_TILE and rows >= DENSE_ROWS


def dense_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x (B, K) @ w.T for w (N, K), as float32 (B, N) contiguous: on CUDA in one cuBLAS call that accumulates
    16-bit operands in float32 and writes float32 (`out_dtype`), elsewhere in float32 (CPU's mm has no out_dtype)."""
    if x.dtype == torch.float32:
        return torch.mm(x, w.t())
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return torch.mm(x.float(), w.float().t())
