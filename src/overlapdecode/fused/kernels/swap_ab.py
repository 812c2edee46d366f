"""The swapped orientation of the fused GEMV kernels ("swap-AB") and the rule that chooses it and its tiles.

Why: the row-block kernels compute a (16 rows x BLOCK_N outputs) tile per program, `tl.dot(x, w^T)`, with the
batch as the MMA's M. Past 16 rows they launch one grid per 16 rows, and each grid reads the whole weight matrix
again (from HBM: a layer's matrices are larger than the L2): at 64 rows four times, at 128 rows eight. Swapped,
a program holds a tile of BLOCK_N weight rows as the MMA's M (32 to 128; from 64 a Hopper warpgroup MMA) and
all the rows of the batch, padded to a power of two from 16 to 128, as its N: `tl.dot(w, x^T)`, acc
(BLOCK_N, BLOCK_M). Each weight byte is then read once for up to 128 rows, on tensor cores in 16-bit dtypes,
and the same prologues and epilogues (norm, RoPE and the cache write, SiLU-mul, GELU, bias, residual, the norm
sums) run on the transposed accumulator (`acc_rows`), so nothing else of a kernel changes.

The rule (`use_swap`, `swap_tiles`), from the row count and the weight's shape:
- swapped from 17 rows on: up to 16 rows one row block already reads the weights once, and its tiles are the
  measured ones (docs/KERNELS.md);
- BLOCK_M = the rows rounded up to a power of two, 16 .. 128 (more rows: several row blocks of 128);
- the weight rows per program (BLOCK_N times the accumulators' pairing: gate/up's and QKV's two rows of a pair are
  one tile, `pair_rows`): the widest of 128, 64 and 32 that still gives every SM a tile unsplit; where none does,
  64 if the split that fills the SMs with 64-row tiles leaves each program at least twice the pipeline's depth of
  K tiles (Llama-1B's down projection, K 8192), else 32 (its O projection, K 2048: 64-row tiles would need K
  ranges of 4 tiles); 8 warps at 128 weight rows or 128 batch rows (4 would spill the accumulator's epilogue:
  tests/fused/test_kernel_compile.py), else 4. Why: each program reads every batch row of x for its K range, so the
  widest tile moves the fewest bytes, while the GPU is full and each program's loads still overlap;
- K tiles of 64, 4 stages, K tiles halved while a pipeline stage (at 128 weight rows) exceeds the shared-memory
  budget; where the weight has more tiles than the GPU has SMs (the LM head), the deepest pipeline at which two
  programs share an SM's shared memory (`two_per_sm`: at 128 rows the LM head's 4 stages of 32 KB left one
  program per SM);
- split-K (`split_k`, as the row-block kernels) until the grid reaches one program per SM, but never so far
  that the float32 partial sums (SPLIT x B x N) outweigh the weight bytes they serve.
Each projection alone at 64 and 128 rows against cuBLAS and a plain Triton GEMM of the same orientation:
scripts/swap_sweep.py; the figures are in docs/KERNELS.md, "Swapped tiles from 17 rows on".
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

ROW_TILE = 16  # rows per program of the row-block kernels (the MMA's smallest M, and N)
MAX_BATCH_TILE = 128  # rows per program of the swapped kernels
SMEM_BUDGET = 160 * 1024  # bytes of shared memory a swapped kernel's pipeline may take (H100/H200: 227 KB)
WEIGHT_TILES = (128, 64, 32)  # weight rows per swapped program, widest first (swap_tiles)
SM_SMEM = 228 * 1024  # shared memory of one SM (H100/H200), shared by the programs resident on it
PRODUCT_ELEMENTS = 8192  # float32 values of one broadcast product (acc_dot): 64 registers a thread at 4 warps
TWO_PER_SM = True  # swap_tiles: with more tiles than SMs, a pipeline shallow enough for two programs per SM


def use_swap(rows: int, swap: bool | None = None) -> bool:
    """Whether a launch over `rows` rows runs swapped: `swap` if given, else from ROW_TILE + 1 rows on."""
    return rows > ROW_TILE if swap is None else bool(swap)


def use_prenorm(rows: int, packed: bool = False) -> bool:
    """Whether a launch over `rows` rows multiplies rows normalised beforehand (norm_prologue.normalized_rows,
    one launch more) instead of normalising each K tile in registers: wherever the launch would swap by default
    (from ROW_TILE + 1 rows), since then x reaches shared memory by asynchronous copies like the weights, where the
    register-normalised tile is stored there by the program in every K step (results/h200/llama-1b-prenorm-rows;
    docs/KERNELS.md, "Rows normalised beforehand"); and at any row count for `packed` (quantized) weights, whose
    row-block loops are bound by their instructions, not by memory: those stores and the tile's normalisation are
    about a sixth of their K step (scripts/sass_counts.py --prenorm)."""
    return rows > ROW_TILE or packed


def row_tile(rows: int, elt_bytes: int) -> int:
    """BLOCK_M of a row-block launch over `rows` rows of weights of `elt_bytes` bytes: ROW_TILE for 16-bit
    weights, whose tl.dot runs on tensor cores, where padding the rows to 16 costs nothing in a memory-bound step;
    for 4-byte weights the rows rounded up to a power of two, since a float32 product runs on the CUDA cores
    (input_precision "ieee": no tensor cores), where each padded row is a row of multiply-adds, and under 16 rows
    the product is a broadcast multiply summed over K (acc_dot)."""
    if elt_bytes >= 4:
        return min(ROW_TILE, triton.next_power_of_2(max(rows, 1)))
    return ROW_TILE


def fit_k(block_m: int, block_n: int, block_k: int) -> int:
    """The K tile of a row-block launch of `block_m` rows: `block_k`, halved (to 16 at least) while a broadcast
    product (block_m < ROW_TILE, acc_dot) would hold more than PRODUCT_ELEMENTS float32 values at once."""
    while block_m < ROW_TILE and block_k > 16 and block_m * block_n * block_k > PRODUCT_ELEMENTS:
        block_k //= 2
    return block_k


def batch_tile(rows: int) -> int:
    """BLOCK_M of a swapped launch: the rows rounded up to a power of two, at least 16 (tl.dot's N), at most 128."""
    return min(MAX_BATCH_TILE, max(ROW_TILE, triton.next_power_of_2(rows)))


def swap_tiles(rows: int, n_out: int, K: int, elt_bytes: int, accs: int, sms: int, stages: int = 4) -> dict:
    """Tile keywords of a swapped launch (block_m, block_n, block_k, num_warps, num_stages, programs: the grid
    split-K aims at) for a weight of `n_out` output rows per accumulator (`accs` of them paired in one tile:
    gate/up 2, QKV's two halves of a head 2) and K inputs of `elt_bytes` bytes each, on a GPU of `sms` SMs (see the
    module docstring)."""
    block_m = batch_tile(rows)
    block_k = 64
    while block_k > 16 and (128 + block_m) * block_k * elt_bytes * stages > SMEM_BUDGET:
        block_k //= 2
    tile = next((t for t in WEIGHT_TILES if triton.cdiv(accs * n_out, t) >= sms), None)
    if tile is None:  # no width fills the SMs unsplit: 64 if its split leaves each program a pipelined K loop
        split = split_k(triton.cdiv(accs * n_out, 64), K, block_k, sms)
        tile = 64 if K // split >= 2 * stages * block_k else 32
    elif TWO_PER_SM and triton.cdiv(accs * n_out, tile) > sms:
        while stages > 2 and 2 * stages * (tile + block_m) * block_k * elt_bytes > SM_SMEM:
            stages -= 1
    return dict(
        block_m=block_m,
        block_n=tile // accs,
        block_k=block_k,
        num_warps=8 if tile == 128 or block_m == MAX_BATCH_TILE else 4,
        num_stages=stages,
        programs=sms,
    )


def split_k(n_blocks: int, K: int, block_k: int, programs: int) -> int:
    """How many K ranges: enough programs to fill `programs` slots, each range at least 4 K tiles long."""
    split = 1
    while n_blocks * split < programs and K // (2 * split) >= 4 * block_k:
        split *= 2
    return split


def split_limit(rows: int, K: int, elt_bytes: int) -> int:
    """The largest power-of-two split whose float32 partial sums (split x rows x N) weigh no more than the weights
    (N x K)."""
    most = max(1, (K * elt_bytes) // (4 * rows))
    return 1 << (most.bit_length() - 1)


@triton.jit
def acc_zeros(BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWAP: tl.constexpr):
    """A float32 accumulator of BLOCK_M rows x BLOCK_N outputs: (BLOCK_M, BLOCK_N), or swapped its transpose."""
    if SWAP:
        return tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        return tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


@triton.jit
def acc_dot(acc, x, w, SWAP: tl.constexpr):
    """acc + x @ w^T for x (BLOCK_M, BLOCK_K) and w (BLOCK_N, BLOCK_K), in acc's orientation: swapped, the weight
    tile is the MMA's M and the rows its N (w @ x^T). Under 16 rows (row_tile's float32 tiles; tl.dot takes 16 at
    least) a broadcast multiply summed over K, so that no padded row is multiplied."""
    if SWAP:
        return tl.dot(w, tl.trans(x), acc, input_precision="ieee")
    elif x.shape[0] < 16:
        return acc + tl.sum(x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :], 2)
    else:
        return tl.dot(x, tl.trans(w), acc, input_precision="ieee")


@triton.jit
def acc_rows(acc, SWAP: tl.constexpr):
    """The accumulator as (BLOCK_M rows, BLOCK_N outputs), for the epilogues, whichever its orientation."""
    if SWAP:
        return tl.trans(acc)
    else:
        return acc


@triton.jit
def pair_rows(a, b, HALF: tl.constexpr):
    """(2 * HALF,) from two (HALF,) tensors, interleaved: a[0], b[0], a[1], b[1], ...: the weight rows (or their
    masks) of a paired tile, gate/up's gate and up rows or QKV's rotary pairs, so that a swapped program multiplies
    both in one MMA per K tile. Why: two dots per K tile on their own accumulators each ended in a wait for the
    tensor cores (sm_90 PTX: `wgmma.wait_group 0` after each, where one dot keeps one group in flight) and ran at
    half a plain GEMM's bandwidth (scripts/swap_sweep.py)."""
    return tl.reshape(tl.join(a, b), (2 * HALF,))


@triton.jit
def unpair(acc, HALF: tl.constexpr, BLOCK_M: tl.constexpr):
    """A swapped accumulator of paired rows (2 * HALF, BLOCK_M) (pair_rows's order) -> the a rows' and the b rows'
    (HALF, BLOCK_M) each."""
    return tl.split(tl.permute(tl.reshape(acc, (HALF, 2, BLOCK_M)), (0, 2, 1)))


@functools.cache
def _sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device) -> int:
    """The SMs of a CUDA device (1 elsewhere: the interpreter runs one program at a time)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return _sms(device.index if device.index is not None else torch.cuda.current_device())
