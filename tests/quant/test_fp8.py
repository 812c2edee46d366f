"""fp8 (float8_e4m3fn) weights with a scale per output row (`od.quantize(model, "fp8")`): the stored numbers against
the formula, the e4m3 rounding written here from its definition; the layer; the whole model; every preset's tokens
equal to Hugging Face generate()'s on the same model (CPU, float32); the fused path's refusal on GPUs older than
sm_89 (its kernels' cases run in the interpreter: tests/fused/test_quant_kernels.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import overlapdecode as od
from overlapdecode.quant import Fp8Linear, dequantize
from overlapdecode.quant.schemes import quantize_fp8
from support.helpers import make_batch


def e4m3_values() -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite float8_e4m3fn number from its bits (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; exponent
    0 subnormal; 0x7F / 0xFF NaN, no infinities), and each one's last mantissa bit."""
    values, last = [], []
    for bits in range(256):
        sign, exp, man = bits >> 7, (bits >> 3) & 0xF, bits & 7
        if exp == 15 and man == 7:
            continue
        v = man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7)
        values.append(-v if sign else v)
        last.append(man & 1)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(last)


VALUES, LAST_BIT = e4m3_values()


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round to the nearest e4m3 number, halves to the even mantissa (float64 out)."""
    dist = (x.double()[..., None] - VALUES).abs()
    best = dist.min(-1, keepdim=True).values
    tied = dist == best
    pick = torch.where(tied.sum(-1, keepdim=True) > 1, tied & (LAST_BIT == 0), tied)
    return VALUES[pick.float().argmax(-1)]


def reference_fp8(w: torch.Tensor):
    """codes (N, K) float64, scales (N, 1) in w's dtype, w' (N, K): one row at a time."""
    codes, scales, out = [], [], []
    for row in w.float():
        s = (row.abs().max() / 448).to(w.dtype)
        q = torch.zeros(row.shape, dtype=torch.float64) if s == 0 else round_e4m3((row / s.float()).clamp(-448, 448))
        codes.append(q)
        scales.append(s)
        out.append((q.float() * s.float()).to(w.dtype))
    return torch.stack(codes), torch.stack(scales)[:, None], torch.stack(out)


def awkward_rows(dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 40, generator=g) * 0.1
    w[1] = 0.0  # no division by zero
    w[2] = -0.3  # one value: every code 448
    w[3, :6] = torch.tensor([448.0, 1.0625, 1.1875, -0.0166015625, 2.0**-9 * 0.5, -1.0625])  # s = 1: halves
    w[3, 6:] = 0.5
    w[4] *= 1e-4  # small numbers: subnormal codes
    w[5] *= 300.0
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_numbers_are_the_formula(dtype):
    w = awkward_rows(dtype)
    q, scales = quantize_fp8(w)
    codes, ref_s, ref_w = reference_fp8(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scales.shape == (6, 1) and scales.dtype == dtype
    assert torch.equal(q.double(), codes) and torch.equal(scales, ref_s)
    assert scales[1].item() == 0 and (q[1].float() == 0).all() and (q[2].float().abs() == 448).all()
    if dtype == torch.float32:  # s = 1 exactly: the halves round to the even mantissa
        assert q[3, :6].float().tolist() == [448.0, 1.0, 1.25, -0.015625, 0.0, -1.0]
    got = dequantize(od.quant.PackedWeight("fp8", q, scales, None, 40, 40))
    assert got.dtype == dtype and torch.equal(got, ref_w)


def test_the_reference_rounding_is_the_e4m3_grid():
    """The grid written from the bits: 254 finite numbers, 448 the largest, 2^-9 the smallest subnormal; torch's own
    conversion agrees on a sweep of numbers, halves included (the reference is checked before it is used)."""
    assert len(VALUES) == 254 and VALUES.max() == 448 and VALUES[VALUES > 0].min() == 2.0**-9
    x = torch.cat([torch.linspace(-448, 448, 20001), (VALUES[1:] + VALUES[:-1]).float() / 2])
    x = x[(x.abs() <= 448)]
    assert torch.equal(x.to(torch.float8_e4m3fn).double(), round_e4m3(x))


@pytest.mark.parametrize("bias", [True, False])
def test_the_fp8_layer_multiplies_by_the_dequantized_weight(bias):
    torch.manual_seed(1)
    lin = torch.nn.Linear(50, 24, bias=bias)
    layer = Fp8Linear(lin.weight, lin.bias)
    ref_w = reference_fp8(lin.weight.detach())[2]
    x = torch.randn(3, 5, 50)
    assert torch.equal(layer(x), F.linear(x, ref_w, lin.bias))
    assert layer.weight.shape == (24, 50) and layer.weight.dtype == torch.float8_e4m3fn and layer.zeros is None
    assert layer.group_size == 50 and torch.equal(dequantize(layer.packed()), ref_w)
    nbytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    assert nbytes == 24 * 50 + 24 * 4 + (24 * 4 if bias else 0)  # a byte a weight, a float32 scale a row


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_quantize_fp8_replaces_every_linear_layer_and_the_head(name):
    from transformers.pytorch_utils import Conv1D

    model = od.load_model(name, device="cpu")
    weights = {
        n: (m.weight.detach().t() if isinstance(m, Conv1D) else m.weight.detach()).clone()
        for n, m in model.named_modules()
        if isinstance(m, (Conv1D, torch.nn.Linear))
    }
    assert od.quantize(model, "fp8") is model
    layers = dict(model.named_modules())
    for layer_name, w in weights.items():
        assert type(layers[layer_name]) is Fp8Linear, layer_name
        assert torch.equal(dequantize(layers[layer_name].packed()), reference_fp8(w)[2]), layer_name
    assert not model.config.tie_word_embeddings


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama"])
def fp8_model(request):
    model = od.load_model(request.param, device="cpu", quantize="fp8")
    full = od.load_model(request.param, device="cpu")
    ids = torch.randint(3, 900, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, full(ids).logits)  # the weights really are other weights
    return model


@pytest.mark.parametrize("preset", ["baseline", "kv", "static", "fused"])
def test_eager_presets_give_hugging_faces_tokens_on_fp8_weights(fp8_model, preset):
    ids, mask = make_batch(4, seed=4)
    ref = fp8_model.generate(
        ids, attention_mask=mask, max_new_tokens=16, do_sample=False, eos_token_id=[], pad_token_id=0
    )
    out = od.generate(fp8_model, ids, attention_mask=mask, max_new_tokens=16, strategy=preset, eos_token_id=[])
    assert torch.equal(out, ref), preset


def test_compiled_presets_give_hugging_faces_tokens_on_fp8_weights():
    model = od.load_model("tiny-llama", device="cpu", quantize="fp8")
    ids, mask = make_batch(3, seed=6)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=0)
    for preset in ("compiled", "interleaved", "deferred", "nocheck"):
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=preset, eos_token_id=[])
        assert torch.equal(out, ref), preset


def test_fused_kernels_refuse_fp8_below_sm_89_naming_the_way_out():
    from overlapdecode.fused.model import check_fp8

    model = od.load_model("tiny-llama", device="cpu", quantize="fp8")
    with pytest.raises(ValueError, match=r"strategy 'fused': fp8 weights .* 8.9 or later .* this one is 8.0; pass "):
        check_fp8(model, (8, 0))
    check_fp8(model, (8, 9))
    check_fp8(model, (9, 0))
    check_fp8(od.load_model("tiny-llama", device="cpu", quantize="int8"), (7, 5))  # other weights: no refusal


def test_the_command_line_takes_fp8(capsys):
    from overlapdecode.cli import main

    argv = ["generate", "--model", "tiny-llama", "--device", "cpu", "--quantize", "fp8", "--prompt-ids", "5,6,7"]
    assert main(argv + ["--max-new-tokens", "4", "--strategy", "static"]) == 0
    assert main(argv + ["--group-size", "32"]) == 2
    assert "--group-size applies to --quantize int4 only" in capsys.readouterr().err
