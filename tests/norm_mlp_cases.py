"""kernels/norm_mlp.py against its torch reference and against the two kernels it fuses, on small shapes that are
not multiples of the tiles. Not collected by itself: test_kernel_norm_mlp.py runs this file in a fresh process
with TRITON_INTERPRET=1 (on CPU), where norm_mlp runs its two phases as two launches. On a GPU machine run it
directly (`pytest tests/norm_mlp_cases.py`): there the same cases run the one-launch kernel with the grid
barrier, and the CUDA-only cases below compare it with the two-launch form.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton.language as tl

from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual, split_k
from overlapdecode.fused.kernels.norm_linear import norm_linear
from overlapdecode.fused.kernels.norm_mlp import norm_mlp, norm_mlp_ref
from triton_interpreter import INTERPRETING, interpreter_loop_bounds  # noqa: F401 (autouse: the persistent loops)

def _bf16_to_f32(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _f32_to_bf16(values):
    """Round to nearest even, as the GPU's cvt.rn.bf16.f32 and torch do (NaN stays NaN)."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), ((u >> 16) | 0x40).astype(np.uint16), rounded)


@pytest.fixture(autouse=True)
def interpreter_bfloat16(monkeypatch):
    """Triton 3.6's interpreter keeps bfloat16 as its uint16 bits and gets it wrong: tl.dot and arithmetic
    multiply the integers, and float32 -> bfloat16 truncates. Here bfloat16 operands are widened to float32
    (exact), results rounded to nearest even, as on the GPU, so that bfloat16 cases mean something on CPU."""
    if not INTERPRETING:
        return
    import triton.runtime.interpreter as ti

    builder = ti.InterpreterBuilder
    dot, binary, cast = builder.create_dot, builder.binary_op, builder.cast_impl

    def widen(h):
        return ti.TensorHandle(_bf16_to_f32(h.data), tl.float32) if h.dtype.scalar == tl.bfloat16 else h

    def create_dot(self, a, b, d, *args):
        return dot(self, widen(a), widen(b), d, *args)

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar == tl.bfloat16 and op in (np.add, np.subtract, np.multiply, np.divide):
            out = op(_bf16_to_f32(lhs.data), _bf16_to_f32(rhs.data))
            return ti.TensorHandle(_f32_to_bf16(out), tl.bfloat16)
        return binary(self, lhs, rhs, op)

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(_f32_to_bf16(src.data), tl.bfloat16)
        return cast(self, src, dst_type)

    monkeypatch.setattr(ti.InterpreterBuilder, "create_dot", create_dot)
    monkeypatch.setattr(ti.InterpreterBuilder, "binary_op", binary_op)
    monkeypatch.setattr(ti.InterpreterBuilder, "cast_impl", cast_impl)



DEV = "cuda" if torch.cuda.is_available() else "cpu"
H, I = 40, 136  # tiles of 16: 9 up-projection tiles, 3 down-projection column blocks (the last ones partial)
TILE = dict(block_n_up=16, block_k_up=16, block_n_down=16, block_k_down=16)
STYLES = {"gpt2": ("gelu_tanh", True, True), "llama": ("silu_mul", False, False)}  # act, LayerNorm, biases


def weights(style: str, B: int, dtype=torch.float32, seed: int = 0, h: int = H, i: int = I):
    """x, norm_w, norm_b, w_up, b_up, w_down, b_down of an MLP block (GPT-2 or Llama style), small by default."""
    act, layer, bias = STYLES[style]
    g = torch.Generator().manual_seed(seed + B)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device=DEV, dtype=dtype)

    rows = 2 * i if act == "silu_mul" else i
    x = r(B, h) + 0.5
    nw, nb = r(h, scale=0.3) + 1, (r(h, scale=0.1) if layer else None)
    wu, bu = r(rows, h, scale=h**-0.5), (r(rows, scale=0.1) if bias else None)
    wd, bd = r(h, i, scale=i**-0.5), (r(h, scale=0.1) if bias else None)
    return act, (x, nw, nb, wu, bu, wd, bd)


