"""Statistics the sampling tests share: Pearson's chi-square p-value of observed counts against a distribution."""

from __future__ import annotations

import torch


def chi2_stat(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of `counts` against `probs` over the outcomes of nonzero probability; an
    outcome of probability 0 that occurs gives an infinite statistic."""
    counts, probs = counts.double(), probs.double()
    if (counts[probs == 0] > 0).any():
        return float("inf"), max(int((probs > 0).sum()) - 1, 1)
    keep = probs > 0
    expected = probs[keep] * counts.sum()
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def chi2_pvalue(stat: float, df: int) -> float:
    """P(X >= stat) for X chi-square with `df` degrees of freedom (the regularised upper incomplete gamma)."""
    if stat == float("inf"):
        return 0.0
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0)))
