"""On a real GPU: the fused verify step (forward.verify_step: the Triton kernels over the B x T tokens as rows,
`cache_group` T) gives the float32 logits and cache of T one-token decode steps, within 1e-4 of the largest logit
(the B x T-row launches may take other tiles than the B-row steps: from 17 rows the dense form, cuBLAS's product);
and the decode attention with cache_group equals its reference at real shapes, float32 within 1e-4 relative and
16-bit within bf16 tolerance (as tests/gpu/test_gpu_decode_attention.py)."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused import forward
from overlapdecode.fused.kernels.decode_attention import decode_attention, decode_attention_ref
from overlapdecode.fused.model import FusedModel
from overlapdecode.inputs import position_ids_for_prompt
from support.fused_families import real_model
from support.greedy_checks import close
from support.helpers import make_batch

DEV = "cuda"
T = 5  # tokens per row: K = 4 drafts and the row's last token


@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("name", ["llama-1b-random", "mistral-sliding", "olmo2", "gemma2"])
@torch.no_grad()
def test_a_verify_of_t_tokens_is_t_one_token_steps(name, B):
    """Llama-1B's shape, Mistral-7B's with every layer in a window of 64 (prompts of 80), OLMo-2-1B's Q/K norms,
    Gemma-2-2B's soft-caps and heads of 256; left padding on the odd rows (make_batch's)."""
    model = od.load_model(name, device=DEV) if name == "llama-1b-random" else real_model(name)
    fm = FusedModel(model, compile_prefill=False)
    assert fm.kernels == "triton"
    ids, mask = make_batch(B, seed=B, prompt_len=80, low=0, high=model.config.vocab_size - 1, device=DEV)
    caches = [fm.cache_for(B, 128, tag) for tag in ("verify", "steps")]
    for cache in caches:
        fm.prefill(cache, ids, mask, position_ids_for_prompt(mask))
    pos = mask.sum(1)[:, None] + torch.arange(T, device=DEV)[None, :]
    new = torch.randint(0, model.config.vocab_size, (B, T), device=DEV)
    W, c = fm.weights, caches[0]
    got = forward.verify_step(W, c.k, c.v, c.pad, new, pos, fm.ops)
    c = caches[1]
    want = torch.stack([forward.decode_step(W, c.k, c.v, c.pad, new[:, t], pos[:, t], fm.ops) for t in range(T)], dim=1)
    close(got, want)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("Hq,Hkv,D", [(32, 8, 64), (32, 8, 128), (8, 4, 256)])
@pytest.mark.parametrize("B,S", [(1, 2048), (4, 300), (32, 2048)])
def test_attention_with_cache_group_matches_reference(B, S, Hq, Hkv, D, dtype):
    """B cache rows of T query rows each, their lengths rising along the row from a random start."""
    torch.manual_seed(B + D)
    q = torch.randn(B * T, Hq, D, device=DEV).to(dtype)
    k, v = (torch.randn(B, Hkv, S, D, device=DEV).to(dtype) for _ in range(2))
    start = torch.randint(0, S // 2, (B,), device=DEV).repeat_interleave(T)
    short = torch.randint(0, S // 4, (B,), device=DEV).repeat_interleave(T)
    length = (S - T + 1 + torch.arange(T, device=DEV)).repeat(B) - short  # rising along each row, at most S
    got = decode_attention(q, k, v, start, length, D**-0.5, cache_group=T)
    ref = decode_attention_ref(q, k, v, start, length, D**-0.5, cache_group=T)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got.float(), ref.float(), **tol)
