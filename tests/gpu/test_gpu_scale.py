"""On a real GPU, at large batches and a long prompt: the swapped GEMV kernels (kernels/swap_ab.py) equal their
references at the Llama-1B shape at 64 and 128 rows (float32), and `fused` gives Hugging Face's float32 greedy
tokens at 40, 64, 100 and 128 rows (mixed prompt lengths; QKV, O and down in dense form, kernels/dense.py, and at
40 and 128 rows on the swapped GEMVs too) and at a 4K-token prompt, on a 2-layer model of Llama-1B's width
(hidden 2048, 32 heads, 8 KV heads, intermediate 8192, vocabulary 128256). A row may diverge only after a step where
its top-two Hugging Face logits were within 1e-4 (float32 on the GPU: a few ulps of difference, docs/KERNELS.md)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

import overlapdecode as od
from overlapdecode.fused.kernels.linear_residual import linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.models.loading import embedded_config
from support.fused_steps import hf_greedy
from support.helpers import make_batch

DEV = "cuda"
TIE = 1e-4


def close(got, ref):
    assert (got.float() - ref.float()).abs().max().item() <= 1e-4 * max(ref.abs().max().item(), 1.0)


@pytest.mark.parametrize("B", [64, 128])
@torch.no_grad()
def test_swapped_kernels_match_references_at_the_1b_shape(B):
    H, Hq, Hkv, D, I = 2048, 32, 8, 64, 8192
    torch.manual_seed(B)
    r = lambda *s, sc=1.0: torch.randn(*s, device=DEV) * sc  # noqa: E731
    x, nw = r(B, H), r(H, sc=0.1) + 1
    w = r((Hq + 2 * Hkv) * D, H, sc=H**-0.5)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos, slot = torch.randint(0, 4000, (B,), device=DEV), torch.randint(0, 300, (B,), device=DEV)
    c = [torch.zeros(B, Hkv, 300, D, device=DEV) for _ in range(4)]
    wu, wd, res, m = r(2 * I, H, sc=H**-0.5), r(H, I, sc=I**-0.5), r(B, H), r(B, I)
    for programs in (None, 528):  # the rule's split (swap_ab.swap_tiles), then a deeper one
        q = norm_qkv(
            x, nw, None, 1e-5, w, None, inv, 1.0, pos, slot, c[2], c[3], Hq, Hkv, D, programs=programs, swap=True
        )
        close(q, norm_qkv_ref(x, nw, None, 1e-5, w, None, inv, 1.0, pos, slot, c[0], c[1], Hq, Hkv, D))
        close(c[2], c[0])
        close(c[3], c[1])
        close(
            norm_linear(x, nw, None, 1e-5, wu, None, "silu_mul", programs=programs),
            norm_linear_ref(x, nw, None, 1e-5, wu, None, "silu_mul"),
        )
        close(linear_residual(m, wd, None, res, programs=programs, swap=True), linear_residual_ref(m, wd, None, res))


@pytest.fixture(scope="module")
def wide_llama():
    """Llama-3.2-1B's width and vocabulary, 2 layers, random float32 weights made on the GPU."""
    cfg = embedded_config("llama-1b-random")
    cfg.num_hidden_layers = 2
    torch.manual_seed(0)
    with torch.device(DEV):
        return LlamaForCausalLM(cfg).eval()


def _check_rows(model, ids, mask, n):
    hf = hf_greedy(model, ids, mask, n)
    # the prefill eager: compiled, each prompt bucket would cost a compile, and the decode step is what is checked
    dec = od.Decoder(model, fused_options=dict(compile_prefill=False))
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])
    P = ids.shape[1]
    top2 = torch.stack([s.float().topk(2, dim=-1).values for s in hf.logits], 1)  # (B, n, 2)
    tie = (top2[..., 0] - top2[..., 1]) < TIE  # (B, n)
    differs = out[:, P:] != hf.sequences[:, P:]
    bad = []
    for row in range(ids.shape[0]):
        steps = differs[row].nonzero().flatten()
        if steps.numel() and not tie[row, : int(steps[0]) + 1].any():
            bad.append((row, int(steps[0])))
    print(f"B={ids.shape[0]} P={P}: rows diverging {int(differs.any(1).sum())}, without a near tie before: {bad}")
    assert not bad


@pytest.mark.parametrize("B", [40, 64, 100, 128])
@torch.no_grad()
def test_float32_tokens_equal_hf_at_many_rows(wide_llama, B):
    ids, mask = make_batch(B, seed=B, prompt_len=24, low=0, high=128000, device=DEV)
    _check_rows(wide_llama, ids, mask, 24)


@pytest.mark.parametrize("B", [40, 128])
@torch.no_grad()
def test_float32_tokens_equal_hf_with_swapped_projections(wide_llama, B, monkeypatch):
    """QKV, O and down on the swapped GEMVs (swap_ab.py) instead of the dense form the rule gives at these rows
    (kernels/dense.py)."""
    from overlapdecode.fused.kernels import dense

    monkeypatch.setattr(dense, "DENSE_ROWS", 10**9)
    ids, mask = make_batch(B, seed=B + 1, prompt_len=24, low=0, high=128000, device=DEV)
    _check_rows(wide_llama, ids, mask, 24)


@torch.no_grad()
def test_float32_tokens_equal_hf_at_a_4k_prompt(wide_llama):
    ids, mask = make_batch(2, seed=4, prompt_len=4096, low=0, high=128000, device=DEV)
    _check_rows(wide_llama, ids, mask, 24)
