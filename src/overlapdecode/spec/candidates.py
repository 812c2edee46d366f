"""Where a round's drafts come from: prompt lookup (n-gram matches in each row's own tokens) or a draft model.

Both propose, for every row, K tokens and how many of them the row offers (`dlen`), on the device, without a host
read; the round loop (rounds.py) caps `dlen` at the row's tokens left.

- `PromptLookup`, as Hugging Face's PromptLookupCandidateGenerator: for n from `ngram` down to 1, the row's last n
  tokens are looked for in its own tokens (the prompt without its left padding, then what it generated); the first
  (leftmost) match whose continuation starts before the row's end gives up to K following tokens, cut before the
  first EOS. No match: the row offers none, and its round is one plain step. The draft is a point mass.
- `Assistant`: the draft model decodes K tokens from the row's last token with its own cache (spec/cache.py's, or
  the fused path's), greedily or, when the call samples, from its own warped distribution q (which the acceptance
  needs). It also feeds its K-th draft, so that its cache holds the same K + 1 slots per round as the model's and is
  cut back the same way, at the positions the model's are fed at (state.feed_positions).
"""

from __future__ import annotations

import torch

from ..sampling import SamplingParams, draw_noise, mark_seen
from .accept import greedy_choices, is_eos, race, warped_probs
from .state import feed_positions


def prompt_lookup(hist: torch.Tensor, hlen: torch.Tensor, k: int, ngram: int, eos_ids: torch.Tensor):
    """(B, L) each row's tokens, left-aligned, (B,) their counts -> ((B, k) drafts, (B,) how many each row offers)."""
    B, L = hist.shape
    device = hist.device
    drafts = torch.zeros((B, k), dtype=torch.long, device=device)
    count = torch.zeros(B, dtype=torch.long, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    ahead = torch.arange(k, device=device)
    for n in range(min(ngram, L - 1), 0, -1):
        tail = hist.gather(1, (hlen[:, None] - n + torch.arange(n, device=device)).clamp(min=0))  # (B, n)
        windows = hist.unfold(1, n, 1)  # (B, L - n + 1, n)
        starts = torch.arange(L - n + 1, device=device)
        match = (windows == tail[:, None, :]).all(dim=2) & (starts[None, :] + n < hlen[:, None])
        found = match.any(dim=1) & ~done
        start = match.to(torch.int8).argmax(dim=1) + n  # the first match's continuation
        cand = hist.gather(1, (start[:, None] + ahead).clamp(max=L - 1))
        drafts = torch.where(found[:, None], cand, drafts)
        count = torch.where(found, (hlen - start).clamp(max=k), count)
        done |= found
    eos = is_eos(drafts, eos_ids) & (ahead[None, :] < count[:, None])
    count = torch.where(eos.any(dim=1), eos.to(torch.int8).argmax(dim=1), count)  # cut before the first EOS
    return drafts, count


class PromptLookup:
    """Prompt lookup's drafts, from the rows' tokens that the round loop keeps (`hist`, `hlen`)."""

    q = None  # a point mass: speculative sampling needs no draft distribution

    def __init__(self, k: int, ngram: int, eos_ids: torch.Tensor, lookup=prompt_lookup):
        self.k, self.ngram, self.eos_ids = k, ngram, eos_ids
        self.lookup = lookup  # `prompt_lookup`, or it compiled (the captured rounds: loop/rounds.py)

    def propose(self, state, params: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor, None]:
        drafts, count = self.lookup(state.hist, state.hlen, self.k, self.ngram, self.eos_ids)
        return drafts, count, None

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> None:
        """Nothing cached."""

    def settle(self, start: int, kept: torch.Tensor, keep: int) -> None:
        """Nothing cached."""

    def settle_rows(self, kept: torch.Tensor, width: int) -> None:
        """Nothing cached."""


class Assistant:
    """A draft model's drafts, from its own cache of the rows' tokens: `cache` (spec/cache.py's RowCache or
    StaticRows, or the fused path's rows) holds them as the model's cache holds its own."""

    def __init__(self, cache, k: int):
        self.cache = cache
        self.k = k

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> None:
        self.cache.prefill(input_ids, attention_mask, positions)

    def propose(self, state, params: SamplingParams, generator):
        """K drafts for every row from its last token at its position -> ((B, K) drafts, (B,) K each, (B, K, V) the
        draft distributions they were drawn from, or None when greedy). A sampled draft draws one (B, V)
        exponential noise per token from `generator`."""
        dlen = state.cap  # K, or the row's tokens left but one where fewer (spec/state.py round_start: at most K)
        seen = None if state.seen is None else state.seen.clone()
        token, drafts, qs = state.last, [], []
        # every forward's positions at once (a few small kernels a round, not a few per draft), (K + 1, B): each
        # forward's contiguous
        steps = torch.arange(self.k + 1, device=dlen.device)
        positions = feed_positions(state.pos, state.active, dlen, steps).T.contiguous()
        # greedy with no penalty on the fused draft: its step chooses the token itself (FusedRows.choose)
        choose = None if params.do_sample or seen is not None else getattr(self.cache, "choose", None)
        for j in range(self.k):
            if choose is not None:
                token = choose(token[:, None], positions[j][:, None], j)
            else:
                logits = self.cache.forward(token[:, None], positions[j][:, None], 1)  # (B, 1, V)
                if params.do_sample:
                    q = warped_probs(logits[:, 0], params, seen)
                    token = race(q, draw_noise(q.shape, q.device, generator))
                    qs.append(q)
                else:
                    token = greedy_choices(logits, params, None if seen is None else seen[:, None])[:, 0]
                if seen is not None:
                    mark_seen(seen, token)
            drafts.append(token)
        # the K-th draft fed without logits (the fused draft reads no LM head): the cache holds the round's K + 1
        # slots, as the model's
        self.cache.feed(token[:, None], positions[self.k][:, None])
        return torch.stack(drafts, dim=1), dlen, torch.stack(qs, dim=1) if qs else None

    def settle(self, start: int, kept: torch.Tensor, keep: int) -> None:
        self.cache.settle(start, kept, keep)

    def settle_rows(self, kept: torch.Tensor, width: int) -> None:
        self.cache.settle_rows(kept, width)
