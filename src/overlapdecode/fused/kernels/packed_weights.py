"""Quantized weights in the projections' kernels: a K tile of packed weights loaded and dequantized in registers,
right after the load, shared by norm_linear, linear_residual and norm_qkv (and so by the LM head).

What a kernel launch takes of its weight (`weight_launch`): a 16-bit (or float32) weight as before; a PackedWeight
(quant/packed.py) as its codes at `w_ptr` and its group numbers at `s_ptr` / `z_ptr`, with two constexprs, QUANT (0
none, 1 int8, 2 int4, 3 fp8 e4m3 codes read as their bytes) and GROUP (input features per group; int8, fp8: K).
`load_weights` returns the (rows, BLOCK_K) tile in the model's dtype either way, so the rest of each kernel (norm
prologue, `tl.dot`, epilogue, split-K, swapped tiles) is unchanged; the arithmetic is quant/schemes.py's,
rounded once to the model dtype (int4 computes in that dtype where it is 16-bit: the same one rounding of an exact
product): w' = (q - z) * s has the same bits as the torch twins' dequantize-then-multiply.

int4: the tile's BLOCK_K / 2 bytes of a row are contiguous (16-byte loads of 32 weights), unpacked by a mask and a
shift into the low and high codes, made floats by their bits (an OR, no integer-to-float conversion: `_int4_tile`),
in the model's dtype where it is 16-bit (float32 otherwise), interleaved back in K order (`tl.join` then
`tl.reshape`) and reshaped to (rows, groups, group) for the zeros and scales. The projections take their tile
through `weights_dot`, which in a 16-bit model with a power-of-two group skips that interleave: the low and the high
codes stay two planes (the tile's even and odd columns), each multiplied with the same columns of x, and on a GPU
four bytes become eight floats in nine instructions of inline PTX (`_codes_as_floats`), each pair landing in the
32-bit register an MMA operand reads. Where GROUP is a power
of two, a K tile (BLOCK_K, a power of two, starting at a multiple of BLOCK_K) holds whole groups or lies in one, so
each row reads BLOCK_K / GROUP (or 1) scales and zeros per tile; another GROUP reads them per weight (correct, not
meant to be fast). The dense form (dense.py, cuBLAS's product from 17 rows) has no place to dequantize: quantized
launches of more than 16 rows run the swapped GEMV tiles instead (swap_ab.py), which load through this same
function.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ...quant.packed import PackedWeight
from .swap_ab import acc_dot

QUANT_CODES = {"int8": 1, "int4": 2, "fp8": 3}
# Triton's interpreter runs no inline assembly: there the int4 codes become floats by the same bits in Triton's ops
INTERPRETED: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET") == "1")


def is_packed(w) -> bool:
    return isinstance(w, PackedWeight)


def weight_launch(w) -> tuple[torch.Tensor, dict]:
    """(the tensor the kernel's w_ptr reads, the launch keywords s_ptr, z_ptr, QUANT, GROUP) of a weight."""
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
    return codes, dict(s_ptr=w.scales, z_ptr=w.zeros, QUANT=QUANT_CODES[w.scheme], GROUP=w.group_size)


def check_block_k(launch: dict, block_k: int, x: torch.Tensor) -> None:
    """int4 codes in a 16-bit model on a GPU take K tiles of 32 or more: compiled by Triton 3.6 for sm_90, a K
    tile of 16 (its interleaved path, `_int4_tile`) gave every weight twice its value (the bit-for-bit test of
    tests/fused/test_quant_kernels.py on an H100), where the interpreter and every K tile of 32 and more (both
    paths) are exact. No default tile is that small; a `block_k` asked for by name is refused, before any launch."""
    sixteen = x.dtype in (torch.float16, torch.bfloat16)
    if launch["QUANT"] == QUANT_CODES["int4"] and sixteen and x.is_cuda and block_k < 32:
        raise ValueError(f"block_k: int4 weights in a 16-bit model take K tiles of at least 32 on a GPU, got {block_k}")


def refuse_dense(dense: bool | None) -> None:
    """A quantized launch never runs the dense form; asked for it by name, a ValueError naming `dense`."""
    if dense:
        raise ValueError("dense: quantized weights have no dense form (cuBLAS takes no packed weights); pass None")


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
    else:  # int4
        w = _int4_tile(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, kk, mask, K, BLOCK_K, GROUP, dtype).to(dtype)
    return w


@triton.jit
def _int4_tile(
    w_ptr,
    s_ptr,
    z_ptr,
    rows,
    rows_ok,
    k0,
    kk,
    mask,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    dtype: tl.constexpr,
):
    """load_weights's int4 tile, in `dtype` where it is 16-bit, else in float32: the row's bytes of the tile (those
    before K; a split's range ends at a multiple of BLOCK_K or at K), unpacked, times the groups' numbers (`mask`:
    the tile's rows and columns in range, for the per-weight group numbers).

    Each code c becomes a float by its bits, an OR in place of an integer-to-float conversion (a quarter of the
    FP32 rate): MAGIC + c, MAGIC a power of two whose unit in the last place is 1 (bfloat16 128, float16 1024,
    float32 2^23); the zero gets MAGIC too, so that the difference is c - z exactly. In a 16-bit dtype the
    arithmetic stays in it (two weights an instruction, no conversion after): (c - z) * s is one rounding of the
    exact product either way, the bits of the float32 twin's rounded once."""
    NG: tl.constexpr = (K + GROUP - 1) // GROUP  # groups per row
    R: tl.constexpr = rows.shape[0]
    KP: tl.constexpr = (K + 1) // 2  # bytes per row
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    byte = tl.load(w_ptr + rows[:, None] * KP + kb[None, :], mask=rows_ok[:, None] & (kb < KP)[None, :], other=0)
    SIXTEEN: tl.constexpr = dtype == tl.bfloat16 or dtype == tl.float16
    if SIXTEEN and s_ptr.dtype.element_ty == dtype and z_ptr.dtype.element_ty == dtype:  # numbers in the dtype
        math: tl.constexpr = dtype
        INT: tl.constexpr = tl.int16
        BITS: tl.constexpr = 0x4300 if dtype == tl.bfloat16 else 0x6400
        MAGIC: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    else:
        math: tl.constexpr = tl.float32
        INT: tl.constexpr = tl.int32
        BITS: tl.constexpr = 0x4B000000
        MAGIC: tl.constexpr = 8388608.0
    lo = ((byte & 0xF).to(INT) | BITS).to(math, bitcast=True)
    hi = ((byte >> 4).to(INT) | BITS).to(math, bitcast=True)
    q = tl.reshape(tl.join(lo, hi), (R, BLOCK_K))
    if (GROUP & (GROUP - 1)) == 0:  # whole groups in the tile, or the tile inside one group
        SUB: tl.constexpr = GROUP if GROUP < BLOCK_K else BLOCK_K
        g = k0 // GROUP + tl.arange(0, BLOCK_K // SUB)
        gm = rows_ok[:, None] & (g < NG)[None, :]
        s = tl.load(s_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0).to(math)
        z = tl.load(z_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0).to(math) + MAGIC
        w = tl.reshape((tl.reshape(q, (R, BLOCK_K // SUB, SUB)) - z[:, :, None]) * s[:, :, None], (R, BLOCK_K))
    else:  # a group per weight
        at = rows[:, None] * NG + (kk // GROUP)[None, :]
        s = tl.load(s_ptr + at, mask=mask, other=0.0).to(math)
        z = tl.load(z_ptr + at, mask=mask, other=0.0).to(math) + MAGIC
        w = (q - z) * s
    return w


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
    BLOCK_K: tl.constexpr,
    QUANT: tl.constexpr,
    GROUP: tl.constexpr,
    dtype: tl.constexpr,
    SWAP: tl.constexpr,
):
    """acc + x @ W^T over the K tile at k0 (swap_ab.acc_dot's orientation) for the weight rows `rows`: x (rows of
    the batch, BLOCK_K) in the model's dtype, W's tile as `load_weights` gives it. int4 in a 16-bit model (its group
    numbers in its dtype, GROUP a power of two) takes the tile as two planes instead, the low and the high codes
    of its bytes (the even and the odd columns, `_int4_planes`), each against the same columns of x: the codes are
    never interleaved back into K order, which cost a byte permute per pair of weights."""
    SIXTEEN: tl.constexpr = dtype == tl.bfloat16 or dtype == tl.float16
    if QUANT == 2 and SIXTEEN and (GROUP & (GROUP - 1)) == 0 and BLOCK_K >= 32:
        # nested: s_ptr and z_ptr are None for 16-bit weights, so their dtypes are read inside the int4 branch only
        if s_ptr.dtype.element_ty == dtype and z_ptr.dtype.element_ty == dtype:
            lo, hi = _int4_planes(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, K, BLOCK_K, GROUP, dtype)
            x_even, x_odd = tl.split(tl.reshape(x, (x.shape[0], BLOCK_K // 2, 2)))
            acc = acc_dot(acc, x_even, lo, SWAP)
            acc = acc_dot(acc, x_odd, hi, SWAP)
        else:
            w = load_weights(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K, BLOCK_K, QUANT, GROUP, dtype)
            acc = acc_dot(acc, x, w, SWAP)
    else:
        w = load_weights(w_ptr, s_ptr, z_ptr, rows, rows_ok, k0, k_end, K, BLOCK_K, QUANT, GROUP, dtype)
        acc = acc_dot(acc, x, w, SWAP)
    return acc


@triton.jit
def _int4_planes(
    w_ptr,
    s_ptr,
    z_ptr,
    rows,
    rows_ok,
    k0,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP: tl.constexpr,
    dtype: tl.constexpr,
):
    """The int4 tile at k0 as two (rows, BLOCK_K / 2) planes in `dtype` (16-bit), dequantized: the low codes of the
    tile's bytes (columns k0, k0 + 2, ...) and the high ones (k0 + 1, k0 + 3, ...). Each code c becomes MAGIC + c by
    its bits as in `_int4_tile`; on a GPU four bytes at a time (`_codes_as_floats`: a shift, then per pair of
    codes a byte permute and one three-input logic op), so that each pair comes out in the one 32-bit register an
    MMA operand takes, whatever the layout's order of the bytes. A plane's column j is k0 + 2j (+ 1), in group
    (k0 + 2j) // GROUP: a plane holds BLOCK_K / 2 / SUB columns of each group it meets."""
    NG: tl.constexpr = (K + GROUP - 1) // GROUP  # groups per row
    R: tl.constexpr = rows.shape[0]
    KP: tl.constexpr = (K + 1) // 2  # bytes per row
    HALF: tl.constexpr = BLOCK_K // 2
    kb = k0 // 2 + tl.arange(0, HALF)
    byte = tl.load(w_ptr + rows[:, None] * KP + kb[None, :], mask=rows_ok[:, None] & (kb < KP)[None, :], other=0)
    MAGIC: tl.constexpr = 128.0 if dtype == tl.bfloat16 else 1024.0
    if INTERPRETED:
        BITS: tl.constexpr = 0x4300 if dtype == tl.bfloat16 else 0x6400
        lo = ((byte & 0xF).to(tl.int16) | BITS).to(dtype, bitcast=True)
        hi = ((byte >> 4).to(tl.int16) | BITS).to(dtype, bitcast=True)
    else:
        lo, hi = _codes_as_floats(byte, dtype)
    SUB: tl.constexpr = (GROUP if GROUP < BLOCK_K else BLOCK_K) // 2  # a plane's columns per group in the tile
    g = k0 // GROUP + tl.arange(0, HALF // SUB)
    gm = rows_ok[:, None] & (g < NG)[None, :]
    s = tl.load(s_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0)[:, :, None]
    z = (tl.load(z_ptr + rows[:, None] * NG + g[None, :], mask=gm, other=0.0) + MAGIC)[:, :, None]
    lo = tl.reshape((tl.reshape(lo, (R, HALF // SUB, SUB)) - z) * s, (R, HALF))
    hi = tl.reshape((tl.reshape(hi, (R, HALF // SUB, SUB)) - z) * s, (R, HALF))
    return lo, hi


# `_codes_as_floats`'s PTX: $4 holds four bytes, $0 $1 the low codes of bytes 0-1 and 2-3, $2 $3 the high ones
_PAIRS_PTX = """{{
.reg .b32 h, t;
shr.b32 h, $4, 4;
prmt.b32 t, $4, 0, 0x1100; lop3.b32 $0, t, 0x000F000F, {bits}, 0xEA;
prmt.b32 t, $4, 0, 0x3322; lop3.b32 $1, t, 0x000F000F, {bits}, 0xEA;
prmt.b32 t, h, 0, 0x1100; lop3.b32 $2, t, 0x000F000F, {bits}, 0xEA;
prmt.b32 t, h, 0, 0x3322; lop3.b32 $3, t, 0x000F000F, {bits}, 0xEA;
}}"""
PAIRS_BF16: tl.constexpr = tl.constexpr(_PAIRS_PTX.format(bits="0x43004300"))
PAIRS_F16: tl.constexpr = tl.constexpr(_PAIRS_PTX.format(bits="0x64006400"))


@triton.jit
def _codes_as_floats(byte, dtype: tl.constexpr):
    """(MAGIC + low code, MAGIC + high code) of each byte as floats of `dtype` (bfloat16: MAGIC 128, bits 0x4300 |
    c; float16: 1024, 0x6400 | c), four bytes an instance: h = bytes >> 4 puts each high code in its byte's low
    nibble; per output pair, a byte permute brings two bytes' low nibbles into the two halves and one LOP3 keeps
    the nibbles and sets the exponent bits ((t & 0x000F000F) | BITS: lookup table 0xEA)."""
    if dtype == tl.bfloat16:
        pairs = tl.inline_asm_elementwise(
            PAIRS_BF16, "=r,=r,=r,=r,r", [byte], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4
        )
    else:
        pairs = tl.inline_asm_elementwise(
            PAIRS_F16, "=r,=r,=r,=r,r", [byte], dtype=(tl.float16, tl.float16), is_pure=True, pack=4
        )
    return pairs
