"""The factored int4 form of the projections' kernels (fused/kernels/packed_weights.py, `int4_form="factored"`): the
kernels against their torch twins (which dequantize, then multiply) within float32 accumulation's tolerance, and
against the exact float64 sum of x (q - z) s, on odd shapes: K not a multiple of the group (a short last tile),
K odd (the last byte's high code is padding), groups of equal weights, rows 1 and 3 (a float32 model's broadcast
product), 16 (tl.dot) and 17 (the swapped tiles), split K, groups of 32, 64 and 128 with K tiles at and below the
group; where the tile cannot lie in one group the launch runs the unpacked form (the same bits). On CPU in Triton's
interpreter; on a GPU compiled; their sm_90 compile checks are test_kernel_compile.py's."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused.kernels import packed_weights
from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.kernels.packed_weights import FACTORED, k_tile, tile_bytes, weight_launch
from overlapdecode.fused.kernels.swap_ab import row_tile
from support.helpers import make_batch
from support.packed_weights import exact_product, packed_weight
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)
# (K, group, K tile): a short last group (K 100, 200, 264), K odd (99, 75), tiles at and below groups of 32, 64 and
# 128; K 264 in tiles of 32 is split in two ranges (of 160 and 104) where a launch asks for 64 programs or more
SHAPES = [(100, 32, 32), (99, 64, 32), (200, 64, 64), (75, 128, 64), (136, 128, 128), (264, 64, 32)]


def rnd(*shape, scale=1.0, shift=0.0):
    return (torch.randn(*shape, device=DEV) * scale + shift).contiguous()


def both_forms(launch) -> dict:
    """{form: launch(form)} for the two int4 forms."""
    return {form: launch(form) for form in packed_weights.INT4_FORMS}


def assert_factored_ran(outs: dict) -> None:
    """The two forms' float32 results differ somewhere (other arithmetic): the factored one ran, not its fallback."""
    assert not torch.equal(outs["factored"], outs["unpacked"])


@pytest.mark.parametrize("B,programs", [(1, 1), (3, 64), (16, 64), (17, 1000)])
@pytest.mark.parametrize("K,group,block_k", SHAPES)
def test_linear_residual_factored_equals_the_twin(B, programs, K, group, block_k):
    torch.manual_seed(B + K)
    x, res = rnd(B, K), rnd(B, 24)
    w = packed_weight(24, K, "int4", group, seed=K, device=DEV)
    outs = both_forms(
        lambda f: linear_residual(
            x, w, None, res, block_k=block_k, programs=programs, tickets=Tickets(DEV), int4_form=f
        )
    )
    torch.testing.assert_close(outs["factored"], linear_residual_ref(x, w, None, res), **TOL)
    assert_factored_ran(outs)


@pytest.mark.parametrize("B", [1, 3, 16, 17])
@pytest.mark.parametrize("act", ["none", "silu_mul", "gelu_tanh"])
@pytest.mark.parametrize("K,group,block_k", [SHAPES[0], SHAPES[3]])
def test_norm_linear_factored_equals_the_twin(B, act, K, group, block_k):
    torch.manual_seed(B + K)
    x = rnd(B, K) + 0.5
    layer = act == "gelu_tanh"
    nw, nb = rnd(K, scale=0.3) + 1, (rnd(K, scale=0.1) if layer else None)
    w = packed_weight(2 * 19 if act == "silu_mul" else 19, K, "int4", group, seed=K, device=DEV)
    b = rnd(w.shape[0], scale=0.1) if act != "none" else None
    od_ = torch.float32 if act == "none" else None
    outs = both_forms(lambda f: norm_linear(x, nw, nb, 1e-5, w, b, act, od_, block_k=block_k, int4_form=f))
    torch.testing.assert_close(outs["factored"], norm_linear_ref(x, nw, nb, 1e-5, w, b, act, od_), **TOL)
    assert_factored_ran(outs)


@pytest.mark.parametrize(
    "B,H,Hq,Hkv,D,group,programs",
    [(1, 99, 3, 1, 24, 32, 1), (3, 264, 4, 2, 16, 64, 1000), (16, 64, 2, 1, 24, 32, 1), (17, 270, 2, 1, 24, 64, 64)],
)
def test_norm_qkv_factored_equals_the_twin(B, H, Hq, Hkv, D, group, programs):
    torch.manual_seed(B + H)
    S = 11
    x, nw = rnd(B, H) + 0.3, rnd(H, scale=0.3) + 1
    w = packed_weight((Hq + 2 * Hkv) * D, H, "int4", group, seed=H, device=DEV)
    b = rnd(w.shape[0], scale=0.1)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos, slot = torch.randint(0, 50, (B,), device=DEV), torch.randint(0, S, (B,), device=DEV)
    caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(6)]
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    outs = {}
    for i, form in enumerate(packed_weights.INT4_FORMS, start=1):
        args = (x, nw, None, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[2 * i], caches[2 * i + 1], Hq, Hkv, D)
        outs[form] = norm_qkv(*args, block_k=32, programs=programs, tickets=Tickets(DEV), int4_form=form)
    torch.testing.assert_close(outs["factored"], q_ref, **TOL)
    torch.testing.assert_close(caches[4], caches[0], **TOL)
    torch.testing.assert_close(caches[5], caches[1], **TOL)
    assert_factored_ran(outs)


