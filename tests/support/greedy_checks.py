"""The GPU tests' checks of the fused step against Hugging Face: its greedy tokens for many steps, a divergence
accepted only after a near tie of the top two logits, and logits within 1e-4 of their scale."""

from __future__ import annotations

import torch

from support.fused_steps import hf_greedy
from support.helpers import make_batch

DEV = "cuda"
TIE = 1e-4  # top-two logits closer than this: a step where two correct decoders may choose differently


def close(got, ref):
    scale = ref.abs().max().item()
    assert (got.float() - ref.float()).abs().max().item() <= 1e-4 * max(scale, 1.0)


def prompts(model, B, P=16, seed=0):
    return make_batch(B, seed, P, low=0, high=model.config.vocab_size - 1, device=DEV)


def near_ties(scores) -> list[int]:
    """Steps whose top-two logits (any row) are within TIE."""
    top2 = torch.stack([s.float().topk(2, dim=-1).values for s in scores], 1)  # (B, n, 2)
    gap = (top2[..., 0] - top2[..., 1]).min(0).values
    return [int(i) for i in (gap < TIE).nonzero().flatten()]


def assert_hf_greedy_tokens(model, ids, mask, run, label: str, n: int = 200):
    """`run(n)`'s tokens equal Hugging Face's greedy tokens for n steps, a divergence accepted only after a near
    tie; -> Hugging Face's generate output (sequences and per-step logits)."""
    hf = hf_greedy(model, ids, mask, n)
    ties = near_ties(hf.logits)
    out = run(n)
    P = ids.shape[1]
    diff = (out[:, P:] != hf.sequences[:, P:]).any(0).nonzero().flatten()
    first = int(diff[0]) if diff.numel() else None
    print(f"{label}: first divergence {first}, near-tie steps {ties}")
    assert first is None or any(t <= first for t in ties), f"diverged at step {first} with no near tie before"
    return hf
