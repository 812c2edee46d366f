"""The sampler against Hugging Face's processors on fixed logit vectors: the kept set at each setting (ties
included), and the distribution of many seeded draws (a chi-square test that a wrong sampler fails)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
)

from overlapdecode.sampling import check_sampling, kept_tokens, pick_next, seen_tokens
from support.helpers import hf_processors

SETTINGS = [
    dict(temperature=0.8),
    dict(top_k=5),
    dict(top_k=1),
    dict(top_p=0.9),
    dict(top_p=0.3),
    dict(top_p=0.999),
    dict(min_p=0.05),
    dict(min_p=0.5),
    dict(repetition_penalty=1.3),
    dict(repetition_penalty=0.7),
    dict(temperature=0.7, top_k=40, top_p=0.95),
    dict(temperature=1.3, top_k=8, top_p=0.6, min_p=0.1, repetition_penalty=1.2),
]


def params_of(setting: dict):
    s = dict(temperature=1.0, top_k=None, top_p=None, min_p=None, repetition_penalty=None) | setting
    return check_sampling(True, s["temperature"], s["top_k"], s["top_p"], None, s["min_p"], s["repetition_penalty"])


def fixed_logits(seed: int, rows: int = 4, vocab: int = 300) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g) * 2.5
    logits[1, 10:20] = logits[1].max()  # ten tokens tied at the top
    logits[2, ::3] = 0.5  # a hundred tokens tied in the middle
    logits[3] = torch.randint(-4, 4, (vocab,), generator=g).float()  # few distinct values: ties everywhere
    return logits


def ids_of(seed: int, rows: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (rows, 12), generator=g)


def test_kept_set_is_hugging_faces(setting_and_seed):
    setting, seed = setting_and_seed
    logits = fixed_logits(seed)
    ids = ids_of(seed, *logits.shape)
    hf = hf_processors(setting)(ids, logits.clone()) > float("-inf")
    _, ours = kept_tokens(logits, params_of(setting), seen_tokens(ids, logits.shape[1]))
    if "top_p" not in setting:
        assert torch.equal(ours, hf)
        return
    # top-p: equal, except that a tie group across the boundary is kept whole (Hugging Face keeps the part
    # its unstable sort places last): HF's set is inside ours, and what we add scores exactly HF's lowest kept
    assert torch.all(hf <= ours)
    extra = ours & ~hf
    for r in range(logits.shape[0]):
        if extra[r].any():
            scores = hf_processors({k: v for k, v in setting.items() if k != "top_p" and k != "min_p"})(
                ids[r : r + 1], logits[r : r + 1].clone()
            )[0]
            lowest = scores[hf[r]].min()
            assert torch.all(scores[extra[r]] == lowest), (setting, r)


@pytest.fixture(
    params=[(s, seed) for s in SETTINGS for seed in (0, 1)],
    ids=lambda p: ",".join(f"{k}={v}" for k, v in p[0].items()) + f"-seed{p[1]}",
)
def setting_and_seed(request):
    return request.param


def test_distinct_scores_give_exactly_hugging_faces_set():
    """No ties: the sets are equal at every top-p, including right at the boundary of each token."""
    logits = torch.linspace(-6, 3, 64)[torch.randperm(64, generator=torch.Generator().manual_seed(3))][None]
    probs = logits.softmax(-1)[0].sort(descending=True).values
    for top_p in [0.05, 0.2, 0.5, 0.77, 0.9, 0.99] + [float(probs[:k].sum()) + 1e-4 for k in (1, 2, 5)]:
        hf = hf_processors(dict(top_p=top_p))(None, logits.clone()) > float("-inf")
        _, ours = kept_tokens(logits, params_of(dict(top_p=top_p)))
        assert torch.equal(ours, hf), top_p


def test_repetition_penalty_counts_every_prompt_column_and_applies_to_greedy():
    logits = torch.tensor([[2.0, 1.9, -1.0, -1.05, 0.0]])
    ids = torch.tensor([[0, 0, 2]])  # token 0 seen twice, token 2 once: once is enough
    params = check_sampling(False, 1.0, None, None, None, repetition_penalty=1.5)
    seen = seen_tokens(ids, 5)
    # 2.0 / 1.5 = 1.33 < 1.9: greedy moves to token 1; -1.0 * 1.5 = -1.5 < -1.05
    assert int(pick_next(logits, None, params, seen)) == 1
    hf = RepetitionPenaltyLogitsProcessor(1.5)(ids, logits.clone())
    assert int(hf.argmax()) == 1
    with pytest.raises(ValueError, match="seen"):
        pick_next(logits, None, params)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the categories of positive probability, and its degrees of freedom."""
    n = counts.sum()
    live = probs > 0
    assert int(counts[~live].sum()) == 0, "a draw outside the kept set"
    expected = probs[live] * n
    return float(((counts[live] - expected) ** 2 / expected).sum()), int(live.sum()) - 1