def call(act, args, tile=TILE, **kw):
    x, nw, nb, wu, bu, wd, bd = args
    return norm_mlp(x, nw, nb, 1e-5, wu, bu, act, wd, bd, **{**tile, **kw})


def ref_of(act, args):
    x, nw, nb, wu, bu, wd, bd = args
    return norm_mlp_ref(x, nw, nb, 1e-5, wu, bu, act, wd, bd)


def two_kernels(act, args, split: int, programs: int):
    """norm_linear then linear_residual with the same tiles, and a split target `programs` that gives `split`."""
    x, nw, nb, wu, bu, wd, bd = args
    n_blocks = -(-H // TILE["block_n_down"])
    assert split_k(n_blocks, wd.shape[1], TILE["block_k_down"], programs) == split
    m = norm_linear(x, nw, nb, 1e-5, wu, bu, act, block_n=TILE["block_n_up"], block_k=TILE["block_k_up"])
    return linear_residual(m, wd, bd, x, block_n=TILE["block_n_down"], block_k=TILE["block_k_down"],
                           programs=programs)


def rel_err(got, ref) -> float:
    return ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


# (split, G): G = 2 makes every program loop over several items of both phases; G = 64 leaves programs idle
@pytest.mark.parametrize("split,G", [(1, 2), (3, 2), (3, 64)])
@pytest.mark.parametrize("B", [1, 3, 17])
@pytest.mark.parametrize("style", list(STYLES))
def test_float32_matches_reference_and_leaves_counters_at_zero(style, B, split, G):
    act, args = weights(style, B)
    tickets = Tickets(DEV)
    ref = ref_of(act, args)
    got = call(act, args, split=split, grid_programs=G, tickets=tickets)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    assert rel_err(got, ref) < 1e-5
    assert not tickets.counters.any()  # the split's tickets (and on CUDA the barrier's counters) back at 0
    again = call(act, args, split=split, grid_programs=G, tickets=tickets)
    assert torch.equal(again, got)  # deterministic, and the counters left by the first launch work
    assert not tickets.counters.any()


@pytest.mark.parametrize("style", list(STYLES))
def test_reference_is_the_mlp_block(style):
    """norm_mlp_ref, written out: x + down(act(up(norm(x)))) (float32, where its roundings change nothing)."""
    act, (x, nw, nb, wu, bu, wd, bd) = weights(style, 3)
    F = torch.nn.functional
    if nb is not None:
        n = F.layer_norm(x, (H,), nw, nb, 1e-5)
    else:
        n = nw * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    y = F.linear(n, wu, bu)
    if act == "silu_mul":
        gate, up = y.chunk(2, dim=-1)
        m = F.silu(gate) * up
    else:
        m = F.gelu(y, approximate="tanh")
    torch.testing.assert_close(norm_mlp_ref(x, nw, nb, 1e-5, wu, bu, act, wd, bd), x + F.linear(m, wd, bd),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("i,split,programs", [(I, 1, 1), (I, 2, 64), (520, 4, 12)])
@pytest.mark.parametrize("B", [1, 17])
@pytest.mark.parametrize("style", list(STYLES))
def test_bitwise_equal_to_the_two_kernels(style, B, i, split, programs, dtype):
    """Same tiles and split as norm_linear then linear_residual: the same bits, float32 included (where a
    change in the order of the 4 partial sums, or of any rounding, shows); and close to the torch reference."""
    act, args = weights(style, B, dtype, i=i)
    got = call(act, args, split=split, grid_programs=5)
    want = two_kernels(act, args, split, programs)
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_err(got, ref_of(act, args)) < tol


@pytest.mark.parametrize("prefetch_k", [0, 16, 32])
@pytest.mark.parametrize("style", list(STYLES))
def test_prefetch_widths_and_in_place(style, prefetch_k):
    """The first tile loaded ahead, of 0 (none) to 2 K tiles, with programs looping (so that the next item's
    tile, loaded during the item before, is used too); and `out` = x (the residual read and overwritten per
    column block by the one program that finishes it)."""
    act, args = weights(style, 3)
    ref = ref_of(act, args)
    got = call(act, args, split=2, grid_programs=2, prefetch_k=prefetch_k)
    assert rel_err(got, ref) < 1e-5
    x = args[0].clone()
    same = call(act, (x,) + args[1:], split=2, grid_programs=2, prefetch_k=prefetch_k, out=x)
    assert same is x and torch.equal(x, got)


def test_bad_inputs_are_refused():
    act, args = weights("llama", 3)
    x, nw, nb, wu, bu, wd, bd = args
    bad = {
        "w_down rows": dict(wd=wd[:-1].contiguous()),
        "w_up rows (silu_mul needs gate and up)": dict(wu=wu[:I].contiguous()),
        "norm_w shape": dict(nw=nw[:-1].contiguous()),
        "dtype": dict(wd=wd.double()),
        "strided x": dict(x=torch.cat([x, x], 1)[:, ::2]),
        "1-D x": dict(x=x[0]),
    }
    for what, change in bad.items():
        a = {**dict(x=x, nw=nw, nb=nb, wu=wu, bu=bu, wd=wd, bd=bd), **change}
        with pytest.raises(ValueError):
            norm_mlp(a["x"], a["nw"], a["nb"], 1e-5, a["wu"], a["bu"], act, a["wd"], a["bd"], **TILE)
            pytest.fail(f"accepted {what}")
    keywords = [dict(pdl=2), dict(prefetch_k=24), dict(prefetch_k=256), dict(split=0), dict(split=10),
                dict(block_n_up=24), dict(grid_programs=0), dict(phases=(2, 1)), dict(out=x.T.contiguous())]
    if DEV == "cpu":
        keywords.append(dict(phases=3))  # the barrier would wait for ever in the interpreter
    for kw in keywords:
        with pytest.raises(ValueError):
            call(act, args, **kw)
            pytest.fail(f"accepted {kw}")
    with pytest.raises(ValueError):
        norm_mlp(x, nw, nb, 1e-5, wu, bu, "relu", wd, bd)


@pytest.mark.skipif(DEV != "cuda", reason="the grid barrier runs on a GPU only")
@pytest.mark.parametrize("pdl", [0, 3])
@pytest.mark.parametrize("cooperative", [True, False])
@pytest.mark.parametrize("B", [1, 17])
@pytest.mark.parametrize("style", list(STYLES))
def test_one_launch_equals_two_launches_on_the_gpu(style, B, pdl, cooperative):
    """One launch with the grid barrier gives the two launches' bits, here and at the GPT-2 MLP shape (with
    GPT-2's down-projection tiles), with programs looping and with one program per SM, and leaves the split's
    tickets and the barrier's counters at zero, launch after launch."""
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    gpt2_tile = dict(block_n_up=32, block_k_up=256, block_n_down=16, block_k_down=64)
    for h, i, tile in ((H, I, TILE), (768, 3072, gpt2_tile)):
        act, args = weights(style, B, torch.bfloat16, h=h, i=i)
        for G, split in ((2, 3), (sms, 2)):
            tickets = Tickets(DEV)
            kw = dict(tile=tile, grid_programs=G, split=split, tickets=tickets)
            one = call(act, args, phases=3, pdl=pdl, cooperative=cooperative, **kw)
            two = call(act, args, phases=(1, 2), **kw)
            assert torch.equal(one, two)
            for _ in range(3):
                assert torch.equal(call(act, args, phases=3, pdl=pdl, cooperative=cooperative, **kw), one)
            torch.cuda.synchronize()  # host sync: the counters are read next
            assert not tickets.counters.any()
