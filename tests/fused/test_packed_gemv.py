"""The int4 GEMV form of the projections (fused/kernels/packed_gemv.py: codes as float32 subnormals by an AND, the
zero point and scale applied once a K tile) against the dequantize-then-multiply twins, in the three projection
kernels: rows 1 to 7 in row tiles of 1, 4 and 8 (a part-filled last block), K of whole words that no tile
divides, weight rows no tile divides, split K (a K range ending inside a tile), groups from 8 to the whole row,
activations from 1e-30 to 1e4, float32 and float16. The launches are counted, so that each case is known to
take the form it tests; a group no K tile lies in, or K not a multiple of 8, takes the dequantized tile."""

from __future__ import annotations

import pytest
import torch

from overlapdecode.fused.kernels import linear_residual as lr_module
from overlapdecode.fused.kernels import norm_linear as nl_module
from overlapdecode.fused.kernels import norm_qkv as qkv_module
from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.kernels.packed_gemv import gemv_form
from overlapdecode.quant import Int4Linear, dequantize
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture)

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def int4_weight(N: int, K: int, group_size: int, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * K**-0.5
    w[1, :group_size] = 0.03  # a group of equal weights
    p = Int4Linear(w, None, group_size).packed()
    return p._replace(q=p.q.to(DEV), scales=nan_after(p.scales.to(DEV, dtype)), zeros=nan_after(p.zeros.to(DEV, dtype)))


def nan_after(t: torch.Tensor) -> torch.Tensor:
    """t, stored with NaN after its end: a read past its last group (a split's last tile) shows in the output."""
    buf = torch.full((t.numel() + 64,), float("nan"), dtype=t.dtype, device=t.device)
    buf[: t.numel()] = t.flatten()
    return buf[: t.numel()].view(t.shape)


class FormSpy:
    """Each launch's form (True: the GEMV), from its constexprs, recorded before the kernel runs (and its tiles in
    `forms.tiles`)."""

    def __init__(self, kernel, forms: list):
        self.kernel, self.forms = kernel, forms

    def __getitem__(self, grid):
        def launch(*args, **kw):
            K = kw["K"] if "K" in kw else args[self.kernel.arg_names.index("K")]
            self.forms.append(gemv_form(kw["QUANT"], kw["SWAP"], kw["BLOCK_M"], kw["BLOCK_K"], K, kw["GROUP"]))
            self.forms.tiles.append((kw.get("BLOCK_N", kw.get("HALF")), kw["BLOCK_K"]))
            return self.kernel[grid](*args, **kw)

        return launch


class Forms(list):
    tiles: list


@pytest.fixture
def forms(monkeypatch):
    seen = Forms()
    seen.tiles = []
    for module, name in (
        (lr_module, "_linear_split_kernel"),
        (nl_module, "_norm_linear_kernel"),
        (qkv_module, "_norm_qkv_kernel"),
    ):
        monkeypatch.setattr(module, name, FormSpy(getattr(module, name), seen))
    return seen


def tolerance(x, w, dtype) -> dict:
    """Within float32's (float16's) rounding of the largest sum of |x| |w'| a row makes: the large activation's
    products cancel in some outputs, which then hold only their rounding."""
    scale = float((x.abs().float() @ dequantize(w).abs().float().t()).max())
    return dict(atol=scale * (1e-6 if dtype == torch.float32 else 2e-3), rtol=1e-4 if dtype == torch.float32 else 2e-3)


def activations(B: int, K: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, K, generator=g)
    x[0, 3] = 1e4 if dtype == torch.float32 else 6e3  # one large activation (float16 holds 65504)
    if dtype == torch.float32:
        x[-1, 5] = 1e-30  # one tiny one: its products are subnormal, their error under 2^-149 each
    return x.to(DEV, dtype)


CASES = [  # (rows, block_m, K, N, group, block_k, programs): programs > 1 splits K
    (1, 1, 200, 40, 8, 8, 1),
    (1, 1, 200, 24, 200, 8, 1),  # the group is the whole row (25 words)
    (3, 4, 136, 37, 32, 16, 1),
    (1, 1, 512, 20, 128, 64, 1000),  # split K: K ranges of whole tiles
    (7, 8, 72, 19, 16, 16, 64),
    (2, 1, 96, 17, 32, 32, 1),  # two row blocks of one row
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,block_m,K,N,group,block_k,programs", CASES)
def test_linear_residual_and_norm_linear(forms, dtype, B, block_m, K, N, group, block_k, programs):
    x = activations(B, K, dtype, seed=K + N)
    res = torch.randn(B, N, device=DEV).to(dtype)
    w = int4_weight(N, K, group, dtype, seed=N)
    tol = tolerance(x, w, dtype)
    got = linear_residual(x, w, None, res, block_k=block_k, block_m=block_m, programs=programs, tickets=Tickets(DEV))
    torch.testing.assert_close(got.float(), linear_residual_ref(x, w, None, res).float(), **tol)
    nw = torch.rand(K, device=DEV).to(dtype) + 0.5
    gu = int4_weight(2 * N, K, group, dtype, seed=N + 1)
    got = norm_linear(
        x, nw, None, 1e-5, gu, None, "silu_mul", None, block_k=block_k, block_m=block_m, programs=programs
    )
    want = norm_linear_ref(x, nw, None, 1e-5, gu, None, "silu_mul")
    torch.testing.assert_close(got.float(), want.float(), **tol)
    assert forms == [True, True], forms


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("B,block_m,programs", [(1, 1, 1), (3, 4, 1000)])
def test_norm_qkv(forms, dtype, B, block_m, programs):
    K, Hq, Hkv, D, S = 136, 4, 2, 16, 9
    x = activations(B, K, dtype, seed=B)
    nw = torch.rand(K, device=DEV).to(dtype) + 0.5
    w = int4_weight((Hq + 2 * Hkv) * D, K, 8, dtype, seed=3)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-3)  # x normalised
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.tensor([5, 0, 40][:B], device=DEV)
    slot = torch.tensor([2, 8, 0][:B], device=DEV)
    caches = [torch.zeros(B, Hkv, S, D, device=DEV, dtype=dtype) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[0], caches[1], Hq, Hkv, D)
    args = (x, nw, None, 1e-5, w, None, inv_freq, 1.0, pos, slot, caches[2], caches[3], Hq, Hkv, D)
    q = norm_qkv(*args, block_k=8, block_m=block_m, programs=programs, tickets=Tickets(DEV))
    torch.testing.assert_close(q.float(), q_ref.float(), **tol)
    torch.testing.assert_close(caches[2].float(), caches[0].float(), **tol)
    torch.testing.assert_close(caches[3].float(), caches[1].float(), **tol)
    assert forms == [True], forms


@pytest.mark.parametrize(
    "K,group,block_k",
    [(136, 24, 16), (132, 32, 16), (128, 32, 64)],  # tiles across groups of 24; K of a half word; of 32
)
def test_the_other_launches_take_the_dequantized_tile(forms, K, group, block_k):
    x = activations(1, K, torch.float32, seed=K)
    w = int4_weight(20, K, group, torch.float32, seed=1)
    got = linear_residual(x, w, None, None, block_k=block_k, block_m=1)
    torch.testing.assert_close(got, linear_residual_ref(x, w, None, None), atol=1e-4, rtol=1e-4)
    assert forms == [False]


@pytest.mark.parametrize(
    "group,K,tiles,form",
    [(128, 256, (128, 128), True), (64, 200, (128, 64), True), (32, 96, (128, 32), True), (24, 96, None, False)],
)
def test_the_default_tiles_of_the_form(forms, group, K, tiles, form):
    """A row tile under 16 rows asked for without tiles: the GEMV form's (packed_gemv.row_block_tiles) where a K
    tile of 32-128 lies in a group, 128 weight rows a program (norm_qkv: 64 rotary pairs at most, a head's);
    elsewhere the launch's own tiles and the dequantized tile's product."""
    x = activations(2, K, torch.float32, seed=group)
    w = int4_weight(20, K, group, torch.float32, seed=2)
    got = linear_residual(x, w, None, None, block_m=2)
    torch.testing.assert_close(got, linear_residual_ref(x, w, None, None), **tolerance(x, w, torch.float32))
    head = int4_weight(24, K, group, torch.float32, seed=3)
    got = norm_linear(x, None, None, 1e-5, head, None, "none", None, block_m=2)  # no norm: x as it is
    want = norm_linear_ref(x, None, None, 1e-5, head, None, "none")
    torch.testing.assert_close(got, want, **tolerance(x, head, torch.float32))
    Hq, Hkv, D = 2, 1, 16
    qkv = int4_weight((Hq + 2 * Hkv) * D, K, group, torch.float32, seed=4)
    inv_freq = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.arange(2, device=DEV)
    caches = [torch.zeros(2, Hkv, 4, D, device=DEV) for _ in range(4)]
    ones = torch.ones(K, device=DEV)
    q_ref = norm_qkv_ref(x, ones, None, 1e-5, qkv, None, inv_freq, 1.0, pos, pos, caches[0], caches[1], Hq, Hkv, D)
    q = norm_qkv(x, ones, None, 1e-5, qkv, None, inv_freq, 1.0, pos, pos, caches[2], caches[3], Hq, Hkv, D, block_m=2)
    torch.testing.assert_close(q, q_ref, atol=1e-4, rtol=1e-4)
    assert forms == [form] * 3, forms.tiles
    if form:
        assert forms.tiles == [tiles, tiles, (D // 2, tiles[1])]
    else:
        assert all(t[1] != 0 and group % t[1] for t in forms.tiles), forms.tiles
