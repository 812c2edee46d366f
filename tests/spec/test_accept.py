"""spec/accept.py: greedy acceptance, the EOS cut, and speculative sampling's law, exactly on a tiny vocabulary (the
accept/residual mixture is p) and by the frequencies of its sampler over many rows (a chi-square test that a
planted bias in the residual fails)."""

from __future__ import annotations

import pytest
import torch

from overlapdecode.spec import accept
from support.stats import chi2_pvalue, chi2_stat


def test_greedy_accepts_the_drafts_the_model_would_have_chosen():
    drafts = torch.tensor([[5, 6, 7], [5, 6, 7], [5, 6, 7], [5, 6, 7]])
    chosen = torch.tensor([[5, 6, 7, 8], [5, 9, 7, 8], [4, 6, 7, 8], [5, 6, 7, 8]])
    dlen = torch.tensor([3, 3, 3, 2])
    n, nxt = accept.greedy_accept(drafts, dlen, chosen)
    # all three and the bonus; the second differs; the first differs; only two offered (the third is not verified)
    assert n.tolist() == [3, 1, 0, 2]
    assert nxt.tolist() == [8, 9, 4, 7]


def test_a_row_that_accepts_an_eos_stops_there():
    eos = torch.tensor([2, 3])
    drafts = torch.tensor([[5, 2, 6], [5, 6, 3], [3, 6, 7], [5, 6, 7]])
    n, hit = accept.stop_at_eos(drafts, torch.tensor([3, 2, 0, 3]), eos)
    # row 0 accepts EOS 2 as its second token; row 1 never reaches its EOS; row 2 rejects it; row 3 has none
    assert n.tolist() == [2, 2, 0, 3] and hit.tolist() == [True, False, False, False]


def _law_cases():
    g = torch.Generator().manual_seed(0)
    cases = []
    for _ in range(20):
        p = torch.rand(5, generator=g) * (torch.rand(5, generator=g) > 0.3)
        q = torch.rand(5, generator=g) * (torch.rand(5, generator=g) > 0.3)
        p[0] += 0.1
        q[1] += 0.1
        cases.append((p / p.sum(), q / q.sum()))
    p = torch.tensor([0.5, 0.5, 0, 0, 0])
    cases += [
        (p, torch.tensor([0, 0, 0.5, 0.5, 0])),  # disjoint: every draft rejected
        (p, p.clone()),  # the draft is the model: every draft accepted
        (p, torch.nn.functional.one_hot(torch.tensor(1), 5).float()),  # prompt lookup's point mass
        (p, torch.nn.functional.one_hot(torch.tensor(3), 5).float()),  # a point mass the model never takes
    ]
    return cases


def test_the_accept_residual_mixture_is_exactly_p():
    for p, q in _law_cases():
        assert torch.allclose(accept.first_token_law(p, q), p, atol=1e-6), (p, q)


def test_the_exact_check_fails_a_residual_that_is_p(monkeypatch):
    monkeypatch.setattr(accept, "residual", lambda p, q: p)  # the planted bias: a rejection samples p itself
    p, q = _law_cases()[0]
    assert not torch.allclose(accept.first_token_law(p, q), p, atol=1e-3)


def _pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    return chi2_pvalue(*chi2_stat(torch.bincount(tokens, minlength=probs.shape[0]), probs))


def _round(rows: int, point_mass: bool, seed: int = 1):
    """One speculative-sampling round of K = 2 over `rows` identical rows: p (3 positions) and q (2) fixed on V = 6,
    the drafts drawn from q, q given or a point mass on each draft -> (p, the first two tokens each row takes, n)."""
    g = torch.Generator().manual_seed(seed)
    V, K = 6, 2
    p = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10, 0.0], [0.05, 0.05, 0.1, 0.2, 0.3, 0.3], [1 / 6] * 6])
    q = torch.tensor([[0.10, 0.10, 0.10, 0.30, 0.20, 0.20], [0.40, 0.30, 0.1, 0.1, 0.1, 0.0]])
    # the drafts drawn from q; a point mass on each (prompt lookup's: the law is p whatever the drafts are)
    drafts = torch.stack([torch.multinomial(q[j], rows, replacement=True, generator=g) for j in range(K)], 1)
    qs = None if point_mass else q.expand(rows, K, V)
    u = torch.rand((rows, K), generator=g)
    noise = torch.empty((rows, V)).exponential_(generator=g)
    n, nxt = accept.speculative_accept(drafts, torch.full((rows,), K), p.expand(rows, K + 1, V), qs, u, noise)
    first = torch.where(n >= 1, drafts[:, 0], nxt)
    second = torch.where(n >= 2, drafts[:, 1], nxt)
    return p, first, second, n


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model", "point-mass"])
def test_sampled_tokens_follow_p_at_each_position(point_mass):
    p, first, second, n = _round(40000, point_mass)
    assert 0.1 < (n == 0).float().mean() < 0.9, "the case should accept some drafts and reject others"
    assert _pvalue(first, p[0]) > 1e-3
    # the second token, of the rows that took the first draft: a draft accepted or the residual of position 1
    assert _pvalue(second[n >= 1], p[1]) > 1e-3


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model", "point-mass"])
def test_the_frequency_check_fails_a_planted_bias_in_the_residual(point_mass, monkeypatch):
    monkeypatch.setattr(accept, "residual", lambda p, q: p)  # a rejection samples p itself: the draft's share twice
    p, first, _, _ = _round(40000, point_mass)
    assert _pvalue(first, p[0]) < 1e-6


def test_the_race_never_draws_a_zero_weight():
    g = torch.Generator().manual_seed(3)
    weights = torch.tensor([[0.0, 0.2, 0.0, 0.8]]).expand(20000, 4)
    noise = torch.empty((20000, 4)).exponential_(generator=g)
    noise[:5, 0] = 0.0  # an exponential draw of 0 on a zero weight (0 / 0) must not win
    tokens = accept.race(weights, noise)
    counts = torch.bincount(tokens, minlength=4)
    assert counts[0] == 0 and counts[2] == 0
    assert abs(counts[3].item() / 20000 - 0.8) < 0.02
