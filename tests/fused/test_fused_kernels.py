"""Each Triton kernel of the fused step against its torch reference, on small shapes that are not multiples
of the block sizes. On CPU the kernels run in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1
before Triton is first imported); on a GPU machine they compile and run there.
"""

from __future__ import annotations

import pytest
import torch

from overlapdecode.fused import forward
from overlapdecode.fused.kernels import dense as dense_gemm
from overlapdecode.fused.kernels import norm_prologue
from overlapdecode.fused.kernels.embed import embed, embed_ref
from overlapdecode.fused.kernels.greedy import GreedyFinish, StepLog, greedy_choice, greedy_finish_ref
from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual, linear_residual_ref, split_k
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_prologue import NormSums, norm_ref, normalized_rows, sums_args
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.kernels.rope import rope_cos_sin, rope_table, rope_table_ref
from overlapdecode.fused.kernels.swap_ab import use_prenorm
from overlapdecode.fused.model import REFERENCE_OPS, FusedModel
from support.fused_families import FAMILIES, family_model
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture: the attention's loops)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)


def column(values, at: int = 1, width: int = 3):
    """`values` (B,) as column `at` of a (B, width) tensor of other numbers: a strided view, as the decode
    loop's tokens and positions are columns of its (B, 3) state."""
    state = torch.randint(1000, 2000, (values.shape[0], width), device=values.device, dtype=values.dtype)
    state[:, at] = values
    return state[:, at]


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).contiguous()


@pytest.mark.parametrize("B,K,N", [(1, 40, 24), (3, 72, 50), (17, 33, 16)])
@pytest.mark.parametrize("act", ["none", "gelu_tanh", "silu_mul"])
@pytest.mark.parametrize("layer", [False, True])
def test_norm_linear(B, K, N, act, layer):
    torch.manual_seed(B * K + N)
    x = rnd(B, K) + 0.5
    nw, nb = rnd(K, scale=0.3) + 1, (rnd(K, scale=0.1) if layer else None)
    rows = 2 * N if act == "silu_mul" else N
    w, b = rnd(rows, K, scale=K**-0.5), (rnd(rows, scale=0.1) if act != "none" else None)
    out_dtype = torch.float32 if act == "none" else None
    ref = norm_linear_ref(x, nw, nb, 1e-5, w, b, act, out_dtype)
    got = norm_linear(x, nw, nb, 1e-5, w, b, act, out_dtype, block_k=32)
    assert got.shape == ref.shape and got.dtype == ref.dtype
    torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize(
    "B,H,Hq,Hkv,D,programs",
    [
        (1, 48, 3, 1, 24, 1),
        (3, 40, 4, 2, 16, 1),
        (2, 64, 2, 2, 40, 1),
        (3, 300, 4, 2, 16, 1000),
        (17, 520, 2, 1, 24, 64),
    ],
)
@pytest.mark.parametrize("rope,layer,bias", [(True, False, False), (True, False, True), (False, True, True)])
def test_norm_qkv(B, H, Hq, Hkv, D, programs, rope, layer, bias):
    torch.manual_seed(B + H + D)
    S = 11
    x = rnd(B, H) + 0.3
    nw, nb = rnd(H, scale=0.3) + 1, (rnd(H, scale=0.1) if layer else None)
    rows = (Hq + 2 * Hkv) * D
    w, b = rnd(rows, H, scale=H**-0.5), (rnd(rows, scale=0.1) if bias else None)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D)) if rope else None
    pos = column(torch.randint(0, 50, (B,), device=DEV))  # strided, as the decode loop's
    slot = torch.randint(0, S, (B,), device=DEV)
    if B > 1:
        assert pos.stride(0) == 3
    caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, nb, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    args = (x, nw, nb, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[2], caches[3], Hq, Hkv, D)
    q = norm_qkv(*args, block_k=32, programs=programs, dense=False)  # at 17 rows the swapped GEMV, split
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)  # K written at the slot, nothing else touched
    torch.testing.assert_close(caches[3], caches[1], **TOL)
    assert caches[0].abs().sum() > 0


@pytest.mark.parametrize("B,K,N,programs", [(1, 100, 24, 1), (3, 520, 40, 64), (9, 1100, 17, 1000)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_residual(B, K, N, programs, bias):
    torch.manual_seed(K + N)
    x, w, res = rnd(B, K), rnd(N, K, scale=K**-0.5), rnd(B, N)
    b = rnd(N, scale=0.1) if bias else None
    got = linear_residual(x, w, b, res, block_k=32, programs=programs)
    torch.testing.assert_close(got, linear_residual_ref(x, w, b, res), **TOL)


@pytest.mark.parametrize("B,swap", [(3, True), (3, False), (40, True), (40, False), (128, True)])
def test_swapped_and_row_block_tiles_match_the_references(B, swap):
    """Both orientations of every GEMV kernel (swap_ab.py: the weight rows as the MMA's M and the batch as its N,
    or 16-row blocks of the batch) on odd shapes, at a few rows, at 40 (a partial batch tile of 64) and at 128 rows,
    split-K (programs=1000) and not, with their epilogues: norm + SiLU-mul and LayerNorm + GELU + bias, norm + QKV
    with RoPE, bias and the cache write (heads of 24 dims: tiles of 16 or 64 span heads), the residual add."""
    torch.manual_seed(B + swap)
    K, N = 72, 50
    x = rnd(B, K) + 0.5
    nw, nb = rnd(K, scale=0.3) + 1, rnd(K, scale=0.1)
    for act, layer, programs in (("silu_mul", False, 1), ("gelu_tanh", True, 1000), ("none", False, 1000)):
        w = rnd(2 * N if act == "silu_mul" else N, K, scale=K**-0.5)
        b = rnd(w.shape[0], scale=0.1) if act == "gelu_tanh" else None
        ref = norm_linear_ref(x, nw, nb if layer else None, 1e-5, w, b, act)
        got = norm_linear(x, nw, nb if layer else None, 1e-5, w, b, act, block_k=16, swap=swap, programs=programs)
        torch.testing.assert_close(got, ref, **TOL)
    Hq, Hkv, D, S = 4, 2, 24, 13
    rows = (Hq + 2 * Hkv) * D
    w, b = rnd(rows, K, scale=K**-0.5), rnd(rows, scale=0.1)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = column(torch.randint(0, 50, (B,), device=DEV))
    slot = torch.randint(0, S, (B,), device=DEV)
    for programs, half in ((1, None), (1000, 16)):
        caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]
        q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, b, inv_freq, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D)
        q = norm_qkv(
            x,
            nw,
            None,
            1e-5,
            w,
            b,
            inv_freq,
            0.9,
            pos,
            slot,
            caches[2],
            caches[3],
            Hq,
            Hkv,
            D,
            half=half,
            block_k=16,
            programs=programs,
            swap=swap,
        )
        torch.testing.assert_close(q, q_ref, **TOL)
        torch.testing.assert_close(caches[2], caches[0], **TOL)
        torch.testing.assert_close(caches[3], caches[1], **TOL)
    Kd = 300
    xd, wd, res = rnd(B, Kd), rnd(N, Kd, scale=Kd**-0.5), rnd(B, N)
    for programs in (1, 1000):
        got = linear_residual(xd, wd, b[:N], res, block_k=16, programs=programs, swap=swap)
        torch.testing.assert_close(got, linear_residual_ref(xd, wd, b[:N], res), **TOL)


@pytest.mark.parametrize("style", ["rms", "rms_offset", "rms_f32", "layer"])
def test_prenormalised_rows_of_the_swapped_launches(style):
    """From 17 rows on (swap_ab.use_prenorm) the swapped kernels multiply rows normalised by one launch beforehand
    (normalized_rows): every norm style as the references round it, from x or from recorded sums of squares, and
    norm_linear / norm_qkv on those rows equal to their references, on odd shapes."""
    torch.manual_seed(len(style))
    B, K, N = 67, 72, 50
    assert use_prenorm(B) and use_prenorm(17) and not use_prenorm(16)  # where the launches swap by default
    x = rnd(B, K) + 0.5
    nw, nb = rnd(K, scale=0.3) + 1, (rnd(K, scale=0.1) if style == "layer" else None)
    rms = "rms" if style == "layer" else style
    ref = norm_ref(x, nw, nb, 1e-5, rms)
    got = normalized_rows(x, nw, nb, 1e-5, rms, sums_args(None, x, nb is not None))
    torch.testing.assert_close(got, ref, **TOL)
    if nb is None:  # the sums of squares as a writer records them (two column blocks)
        parts = torch.stack([(x[:, :40].float() ** 2).sum(1), (x[:, 40:].float() ** 2).sum(1)])
        sums = NormSums()
        sums.record(x, parts)
        torch.testing.assert_close(normalized_rows(x, nw, None, 1e-5, rms, sums_args(sums, x, False)), ref, **TOL)
    w = rnd(2 * N, K, scale=K**-0.5)
    got = norm_linear(x, nw, nb, 1e-5, w, None, "silu_mul", block_k=16, swap=True, programs=1000, norm_style=rms)
    torch.testing.assert_close(got, norm_linear_ref(x, nw, nb, 1e-5, w, None, "silu_mul", norm_style=rms), **TOL)
    if nb is None and style != "rms_f32":
        Hq, Hkv, D, S = 4, 2, 24, 13
        wq = rnd((Hq + 2 * Hkv) * D, K, scale=K**-0.5)
        inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
        pos = column(torch.randint(0, 50, (B,), device=DEV))
        slot = torch.randint(0, S, (B,), device=DEV)
        caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]
        args = (wq, None, inv_freq, 1.0, pos, slot)
        q_ref = norm_qkv_ref(x, nw, None, 1e-5, *args, caches[0], caches[1], Hq, Hkv, D, norm_style=rms)
        q = norm_qkv(x, nw, None, 1e-5, *args, caches[2], caches[3], Hq, Hkv, D, block_k=16, swap=True, norm_style=rms)
        torch.testing.assert_close(q, q_ref, **TOL)
        torch.testing.assert_close(caches[2], caches[0], **TOL)


