"""The GPU tests' checks of the fused step against Hugging Face: its greedy tokens for many steps, a divergence
accepted only after a near tie of the top two logits, and logits within 1e-4 of their scale."""

from __future__ import annotations

import torch

from support.fused_steps import hf_greedy
from support.helpers import make_batch

DEV = "cuda"
TIE = 1e-4  # top-two logits closer than this: a step where two correct decoders may choose differently (float32)


def close(got, ref):
    scale = ref.abs().max().item()
    assert (got.float() - ref.float()).abs().max().item() <= 1e-4 * max(scale, 1.0)


def prompts(model, B, P=16, seed=0):
    return make_batch(B, seed, P, low=0, high=model.config.vocab_size - 1, device=DEV)


def near_ties(scores) -> list[int]:
    """Steps whose top-two logits (any row) are within TIE, or within two units in the last place of the logits'
    own dtype at the top logit: in float16 or bfloat16 the logits are rounded to a few significant bits, and two
    correct decoders that round in another order may rank values one or two such units apart either way (float16
    GPTQ act-order logits on CPU: Hugging Face and the compiled preset part after a gap of one unit, 2.4e-4)."""
    top2 = torch.stack([s.topk(2, dim=-1).values for s in scores], 1).float()  # (B, n, 2)
    eps = torch.finfo(scores[0].dtype).eps
    ulp = eps * torch.exp2(torch.floor(torch.log2(top2[..., 0].abs().clamp_min(torch.finfo(torch.float32).tiny))))
    tie = (top2[..., 0] - top2[..., 1]) < torch.clamp(2 * ulp, min=TIE)
    return [int(i) for i in tie.any(0).nonzero().flatten()]


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
