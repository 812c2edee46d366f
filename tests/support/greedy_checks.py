"""The GPU tests' checks of the fused step against Hugging Face: its greedy tokens for many steps, a divergence
accepted only after a near tie of the top two logits (in 16 bits, one within the logits' own error), and logits
within 1e-4 of their scale."""

from __future__ import annotations

import copy

import torch

from support.fused_steps import hf_greedy
from support.helpers import hf_positions, make_batch

DEV = "cuda"
TIE = 1e-4  # top-two logits closer than this: a step where two correct float32 decoders may choose differently


def close(got, ref):
    scale = ref.abs().max().item()
    assert (got.float() - ref.float()).abs().max().item() <= 1e-4 * max(scale, 1.0)


def prompts(model, B, P=16, seed=0):
    return make_batch(B, seed, P, low=0, high=model.config.vocab_size - 1, device=DEV)


def near_ties(scores) -> list[int]:
    """Steps whose top-two logits (any row) are within TIE. Hugging Face's generate() hands its logits out in
    float32 whatever the model's dtype; a 16-bit model's own rounding is `own_error_ties`'s."""
    top2 = torch.stack([s.float().topk(2, dim=-1).values for s in scores], 1)  # (B, n, 2)
    gap = (top2[..., 0] - top2[..., 1]).min(0).values
    return [int(i) for i in (gap < TIE).nonzero().flatten()]


OWN_ERROR = 1.25  # a preset's 16-bit logits may be off by this many times Hugging Face's own error (the bf16 bound)


def own_error_ties(model, ids, mask, hf, upto: int) -> list[int]:
    """Steps 0..upto whose top-two gap (any row) is within what two correct 16-bit decoders can disagree by:
    Hugging Face's own error, the largest distance of its logits at that step or before from the same model's in
    float32 (a float32 copy fed Hugging Face's tokens in one forward), plus the preset's, at most OWN_ERROR times
    that. In 16 bits the rounding a model carries through its layers can exceed a few units in the last place of
    small logits (a random GPTQ act-order model in float16 on CPU: Hugging Face 5e-4 to 1.2e-3 from float32, its
    logits under 0.65, the compiled preset parting from it after a gap of 2.4e-4)."""
    seq = hf.sequences
    full = torch.cat([mask, mask.new_ones(seq.shape[0], seq.shape[1] - mask.shape[1])], 1)
    reference = copy.deepcopy(model).float()
    with torch.no_grad():
        logits = reference(input_ids=seq, attention_mask=full, position_ids=hf_positions(full)).logits
    del reference
    P, got = ids.shape[1], torch.stack(hf.logits[: upto + 1], 1).float()  # (B, upto + 1, V)
    err = (got - logits[:, P - 1 : P + upto].float()).abs().amax(-1).amax(0).cummax(0).values  # (upto + 1,)
    top2 = got.topk(2, dim=-1).values
    gap = (top2[..., 0] - top2[..., 1]).amin(0)
    return [int(i) for i in (gap < (1 + OWN_ERROR) * err).nonzero().flatten()]


def assert_hf_greedy_tokens(model, ids, mask, run, label: str, n: int = 200):
    """`run(n)`'s tokens equal Hugging Face's greedy tokens for n steps, a divergence accepted only after a near
    tie (`near_ties`; in a 16-bit model, if none came before it, `own_error_ties`); -> Hugging Face's generate
    output (sequences and per-step logits)."""
    hf = hf_greedy(model, ids, mask, n)
    ties = near_ties(hf.logits)
    out = run(n)
    P = ids.shape[1]
    diff = (out[:, P:] != hf.sequences[:, P:]).any(0).nonzero().flatten()
    first = int(diff[0]) if diff.numel() else None
    if first is not None and not any(t <= first for t in ties) and model.dtype != torch.float32:
        ties = own_error_ties(model, ids, mask, hf, first)  # only where needed: a float32 copy of the model
        print(f"{label}: within 16-bit logits' own error of float32's at steps {ties}")
    print(f"{label}: first divergence {first}, near-tie steps {ties}")
    assert first is None or any(t <= first for t in ties), f"diverged at step {first} with no near tie before"
    return hf
