"""The projections' product with their weights, in the form the launch's tiles call for: the row-block tile's
`tl.dot` (or broadcast product) on a dequantized weight tile (packed_weights.load_weights, swap_ab.acc_dot), or,
for int4 weights under ROW_TILE rows, a GEMV that never dequantizes a weight.

Why the GEMV form: dequantizing a K tile for `tl.dot` costs about 8 sm_90 instructions a weight (unpacking, the
interleave back into K order and the shuffle into the MMA's operand layout; scripts/sass_counts.py), which at one
row is more than the weight's bytes take to arrive. Here the codes are read as 32-bit words of 8 (the packed
layout's bytes as they lie: code j of a word in bits 4j .. 4j + 3), and each code is made a float by one AND:
`word & (0xF << 4j)` read as a float32 is c 16^j 2^-149 exactly (a subnormal number; the GPU's and NumPy's
float32 arithmetic keep them). Its product with x_j 2^(53 - 4j), prepared once a K tile for all the weight rows
of a thread, is c x_j 2^-96, so that a weight costs an AND and a fused multiply-add (for 4 <= j < 8 the word's
upper half, one shift a word). The zero point and the scale leave the sum, as the group is constant over the
tile: per row, sum_k (c_k - z) s x_k = s 2^96 sum_k c_k x_k 2^-96 - z s sum_k x_k. The accumulator keeps one
column a word ((BLOCK_M, BLOCK_N, BLOCK_K / 8)), summed over its columns once, after the K loop.

The form serves a launch where QUANT is int4, the tile is not swapped, BLOCK_M < ROW_TILE (swap_ab.row_tile:
`block_m`, or float32 models' tiles), K is a multiple of 8 (whole words a row) and the K tile lies in one group
(GROUP a multiple of BLOCK_K); elsewhere the dequantized tile's product. Its numbers: x 2^53 stays finite for
|x| < 2^75, s 2^96 for s < 2^32; a product c x 2^-96 under 2^-126 is subnormal, its error under 2^-149, which is
2^-53 s on the output. The sum's rounding differs from the dequantize-then-multiply twin's (s and z applied once a
tile, not once a weight), as a different summation order's does.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .packed_weights import load_weights
from .swap_ab import acc_dot, acc_rows, acc_zeros

GEMV_ROWS = 128  # weight rows a program of the GEMV form multiplies (row_block_tiles)
GEMV_K = 128  # its longest K tile

X_SCALE = tl.constexpr(2.0**53)  # 2^53: x_j 2^(53 - 4j) times the code's c 16^j 2^-149 is c x_j 2^-96
OUT_SCALE = tl.constexpr(2.0**96)  # 2^96, back to c x_j on the scale


def row_block_tiles(packed: dict, K: int, block_m: int, block_n: int, block_k: int, pairs: int | None = None) -> dict:
    """The default block_n and block_k of a row-block launch of `block_m` rows over K inputs, its weight's launch
    keywords `packed` (packed_weights.weight_launch): `block_n` and `block_k` as the
    launch would take them, unless the launch takes the GEMV form with the largest power-of-two K tile from 32 to
    GEMV_K that its group holds: then GEMV_ROWS weight rows (a program's thread then holds 8 rows of 4 words, over which
    the x tile's pass through shared memory is shared: 4.2-4.4 sm_90 instructions a weight at 128 rows, 6.8-7.0
    at 64; results/cpu/llama-1b-int4-sass-counts) and that K tile. For norm_qkv, whose block_n counts rotary
    pairs (two weight rows each) of one head, `pairs` is the head's: GEMV_ROWS // 2, at most `pairs`."""
    if packed["QUANT"] != 2 or block_m >= 16 or K % 8:
        return dict(block_n=block_n, block_k=block_k)
    k_tile = GEMV_K
    while k_tile >= 32 and packed["GROUP"] % k_tile:
        k_tile //= 2
    if k_tile < 32:  # under 16 bytes of a row a K tile, a thread's loads are narrower than one 16-byte copy
        return dict(block_n=block_n, block_k=block_k)
    return dict(block_n=GEMV_ROWS if pairs is None else min(GEMV_ROWS // 2, pairs), block_k=k_tile)


@triton.constexpr_function
def gemv_form(QUANT, SWAP, BLOCK_M, BLOCK_K, K, GROUP) -> bool:
    """Whether a launch takes the GEMV form (the module docstring's conditions)."""
    return QUANT == 2 and not SWAP and BLOCK_M < 16 and K % 8 == 0 and BLOCK_K >= 8 and GROUP % BLOCK_K == 0


@triton.jit
def product_zeros(
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SWAP: tl.constexpr,
    QUANT: tl.constexpr,
    K: tl.constexpr,
    GROUP: tl.constexpr,
):
    """The product's float32 accumulator: (BLOCK_M, BLOCK_N, BLOCK_K / 8) in the GEMV form, else acc_zeros's."""
    if gemv_form(QUANT, SWAP, BLOCK_M, BLOCK_K, K, GROUP):
        return tl.zeros((BLOCK_M, BLOCK_N, BLOCK_K // 8), dtype=tl.float32)
    else:
        return acc_zeros(BLOCK_M, BLOCK_N, SWAP)


@triton.jit
def product_rows(acc, SWAP: tl.constexpr, QUANT: tl.constexpr, BLOCK_K: tl.constexpr, K: tl.constexpr, GROUP):
    """The accumulator as (BLOCK_M rows, BLOCK_N outputs), for the epilogues (acc_rows's, or the GEMV's columns
    summed)."""
    if gemv_form(QUANT, SWAP, acc.shape[0], BLOCK_K, K, GROUP):
        return tl.sum(acc, 2)
    else:
        return acc_rows(acc, SWAP)


@triton.jit
def product_tile(
    acc,
    x,
    w_ptr,
    s_ptr,
    z_ptr,
    rows,
    rows_ok,
    k0,
    k_end,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    dtype: tl.constexpr,
    SWAP: tl.constexpr,
):
    """acc plus x (BLOCK_M, BLOCK_K) times the weight rows `rows` at columns k0 .. k0 + BLOCK_K - 1 (zero past
    k_end: the caller's x is), in acc's form."""
    BLOCK_M: tl.constexpr = x.shape[0]
    if gemv_form(QUANT, SWAP, BLOCK_M, BLOCK_K, K, GROUP):
        return _gemv_tile(acc, x, w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K, BLOCK_K, GROUP)
    else:
        w = load_weights(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K, BLOCK_K, QUANT, GROUP, dtype)
        return acc_dot(acc, x, w, SWAP)


@triton.jit
def _code(word, j: tl.constexpr):
    """Code j (0-3) of each word, as the float32 c 16^j 2^-149 (its bits, no conversion)."""
    return (word & (0xF << (4 * j))).to(tl.float32, bitcast=True)


@triton.jit
def _gemv_tile(acc, x, w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K: tl.constexpr, BLOCK_K: tl.constexpr, GROUP):
    BLOCK_M: tl.constexpr = x.shape[0]
    W: tl.constexpr = BLOCK_K // 8  # words of a row in the tile
    KW: tl.constexpr = K // 8  # words of a row
    NG: tl.constexpr = K // GROUP if K % GROUP == 0 else K // GROUP + 1  # groups of a row
    kw = k0 // 8 + tl.arange(0, W)
    words = w_ptr.to(tl.pointer_type(tl.uint32))
    # words to K, not k_end: a split's range ends at a multiple of BLOCK_K or at K, and past it the caller's x is
    # zero (as in load_weights); a bound known at compile time keeps the loads 16 bytes wide
    word = tl.load(words + rows[:, None] * KW + kw[None, :], mask=rows_ok[:, None] & (kw < KW)[None, :], other=0)
    g = k0 // GROUP  # past the row's last group where a split's last tile starts at K: read as 0, x is 0 there
    s = tl.load(s_ptr + rows * NG + g, mask=rows_ok & (g < NG), other=0.0).to(tl.float32)
    z = tl.load(z_ptr + rows * NG + g, mask=rows_ok & (g < NG), other=0.0).to(tl.float32)
    # x's columns by their place in a word: j = 4a + 2b + c (c the fastest), each (BLOCK_M, W)
    xa, xb = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_M, W, 2, 2, 2)))
    x0, x4 = tl.split(tl.split(xa)[0])
    x2, x6 = tl.split(tl.split(xa)[1])
    x1, x5 = tl.split(tl.split(xb)[0])
    x3, x7 = tl.split(tl.split(xb)[1])
    x_sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))
    high = word >> 16  # codes 4-7 in the low half
    t = _code(word, 0)[None, :, :] * (x0 * X_SCALE)[:, None, :]
    t += _code(word, 1)[None, :, :] * (x1 * (X_SCALE / 16))[:, None, :]
    t += _code(word, 2)[None, :, :] * (x2 * (X_SCALE / 256))[:, None, :]
    t += _code(word, 3)[None, :, :] * (x3 * (X_SCALE / 4096))[:, None, :]
    t += _code(high, 0)[None, :, :] * (x4 * X_SCALE)[:, None, :]
    t += _code(high, 1)[None, :, :] * (x5 * (X_SCALE / 16))[:, None, :]
    t += _code(high, 2)[None, :, :] * (x6 * (X_SCALE / 256))[:, None, :]
    t += _code(high, 3)[None, :, :] * (x7 * (X_SCALE / 4096))[:, None, :]
    return acc + t * (s * OUT_SCALE)[None, :, None] - (z * s)[None, :, None] * x_sum[:, None, :]