@pytest.mark.parametrize("B", [1, 16, 17])
@pytest.mark.parametrize("group,block_k", [(24, 16), (16, 16), (64, 128)])
def test_where_the_tile_cannot_lie_in_one_group_the_unpacked_form_runs(B, group, block_k):
    """A group of no power of two (24), or of 16 where tl.dot would need halves of 8 (16 and 17 rows), runs the
    unpacked form: the same bits at the same tiles (one row of a float32 model: the factored form's broadcast tile
    whatever the math, tl.dot's 16 rows for the unpacked form); a K tile wider than a group of a power of two from
    32 is cut to the group (k_tile), the same bits as asking for the group's tile."""
    torch.manual_seed(B)
    x, res = rnd(B, 150), rnd(B, 20)
    w = packed_weight(20, 150, "int4", group, seed=group, device=DEV)

    def run(form, bk):
        return linear_residual(x, w, None, res, block_k=bk, int4_form=form)

    factored = run("factored", block_k)
    torch.testing.assert_close(factored, linear_residual_ref(x, w, None, res), **TOL)
    if group == 64:
        assert torch.equal(factored, run("factored", group)) and not torch.equal(factored, run("unpacked", block_k))
    elif B > 1:
        assert torch.equal(factored, run("unpacked", block_k))
    elif group == 16:  # one row of a float32 model: the broadcast product, whose tile of 16 lies in a group of 16
        assert not torch.equal(factored, run("unpacked", block_k))


def test_a_splits_tiles_past_the_rows_groups_read_no_group_numbers():
    """K split in two ranges of 80 (K 130, K tiles of 16, groups of 16: 9 a row): the second range's last tile starts
    at 144, past the row's groups; its scale and zero are not loaded (NaN planted right after the group numbers
    stays out of the sum), in either form."""
    torch.manual_seed(0)
    x, res = rnd(1, 130), rnd(1, 20)
    w = packed_weight(20, 130, "int4", 16, seed=1, device=DEV)

    def nan_after(t):
        room = torch.full((t.numel() + 16,), float("nan"), device=DEV)
        room[: t.numel()] = t.flatten()
        return room[: t.numel()].view(t.shape)

    w = w._replace(scales=nan_after(w.scales), zeros=nan_after(w.zeros))
    ref = linear_residual_ref(x, w, None, res)
    for form in packed_weights.INT4_FORMS:
        got = linear_residual(x, w, None, res, block_k=16, programs=64, tickets=Tickets(DEV), int4_form=form)
        torch.testing.assert_close(got, ref, **TOL)


# the interpreter holds bfloat16 as its bits and truncates its conversions: bfloat16 on a GPU only
BF16_ON_GPU = pytest.param(torch.bfloat16, marks=pytest.mark.skipif(DEV == "cpu", reason="the interpreter's bfloat16"))


@pytest.mark.parametrize("dtype", [torch.float16, BF16_ON_GPU])
@pytest.mark.parametrize("B", [1, 17])
@pytest.mark.parametrize("shift", [0.0, 1.0])
def test_the_factored_form_is_as_close_to_float64_in_16_bit(dtype, B, shift):
    """16-bit models: the factored form multiplies exact codes and never rounds w' = (q - z) s to the dtype, so its
    outputs lie on average at least as close to the float64 sum of x (q - z) s as the unpacked form's, x of mean 0
    or 1 (both outputs rounded to the dtype, as the kernels round a projection)."""
    torch.manual_seed(B)
    x = rnd(B, 256, shift=shift).to(dtype)
    w = packed_weight(64, 256, "int4", 64, seed=B, device=DEV, dtype=dtype)
    exact = exact_product(x, w)
    err = {
        f: (norm_linear(x, None, None, 1e-5, w, None, "none", torch.float32, int4_form=f).double() - exact).abs().mean()
        for f in packed_weights.INT4_FORMS
    }
    assert err["factored"] <= err["unpacked"], err