def test_swapped_tiles_in_16_bit_follow_the_row_block_tiles():
    """float16 (bfloat16's stand-in in the interpreter): the swapped kernels convert to the dtype where the
    row-block kernels do; only the order of the float32 sums inside a dot may differ, a flipped last bit now and
    then."""
    torch.manual_seed(9)
    h, B, K, N = torch.float16, 40, 96, 64
    x, nw = (rnd(B, K) + 0.3).to(h), (rnd(K, scale=0.3) + 1).to(h)
    w = rnd(2 * N, K, scale=K**-0.5).to(h)
    a, c = (norm_linear(x, nw, None, 1e-5, w, None, "silu_mul", block_k=32, swap=s) for s in (True, False))
    assert (a != c).float().mean() < 0.05
    torch.testing.assert_close(a, c, atol=4e-3, rtol=2e-3)
    res = rnd(B, N).to(h)
    a, c = (linear_residual(x, w[:N], None, res, block_k=32, swap=s, programs=1000) for s in (True, False))
    assert (a != c).float().mean() < 0.05
    torch.testing.assert_close(a, c, atol=4e-3, rtol=2e-3)


@pytest.mark.parametrize("B,H,block_n,programs", [(1, 40, 16, 1), (3, 72, 16, 64), (17, 100, 32, 1000)])
def test_norm_sums_handed_from_writers_to_rms_norms(B, H, block_n, programs):
    """The writers of a hidden state (embed, linear_residual, split or not) record its rows' sums of squares
    per column block (NormSums); the RMSNorm kernels that read that very tensor use them, and give what their
    references give. A tensor made otherwise (here a copy), or changed in place since, is normalised from x.
    (The interpreter runs a split's programs one after another, so the program that finishes a tile is always
    the last to run here: a sums store misplaced before the split's reduction would pass on CPU and only the
    GPU run of this file could catch it.)"""
    torch.manual_seed(B * H + block_n)
    V, K, Hq, Hkv, D, S = 13, 3 * H, 2, 1, 16, 9
    sums = NormSums(min_rows=1)
    wte = rnd(V, H)
    ids = column(torch.randint(0, V, (B,), device=DEV), at=0)
    pos = column(torch.randint(0, 4, (B,), device=DEV))
    pad = torch.zeros(B, dtype=torch.long, device=DEV)
    h, slot, _ = embed(wte, None, ids, pos, pad, block=16, norm_sums=sums)
    blocks = -(-H // 16)
    assert sums.of(h).shape == (blocks, B)
    hf = torch.nn.functional.pad(h, (0, blocks * 16 - H)).view(B, blocks, 16)
    torch.testing.assert_close(sums.of(h), (hf * hf).sum(-1).T, **TOL)  # (NB, B): block-major
    nw = rnd(H, scale=0.3) + 1
    w = rnd((Hq + 2 * Hkv) * D, H, scale=H**-0.5)
    caches = [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]
    q = norm_qkv(
        h,
        nw,
        None,
        1e-5,
        w,
        None,
        None,
        1.0,
        pos,
        slot,
        caches[2],
        caches[3],
        Hq,
        Hkv,
        D,
        block_k=32,
        programs=programs,
        norm_sums=sums,
        dense=False,
    )
    q_ref = norm_qkv_ref(h, nw, None, 1e-5, w, None, None, 1.0, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)
    x, wd = rnd(B, K), rnd(H, K, scale=K**-0.5)
    h2 = linear_residual(x, wd, None, h, block_n=block_n, block_k=32, programs=programs, norm_sums=sums, dense=False)
    assert sums.of(h) is None and sums.of(h2).shape == (-(-H // block_n), B)
    nb = -(-H // block_n)
    hb = torch.nn.functional.pad(h2, (0, nb * block_n - H)).view(B, nb, block_n)
    torch.testing.assert_close(sums.of(h2), (hb * hb).sum(-1).T, **TOL)
    wu = rnd(2 * 24, H, scale=H**-0.5)
    for act, w_, od in (("silu_mul", wu, None), ("none", wu, torch.float32)):
        got = norm_linear(h2, nw, None, 1e-5, w_, None, act, od, block_k=32, norm_sums=sums)
        torch.testing.assert_close(got, norm_linear_ref(h2, nw, None, 1e-5, w_, None, act, od), **TOL)
    # sums of another tensor are never used: a copy, or h2 changed in place after its writer
    other = h2 * 3
    torch.testing.assert_close(
        norm_linear(other, nw, None, 1e-5, wu, None, "none", None, block_k=32, norm_sums=sums),
        norm_linear_ref(other, nw, None, 1e-5, wu, None, "none"),
        **TOL,
    )
    h2.mul_(3)
    assert sums.of(h2) is None
    # a writer that does not record (below min_rows) into a recorded tensor drops its sums
    h3 = linear_residual(x, wd, None, h, block_n=block_n, block_k=32, norm_sums=sums)
    assert sums.of(h3) is not None
    sums.min_rows = B + 1
    linear_residual(x, wd, None, h, block_n=block_n, block_k=32, norm_sums=sums, out=h3)
    assert sums.of(h3) is None
    torch.testing.assert_close(
        norm_linear(h2, nw, None, 1e-5, wu, None, "none", None, block_k=32, norm_sums=sums),
        norm_linear_ref(h2, nw, None, 1e-5, wu, None, "none"),
        **TOL,
    )


@torch.inference_mode()
def test_norm_sums_under_inference_mode():
    """Under torch.inference_mode the hidden states have no version counter: the sums are still handed on
    (by identity) and a whole call gives the references' tokens (it raised at e820448)."""
    import overlapdecode as od

    model = od.load_model("tiny-llama", device=DEV)
    ids = torch.randint(0, 500, (3, 5), device=DEV, generator=torch.Generator(DEV).manual_seed(1))
    outs = [
        od.Decoder(model, fused_options=dict(kernels=k, compile_prefill=False)).generate(
            ids, max_new_tokens=6, eos_token_id=[], strategy=od.Strategy(cache="fused", stop_check="pingpong")
        )
        for k in ("torch", "triton")
    ]
    assert torch.equal(outs[1], outs[0])
    sums = NormSums(min_rows=1)
    h = linear_residual(rnd(2, 48), rnd(24, 48), None, rnd(2, 24), block_k=16, norm_sums=sums)
    assert h.is_inference() and sums.of(h) is not None


def test_norm_sums_are_recorded_from_min_rows_on():
    """Below NormSums.min_rows (default 2) writers record nothing, and readers normalise from x."""
    sums = NormSums()
    x, w = rnd(1, 48), rnd(24, 48, scale=48**-0.5)
    h1 = linear_residual(x, w, None, rnd(1, 24), block_k=16, norm_sums=sums)
    assert sums.of(h1) is None
    h2 = linear_residual(rnd(2, 48), w, None, rnd(2, 24), block_k=16, norm_sums=sums)
    assert sums.of(h2).shape == (1, 2)


def test_split_tickets_return_to_zero_and_serve_the_next_launch():
    """The last program of a split tile puts its counter back to 0: one Tickets serves launch after launch
    (the fused step shares one across its kernels), and every launch is right."""
    torch.manual_seed(3)
    tickets = Tickets(DEV)
    for B, K, N in [(3, 520, 40), (2, 1100, 17), (3, 520, 40)]:
        x, w, res = rnd(B, K), rnd(N, K, scale=K**-0.5), rnd(B, N)
        got = linear_residual(x, w, None, res, block_k=32, programs=64, tickets=tickets)
        torch.testing.assert_close(got, linear_residual_ref(x, w, None, res), **TOL)
        assert int(tickets.counters.abs().sum()) == 0
    S, H, Hq, Hkv, D = 7, 300, 4, 2, 16
    x, nw = rnd(2, H), rnd(H) + 1
    w = rnd((Hq + 2 * Hkv) * D, H, scale=H**-0.5)
    pos = slot = torch.tensor([1, 5], device=DEV)
    caches = [torch.zeros(2, Hkv, S, D, device=DEV) for _ in range(4)]
    for _ in range(2):
        q = norm_qkv(
            x,
            nw,
            None,
            1e-5,
            w,
            None,
            None,
            1.0,
            pos,
            slot,
            caches[2],
            caches[3],
            Hq,
            Hkv,
            D,
            block_k=32,
            programs=1000,
            tickets=tickets,
        )
        torch.testing.assert_close(
            q, norm_qkv_ref(x, nw, None, 1e-5, w, None, None, 1.0, pos, slot, caches[0], caches[1], Hq, Hkv, D), **TOL
        )
        assert int(tickets.counters.abs().sum()) == 0


def _finish(state, eos, pad_id=0):
    return GreedyFinish(
        state.clone(),
        torch.tensor(eos, dtype=torch.long, device=DEV),
        pad_id,
        torch.zeros((), dtype=torch.bool, device=DEV),
    )


def _check_choice_against_ref(logits, state, eos, pad_id=0, block_v=16, tickets=None):
    """greedy_choice against greedy_finish_ref (the decode loop's choice): state and flag exactly."""
    ref, got = _finish(state, eos, pad_id), _finish(state, eos, pad_id)
    greedy_finish_ref(logits, ref)
    greedy_choice(logits, got, tickets=tickets, block_v=block_v)
    assert torch.equal(got.state, ref.state), (got.state, ref.state)
    assert bool(got.done) == bool(ref.done)
    return got


@pytest.mark.parametrize(
    "B,V,block_v", [(1, 50, 16), (3, 67, 32), (17, 16 * 300 + 5, 16), (2, 1000, 2048), (9, 1500, None)]
)
def test_greedy_choice_equals_the_loops_choice(B, V, block_v):
    """The greedy choice kernel (kernels/greedy.py) makes the decode loop's choice (argmax_rows then
    mark_finished): tokens, positions + 1, finished flags and the all-finished flag, with finished rows padded
    and EOS among the chosen tokens, over one or two row blocks, one program or more column blocks than one
    reduction pass."""
    torch.manual_seed(B + V)
    logits = rnd(B, V)
    state = torch.stack(
        [torch.randint(0, V, (B,)), torch.randint(5, 50, (B,)), torch.zeros(B, dtype=torch.long)], 1
    ).to(DEV)
    first = _check_choice_against_ref(logits, state, [], block_v=block_v)
    assert not bool(first.done) and (first.state[:, 1] == state[:, 1] + 1).all()
    chosen = first.state[:, 0].tolist()
    if B > 1:
        state[0, 2] = 1  # row 0 finished earlier: it emits the pad id
    got = _check_choice_against_ref(logits, state, [chosen[-1], V + 3], pad_id=7, block_v=block_v)
    assert got.state[-1, 2] == 1 and (B == 1 or got.state[0, 0] == 7)
    state[:, 2] = 1
    assert bool(_check_choice_against_ref(logits, state, [1], pad_id=2, block_v=block_v).done)


@pytest.mark.parametrize("running", [None, 0, 1, 2])
def test_greedy_choice_flag_counts_every_row_block(running):
    """Each row block's last program reduces its own rows and the last of those writes the all-finished flag: over
    two row blocks and a part block (B 40), every row finished but one of block `running` (None: none running):
    done only when no block has a row running, whichever block's reduction comes last; the counters back at 0."""
    B, V = 40, 300
    torch.manual_seed(40)
    logits = rnd(B, V)
    state = torch.zeros((B, 3), dtype=torch.long, device=DEV)
    state[:, 2] = 1
    if running is not None:
        state[running * 16, 2] = 0  # one row of the block still running
    tickets = Tickets(DEV)
    got = _check_choice_against_ref(logits, state, [], tickets=tickets)
    assert bool(got.done) == (running is None) and int(tickets.counters.abs().sum()) == 0


@pytest.mark.parametrize(
    "case",
    [
        "tie across passes",
        "NaN beats inf",
        "NaN beats inf in its block",
        "NaN beats inf in its pass",
        "all -inf",
        "inf",
    ],
)
def test_greedy_choice_ties_nan_and_infinities(case):
    """Row 0 of the logits made for the case, row 1 random: a tie goes to the first column, also across the
    reduction's passes (301 column blocks of 16); a NaN counts as the maximum (the first NaN); a row of -inf
    chooses column 0, as torch.argmax does."""
    B, V = 2, 16 * 300 + 5
    logits = rnd(B, V)
    want = {
        "tie across passes": 100,
        "NaN beats inf": 4600,
        "NaN beats inf in its block": 4601,
        "NaN beats inf in its pass": 200,
        "all -inf": 0,
        "inf": 4700,
    }[case]
    if case == "tie across passes":
        logits[0, 100] = logits[0, 4500] = 50.0
    elif case == "NaN beats inf":
        logits[0, 50] = float("inf")
        logits[0, 4600] = logits[0, 4700] = float("nan")
    elif case == "NaN beats inf in its block":  # columns 4600 and 4601: one block of 16
        logits[0, 4600], logits[0, 4601] = float("inf"), float("nan")
    elif case == "NaN beats inf in its pass":  # blocks 3 and 12: one reduction pass
        logits[0, 50], logits[0, 200] = float("inf"), float("nan")
    elif case == "all -inf":
        logits[0].fill_(float("-inf"))
    else:
        logits[0, 4700] = logits[0, 4800] = float("inf")
    state = torch.zeros((B, 3), dtype=torch.long, device=DEV)
    tickets = Tickets(DEV)
    wide = torch.full((B, V + 7), 99.0, device=DEV)  # its last 7 columns would win if read
    wide[:, :V] = logits
    for rows in (logits, wide[:, :V]):  # the second a column slice (rows not back to back), read in place
        got = _check_choice_against_ref(rows, state, [want], tickets=tickets)
        assert got.state[0].tolist() == [want, 1, 1] and int(tickets.counters.abs().sum()) == 0


def test_greedy_choice_refuses_bad_buffers():
    logits = rnd(2, 20)
    ok = _finish(torch.zeros((2, 3), dtype=torch.long, device=DEV), [1])
    with pytest.raises(ValueError, match="finish.state must be a contiguous \\(2, 3\\) long"):
        greedy_choice(logits, ok._replace(state=ok.state[:1]))
    with pytest.raises(ValueError, match="finish.done must be a 0-d bool"):
        greedy_choice(logits, ok._replace(done=ok.state))
    with pytest.raises(ValueError, match="logits must be a \\(B, V\\) float32 tensor"):
        greedy_choice(logits.half(), ok)
    with pytest.raises(ValueError, match="logits must have contiguous rows"):
        greedy_choice(rnd(20, 2).t(), ok)
    with pytest.raises(ValueError, match="at least one row and one column"):
        greedy_choice(rnd(2, 0), ok)
    with pytest.raises(ValueError, match="block_v must be a power of two"):
        greedy_choice(logits, ok, block_v=48)


@pytest.mark.parametrize("B", [3, 17])
def test_greedy_choice_writes_each_steps_tokens_and_flag_into_the_step_log(B):
    """With a StepLog the kernel also writes each row's token at column `count` of the log's tokens and the
    all-finished flag at slot `count` of its flags (pinned host memory on a GPU), and advances the count; a count
    past the log's end writes nothing. (Its torch twin writes the log on CPU only: tests/loop/test_step_graph.py.)"""
    torch.manual_seed(7 + B)
    V, L = 70, 5
    tickets = Tickets(DEV)
    state = torch.zeros((B, 3), dtype=torch.long, device=DEV)
    state[1:, 2] = 1  # rows after the first already finished: they emit pad
    # views of longer buffers (one more row of tokens, three more flags): writes past the log show
    longer = StepLog.empty(B, L + 3, torch.device(DEV))
    guard = StepLog(torch.full((B + 1, L), -1, dtype=torch.long, device=DEV), longer.flags, longer.count)
    log = StepLog(guard.tokens[:B], guard.flags[:L], guard.count)
    log.count.fill_(1)
    got, ref = _finish(state, [5])._replace(log=log), _finish(state, [5])
    want_flags, want_tokens = [False] * (L + 3), [[-1] * L for _ in range(B)]
    for step in range(6):  # step j writes column j + 1 (none past column 4); at step 3 every row emits EOS (5)
        logits = rnd(B, V)
        logits[:, 5] = -1e9 if step < 3 else 1e9
        greedy_choice(logits, got, tickets=tickets, block_v=16)
        greedy_finish_ref(logits, ref)
        assert torch.equal(got.state, ref.state) and bool(got.done) == bool(ref.done)
        if step + 1 < L:
            want_flags[step + 1] = bool(ref.done)
            for b in range(B):
                want_tokens[b][step + 1] = int(ref.state[b, 0])
    assert want_flags[4] and guard.flags.tolist() == want_flags
    assert log.tokens.tolist() == want_tokens and guard.tokens[B].tolist() == [-1] * L
    assert log.count.tolist() == [7] and int(tickets.counters.abs().sum()) == 0


def test_greedy_choice_refuses_a_bad_step_log():
    logits = rnd(2, 20)
    ok = _finish(torch.zeros((2, 3), dtype=torch.long, device=DEV), [1])
    log = StepLog.empty(2, 4, torch.device(DEV))
    with pytest.raises(TypeError, match="finish.log must be a StepLog"):
        greedy_choice(logits, ok._replace(log=tuple(log)))
    with pytest.raises(ValueError, match="finish.log.flags must be a contiguous non-empty 1-d bool"):
        greedy_choice(logits, ok._replace(log=log._replace(flags=log.flags.long())))
    with pytest.raises(ValueError, match="finish.log.tokens must be a contiguous \\(2, 4\\) long"):
        greedy_choice(logits, ok._replace(log=log._replace(tokens=log.tokens[:, :3])))
    with pytest.raises(ValueError, match="finish.log.count must be a \\(1,\\) int32"):
        greedy_choice(logits, ok._replace(log=log._replace(count=log.count.long())))


@pytest.mark.parametrize("B,H,block", [(1, 40, 16), (3, 37, 16), (2, 64, 1024)])
@pytest.mark.parametrize("positions", [False, True])
def test_embed(B, H, block, positions):
    """Token (+ position) embedding, slot and length in one launch; an id outside the table reads zeros."""
    torch.manual_seed(B * H)
    V, S = 11, 23
    wte, wpe = rnd(V, H), (rnd(S, H) if positions else None)
    # tokens and positions as columns of a (B, 3) state (strided), as the decode loop passes them
    ids = column(torch.randint(0, V, (B,), device=DEV), at=0)
    pos = column(torch.randint(0, S - 5, (B,), device=DEV))
    pad = torch.randint(0, 5, (B,), device=DEV)
    got, ref = embed(wte, wpe, ids, pos, pad, block=block), embed_ref(wte, wpe, ids, pos, pad)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        torch.testing.assert_close(g, r, atol=0, rtol=0)  # a gather and one add: exact
    ids[0] = V  # past the table (never made by the step: ids outside [0, V) read zeros, not memory past it)
    h, _, _ = embed(wte, wpe, ids, pos, pad, block=block)
    assert torch.equal(h[0], torch.zeros(H, device=DEV) if wpe is None else wpe[pos[0]])


@pytest.mark.parametrize("B", [2, 20])
@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
@torch.no_grad()
def test_whole_step_kernels_vs_reference(name, B, monkeypatch):
    """The decode step made of the kernels equals the one made of their references, cache writes included,
    with the step's embedding by the embedding kernel (as the step runs it) and by torch ops. At 20 rows in dense
    form (from 17 rows here): every O and down epilogue hands its rows normalised to the next projection
    (kernels/residual_norm.py; GPT-2's LayerNorm, Llama's RMSNorm), so the one normalising launch left in the step
    is the first layer's."""
    import overlapdecode as od

    normalising = []
    if B > 16:
        monkeypatch.setattr(dense_gemm, "DENSE_ROWS", 17)
        rows = norm_prologue.normalized_rows
        monkeypatch.setattr(norm_prologue, "normalized_rows", lambda *a, **k: normalising.append(1) or rows(*a, **k))
    model = od.load_model(name, device=DEV)
    fm = FusedModel(model, kernels="triton", compile_prefill=False)
    S = 16
    ids = column(torch.tensor([5, 17] * (B // 2), device=DEV), at=0)
    pos = column(torch.tensor([6, 3] * (B // 2), device=DEV))
    results = []
    for ops in (REFERENCE_OPS, fm.ops, fm.ops._replace(embed=embed_ref)):
        cache = fm.cache_for(B, S)
        torch.manual_seed(0)
        for t in cache.k + cache.v:
            t.copy_(torch.randn_like(t))
        cache.pad.copy_(torch.tensor([1, 4] * (B // 2), device=DEV))
        logits = forward.decode_step(fm.weights, cache.k, cache.v, cache.pad, ids, pos, ops)
        results.append((logits, [t.clone() for t in cache.k + cache.v]))
    for logits, caches in results[1:]:
        torch.testing.assert_close(logits, results[0][0], **TOL)
        for a, b in zip(caches, results[0][1]):
            torch.testing.assert_close(a, b, **TOL)
    assert len(normalising) == (2 if B > 16 else 0)  # one per kernel step: the first layer's QKV


@pytest.mark.parametrize(
    "name,variant",
    [(n, v) for n in ("tiny-gpt2", "tiny-llama") for v in ("as in the step", "split-K everywhere, hidden 256")]
    + [("tiny-llama", "40 rows: swapped tiles"), ("tiny-llama", "40 rows: as in the step")],
)
@torch.no_grad()
def test_generate_with_the_kernels_equals_generate_with_the_references(name, variant, monkeypatch):
    """Whole calls, as the decode loop makes them (left-padded batch of 4, its tokens and positions strided
    columns of its state): the Triton kernels give the tokens of their torch references and leave the same
    keys and values in the cache (an unstrided test of each kernel alone missed that rows past the first read
    the wrong position for RoPE; the tokens of a tiny random model barely depend on it, the cached keys do).
    Llama's RMSNorms take their sums of squares from the hidden states' writers (NormSums), GPT-2's
    LayerNorms do not. The second variant also splits K in every QKV and output/down projection
    (tiny shapes on one "SM" never split otherwise), all splits sharing one Tickets, as on a GPU. The third runs
    40 rows, mixed prompt lengths: every GEMV swapped (swap_ab.py), the batch one partial tile of 64; the fourth the
    same 40 rows as the step runs them: QKV, O and down in dense form (dense.py; the products in two pieces of K where
    even, as on a GPU), the O and down epilogues handing the next norm's rows over (residual_norm.py), the attention
    on its direct tiles where each row and kv head is one piece."""
    import functools

    import overlapdecode as od

    if variant == "40 rows: as in the step":
        monkeypatch.setattr(dense_gemm, "pieces_for", lambda n, K, sms: 2 if K % 2 == 0 else 1)
    model = od.load_model(name, device=DEV)
    torch.manual_seed(0)
    ids = torch.randint(0, 500, (40 if variant.startswith("40") else 4, 6), device=DEV)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[2, :1] = 0
    mask[5::3, :3] = 0
    outs, kv = [], []
    for kernels in ("torch", "triton"):
        dec = od.Decoder(model, fused_options=dict(kernels=kernels, compile_prefill=False))
        if kernels == "triton" and "as in the step" not in variant:
            fm, tickets = dec.fused_model(), Tickets(DEV)
            for K in (256, 512):  # the QKV and output projections' K, the down projection's: all split
                assert split_k(2, K, 16, 10000) > 1
            sums = dict(norm_sums=fm.ops.embed.keywords["norm_sums"]) if name == "tiny-llama" else {}
            fm.ops = fm.ops._replace(
                norm_qkv=functools.partial(norm_qkv, programs=10000, block_k=16, tickets=tickets, dense=False, **sums),
                linear_residual=functools.partial(
                    linear_residual, programs=10000, block_k=16, tickets=tickets, dense=False, **sums
                ),
            )
        outs.append(
            dec.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=4,  # the prefill's token, then three kernel steps, each reading what the last wrote
                eos_token_id=[],
                strategy=od.Strategy(cache="fused", stop_check="pingpong"),
            )
        )
        (cache,) = dec.fused_model()._caches.values()  # every slot written: by the prefill, then the steps
        kv.append(torch.stack(cache.k + cache.v))
    assert torch.equal(outs[1], outs[0])
    torch.testing.assert_close(kv[1], kv[0], **TOL)


def test_a_strided_operand_is_refused_not_misread():
    """The GEMV kernels index x and w row-major from their first element; a strided view is a ValueError
    naming it, not silently wrong output."""
    x, w, res = rnd(3, 64), rnd(24, 64), rnd(3, 24)
    wide = rnd(3, 128)[:, ::2]  # (3, 64), not contiguous
    with pytest.raises(ValueError, match="x must be contiguous"):
        linear_residual(wide, w, None, res)
    with pytest.raises(ValueError, match="w must be contiguous"):
        linear_residual(x, rnd(64, 24).t(), None, res)
    with pytest.raises(ValueError, match="x must be contiguous"):
        norm_linear(wide, rnd(64) + 1, None, 1e-5, w, None, "none")
    with pytest.raises(ValueError, match="wte must be contiguous"):
        embed(
            rnd(64, 11).t(),
            None,
            torch.zeros(3, dtype=torch.long, device=DEV),
            torch.zeros(3, dtype=torch.long, device=DEV),
            torch.zeros(3, dtype=torch.long, device=DEV),
        )


def test_16bit_roundings_follow_the_references():
    """In a 16-bit dtype the kernels round where their torch twins (and Hugging Face) round: RoPE each product
    and then the sum, the LM head's logits to the dtype before float32. float16 stands in for bfloat16 (the
    interpreter's bfloat16 conversions truncate). What may still differ is the order of the float32
    accumulation inside a dot product, which flips a rounding now and then: a few elements in a hundred, where
    rounding RoPE once (as before e3f2feb) differed in about a third of them."""
    torch.manual_seed(5)
    h = torch.float16
    B, H, Hq, Hkv, D, S = 3, 64, 4, 2, 32, 9
    x = (rnd(B, H) + 0.3).to(h)
    nw = (rnd(H, scale=0.3) + 1).to(h)
    w = rnd((Hq + 2 * Hkv) * D, H, scale=H**-0.5).to(h)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = column(torch.tensor([3, 700, 7000], device=DEV))
    slot = torch.tensor([1, 4, 8], device=DEV)
    caches = [torch.zeros(B, Hkv, S, D, device=DEV, dtype=h) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    q = norm_qkv(x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[2], caches[3], Hq, Hkv, D, block_k=32)
    assert (q != q_ref).float().mean() < 0.05 and (caches[2] != caches[0]).float().mean() < 0.05
    torch.testing.assert_close(q, q_ref, atol=4e-3, rtol=2e-3)
    V = 300
    lm = rnd(V, H, scale=H**-0.5).to(h)
    logits = norm_linear(x, nw, None, 1e-5, lm, None, "none", torch.float32, block_k=32)
    ref = norm_linear_ref(x, nw, None, 1e-5, lm, None, "none", torch.float32)
    assert logits.dtype == torch.float32 and torch.equal(logits, logits.to(h).float())  # values of the dtype
    assert (logits != ref).float().mean() < 0.05


# --- the decoder families' flags (layout.DECODERS) -----------------------------------------------------------


QKV_CASE = (40, 4, 2, 24, 9)  # H, Hq, Hkv, D (24: 12 of a tile's 16 lanes live), cache slots


def _qkv_inputs(variant: str, B: int):
    """norm_qkv's inputs at QKV_CASE for a variant naming its flags: "q/k norm", "(1 + w)", "partial" (16 of 24
    dims rotated), "no norm", "layer norm", "no rope", "bias"; four zeroed caches."""
    H, Hq, Hkv, D, S = QKV_CASE
    offset = "(1 + w)" in variant
    R = 16 if "partial" in variant else D
    x = rnd(B, H) + 0.3
    nw = None if "no norm" in variant else rnd(H, scale=0.3) + (0.0 if offset else 1.0)
    nb = rnd(H, scale=0.1) if "layer norm" in variant else None
    rows = (Hq + 2 * Hkv) * D
    w, b = rnd(rows, H, scale=H**-0.5), (rnd(rows, scale=0.1) if "bias" in variant else None)
    inv = None if "no rope" in variant else 1.0 / (500.0 ** (torch.arange(0, R, 2, device=DEV).float() / R))
    kw = dict(norm_style="rms_offset" if offset else "rms")
    if variant.startswith("q/k norm"):
        kw.update(q_norm=rnd(D, scale=0.3) + 1, k_norm=rnd(D, scale=0.3) + 1)
    pos = column(torch.randint(0, 50, (B,), device=DEV))
    slot = torch.randint(0, S, (B,), device=DEV)
    return x, nw, nb, w, b, inv, kw, pos, slot, [torch.zeros(B, Hkv, S, D, device=DEV) for _ in range(4)]


@pytest.mark.parametrize(
    "variant",
    ["q/k norm", "q/k norm (1 + w), no norm, partial rotary", "partial rotary", "q/k norm, partial rotary"],
)
@pytest.mark.parametrize(
    "B,programs,swap", [(3, 1, False), (2, 1000, False), (17, 64, True), (3, 1000, True), (17, 1, None)]
)
def test_norm_qkv_with_the_families_flags(variant, B, programs, swap):
    """Per-head Q/K RMSNorms before RoPE (Qwen3; Gemma 3's (1 + w) with its (1 + w) prologue), no prologue norm,
    partial rotary (Phi-3: the first R of D dims rotated, R/2 pairs): heads of 24 dims (one program a head with
    the norms, 12 of 16 lanes live), odd sizes, split-K and not, both tile orientations, and at 17 rows without
    `swap` the dense form (dense.py)."""
    torch.manual_seed(B + programs + len(variant))
    H, Hq, Hkv, D, S = QKV_CASE
    x, nw, _, w, b, inv, kw, pos, slot, caches = _qkv_inputs(variant + ", bias", B)
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, b, inv, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D, **kw)
    q = norm_qkv(
        x,
        nw,
        None,
        1e-5,
        w,
        b,
        inv,
        0.9,
        pos,
        slot,
        caches[2],
        caches[3],
        Hq,
        Hkv,
        D,
        block_k=16,
        programs=programs,
        swap=swap,
        **kw,
    )
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)
    torch.testing.assert_close(caches[3], caches[1], **TOL)
    plain = norm_qkv_ref(
        x, nw, None, 1e-5, w, b, None, 0.9, pos, slot, caches[0].clone(), caches[1].clone(), Hq, Hkv, D
    )
    assert (q_ref - plain).abs().max() > 1e-2  # the flags change the result
    # the step's rotary table read instead of sin and cos computed in the epilogue: the same bits
    kc, vc = torch.zeros_like(caches[2]), torch.zeros_like(caches[3])
    table = rope_table(inv, 0.9, pos, x.dtype)
    args = (x, nw, None, 1e-5, w, b, inv, 0.9, pos, slot, kc, vc, Hq, Hkv, D)
    q_table = norm_qkv(*args, block_k=16, programs=programs, swap=swap, rope_table=table, **kw)
    assert torch.equal(q_table, q) and torch.equal(kc, caches[2]) and torch.equal(vc, caches[3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,R2", [(5, 8), (19, 12)])
def test_rope_table_equals_its_reference(B, R2, dtype):
    """The step's rotary table (kernels/norm_qkv.py rope_table): each row's cos and sin, scaled and rounded to the
    model's dtype as Hugging Face has them, from a strided column of positions; one or two row blocks, frequencies
    not a power of two; bad arguments refused by name."""
    torch.manual_seed(B + R2)
    inv = 1.0 / (10000.0 ** (torch.arange(0, 2 * R2, 2, device=DEV).float() / (2 * R2)))
    pos = column(torch.randint(0, 5000, (B,), device=DEV))
    got = rope_table(inv, 0.7, pos, dtype)
    want = rope_table_ref(inv, 0.7, pos, dtype)
    # within one rounding of the dtype (Triton's sin and cos against torch's may differ in float32's last bit,
    # which can move a 16-bit rounding; the QKV kernels read the table or compute the same Triton code: equal bits,
    # test_norm_qkv_with_the_families_flags)
    tol = dict(rtol=0, atol=2 * torch.finfo(dtype).eps)
    assert got.shape == (B, 2 * R2) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, **tol)
    assert torch.equal(got, got.to(dtype).float())  # values of the dtype
    cos, sin = rope_cos_sin(inv, 0.7, pos, dtype)  # the model's own (B, 2 R2) halves
    torch.testing.assert_close(got, torch.cat((cos[:, :R2], sin[:, :R2]), 1).float(), **tol)
    with pytest.raises(ValueError, match="inv_freq must be a contiguous 1-d float"):
        rope_table(inv[None], 0.7, pos, dtype)
    with pytest.raises(ValueError, match="dtype must be one of"):
        rope_table(inv, 0.7, pos, torch.int32)
    caches = [torch.zeros(B, 2, 4, 6, device=DEV) for _ in range(2)]  # 2 KV heads of 6 dims, 3 rotary pairs
    args = (rnd(B, 8), None, None, 1e-5, rnd(36, 8), None, inv[:3], 1.0, pos, pos, *caches, 2, 2, 6)
    with pytest.raises(ValueError, match=rf"rope_table must be a contiguous \({B}, 6\) float32"):
        norm_qkv(*args, rope_table=got)
    with pytest.raises(ValueError, match="rope_table: given without inv_freq"):
        norm_qkv(*args[:6], None, *args[7:], rope_table=got[:, :6].contiguous())


@pytest.mark.parametrize("B,swap", [(3, False), (17, None)])
@pytest.mark.parametrize(
    "variant",
    [
        "gelu_tanh_mul",
        "(1 + w) norm",
        "float32 norm",
        "no norm",
        "logit division",
        "soft-cap",
        "(1 + w) head, soft-cap",
    ],
)
def test_norm_linear_with_the_families_flags(variant, B, swap):
    """Gemma's GeGLU (tanh GELU of the gate times up) and (1 + w) RMSNorm, OLMo2's float32 RMSNorm (its final
    norm) and no norm (its MLP), the LM head's division by Granite's logits_scaling and Gemma 2's final soft-cap, on
    odd shapes, both tile orientations. (float32: the two RMSNorm roundings agree; 16-bit below.)"""
    torch.manual_seed(B + len(variant))
    K, N = 72, 50
    x = rnd(B, K) + 0.5
    offset = "(1 + w)" in variant
    nw = None if variant == "no norm" else rnd(K, scale=0.3) + (0.0 if offset else 1.0)
    act = "gelu_tanh_mul" if variant == "gelu_tanh_mul" else ("silu_mul" if "norm" in variant else "none")
    w = rnd(2 * N if act.endswith("mul") else N, K, scale=K**-0.5)
    kw = dict(norm_style="rms_offset" if offset else ("rms_f32" if "float32" in variant else "rms"))
    if variant == "logit division":
        kw["logit_div"] = 3.0
    if "soft-cap" in variant:
        kw["softcap"] = 0.7
    out_dtype = torch.float32 if act == "none" else None
    ref = norm_linear_ref(x, nw, None, 1e-5, w, None, act, out_dtype, **kw)
    got = norm_linear(x, nw, None, 1e-5, w, None, act, out_dtype, block_k=32, swap=swap, **kw)
    torch.testing.assert_close(got, ref, **TOL)
    plain = norm_linear_ref(x, rnd(K) * 0 + 1, None, 1e-5, w, None, "silu_mul" if act != "none" else "none", out_dtype)
    assert (ref - plain).abs().max() > 1e-2  # the flags change the result


def test_the_rms_norm_styles_round_as_their_families_in_16_bit():
    """float16 (bfloat16's stand-in): Llama's RMSNorm rounds the normalised x before its weight, Gemma's and
    OLMo2's multiply in float32 and round once; the kernels' prologues follow their references exactly (a norm
    alone: no dot), and the three differ."""
    torch.manual_seed(2)
    h = torch.float16
    B, K = 3, 72
    x, nw = (rnd(B, K) + 0.5).to(h), (rnd(K, scale=0.3) + 1).to(h)
    eye = torch.eye(K, device=DEV, dtype=h)  # the norm's output through an identity projection
    outs = {}
    for style in ("rms", "rms_offset", "rms_f32"):
        got = norm_linear(x, nw, None, 1e-5, eye, None, "none", None, block_k=32, norm_style=style)
        torch.testing.assert_close(
            got, norm_linear_ref(x, nw, None, 1e-5, eye, None, "none", norm_style=style), atol=0, rtol=0
        )
        outs[style] = got
    assert not torch.equal(outs["rms"], outs["rms_f32"]) and not torch.equal(outs["rms"], outs["rms_offset"])


@pytest.mark.parametrize("B,K,N,programs", [(3, 100, 24, 1), (3, 520, 40, 64)])
@pytest.mark.parametrize("variant", ["residual scale", "branch alone"])
def test_linear_residual_with_the_families_flags(B, K, N, programs, variant):
    """Granite's residual_multiplier on the branch before its add, and the branch alone (no residual: a post-norm
    layer normalises it first), split-K and not."""
    torch.manual_seed(K + N)
    x, w, res = rnd(B, K), rnd(N, K, scale=K**-0.5), rnd(B, N)
    if variant == "residual scale":
        ref, got = (
            f(x, w, None, res, res_scale=0.3)
            if f is linear_residual_ref
            else f(x, w, None, res, res_scale=0.3, block_k=32, programs=programs)
            for f in (linear_residual_ref, linear_residual)
        )
        assert (ref - linear_residual_ref(x, w, None, res)).abs().max() > 1e-2
    else:
        ref = linear_residual_ref(x, w, None, None)
        got = linear_residual(x, w, None, None, block_k=32, programs=programs, norm_sums=NormSums(min_rows=1))
    torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize("B,pieces", [(3, 1), (19, 1), (19, 2)])
@pytest.mark.parametrize(
    "variant", ["rope, bias", "layer norm, no rope", "q/k norm (1 + w), partial rotary", "no norm", "rope table"]
)
def test_norm_qkv_dense_runs_the_same_epilogue_on_the_product(variant, B, pieces, monkeypatch):
    """dense=True (kernels/dense.py): the product by torch.mm on the normalised rows (or its partial products over
    `pieces` of K), then the kernel's epilogue alone over the product's tiles, equals the reference with every flag
    of the families' QKV (bias, LayerNorm, per-head Q/K norms of the (1 + w) style, partial rotary, no norm, the
    step's rotary table), at odd shapes."""
    monkeypatch.setattr(dense_gemm, "pieces_for", lambda n, K, sms: pieces)
    torch.manual_seed(B + len(variant))
    H, Hq, Hkv, D, S = QKV_CASE
    x, nw, nb, w, b, inv, kw, pos, slot, caches = _qkv_inputs(variant, B)
    q_ref = norm_qkv_ref(x, nw, nb, 1e-5, w, b, inv, 0.9, pos, slot, caches[0], caches[1], Hq, Hkv, D, **kw)
    if variant == "rope table":
        kw["rope_table"] = rope_table(inv, 0.9, pos, x.dtype)
    q = norm_qkv(x, nw, nb, 1e-5, w, b, inv, 0.9, pos, slot, caches[2], caches[3], Hq, Hkv, D, dense=True, **kw)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(caches[2], caches[0], **TOL)
    torch.testing.assert_close(caches[3], caches[1], **TOL)
    assert caches[0].abs().sum() > 0 and caches[1].abs().sum() > 0


@pytest.mark.parametrize("B,K,N,pieces", [(3, 100, 24, 1), (19, 72, 130, 1), (19, 72, 130, 3)])
@pytest.mark.parametrize("variant", ["residual, bias", "residual scale", "branch alone", "norm sums"])
def test_linear_residual_dense_runs_the_same_epilogue_on_the_product(B, K, N, pieces, variant, monkeypatch):
    """dense=True: torch.mm's float32 product (or bmm's over `pieces` of K, added in the epilogue), then the
    kernel's epilogue (bias, Granite's residual scale, the branch alone, the rows' norm sums per column block as the
    next RMSNorm reads them) equals the reference."""
    monkeypatch.setattr(dense_gemm, "pieces_for", lambda n, K, sms: pieces)
    torch.manual_seed(B + K + N + len(variant))
    x, w, res = rnd(B, K), rnd(N, K, scale=K**-0.5), rnd(B, N)
    b = rnd(N, scale=0.1) if "bias" in variant else None
    kw = dict(res_scale=0.3) if variant == "residual scale" else {}
    residual = None if variant == "branch alone" else res
    sums = NormSums(min_rows=1) if variant == "norm sums" else None
    got = linear_residual(x, w, b, residual, dense=True, norm_sums=sums, **kw)
    torch.testing.assert_close(got, linear_residual_ref(x, w, b, residual, **kw), **TOL)
    if sums is not None:  # per 64-column block of the epilogue's tiles
        nb = -(-N // 64)
        hb = torch.nn.functional.pad(got, (0, nb * 64 - N)).view(B, nb, 64)
        torch.testing.assert_close(sums.of(got), (hb * hb).sum(-1).T, **TOL)


@pytest.mark.parametrize("B,K,N,pieces", [(17, 100, 24, 1), (19, 72, 130, 2)])
@pytest.mark.parametrize(
    "style,variant", [("rms", "bias"), ("rms_offset", "residual scale"), ("rms_f32", ""), ("layer", "bias")]
)
def test_residual_norm_writes_h_and_the_next_norm_of_it(B, K, N, pieces, style, variant, monkeypatch):
    """kernels/residual_norm.py: the dense O/down epilogue over whole rows writes h exactly as linear_residual's
    dense epilogue does, and h normalised by the norm that reads it next (each family's rounding; GPT-2's
    LayerNorm) as norm_ref computes it, recorded for that h and that norm only; RMSNorm sums as one block."""
    from overlapdecode.fused.kernels.norm_prologue import NormedRows, norm_ref
    from overlapdecode.fused.kernels.residual_norm import linear_residual_norm

    monkeypatch.setattr(dense_gemm, "pieces_for", lambda n, K, sms: pieces)  # (`pieces` of K: added in order)
    torch.manual_seed(B + K + N + len(style))
    x, w, res = rnd(B, K), rnd(N, K, scale=K**-0.5), rnd(B, N)
    b = rnd(N, scale=0.1) if variant == "bias" else None
    kw = dict(res_scale=0.3) if variant == "residual scale" else {}
    nw = 1.0 + rnd(N, scale=0.3)
    nb = rnd(N, scale=0.1) if style == "layer" else None
    norm = (nw, nb, 1e-5, "rms" if style == "layer" else style)
    rows, sums = NormedRows(), NormSums(min_rows=1)
    h = linear_residual_norm(x, w, b, res, dense=True, then_norm=norm, normed_rows=rows, norm_sums=sums, **kw)
    assert torch.equal(h, linear_residual(x, w, b, res, dense=True, **kw))  # the same epilogue code
    xn = rows.of(h, NormedRows.key(*norm))
    assert xn is not None and xn.dtype == h.dtype
    torch.testing.assert_close(xn, norm_ref(h, nw, nb, 1e-5, norm[3]), **TOL)
    if style != "layer":
        torch.testing.assert_close(sums.of(h), (h * h).sum(1)[None], **TOL)
    assert rows.of(h, NormedRows.key(nw.clone(), nb, 1e-5, norm[3])) is None  # another norm's weight
    assert rows.of(h.clone(), NormedRows.key(*norm)) is None  # another tensor
    h.add_(0)
    assert rows.of(h, NormedRows.key(*norm)) is None  # modified since


def test_residual_norm_falls_back_where_its_kernel_does_not_serve(monkeypatch):
    """Where the launch is not dense, has no norm after it, has at most 16 rows (no swapped reader), rows wider
    than MAX_N or the kernel switched off (ENABLED), linear_residual_norm is linear_residual and records nothing."""
    from overlapdecode.fused.kernels import residual_norm as rn
    from overlapdecode.fused.kernels.norm_prologue import NormedRows

    torch.manual_seed(5)
    cases = [(19, 24, False, True, {}), (19, 24, True, False, {}), (16, 24, True, True, {})]
    cases += [(19, 40, True, True, dict(MAX_N=32)), (19, 24, True, True, dict(ENABLED=False))]
    for B, N, dense, then, module in cases:
        x, w, res = rnd(B, 32), rnd(N, 32, scale=32**-0.5), rnd(B, N)
        norm = (1.0 + rnd(N, scale=0.3), None, 1e-5, "rms") if then else None
        rows = NormedRows()
        with monkeypatch.context() as m:
            for name, value in module.items():
                m.setattr(rn, name, value)
            h = rn.linear_residual_norm(x, w, None, res, dense=dense, then_norm=norm, normed_rows=rows)
        torch.testing.assert_close(h, linear_residual_ref(x, w, None, res), **TOL)
        assert rows._last is None, (B, N, dense, then, module)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_dense_16_bit_products_are_float32_accumulations(dtype):
    """In 16-bit the dense product is accumulated and kept in float32 (the fused kernels' accumulator), and the
    epilogue rounds it once as the references do: the results stay within one 16-bit ulp of the swapped kernels'."""
    torch.manual_seed(7)
    B, K, N = 33, 96, 80
    x, w, res = rnd(B, K).to(dtype), rnd(N, K, scale=K**-0.5).to(dtype), rnd(B, N).to(dtype)
    got = linear_residual(x, w, None, res, dense=True)
    assert got.dtype == dtype
    ref = (res.float() + (x.float() @ w.float().T).to(dtype).float()).to(dtype)
    torch.testing.assert_close(got.float(), ref.float(), atol=2e-2, rtol=1e-2)
    if dtype == torch.bfloat16 and DEV == "cpu":  # Triton 3.6's interpreter rounds bfloat16 otherwise than CUDA
        return
    # the same bits nearly everywhere (float32 sums in another order can cross a rounding boundary, rarely)
    assert (got == ref).float().mean() > 0.97
    fused = linear_residual(x, w, None, res, dense=False, swap=True)
    torch.testing.assert_close(got.float(), fused.float(), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("B,H,block", [(3, 37, 16), (2, 64, 1024)])
@pytest.mark.parametrize("style", ["rms", "rms_offset", "rms_f32"])
def test_norm_residual(B, H, block, style):
    """residual + RMSNorm(branch), the post-norms of OLMo2 and Gemma 2/3, in each family's rounding."""
    from overlapdecode.fused.kernels.norm_residual import norm_residual, norm_residual_ref

    torch.manual_seed(B * H)
    x, res, nw = rnd(B, H) * 3, rnd(B, H), rnd(H, scale=0.3) + 1
    got = norm_residual(x, nw, 1e-5, res, style, block=block)
    torch.testing.assert_close(got, norm_residual_ref(x, nw, 1e-5, res, style), **TOL)
    if style == "rms_offset":
        assert (norm_residual_ref(x, nw, 1e-5, res, "rms") - got).abs().max() > 1e-2


def test_embed_scale():
    """The embedding times the model's scale (Granite's embedding_multiplier, Gemma's sqrt(hidden)), and the
    RMSNorm sums of the scaled rows."""
    torch.manual_seed(4)
    B, H, V = 3, 37, 11
    wte = rnd(V, H)
    ids = column(torch.randint(0, V, (B,), device=DEV), at=0)
    pos = column(torch.randint(0, 5, (B,), device=DEV))
    pad = torch.randint(0, 3, (B,), device=DEV)
    sums = NormSums(min_rows=1)
    got = embed(wte, None, ids, pos, pad, scale=6.0, block=16, norm_sums=sums)
    ref = embed_ref(wte, None, ids, pos, pad, scale=6.0)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=0, rtol=0)
    assert torch.equal(got[0], wte[ids] * 6.0)
    hf = torch.nn.functional.pad(got[0], (0, 3 * 16 - H)).view(B, 3, 16)
    torch.testing.assert_close(sums.of(got[0]), (hf * hf).sum(-1).T, **TOL)


@pytest.mark.parametrize("window,starts", [(6, [24, 34, 3]), (13, [17, 27, 1]), (50, [0, 3, 1])])
@pytest.mark.parametrize("splits", [1, 3])
def test_attention_softcap_and_window_start(splits, window, starts):
    """Gemma 2's soft-capped scores, and a sliding window as a later first slot (forward.window_start): the
    kernel against the reference, one piece and three, windows of 6 and 13 keys (no multiple of the 16-key
    blocks) shorter than the rows and one of 50 longer than all of them (the rows' own first slots)."""
    from overlapdecode.fused.kernels.decode_attention import decode_attention, decode_attention_ref

    torch.manual_seed(splits)
    B, Hq, Hkv, S, D = 3, 4, 2, 40, 24
    q, k, v = rnd(B, Hq, D) * 2, rnd(B, Hkv, S, D) * 2, rnd(B, Hkv, S, D)
    pad = torch.tensor([0, 3, 1], device=DEV)
    length = torch.tensor([30, 40, 9], device=DEV)
    start = forward.window_start(pad, length, window)
    assert start.tolist() == starts
    for cap in (None, 0.8):
        got = decode_attention(q, k, v, start, length, 0.3, num_splits=splits, block_n=16, softcap=cap)
        torch.testing.assert_close(got, decode_attention_ref(q, k, v, start, length, 0.3, softcap=cap), **TOL)
        torch.testing.assert_close(got, forward.decode_attention_torch(q, k, v, start, length, 0.3, softcap=cap), **TOL)
    capped = decode_attention_ref(q, k, v, start, length, 0.3, softcap=0.8)
    assert (capped - decode_attention_ref(q, k, v, start, length, 0.3)).abs().max() > 1e-2


@pytest.mark.parametrize("splits", [1, 3, 5])
def test_attention_sinks(splits):
    """gpt-oss's sinks (a logit per query head in its softmax, no value), with a sliding window's later first slot:
    the kernel against both references in one piece and in several (the sink in the combine's max and
    denominator); sinks above every score and below, groups of 3 heads, a head size not a power of two."""
    from overlapdecode.fused.kernels.decode_attention import decode_attention, decode_attention_ref

    torch.manual_seed(splits)
    B, Hq, Hkv, S, D = 3, 6, 2, 37, 20
    q, k, v = rnd(B, Hq, D) * 2, rnd(B, Hkv, S, D) * 2, rnd(B, Hkv, S, D)
    sinks = torch.tensor([4.0, -3.0, 0.5, 9.0, -30.0, 1.5], device=DEV)
    pad = torch.tensor([0, 3, 1], device=DEV)
    length = torch.tensor([30, 37, 9], device=DEV)
    for start in (pad, forward.window_start(pad, length, 6)):
        got = decode_attention(q, k, v, start, length, 0.3, num_splits=splits, block_n=16, sinks=sinks)
        ref = decode_attention_ref(q, k, v, start, length, 0.3, sinks=sinks)
        torch.testing.assert_close(got, ref, **TOL)
        torch.testing.assert_close(got, forward.decode_attention_torch(q, k, v, start, length, 0.3, sinks=sinks))
        assert (ref - decode_attention_ref(q, k, v, start, length, 0.3)).abs().max() > 1e-2
    with pytest.raises(ValueError, match="sinks"):
        decode_attention(q, k, v, pad, length, 0.3, sinks=sinks[:4])


@pytest.mark.parametrize(
    "B,E,top_k,H,I,block_n,block_k", [(1, 5, 2, 72, 40, 16, 32), (4, 7, 3, 50, 33, 8, 16), (3, 12, 4, 64, 24, 32, 64)]
)
def test_moe_experts_gpt_oss(B, E, top_k, H, I, block_n, block_k):
    """gpt-oss's experts (kernels/moe.py's flags) against their reference: the top k of the logits then their
    softmax, the experts' biases, gate/up rows interleaved and the clamped SwiGLU (its limit reached on both sides);
    expert counts not a power of two, widths not multiples of the tiles; each flag changes the sum, and the
    prefill's dense form gives the same one."""
    from overlapdecode.fused.kernels.moe import moe_dense_ref, moe_experts, moe_experts_ref
    from overlapdecode.fused.kernels.norm_prologue import norm_ref

    torch.manual_seed(B * E + top_k)
    h, nw, router = rnd(B, H), rnd(H, scale=0.3) + 1, rnd(E, H, scale=0.5)
    w_up, w_down = rnd(E, 2 * I, H, scale=3 * H**-0.5), rnd(E, H, I, scale=I**-0.5)
    b_up, b_down = rnd(E, 2 * I, scale=0.5), rnd(E, H, scale=0.5)
    logits = norm_linear_ref(h, nw, None, 1e-6, router, None, "none")
    options = dict(b_up=b_up, b_down=b_down, topk_first=True, interleaved=True, swiglu=(1.702, 1.5))
    gate_up = torch.einsum("eoh,bh->beo", w_up, norm_ref(h, nw, None, 1e-6)) + b_up
    assert (gate_up > 1.5).any() and (gate_up < -1.5).any()  # the clamp takes effect
    ref = moe_experts_ref(h, nw, 1e-6, logits, w_up, w_down, top_k, False, **options)
    got = moe_experts(h, nw, 1e-6, logits, w_up, w_down, top_k, False, block_n=block_n, block_k=block_k, **options)
    torch.testing.assert_close(got, ref, **TOL)
    # as transformers ships them, (E, H, 2I) and (E, I, H): read through their transposed views, not copied
    up_t, down_t = (
        w_up.transpose(1, 2).contiguous().transpose(1, 2),
        w_down.transpose(1, 2).contiguous().transpose(1, 2),
    )
    assert not up_t.is_contiguous() and not down_t.is_contiguous()
    shipped = moe_experts(h, nw, 1e-6, logits, up_t, down_t, top_k, False, block_n=block_n, block_k=block_k, **options)
    torch.testing.assert_close(shipped, got, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="w_up must have positive strides"):
        moe_experts(h, nw, 1e-6, logits, w_up[:1].expand(E, -1, -1), w_down, top_k, False, **options)
    dense = h + moe_dense_ref(norm_ref(h, nw, None, 1e-6), logits, w_up, w_down, top_k, False, **options)
    torch.testing.assert_close(dense, ref, **TOL)
    for name, off in (("b_up", None), ("b_down", None), ("topk_first", False), ("interleaved", False)):
        other = moe_experts_ref(h, nw, 1e-6, logits, w_up, w_down, top_k, False, **dict(options, **{name: off}))
        assert (other - ref).abs().max() > 1e-3, name
    unclamped = moe_experts_ref(h, nw, 1e-6, logits, w_up, w_down, top_k, False, **dict(options, swiglu=(1.702, 99)))
    assert (unclamped - ref).abs().max() > 1e-3
    with pytest.raises(ValueError, match="b_down"):
        moe_experts(h, nw, 1e-6, logits, w_up, w_down, top_k, False, **dict(options, b_down=b_down[:, :-1]))


# qwen3-moe routes every layer's tokens to 8 of its 10 experts, the interpreter's slowest case (about 23 s a
# 20-row step): it runs at 2 rows, with its flags (8 of 10, the top-k weights not renormalised, per-head Q/K norms);
# its 20-row forms, swapped and dense, are those qwen3-moe-dense runs (the same attention, a routed layer of 2 of 5
# and a dense one), and 20 routed rows also run in mixtral's and the gpt-oss families' cases
ROWS_OF = {"qwen3-moe": [(2, False)]}
WHOLE_STEPS = [
    pytest.param(name, B, dense, id=f"{name}-{B}-{dense}")
    for name in FAMILIES
    for B, dense in ROWS_OF.get(name, [(2, False), (20, False), (20, True)])
]


@pytest.mark.parametrize("name, B, dense", WHOLE_STEPS)
@torch.no_grad()
def test_whole_step_of_each_family_kernels_vs_reference(name, B, dense, monkeypatch):
    """Each family's decode step made of the kernels (with its flags) equals the one made of their references,
    cache writes included, with left padding and positions past its sliding windows: at 2 rows (row-block tiles)
    and at 20 (swapped tiles on rows normalised beforehand, swap_ab.py), there also with QKV, O and down in dense
    form from 17 rows (kernels/dense.py: torch.mm's product, the kernels' epilogues), where the O and down
    epilogues also hand the rows normalised for the next projection over (kernels/residual_norm.py): each such
    writer takes one normalising launch out of the step, and the step equals the one without the hand-off."""
    products, normalising = [], []
    monkeypatch.setattr(dense_gemm, "DENSE_ROWS", 17 if dense else 10**9)  # 20 rows: dense or the swapped GEMVs
    if dense:  # the products in two pieces of K where it is even (dense.pieces_for), as on a GPU
        monkeypatch.setattr(dense_gemm, "pieces_for", lambda n, K, sms: 2 if K % 2 == 0 else 1)
        mm = dense_gemm.dense_product

        def counted(x, w, pieces=None):  # each product's weight shape and the pieces it chose
            part, pieces = mm(x, w, pieces)
            products.append((w.shape, pieces))
            return part, pieces

        monkeypatch.setattr(dense_gemm, "dense_product", counted)
        rows = norm_prologue.normalized_rows
        monkeypatch.setattr(norm_prologue, "normalized_rows", lambda *a, **k: normalising.append(1) or rows(*a, **k))
    model = family_model(name, device=DEV)
    fm = FusedModel(model, kernels="triton", compile_prefill=False)
    W = fm.weights
    S = 16
    ids = column(torch.tensor([5, 17] * (B // 2), device=DEV), at=0)
    pos = column(torch.tensor([11, 8] * (B // 2), device=DEV))
    results, tables = [], []
    kernels = fm.ops._replace(rope_table=lambda *a, **k: tables.append(fm.ops.rope_table(*a, **k)) or tables[-1])
    if dense:  # the dense form changes QKV, O, down and the norms they hand over; the attention and the routed
        # experts launch as in the same family's 20-row case without it (the same kernels, tiles and rows: on
        # the interpreter about a third of the MoE families' time), so here their references stand in
        kernels = kernels._replace(attention=REFERENCE_OPS.attention, moe=REFERENCE_OPS.moe)
    # the writers that hand normalised rows: O before a dense MLP, down of a layer without post-norms
    handed = sum(
        (L.post_attn_w is None and L.router is None) + (L.post_ffn_w is None and L.router is None) for L in W.layers
    )
    handing = []  # the kernels' linear_residual launches given a then_norm
    launch = kernels.linear_residual
    kernels = kernels._replace(
        linear_residual=lambda *a, then_norm=None, **k: (
            handing.append(then_norm is not None) or launch(*a, then_norm=then_norm, **k)
        )
    )
    # the same kernels, each norm normalising its rows itself: every writer's then_norm dropped (a step where no
    # writer hands off, every layer's MLP routed experts, would be the kernels' own again: not run twice)
    unhanded = kernels._replace(linear_residual=lambda *a, then_norm=None, **k: launch(*a, **k))
    launches = []
    for ops in (REFERENCE_OPS, kernels) + ((unhanded,) if dense and handed else ()):
        launches.append(len(normalising))
        cache = fm.cache_for(B, S)
        torch.manual_seed(0)
        for t in cache.k + cache.v:
            t.copy_(torch.randn_like(t))
        cache.pad.copy_(torch.tensor([1, 4] * (B // 2), device=DEV))
        logits = forward.decode_step(fm.weights, cache.k, cache.v, cache.pad, ids, pos, ops)
        results.append((logits, [t.clone() for t in cache.k + cache.v]))
    for result in results[1:]:
        torch.testing.assert_close(result[0], results[0][0], **TOL)
        for a, b in zip(result[1], results[0][1]):
            torch.testing.assert_close(a, b, **TOL)
    # from 17 rows the QKV launches read the step's rotary tables: one per table a layer's norm_qkv rotates with
    read = {L.rope for L in W.layers if L.rope is not None and not forward.whole_qk_norms(W, L)}
    runs = 2 if dense and handed else 1  # the kernels' runs: with and without the hand-off where there is one
    assert len(tables) == (len(read) * runs if B > 16 else 0), (name, B, len(tables), read)
    # dense: every layer's QKV and its linear_residual launches (O, down where not routed experts) took the product
    plain = sum(1 for L in W.layers if L.router is None)
    per_step = len(W.layers) + len(W.layers) + plain
    assert len(products) == (runs * per_step if dense else 0), (name, len(products))
    assert not dense or any(p == 2 for _, p in products), name
    # each such writer is given its reader's norm, and no other
    assert sum(handing) == handed, (name, sum(handing), handed)
    if dense and handed:  # and each takes one normalising launch out of the step
        with_hand, without = launches[2] - launches[1], len(normalising) - launches[2]
        assert without - with_hand == handed, (name, with_hand, without, handed)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_norm_qkv_reads_the_rope_table_bit_for_bit_in_16_bit(dtype, swap):
    """In 16-bit, where cos and sin are rounded to the dtype, norm_qkv reading rope_table's table (partial rotary, a
    strided position column, split K): in the interpreter the bits of computing cos and sin in the epilogue; on a
    GPU torch's (norm_qkv_ref) but for roundings in at most 5% of the elements (on an H200: none in bfloat16, 33 of
    1824 Q elements in float16 with row-block tiles, whose norm is summed in the kernel). There the epilogue's own
    cos and sin gave other roundings than torch's in 289 of the 1824 bfloat16 Q elements: a fact of the launches up
    to 16 rows, which compute them (forward.step_rope_tables)."""
    torch.manual_seed(3)
    B, H, Hq, Hkv, D, R, S = 19, 40, 4, 2, 24, 16, 9
    x = rnd(B, H).to(dtype)
    w = (rnd((Hq + 2 * Hkv) * D, H) * H**-0.5).to(dtype)
    inv = 1.0 / (500.0 ** (torch.arange(0, R, 2, device=DEV).float() / R))
    pos = column(torch.randint(0, 3000, (B,), device=DEV))
    slot = torch.randint(0, S, (B,), device=DEV)
    nw = rnd(H).to(dtype) + 1
    outs = []
    for table in (None, rope_table(inv, 0.8, pos, dtype)):
        kc, vc = (torch.zeros(B, Hkv, S, D, device=DEV, dtype=dtype) for _ in range(2))
        q = norm_qkv(
            x,
            nw,
            None,
            1e-5,
            w,
            None,
            inv,
            0.8,
            pos,
            slot,
            kc,
            vc,
            Hq,
            Hkv,
            D,
            block_k=16,
            programs=1000,
            swap=swap,
            rope_table=table,
        )
        outs.append((q, kc, vc))
    kc, vc = (torch.zeros(B, Hkv, S, D, device=DEV, dtype=dtype) for _ in range(2))
    ref = norm_qkv_ref(x, nw, None, 1e-5, w, None, inv, 0.8, pos, slot, kc, vc, Hq, Hkv, D)
    if DEV == "cuda":  # the norm's and the GEMM's float32 sums in another order than torch's cross a rounding, rarely
        for a, b in zip(outs[1], (ref, kc, vc)):
            torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)
            assert (a != b).float().mean() <= 0.05
    else:  # the interpreter (whose bfloat16 tl.dot is wrong): the same bits with or without the table
        if dtype == torch.float16:
            for a, b in zip(outs[1], (ref, kc, vc)):
                torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=1e-2)
        for a, b in zip(*outs):
            assert torch.equal(a, b)


@pytest.mark.parametrize(
    "name",
    [
        "mistral-sliding",
        "qwen3",
        "phi3",
        "granite",
        "olmo2",
        "gemma2",
        "gemma3",
        "qwen3-moe-dense",
        "mixtral",
        "gpt-oss",
    ],
)
@torch.no_grad()
def test_generate_of_each_family_with_the_kernels_equals_the_references(name):
    """Whole calls (left-padded batch of 3, strided state columns, the kernels' NormSums where the family's norms
    take them): the kernels' tokens are their references' and the cache holds the same keys and values."""
    import overlapdecode as od

    model = family_model(name, device=DEV)
    torch.manual_seed(0)
    ids = torch.randint(3, 900, (3, 7), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    outs, kv = [], []
    for kernels in ("torch", "triton"):
        dec = od.Decoder(model, fused_options=dict(kernels=kernels, compile_prefill=False))
        outs.append(
            dec.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=4,  # three kernel steps past the windows of 6 (the prompt has 7 tokens)
                eos_token_id=[],
                strategy=od.Strategy(cache="fused", stop_check="pingpong"),
            )
        )
        (cache,) = dec.fused_model()._caches.values()
        kv.append(torch.stack(cache.k + cache.v))
    assert torch.equal(outs[1], outs[0])
    torch.testing.assert_close(kv[1], kv[0], **TOL)


@pytest.mark.parametrize("B,Hq,Hkv,D,block", [(3, 4, 2, 24, 16), (2, 3, 1, 16, 1024)])
@pytest.mark.parametrize("rope", [True, False])
def test_qk_norm_rope(B, Hq, Hkv, D, block, rope):
    """OLMo2's Q/K RMSNorms over the whole projections, then RoPE: Q returned, each row's K rewritten at its slot
    and nothing else of the cache touched."""
    from overlapdecode.fused.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref

    torch.manual_seed(B + D)
    S = 7
    q = rnd(B, Hq, D) * 2
    caches = [rnd(B, Hkv, S, D)]
    caches.append(caches[0].clone())
    qn, kn = rnd(Hq * D, scale=0.3) + 1, rnd(Hkv * D, scale=0.3) + 1
    inv = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D)) if rope else None
    pos = column(torch.randint(0, 50, (B,), device=DEV))
    slot = column(torch.randint(0, S, (B,), device=DEV), at=2)
    ref = qk_norm_rope_ref(q.clone(), caches[0], slot, qn, kn, 1e-5, inv, 0.9, pos, "rms_f32")
    got = qk_norm_rope(q.clone(), caches[1], slot, qn, kn, 1e-5, inv, 0.9, pos, block=block)
    torch.testing.assert_close(got, ref, **TOL)
    torch.testing.assert_close(caches[1], caches[0], **TOL)
    assert (ref - q).abs().max() > 1e-2


@pytest.mark.parametrize(
    "B,E,top_k,H,I,block_n,block_k",
    [
        (1, 6, 2, 72, 40, 16, 32),
        (5, 10, 8, 72, 40, 16, 32),
        (3, 7, 3, 50, 33, 8, 16),
        (16, 12, 8, 100, 24, 32, 64),
        (1, 1, 1, 40, 24, 16, 16),  # one expert: a one-lane softmax
        (1, 5, 5, 40, 24, 16, 16),  # every expert chosen: each real lane picked once, the padding never
    ],
)
@pytest.mark.parametrize("renorm", [False, True])
def test_moe_experts(B, E, top_k, H, I, block_n, block_k, renorm):
    """The routed experts (kernels/moe.py) against their reference: expert counts not a power of two, one expert,
    top-k 1 to 8 and all of them, widths not multiples of the tiles, one row and several whose choices overlap; the
    prefill's dense form gives the same sum."""
    from overlapdecode.fused.kernels.moe import moe_dense_ref, moe_experts, moe_experts_ref, route_ref
    from overlapdecode.fused.kernels.norm_prologue import norm_ref

    torch.manual_seed(B * E + top_k)
    h, nw, router = rnd(B, H), rnd(H, scale=0.3) + 1, rnd(E, H, scale=0.5)
    w_up, w_down = rnd(E, 2 * I, H, scale=H**-0.5), rnd(E, H, I, scale=I**-0.5)
    logits = norm_linear_ref(h, nw, None, 1e-6, router, None, "none")
    experts = route_ref(logits, top_k, renorm)[1]
    if B > 1:  # several rows share an expert and the rows' choices differ
        assert len(set(experts.flatten().tolist())) < B * top_k
        assert len({frozenset(row.tolist()) for row in experts}) > 1
    ref = moe_experts_ref(h, nw, 1e-6, logits, w_up, w_down, top_k, renorm)
    got = moe_experts(h, nw, 1e-6, logits, w_up, w_down, top_k, renorm, block_n=block_n, block_k=block_k)
    torch.testing.assert_close(got, ref, **TOL)
    dense = h + moe_dense_ref(norm_ref(h, nw, None, 1e-6), logits, w_up, w_down, top_k, renorm)
    torch.testing.assert_close(dense, ref, **TOL)


@pytest.mark.parametrize("style", ["rms", "rms_offset", "rms_f32"])
def test_moe_experts_read_only_the_chosen_experts(style):
    """Every expert no row chose holds NaN: the kernels and the reference never read it (their sums stay finite
    and equal), in each RMSNorm rounding the kernel takes."""
    from overlapdecode.fused.kernels.moe import moe_experts, moe_experts_ref, route_ref

    torch.manual_seed(3)
    B, E, top_k, H, I = 2, 9, 2, 40, 24
    h, nw, router = rnd(B, H), rnd(H, scale=0.3) + 1, rnd(E, H, scale=0.5)
    w_up, w_down = rnd(E, 2 * I, H, scale=H**-0.5), rnd(E, H, I, scale=I**-0.5)
    logits = norm_linear_ref(h, nw, None, 1e-6, router, None, "none")
    chosen = set(route_ref(logits, top_k, True)[1].flatten().tolist())
    unused = [e for e in range(E) if e not in chosen]
    assert unused
    w_up[unused], w_down[unused] = float("nan"), float("nan")
    ref = moe_experts_ref(h, nw, 1e-6, logits, w_up, w_down, top_k, True, style)
    got = moe_experts(h, nw, 1e-6, logits, w_up, w_down, top_k, True, style, block_n=16, block_k=16)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, **TOL)
