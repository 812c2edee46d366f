"""The projections' Triton kernels on quantized weights (fused/kernels/packed_weights.py) against their torch twins,
which dequantize and then multiply: odd shapes (K not a multiple of the group, groups of a power of two and not,
K tiles shorter and longer than a group), groups of equal weights, rows 1 to 17 (17: the swapped tiles, which
quantized launches take where 16-bit ones take the dense form), split K. On CPU in Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET=1), on a GPU compiled; their sm_90 compile checks are test_kernel_compile.py's.
"""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused import forward
from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.model import REFERENCE_OPS, FusedModel
from overlapdecode.quant import Fp8Linear, Int4Linear, Int8Linear, PackedWeight, dequantize
from support.helpers import make_batch
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)
# (scheme, group size): a power of two shorter and longer than the K tiles, one that is none, int8's and fp8's rows
SCHEMES = [("int4", 16), ("int4", 64), ("int4", 24), ("int8", None), ("fp8", None)]


def packed_weight(N: int, K: int, scheme: str, group_size: int | None, seed: int = 0) -> PackedWeight:
    """A random (N, K) weight quantized, with some groups of equal weights (and an all-zero row)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * K**-0.5
    w[0, : group_size or K] = 0.05
    w[N // 2, : min(K, 5)] = -0.02  # a group's first weights equal (the rest of it random)
    w[-1] = 0.0
    layer = (
        Int4Linear(w, None, group_size) if scheme == "int4" else {"int8": Int8Linear, "fp8": Fp8Linear}[scheme](w, None)
    )
    p = layer.packed()
    moved = {k: getattr(p, k).detach().to(DEV) for k in ("q", "scales", "zeros") if getattr(p, k) is not None}
    return p._replace(**moved)


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).contiguous()


@pytest.mark.parametrize("scheme,group_size", SCHEMES)
@pytest.mark.parametrize("B,K,N", [(1, 40, 24), (5, 72, 19), (17, 50, 16)])
@pytest.mark.parametrize("act,layer", [("none", False), ("silu_mul", False), ("gelu_tanh", True)])
@pytest.mark.parametrize("block_k", [16, 64])
def test_norm_linear(scheme, group_size, B, K, N, act, layer, block_k):
    torch.manual_seed(B * K + N)
    x = rnd(B, K) + 0.5
    nw, nb = rnd(K, scale=0.3) + 1, (rnd(K, scale=0.1) if layer else None)
    w = packed_weight(2 * N if act == "silu_mul" else N, K, scheme, group_size, seed=K)
    b = rnd(w.shape[0], scale=0.1) if act != "none" else None
    out_dtype = torch.float32 if act == "none" else None
    ref = norm_linear_ref(x, nw, nb, 1e-5, w, b, act, out_dtype)
    torch.testing.assert_close(ref, norm_linear_ref(x, nw, nb, 1e-5, dequantize(w), b, act, out_dtype))
    got = norm_linear(x, nw, nb, 1e-5, w, b, act, out_dtype, block_k=block_k)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, **TOL)


def test_quantized_launches_multiply_rows_normalised_beforehand(monkeypatch):
    """norm_linear and norm_qkv with packed weights normalise x in a launch of its own (norm_prologue.normalized_rows)
    at every row count, 16-bit weights only from 17 rows (swap_ab.use_prenorm), and give their references' output
    either way."""
    from overlapdecode.fused.kernels import norm_prologue

    calls = []
    real = norm_prologue.normalized_rows
    monkeypatch.setattr(norm_prologue, "normalized_rows", lambda *a, **k: calls.append(a[0].shape[0]) or real(*a, **k))
    torch.manual_seed(3)
    x, nw = rnd(1, 40) + 0.5, rnd(40, scale=0.3) + 1
    for w in (
        packed_weight(24, 40, "int4", 16, seed=5),
        dequantize(packed_weight(24, 40, "int4", 16, seed=5)).contiguous(),
    ):
        got = norm_linear(x, nw, None, 1e-5, w, None, "none", torch.float32)
        torch.testing.assert_close(got, norm_linear_ref(x, nw, None, 1e-5, w, None, "none", torch.float32), **TOL)
    assert calls == [1]  # the packed launch only
    Hq, Hkv, D, S = 2, 1, 8, 5
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos, slot = torch.tensor([7], device=DEV), torch.tensor([3], device=DEV)
    for w in (
        packed_weight((Hq + 2 * Hkv) * D, 40, "int4", 16, seed=6),
        dequantize(packed_weight((Hq + 2 * Hkv) * D, 40, "int4", 16, seed=6)).contiguous(),
    ):
        caches = [torch.zeros(1, Hkv, S, D, device=DEV) for _ in range(4)]
        q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[0], caches[1], Hq, Hkv, D)
        args = (x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[2], caches[3], Hq, Hkv, D)
        torch.testing.assert_close(norm_qkv(*args, tickets=Tickets(DEV)), q_ref, **TOL)
        torch.testing.assert_close(caches[2], caches[0], **TOL)
    assert calls == [1, 1]  # again the packed launch only


@pytest.mark.parametrize("scheme,group_size", SCHEMES)
@pytest.mark.parametrize(
    "B,K,N,programs", [(1, 100, 24, 1), (3, 136, 40, 64), (7, 72, 9, 1), (16, 56, 20, 1), (17, 150, 17, 1000)]
)
@pytest.mark.parametrize("bias,block_k", [(False, 16), (True, 64)])
def test_linear_residual(scheme, group_size, B, K, N, programs, bias, block_k):
    torch.manual_seed(K + N)
    x, res = rnd(B, K), rnd(B, N)
    w = packed_weight(N, K, scheme, group_size, seed=N)
    b = rnd(N, scale=0.1) if bias else None
    got = linear_residual(x, w, b, res, block_k=block_k, programs=programs, tickets=Tickets(DEV))  # split K if asked
    torch.testing.assert_close(got, linear_residual_ref(x, w, b, res), **TOL)
    torch.testing.assert_close(got, linear_residual_ref(x, dequantize(w), b, res), **TOL)


@pytest.mark.parametrize("scheme,group_size", SCHEMES)
@pytest.mark.parametrize(
    "B,H,Hq,Hkv,D,programs",
    [(1, 48, 3, 1, 24, 1), (3, 40, 4, 2, 16, 1), (2, 300, 4, 2, 16, 1000), (17, 56, 2, 1, 24, 64)],
)
def test_norm_qkv(scheme, group_size, B, H, Hq, Hkv, D, programs):
    torch.manual_seed(B + H + D)
    S = 11
    x = rnd(B, H) + 0.3
    nw = rnd(H, scale=0.3) + 1
    w = packed_weight((Hq + 2 * Hkv) * D, H, scheme, group_size, seed=H)
    b = rnd(w.shape[0], scale=0.1)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.randint(0, 50, (B,), device=DEV)
    slot = torch.randint(0, S, (B,), device=DEV)
    caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    args = (x, nw, None, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[2], caches[3], Hq, Hkv, D)
    q = norm_qkv(*args, block_k=16, programs=programs, tickets=Tickets(DEV))
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)
    torch.testing.assert_close(caches[3], caches[1], **TOL)
    assert caches[0].abs().sum() > 0


# the interpreter holds bfloat16 as its bits and truncates its conversions: bfloat16 on a GPU only
BF16_ON_GPU = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEV == "cpu", reason="the interpreter's bfloat16"))


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize(
    "scheme,group_size,block_k",
    [
        ("int4", 32, 16),
        ("int4", 24, 16),
        ("int8", None, 16),
        ("fp8", None, 16),
        # int4 tiles of 32 and 64 columns: a group a tile, four groups a tile, a tile inside a group
        ("int4", 32, 32),
        ("int4", 16, 64),
        ("int4", 128, 32),
    ],
)
@pytest.mark.parametrize("first,rows", [(0, 16), (16, 16), (52, 20)])  # 20 rows: the swapped tile
def test_the_kernels_dequantize_to_the_twins_bits_in_16_bit(dtype, scheme, group_size, block_k, first, rows):
    """x = `rows` rows of the identity from column `first`: output row r is weight column first + r, so the
    kernel's dequantized weights are compared bit for bit with the twins' (one product in the dtype,
    packed_weights.py)."""
    K, N = 72, 20
    w = packed_weight(N, K, scheme, group_size, seed=3)
    w = w._replace(scales=w.scales.to(dtype), zeros=None if w.zeros is None else w.zeros.to(dtype))
    x = torch.eye(K, device=DEV, dtype=dtype)[first : first + rows]  # row r picks weight column first + r
    if scheme == "int4" and block_k < 32 and DEV == "cuda":  # packed_weights.check_block_k
        with pytest.raises(ValueError, match="^block_k: int4 weights in a 16-bit model take K tiles of at least 32"):
            linear_residual(x, w, None, None, block_k=block_k)
        return
    got = linear_residual(x, w, None, None, block_k=block_k)
    assert torch.equal(got, dequantize(w)[:, first : first + rows].t().contiguous())


def test_int4_k_tiles_under_32_are_refused_in_16_bit_on_a_gpu_only():
    """packed_weights.check_block_k: K tiles of 16 over int4 codes in a 16-bit model on a GPU are refused naming
    `block_k` (compiled, they doubled every weight); float32 models, other schemes, 32 and the CPU pass."""
    from types import SimpleNamespace

    from overlapdecode.fused.kernels.packed_weights import QUANT_CODES, check_block_k

    gpu16, int4 = SimpleNamespace(dtype=torch.bfloat16, is_cuda=True), dict(QUANT=QUANT_CODES["int4"])
    with pytest.raises(ValueError, match=r"^block_k: .* got 16$"):
        check_block_k(int4, 16, gpu16)
    check_block_k(int4, 32, gpu16)
    check_block_k(dict(QUANT=QUANT_CODES["int8"]), 16, gpu16)
    check_block_k(int4, 16, SimpleNamespace(dtype=torch.float32, is_cuda=True))
    check_block_k(int4, 16, SimpleNamespace(dtype=torch.float16, is_cuda=False))


def test_dense_is_refused_naming_the_option():
    w = packed_weight(24, 40, "int4", 16)
    x, res = rnd(20, 40), rnd(20, 24)
    with pytest.raises(ValueError, match="^dense: quantized weights have no dense form"):
        linear_residual(x, w, None, res, dense=True)


QUANTIZED = [("tiny-gpt2", "int4", 16), ("tiny-llama", "int4", 48), ("tiny-llama", "int8", 128)]
QUANTIZED += [("tiny-gpt2", "fp8", 128)]


@pytest.mark.parametrize("name,scheme,group_size", QUANTIZED)
@pytest.mark.parametrize("B", [2, 20])
@torch.no_grad()
def test_whole_step_kernels_vs_reference(name, scheme, group_size, B):
    """The decode step of the kernels equals that of their twins on a quantized model, cache writes included; at 20
    rows the projections run swapped tiles (no dense form for packed weights)."""
    model = od.load_model(name, device=DEV, quantize=scheme, group_size=group_size)
    fm = FusedModel(model, kernels="triton", compile_prefill=False)
    assert isinstance(fm.weights.layers[0].w_qkv, PackedWeight) and isinstance(fm.weights.lm_head, PackedWeight)
    S = 16
    ids = torch.tensor([5, 17] * (B // 2), device=DEV)
    pos = torch.tensor([6, 3] * (B // 2), device=DEV)
    results = []
    for ops in (REFERENCE_OPS, fm.ops):
        cache = fm.cache_for(B, S)
        torch.manual_seed(0)
        for t in cache.k + cache.v:
            t.copy_(torch.randn_like(t))
        cache.pad.copy_(torch.tensor([1, 4] * (B // 2), device=DEV))
        logits = forward.decode_step(fm.weights, cache.k, cache.v, cache.pad, ids, pos, ops)
        results.append((logits, [t.clone() for t in cache.k + cache.v]))
    torch.testing.assert_close(results[1][0], results[0][0], **TOL)
    for a, b in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("name,scheme,group_size", QUANTIZED)
@torch.no_grad()
def test_generate_with_the_kernels_gives_hugging_faces_tokens(name, scheme, group_size):
    """Whole calls of the fused strategy with the Triton kernels (left padding, EOS disabled) on a quantized model:
    Hugging Face generate()'s tokens on the same model."""
    model = od.load_model(name, device=DEV, quantize=scheme, group_size=group_size)
    ids, mask = make_batch(4, seed=4, device=DEV)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, eos_token_id=[], pad_token_id=0)
    dec = od.Decoder(model, fused_options=dict(kernels="triton", compile_prefill=False))
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=5, eos_token_id=[], strategy="fused")
    assert torch.equal(out, ref)


@pytest.mark.parametrize("name", ["phi3", "olmo2", "gemma2"])
@torch.no_grad()
def test_generate_of_decoder_families_with_the_kernels_equals_the_references(name):
    """A family's flags (Phi-3's QKV and gate/up as shipped, OLMo2's post-norms and whole-projection Q/K norms,
    Gemma 2's soft-caps and four norms) on int4 weights (a group of 24: per-weight group numbers): the kernels' tokens
    are their torch twins' and the caches hold the same keys and values."""
    from support.fused_families import family_model

    model = od.quantize(family_model(name, device=DEV), "int4", group_size=24)
    torch.manual_seed(0)
    ids = torch.randint(3, 500, (3, 7), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    outs, kv = [], []
    for kernels in ("torch", "triton"):
        dec = od.Decoder(model, fused_options=dict(kernels=kernels, compile_prefill=False))
        outs.append(dec.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=[], strategy="fused"))
        (cache,) = dec.fused_model()._caches.values()
        kv.append(torch.stack(cache.k + cache.v))
    assert torch.equal(outs[1], outs[0])
    torch.testing.assert_close(kv[1], kv[0], **TOL)
