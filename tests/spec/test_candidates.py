"""spec/candidates.py: prompt lookup's drafts are those of Hugging Face's PromptLookupCandidateGenerator, for every
row of a batch whose rows have different lengths."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from overlapdecode.spec.candidates import prompt_lookup


def hf_candidates(tokens: list[int], k: int, ngram: int, eos: list[int]) -> list[int]:
    """Hugging Face's prompt-lookup candidates for one row (its generator takes batch 1)."""
    gen = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(eos) if eos else None,
        num_output_tokens=k,
        max_matching_ngram_size=ngram,
        max_length=10_000,
    )
    ids, _ = gen.get_candidates(torch.tensor([tokens]))
    return ids[0, len(tokens) :].tolist()


@pytest.mark.parametrize("k, ngram", [(1, 2), (3, 2), (5, 1), (4, 3)])
def test_prompt_lookup_matches_hugging_faces_candidates(k, ngram):
    g = torch.Generator().manual_seed(k * 10 + ngram)
    eos = [3]
    for trial in range(30):
        B, L = 5, 24
        hist = torch.randint(0, 6, (B, L), generator=g)  # a small vocabulary: n-grams repeat
        hlen = torch.randint(1, L, (B,), generator=g)
        hlen[0] = L - 1  # as long as the buffer allows (its last column is the round loop's dump column)
        stop = eos if trial % 2 else []  # with and without EOS ids (then nothing is cut)
        drafts, count = prompt_lookup(hist, hlen, k, ngram, torch.tensor(stop, dtype=torch.long))
        for r in range(B):
            row = hist[r, : hlen[r]].tolist()
            assert drafts[r, : count[r]].tolist() == hf_candidates(row, k, ngram, stop), (trial, r, row)


def test_prompt_lookup_finds_the_continuation_of_a_repeated_phrase():
    hist = torch.tensor([[7, 8, 9, 10, 11, 7, 8, 0, 0]])
    drafts, count = prompt_lookup(hist, torch.tensor([7]), 3, 2, torch.tensor([11]))
    assert drafts[0, : count[0]].tolist() == [9, 10]  # cut before the EOS 11
    drafts, count = prompt_lookup(hist, torch.tensor([4]), 3, 2, torch.tensor([11]))
    assert count.item() == 0  # [7, 8, 9, 10]: no earlier match