@pytest.mark.parametrize("B", [1, 16, 17])
def test_the_factored_form_in_float32_stays_near_float64(B):
    """float32: both forms round at float32's level; the factored one's partial sum x (q - 8) of centred codes keeps
    near the result's size (uncentred, sum x q of x of mean 1 is ~8x larger: errors ~10x the unpacked form's), so
    its mean distance to float64 stays within 3x the unpacked form's."""
    torch.manual_seed(B)
    x = rnd(B, 256, shift=1.0)
    w = packed_weight(64, 256, "int4", 128, seed=B, device=DEV)
    exact = exact_product(x, w)
    err = {
        f: (norm_linear(x, None, None, 1e-5, w, None, "none", torch.float32, int4_form=f).double() - exact).abs().mean()
        for f in packed_weights.INT4_FORMS
    }
    assert err["factored"] <= 3 * err["unpacked"], err


def test_the_form_is_chosen_by_keyword_or_module_default_and_checked(monkeypatch):
    w = packed_weight(8, 64, "int4", 32)
    assert weight_launch(w)[1]["QUANT"] == 2  # the default form: unpacked
    assert weight_launch(w, "factored")[1]["QUANT"] == FACTORED
    assert weight_launch(packed_weight(8, 64, "int8", None), "factored")[1]["QUANT"] == 1  # int4 only
    with pytest.raises(ValueError, match="^int4_form must be one of 'unpacked', 'factored', got 'packed'"):
        weight_launch(w, "packed")
    with pytest.raises(ValueError, match="^int4_form must be one of"):  # before any work, whatever the weight
        linear_residual(rnd(2, 64), torch.zeros(8, 64, device=DEV), None, None, int4_form="Factored")
    monkeypatch.setattr(packed_weights, "INT4_FORM", "factored")
    assert weight_launch(w)[1]["QUANT"] == FACTORED and weight_launch(w, "unpacked")[1]["QUANT"] == 2
    monkeypatch.setattr(packed_weights, "INT4_FORM", "fast")
    with pytest.raises(ValueError, match="^packed_weights.INT4_FORM must be one of"):
        weight_launch(w)


def test_the_factored_forms_tiles():
    """Row tiles: a float32 model's factored launches under 16 rows take the rows rounded up to a power of two (the
    broadcast product), 16-bit ones and the unpacked form 16 rows (tl.dot); K tiles cut to a group of a power of
    two from 32."""
    for dtype, factored_rows in ((torch.float32, [1, 4, 16]), (torch.float16, [16] * 3)):
        w = packed_weight(8, 64, "int4", 32, dtype=dtype)
        codes, unpacked = weight_launch(w, "unpacked")
        _, factored = weight_launch(w, "factored")
        assert [row_tile(r, tile_bytes(codes, factored)) for r in (1, 3, 16)] == factored_rows
        assert [row_tile(r, tile_bytes(codes, unpacked)) for r in (1, 3, 16)] == [16] * 3
        assert k_tile(256, factored) == 32 and k_tile(16, factored) == 16 and k_tile(256, unpacked) == 256
    for group, cut in ((128, 128), (16, 256), (96, 256)):
        assert k_tile(256, weight_launch(packed_weight(8, 256, "int4", group), "factored")[1]) == cut


@torch.no_grad()
def test_generate_with_the_factored_form_gives_hugging_faces_tokens(monkeypatch):
    """A whole fused call (float32 tiny Llama, int4 in groups of 32, left padding, EOS disabled) with every int4
    launch in the factored form (the module default set, as scripts/kernel_sweep.py sets it): Hugging Face
    generate()'s tokens on the same model."""
    from overlapdecode.fused.kernels import linear_residual as lr_module
    from overlapdecode.fused.kernels import norm_linear as nl_module
    from overlapdecode.fused.kernels import norm_qkv as nq_module

    seen = []

    def spy(w, int4_form=None):
        codes, launch = weight_launch(w, int4_form)
        seen.append(launch["QUANT"])
        return codes, launch

    for module in (lr_module, nl_module, nq_module):
        monkeypatch.setattr(module, "weight_launch", spy)
    monkeypatch.setattr(packed_weights, "INT4_FORM", "factored")
    model = od.load_model("tiny-llama", device=DEV, quantize="int4", group_size=32)
    ids, mask = make_batch(4, seed=4, device=DEV)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=[], pad_token_id=0)
    dec = od.Decoder(model, fused_options=dict(kernels="triton", compile_prefill=False))
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=6, eos_token_id=[], strategy="fused")
    assert torch.equal(out, ref)
    assert seen and set(seen) == {FACTORED}
