"""Quantized weights in the projections' kernels: a K tile of packed weights multiplied with the x tile right after
its load, shared by norm_linear, linear_residual and norm_qkv (and so by the LM head), through one call per tile,
`weights_dot` (acc + x @ w^T in the accumulator's orientation, swap_ab.acc_dot's contract).

What a kernel launch takes of its weight (`weight_launch`): a 16-bit (or float32) weight as before; a PackedWeight
(quant/packed.py) as its codes at `w_ptr` and its group numbers at `s_ptr` / `z_ptr`, with two constexprs, QUANT (0
none, 1 int8, 2 int4, 3 fp8 e4m3 codes read as their bytes, 4 int4 in the factored form) and GROUP (input features
per group; int8, fp8: K). The rest of each kernel (norm prologue, epilogue, split-K, swapped tiles) is unchanged.

int8, fp8 and int4 "unpacked" (QUANT 1-3; the default form): `load_weights` returns the (rows, BLOCK_K) tile in the
model's dtype, then acc_dot multiplies it like a 16-bit tile (`tl.dot`; the broadcast product under 16 rows). The
arithmetic is quant/schemes.py's, in float32, rounded once to the model dtype: w' = (q - z) * s has the same bits as
the torch twins' dequantize-then-multiply. int4's bytes of a row's tile are contiguous (16-byte loads of 32
weights), unpacked by a mask and a shift into the low and high codes, interleaved back in K order (`tl.join` then
`tl.reshape`) and reshaped to (rows, groups, group) for the zeros and scales: about 8-10 operations per weight
before the product. Where GROUP is a power of two, a K tile (BLOCK_K, a power of two, starting at a multiple of
BLOCK_K) holds whole groups or lies in one, so each row reads BLOCK_K / GROUP (or 1) scales and zeros per tile;
another GROUP reads them per weight (correct, not meant to be fast).

int4 "factored" (QUANT 4, `int4_form="factored"`): for a K tile inside one group the scale and zero leave the sum,

    sum_k x[m, k] (q[n, k] - z[n]) s[n]  =  s[n] (sum_k x[m, k] q[n, k]  -  z[n] sum_k x[m, k])

and the order of K does not matter to a sum: byte j holds code 2j low and 2j + 1 high (quant/schemes.pack_int4), so
the x tile split into its even and odd columns (in registers: the x tile is small) meets the low and the high codes
as they come out of the bytes, x_even . lo + x_odd . hi, no interleave: per weight a mask or shift, a conversion and
a multiply-add; per tile and output one correction s (partial - z xsum), xsum the sum of the tile's x, which is 0
past the K range and in padded rows, so the correction counts the valid columns only. Where the launch's tile has
16 rows or more (every 16-bit launch: 16-row tiles under 17 rows as for the unpacked form, swapped from 17; a
float32 model's from 16 rows) the codes in the model dtype (0-15 are exact in every float dtype) meet x in two
`tl.dot`s into a float32 partial per tile, corrected and added to the accumulator (so a swapped program's warpgroup
MMAs are waited for in every K tile: the correction reads them). Under 16 rows of a float32 model (`tile_bytes`:
the rows rounded up to a power of two, float32 weights' rule) the product is a float32 broadcast summed over the
tile. Float32 codes are centred (q - 8, z - 8), which costs a subtraction per weight and keeps the partial near the
result's size rather than sum x q's. The tile must lie in one group: GROUP a power of two, BLOCK_K <= GROUP and,
for the dots, BLOCK_K >= 32 (each half a dot's K of 16 at least); `k_tile` cuts a launch's K tile to a group of a
power of two from 32, and where the tile still does not fit (a group of no power of two; of 16 under the dots) the
launch runs the unpacked form: the constexprs choose, never the numbers.
Numerics (tests/fused/test_int4_factored.py): the factored form never rounds w' to the model dtype (the unpacked
one does, as the twins do), so it differs from the twins by float32 accumulation. Against the exact float64 sum
of x (q - z) s over the stored numbers, its 16-bit outputs lie on average at least as close as the unpacked form's
(which carries each w' rounded to 11 or 8 bits); in float32, where the unpacked w' is exact to float32's rounding,
its mean distance stays within 3x the unpacked one's (both at float32's rounding; uncentred about 10x for x of
mean 1). Which form is faster waits for a GPU A/B (docs/QUANTIZATION.md); `INT4_FORM` is the form of a launch
whose `int4_form` is None (scripts set it to build a whole step in one form).

The dense form (dense.py, cuBLAS's product from 17 rows) has no place to dequantize: quantized launches of more than
16 rows run the swapped GEMV tiles instead (swap_ab.py), which load through this same code.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...quant.packed import PackedWeight
from .swap_ab import acc_dot

QUANT_CODES = {"int8": 1, "int4": 2, "fp8": 3}
FACTORED = 4  # QUANT of an int4 weight read in the factored form
INT4_FORMS = ("unpacked", "factored")
INT4_FORM = "unpacked"  # the form of a launch whose int4_form is None (scripts/kernel_sweep.py sets it per step)


def is_packed(w) -> bool:
    return isinstance(w, PackedWeight)


def weight_launch(w, int4_form: str | None = None) -> tuple[torch.Tensor, dict]:
    """(the tensor the kernel's w_ptr reads, the launch keywords s_ptr, z_ptr, QUANT, GROUP) of a weight; an int4
    weight in `int4_form` (one of INT4_FORMS; None: INT4_FORM), which other weights ignore."""
    form = INT4_FORM if int4_form is None else int4_form
    if form not in INT4_FORMS:
        name = "int4_form" if int4_form is not None else "packed_weights.INT4_FORM"
        raise ValueError(f"{name} must be one of {', '.join(map(repr, INT4_FORMS))}, got {form!r}")
    if not is_packed(w):
        return w, dict(s_ptr=None, z_ptr=None, QUANT=0, GROUP=0)
    K = w.in_features
    width = (K + 1) // 2 if w.scheme == "int4" else K
    groups = triton.cdiv(K, w.group_size)
    if w.q.shape[1] != width or w.scales.shape != (w.q.shape[0], groups) or not w.scales.is_contiguous():
        raise ValueError(
            f"w: a {w.scheme} weight of {K} input features in groups of {w.group_size} must have codes "
            f"({w.q.shape[0]}, {width}) and contiguous group numbers ({w.q.shape[0]}, {groups}); got "
            f"{tuple(w.q.shape)} and {tuple(w.scales.shape)}"
        )
    if w.zeros is not None and (w.zeros.shape != w.scales.shape or not w.zeros.is_contiguous()):
        raise ValueError(f"w: the zeros must be contiguous {tuple(w.scales.shape)}, got {tuple(w.zeros.shape)}")
    codes = w.q.view(torch.uint8) if w.scheme == "fp8" else w.q  # fp8: bytes, so that a masked load reads 0
    quant = FACTORED if w.scheme == "int4" and form == "factored" else QUANT_CODES[w.scheme]
    return codes, dict(s_ptr=w.scales, z_ptr=w.zeros, QUANT=quant, GROUP=w.group_size)


def tile_bytes(codes: torch.Tensor, packed: dict) -> int:
    """The element bytes that size a row-block launch's rows (swap_ab.row_tile): the codes' (a packed tile is
    dequantized to the model dtype and multiplied in 16-row tiles, as a 16-bit weight's), but the model dtype's for
    the factored int4 form, whose product under 16 rows in a float32 model is the float32 broadcast of float32
    weights (no padded rows multiplied); in a 16-bit model its 16-row tiles stay."""
    return packed["s_ptr"].element_size() if packed["QUANT"] == FACTORED else codes.element_size()


def k_tile(block_k: int, packed: dict) -> int:
    """A launch's K tile: `block_k`, cut to the group for the factored int4 form where the group is a power of two of
    32 or more, so that each tile lies in one group (weights_dot; a smaller group is left to the kernel's choice, a
    group of no power of two runs the unpacked form whatever the tile)."""
    group = packed["GROUP"]
    if packed["QUANT"] == FACTORED and group >= 32 and group & (group - 1) == 0:
        return min(block_k, group)
    return block_k


def refuse_dense(dense: bool | None) -> None:
    """A quantized launch never runs the dense form; asked for it by name, a ValueError naming `dense`."""
    if dense:
        raise ValueError("dense: quantized weights have no dense form (cuBLAS takes no packed weights); pass None")


@triton.jit
def weights_dot(
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
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    SWAP: tl.constexpr,
):
    """acc + x @ w^T over one K tile, in acc's orientation (swap_ab.acc_dot): x the (BLOCK_M, BLOCK_K) tile at
    columns k0 .. k0 + BLOCK_K - 1 (k0 a multiple of BLOCK_K) in the model's dtype, 0 past `k_end` and in padded rows
    (every caller masks it so); w the weight's `rows` (0 where not `rows_ok`). The factored int4 form where its tile
    lies in one group (QUANT 4, the module docstring), else the tile of load_weights multiplied by acc_dot."""
    BLOCK_K: tl.constexpr = x.shape[1]
    DOTS: tl.constexpr = SWAP or x.shape[0] >= 16  # tl.dot's products, whose K (BLOCK_K / 2 a half) is 16 at least
    if QUANT == 4 and (GROUP & (GROUP - 1)) == 0 and BLOCK_K <= GROUP and (BLOCK_K >= 32 or not DOTS):
        return _factored_dot(acc, x, w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, K, GROUP, SWAP, DOTS)
    else:
        w = load_weights(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K, BLOCK_K, QUANT, GROUP, x.dtype)
        return acc_dot(acc, x, w, SWAP)


@triton.jit
def _factored_dot(
    acc,
    x,
    w_ptr,
    s_ptr,
    z_ptr,
    rows,
    rows_ok,
    k0,
    K: tl.constexpr,
    GROUP: tl.constexpr,
    SWAP: tl.constexpr,
    DOTS: tl.constexpr,
):
    """weights_dot's factored int4 form: s (x_even . lo + x_odd . hi - z xsum) for a tile inside group k0 // GROUP.
    Past K range ends the codes are finite (0, or the next split's) and meet x's zeros; past the row's groups (a
    split's last tile beyond K) and in rows not ok the scale and zero load as 0."""
    NG: tl.constexpr = (K + GROUP - 1) // GROUP  # groups per row
    KP: tl.constexpr = (K + 1) // 2  # bytes per row
    M: tl.constexpr = x.shape[0]
    HALF: tl.constexpr = x.shape[1] // 2
    kb = k0 // 2 + tl.arange(0, HALF)
    byte = tl.load(w_ptr + rows[:, None] * KP + kb[None, :], mask=rows_ok[:, None] & (kb < KP)[None, :], other=0)
    g = k0 // GROUP
    gm = rows_ok & (g < NG)
    s = tl.load(s_ptr + rows * NG + g, mask=gm, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + rows * NG + g, mask=gm, other=0.0).to(tl.float32)
    x_even, x_odd = tl.split(tl.reshape(x, (M, HALF, 2)))  # columns 2j (low codes) and 2j + 1 (high codes)
    xsum = tl.sum(x.to(tl.float32), 1)
    if DOTS and x.dtype != tl.float32:  # the codes in the 16-bit model dtype: 0-15 exact
        lo = (byte & 0xF).to(x.dtype)
        hi = (byte >> 4).to(x.dtype)
    else:  # float32 codes, centred (q - 8, z - 8): the partial then stays near the result's size, not sum x q's
        lo = (byte & 0xF).to(tl.float32) - 8.0
        hi = (byte >> 4).to(tl.float32) - 8.0
        z = z - 8.0
    if not DOTS:  # under 16 rows: a float32 broadcast product summed over the tile, (BLOCK_M, rows)
        xe = x_even.to(tl.float32)[:, None, :]
        xo = x_odd.to(tl.float32)[:, None, :]
        part = tl.sum(xe * lo[None, :, :] + xo * hi[None, :, :], 2)
        out = acc + s[None, :] * (part - xsum[:, None] * z[None, :])
    elif SWAP:  # two products into one float32 partial (rows, BLOCK_M), acc's orientation
        part = tl.dot(lo, tl.trans(x_even), input_precision="ieee")
        part = tl.dot(hi, tl.trans(x_odd), part, input_precision="ieee")
        out = acc + s[:, None] * (part - z[:, None] * xsum[None, :])
    else:  # (BLOCK_M, rows)
        part = tl.dot(x_even, tl.trans(lo), input_precision="ieee")
        part = tl.dot(x_odd, tl.trans(hi), part, input_precision="ieee")
        out = acc + s[None, :] * (part - xsum[:, None] * z[None, :])
    return out


@triton.jit
def load_weights(
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
):
    """The weight tile of `rows` (R,) at columns k0 .. k0 + BLOCK_K - 1 (k0 a multiple of BLOCK_K), in `dtype` (the
    model's): the plain weight's own elements (QUANT 0, 0 where a row is not `rows_ok` or a column is past `k_end`),
    else dequantized: 0 for rows not ok (their scales load as 0), and past k_end finite numbers (codes of 0, or of
    the next split's range) that the x tile's zeros there cancel, as every caller masks x by the same k_end."""
    kk = k0 + tl.arange(0, BLOCK_K)
    mask = rows_ok[:, None] & (kk < k_end)[None, :]
    if QUANT == 0:
        w = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0.0)
    elif QUANT == 1 or QUANT == 3:  # int8, or fp8 as its bytes: (N, K) codes, one scale per row (GROUP == K)
        q = tl.load(w_ptr + rows[:, None] * K + kk[None, :], mask=mask, other=0)
        if QUANT == 3:
            q = q.to(tl.float8e4nv, bitcast=True)
        s = tl.load(s_ptr + rows, mask=rows_ok, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) * s[:, None]).to(dtype)
    else:  # int4 (QUANT 2, or 4 where its factored form does not fit the tile)
        w = _int4_tile(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, kk, mask, K, BLOCK_K, GROUP).to(dtype)
    return w


@triton.jit
def _int4_tile(
    w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, kk, mask, K: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr
):
    """load_weights's int4 tile in float32: the row's bytes of the tile (those before K; a split's range ends at a
    multiple of BLOCK_K or at K), unpacked, times the groups' numbers (`mask`: the tile's rows and columns in range,
    for the per-weight group numbers)."""
    NG: tl.constexpr = (K + GROUP - 1) // GROUP  # groups per row
    R: tl.constexpr = rows.shape[0]
    KP: tl.constexpr = (K + 1) // 2  # bytes per row
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    byte = tl.load(w_ptr + rows[:, None] * KP + kb[None, :], mask=rows_ok[:, None] & (kb < KP)[None, :], other=0)
    q = tl.reshape(tl.join((byte & 0xF).to(tl.float32), (byte >> 4).to(tl.float32)), (R, BLOCK_K))
    if (GROUP & (GROUP - 1)) == 0:  # whole groups in the tile, or the tile inside one group
        SUB: tl.constexpr = GROUP if GROUP < BLOCK_K else BLOCK_K
        g = k0 // GROUP + tl.arange(0, BLOCK_K // SUB)
        gm = rows_ok[:, None] & (g < NG)[None, :]
        s = tl.load(s_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0).to(tl.float32)
        w = tl.reshape((tl.reshape(q, (R, BLOCK_K // SUB, SUB)) - z[:, :, None]) * s[:, :, None], (R, BLOCK_K))
    else:  # a group per weight
        at = rows[:, None] * NG + (kk // GROUP)[None, :]
        s = tl.load(s_ptr + at, mask=mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + at, mask=mask, other=0.0).to(tl.float32)
        w = (q - z) * s
    return w
