"""Weight-only quantization (overlapdecode.quant): the stored numbers against the formulas, computed here from
scratch group by group; the quantized layers; `od.quantize` and `load_model(quantize=...)` over whole models; every
preset's tokens equal to Hugging Face generate()'s on the same quantized model (CPU, float32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from overlapdecode.quant import Int4Linear, Int8Linear, dequantize
from overlapdecode.quant.schemes import pack_int4, quantize_int4, quantize_int8, unpack_int4

# --- the formulas, from scratch ---------------------------------------------------------------------------------


def reference_int4(w: torch.Tensor, group_size: int):
    """codes (N, K), scales and zeros (N, G) in w's dtype, w' (N, K): one group at a time, float32 scalars; s rounded
    to w's dtype before it is used, as stored."""
    N, K = w.shape
    codes = torch.empty(N, K)
    out = torch.empty(N, K, dtype=w.dtype)
    scales, zeros = [], []
    for n in range(N):
        row_s, row_z = [], []
        for start in range(0, K, group_size):
            g = w[n, start : start + group_size].float()
            s = (g.max() - g.min()) / 15
            s = torch.maximum(s, torch.tensor(torch.finfo(w.dtype).tiny)).to(w.dtype)
            sf = s.float()
            z = torch.clamp(torch.round(-g.min() / sf), 0, 15)
            q = torch.clamp(torch.round(g / sf) + z, 0, 15)
            codes[n, start : start + group_size] = q
            out[n, start : start + group_size] = ((q - z) * sf).to(w.dtype)
            row_s.append(s)
            row_z.append(z.to(w.dtype))
        scales.append(torch.stack(row_s))
        zeros.append(torch.stack(row_z))
    return codes, torch.stack(scales), torch.stack(zeros), out


def reference_int8(w: torch.Tensor):
    """codes (N, K), scales (N, 1) in w's dtype, w' (N, K): one row at a time."""
    codes, scales, out = [], [], []
    for row in w.float():
        s = (row.abs().max() / 127).to(w.dtype)
        q = torch.zeros_like(row) if s == 0 else torch.round(row / s.float())
        codes.append(q)
        scales.append(s)
        out.append((q * s.float()).to(w.dtype))
    return torch.stack(codes), torch.stack(scales)[:, None], torch.stack(out)


def awkward_weight(N: int, K: int, group_size: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Random rows, and rows whose first group is all equal, negative only, positive only, all zero."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.1
    w[1, :group_size] = 0.37
    w[2, :group_size] = -w[2, :group_size].abs() - 0.01
    w[3, :group_size] = w[3, :group_size].abs() + 0.01
    w[4, :group_size] = 0.0
    w[5] = -0.25  # a whole row of one value
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("K,group_size", [(64, 16), (50, 16), (64, 48), (40, 128), (33, 32)])
def test_int4_numbers_are_the_formulas(K, group_size, dtype):
    w = awkward_weight(7, K, group_size, dtype)
    packed, scales, zeros = quantize_int4(w, group_size)
    codes, ref_s, ref_z, ref_w = reference_int4(w, group_size)
    G = -(-K // group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (7, (K + 1) // 2)
    assert scales.dtype == zeros.dtype == dtype and scales.shape == zeros.shape == (7, G)
    assert torch.equal(unpack_int4(packed, K).float(), codes)
    assert torch.equal(scales, ref_s) and torch.equal(zeros, ref_z)
    got = dequantize_int4_of(packed, scales, zeros, K, group_size)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got, ref_w)
    assert (zeros >= 0).all() and (zeros <= 15).all() and (scales > 0).all()


def dequantize_int4_of(packed, scales, zeros, K, group_size):
    from overlapdecode.quant import PackedWeight

    return dequantize(PackedWeight("int4", packed, scales, zeros, K, group_size))


def test_int4_edge_groups_reconstruct_as_the_formulas_say():
    """The awkward groups, by value: an all-zero group is exact, a group of equal weights takes the floor scale
    (no division by zero, no NaN), a group straddling zero is within half a step of its weights."""
    w = awkward_weight(7, 64, 16)
    got = dequantize_int4_of(*quantize_int4(w, 16), 64, 16)
    assert torch.equal(got[4, :16], torch.zeros(16))
    assert torch.isfinite(got).all()
    s = (w[0, :16].max() - w[0, :16].min()) / 15
    assert (got[0, :16] - w[0, :16]).abs().max() <= s / 2 + 1e-7


def test_int4_packs_two_codes_per_byte_along_k():
    """The documented layout: byte j of a row holds code 2j in its low four bits and 2j + 1 in its high four."""
    codes = torch.tensor([[1, 2, 3, 4, 5], [15, 0, 0, 15, 7]])
    packed = pack_int4(codes)
    assert packed.tolist() == [[1 | 2 << 4, 3 | 4 << 4, 5], [15, 15 << 4, 7]]
    assert torch.equal(unpack_int4(packed, 5), codes.to(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_numbers_are_the_formulas(dtype):
    w = awkward_weight(7, 50, 16, dtype)
    w[4] = 0.0  # an all-zero row
    q, scales = quantize_int8(w)
    codes, ref_s, ref_w = reference_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scales.shape == (7, 1) and scales.dtype == dtype
    assert torch.equal(q.float(), codes) and torch.equal(scales, ref_s)
    assert scales[4].item() == 0 and (q[4] == 0).all()
    from overlapdecode.quant import PackedWeight

    got = dequantize(PackedWeight("int8", q, scales, None, 50, 50))
    assert got.dtype == dtype and torch.equal(got, ref_w)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("bias", [True, False])
def test_quantized_layers_multiply_by_the_dequantized_weight(scheme, bias):
    torch.manual_seed(1)
    lin = torch.nn.Linear(50, 24, bias=bias)
    layer = Int4Linear(lin.weight, lin.bias, 16) if scheme == "int4" else Int8Linear(lin.weight, lin.bias)
    ref_w = reference_int4(lin.weight.detach(), 16)[3] if scheme == "int4" else reference_int8(lin.weight.detach())[2]
    x = torch.randn(3, 5, 50)
    assert torch.equal(layer(x), F.linear(x, ref_w, lin.bias))
    assert (layer.bias is None) == (not bias)
    if bias:
        assert torch.equal(layer.bias, lin.bias)
    assert layer.weight.shape[0] == 24  # the output size, as nn.Linear's weight has it
    assert all(not p.requires_grad for p in layer.parameters())
    packed = layer.packed()
    assert packed.shape == (24, 50) and torch.equal(dequantize(packed), ref_w)
    # the packed size: half a byte (int4) or a byte (int8) per weight, plus the group numbers and the bias
    nbytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    numbers = 24 * 4 * 4 * 2 if scheme == "int4" else 24 * 4
    assert nbytes == (24 * 25 if scheme == "int4" else 24 * 50) + numbers + (24 * 4 if bias else 0)