# chi-square critical values at p = 1e-4 (a correct sampler fails one run in 10,000)
CRITICAL = {
    1: 15.14,
    2: 18.42,
    3: 21.11,
    4: 23.51,
    5: 25.74,
    6: 27.86,
    7: 29.88,
    8: 31.83,
    9: 33.72,
    10: 35.56,
    11: 37.37,
    12: 39.13,
    13: 40.87,
    14: 42.58,
    15: 44.26,
}


def draws(sampler, logits: torch.Tensor, setting: dict, n: int = 40000) -> torch.Tensor:
    rows = logits.expand(n, -1).contiguous()
    noise = torch.empty_like(rows).exponential_(generator=torch.Generator().manual_seed(11))
    tokens = sampler(rows, noise, params_of(setting))
    return torch.bincount(tokens, minlength=logits.shape[1]).float()


DIST_SETTINGS = [
    dict(temperature=0.7),
    dict(top_k=6),
    dict(top_p=0.8),
    dict(min_p=0.1),
    dict(temperature=1.5, top_k=10, top_p=0.9, min_p=0.02),
]


@pytest.mark.parametrize("setting", DIST_SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_draws_follow_hugging_faces_probabilities(setting):
    logits = torch.linspace(-2, 2, 16)[torch.randperm(16, generator=torch.Generator().manual_seed(5))][None]
    probs = hf_processors(setting)(None, logits.clone()).softmax(-1)[0]
    stat, dof = chi_square(draws(pick_next, logits, setting), probs)
    assert stat < CRITICAL[dof], (stat, dof)


def test_the_distribution_test_fails_a_wrong_sampler():
    """The same test on two samplers that are wrong by a little: it must reject both."""
    logits = torch.linspace(-2, 2, 16)[torch.randperm(16, generator=torch.Generator().manual_seed(5))][None]
    setting = dict(top_p=0.8)
    probs = hf_processors(setting)(None, logits.clone()).softmax(-1)[0]

    def sharper(rows, noise, params):  # the race with noise ** 1.1: a slightly sharper distribution
        return pick_next(rows, noise**1.1, params)

    def no_top_p(rows, noise, params):  # forgets top-p: draws outside the kept set
        return pick_next(rows, noise, params_of({}))

    stat, dof = chi_square(draws(sharper, logits, setting), probs)
    assert stat > CRITICAL[dof], (stat, dof)
    with pytest.raises(AssertionError, match="outside the kept set"):
        chi_square(draws(no_top_p, logits, setting), probs)


@pytest.mark.parametrize("vocab", [50257, 128256])
def test_long_rows_need_no_sort(vocab):
    """At real vocabularies the threshold is the same as a sort's (the bisection has enough rounds)."""
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(2, vocab, generator=g) * 4
    for setting in (dict(top_p=0.9), dict(top_p=0.5, top_k=1000)):
        hf = hf_processors(setting)(None, logits.clone()) > float("-inf")
        _, ours = kept_tokens(logits, params_of(setting))
        assert torch.equal(ours, hf), setting


def test_check_sampling_names_each_argument():
    for kwargs, name in (
        (dict(min_p=1.5), "min_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p="0.1"), "min_p"),
        (dict(repetition_penalty=0), "repetition_penalty"),
        (dict(repetition_penalty=math.inf), "repetition_penalty"),
        (dict(repetition_penalty=math.nan), "repetition_penalty"),
        (dict(repetition_penalty=True), "repetition_penalty"),
        (dict(top_k=-1), "top_k"),
    ):
        with pytest.raises((ValueError, TypeError), match=f"^{name}"):
            check_sampling(
                True, 1.0, kwargs.get("top_k"), None, None, kwargs.get("min_p"), kwargs.get("repetition_penalty")
            )
    assert check_sampling(True, 1.0, 0, 1.0, None, None, 1.0) == check_sampling(True, 1.0, None, None, None)
    with pytest.warns(UserWarning, match="min_p"):
        check_sampling(False, 1.0, None, None, None, min_p=0.1)
