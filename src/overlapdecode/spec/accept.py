"""The acceptance math of speculative decoding, batched over rows: pure torch on device tensors, no host read.

One round verifies K drafted tokens d_1..d_K of each row with one forward of the model over K + 1 positions (the
row's last token, then the drafts), which gives the model's distribution p_j after d_1..d_j for j = 0..K. A row
offers `dlen` <= K drafts (fewer near its last allowed token, or where prompt lookup finds fewer).

- Greedy: d_j is accepted while it equals the model's own choice at j - 1; the row then takes the model's choice
  after its last accepted draft. Its tokens are those of greedy decoding without speculation.
- Sampling (Leviathan et al. 2023, Chen et al. 2023): d_j, drawn from the draft's q_j, is accepted with probability
  min(1, p(d_j) / q(d_j)); at the first rejection the row samples the normalised residual max(0, p - q) instead,
  and after dlen acceptances it samples p itself. Each token so taken is distributed as p (`first_token_law` is
  that mixture in closed form, the tests' reference). Prompt lookup's draft is a point mass: q(d) = 1, so d is
  accepted with probability p(d), and the residual is p without d.

p and q are the warped distributions (repetition penalty, temperature, top-k, top-p, min-p: `warped_probs`), so
the output is the model's distribution under the same warpers. The draws are the sampler's (sampling.py): a
uniform u per draft, and one exponential race for the row's last token.
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, argmax_rows, kept_tokens, pick_next


def warped_probs(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """(..., V) logits -> (..., V) float32 probabilities after Hugging Face's processors (those pick_next samples
    from): the softmax over the kept tokens. `seen`: (..., V) bool, for the repetition penalty."""
    shape = logits.shape
    flat_seen = None if seen is None else seen.reshape(-1, shape[-1])
    scores, kept = kept_tokens(logits.reshape(-1, shape[-1]), params, flat_seen)
    e = torch.where(kept, scores.exp(), 0.0)
    return (e / e.sum(dim=-1, keepdim=True)).view(shape)


def greedy_choices(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T, V) logits -> (B, T) tokens: at each position the token greedy decoding picks (sampling.pick_next,
    the repetition penalty applied with `seen` (B, T, V))."""
    B, T, V = logits.shape
    flat_seen = None if seen is None else seen.reshape(B * T, V)
    return pick_next(logits.reshape(B * T, V), None, params, flat_seen).view(B, T)


def race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """(B, V) weights >= 0 (not all 0), (B, V) Exponential(1) noise -> (B,) a token drawn with probability
    proportional to its weight (the exponential race, as sampling.pick_next draws). A zero weight never wins."""
    return argmax_rows(torch.where(weights > 0, weights / noise, -1.0))


def leading(ok: torch.Tensor) -> torch.Tensor:
    """(B, K) bool -> (B,) the number of leading True values of each row."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def within(dlen: torch.Tensor, k: int) -> torch.Tensor:
    """(B,) draft lengths -> (B, k) bool, True for the drafts a row offers."""
    return torch.arange(k, device=dlen.device)[None, :] < dlen[:, None]


def greedy_accept(drafts: torch.Tensor, dlen: torch.Tensor, chosen: torch.Tensor):
    """(B, K) drafts, (B,) draft lengths, (B, K + 1) the model's greedy choice at each verified position ->
    ((B,) accepted counts n, (B,) the model's choice after the n-th draft)."""
    K = drafts.shape[1]
    n = leading((drafts == chosen[:, :K]) & within(dlen, K))
    return n, chosen.gather(1, n[:, None])[:, 0]


def accept_ratio(p_d: torch.Tensor, q_d: torch.Tensor) -> torch.Tensor:
    """The probability min(1, p(d) / q(d)) of accepting a draft d drawn from q (q(d) > 0)."""
    return torch.clamp(p_d / q_d, max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V) -> the normalised max(0, p - q), where a rejected draft's row samples; p itself where that is all 0
    (p <= q everywhere: then p = q up to rounding, and a rejection had probability 0 but for it)."""
    r = torch.clamp(p - q, min=0.0)
    total = r.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, r / torch.where(total > 0, total, 1.0), p)


def point_mass(drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, ...) ids -> (B, ..., V) float32 one-hot: the draft distribution of prompt lookup."""
    mass = torch.zeros((*drafts.shape, vocab), dtype=torch.float32, device=drafts.device)
    return mass.scatter_(-1, drafts[..., None], 1.0)


def is_eos(tokens: torch.Tensor, eos_ids: torch.Tensor) -> torch.Tensor:
    """torch.isin(tokens, eos_ids) by one comparison: isin may sort (and read the host) when the ids are many."""
    return (tokens[..., None] == eos_ids).any(dim=-1)


def speculative_accept(
    drafts: torch.Tensor,
    dlen: torch.Tensor,
    p: torch.Tensor,
    q: torch.Tensor | None,
    u: torch.Tensor,
    noise: torch.Tensor,
):
    """Speculative sampling of one round, every row at once.

    drafts (B, K), dlen (B,), p (B, K + 1, V) the model's warped probabilities at each verified position, q (B, K, V)
    the draft's (None: a point mass on each draft), u (B, K) uniform in [0, 1), noise (B, V) Exponential(1) ->
    ((B,) accepted counts n, (B,) the token after the n-th draft: from the residual at a rejection, from p_dlen
    after dlen acceptances)."""
    B, K = drafts.shape
    V = p.shape[-1]
    p_d = p[:, :K].gather(2, drafts[..., None])[..., 0]  # (B, K)
    q_d = torch.ones_like(p_d) if q is None else q.gather(2, drafts[..., None])[..., 0]
    n = leading((u < accept_ratio(p_d, q_d)) & within(dlen, K))
    rows = torch.arange(B, device=drafts.device)
    p_n = p[rows, n]  # (B, V)
    at = n.clamp(max=K - 1)
    q_n = point_mass(drafts[rows, at], V) if q is None else q[rows, at]
    final = torch.where((n < dlen)[:, None], residual(p_n, q_n), p_n)
    return n, race(final, noise)


def stop_at_eos(drafts: torch.Tensor, n: torch.Tensor, eos_ids: torch.Tensor):
    """A row that accepts an EOS stops there: (B, K) drafts, (B,) accepted counts, (E,) EOS ids -> ((B,) the counts
    cut after the first accepted EOS, (B,) bool whether a row accepted one: its round emits no further token)."""
    K = drafts.shape[1]
    hit = is_eos(drafts, eos_ids) & within(n, K)
    first = hit.to(torch.int8).argmax(dim=1)  # the first True of a bool row
    any_hit = hit.any(dim=1)
    return torch.where(any_hit, first + 1, n), any_hit


def first_token_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,) p and q -> the law of the token speculative sampling takes at one position (the reference of the
    tests): accept d ~ q with probability accept_ratio, else draw from the residual. It equals p."""
    accept = q * torch.where(q > 0, accept_ratio(p, torch.where(q > 0, q, 1.0)), 0.0)
    return accept + (1 - accept.sum()) * residual(p, q)
