"""A model's Hugging Face cache in a speculative call, whose rows keep different numbers of slots: `RowCache` (the
reference loop's, cut back from the host) and `StaticRows` (the captured rounds', cut back on the device).

A round writes K + 1 slots for every row (the row's last token and its K drafts) and each row keeps the first
n + 1 of them, n its accepted drafts. The rows share the cache's slots, so a row that keeps fewer has holes: its
attention mask is 0 there, as on left padding, and the positions are given per row (they count a row's own tokens,
never the slots). After each round the cache is cut back (`Cache.crop`) to the most slots any row kept, so at
batch 1 there are no holes at all. Static caches are sized by `spec_cache_len`, for the most slots a call can use.
StaticRows cuts its cache on the device: a round after every row has stopped keeps no slot, so it writes the same
K + 1 slots again, and rounds run late by the stop check never write past that size.
"""

from __future__ import annotations

import torch

from ..hf.caches import cache_keyword, cut_back, fresh_cache, set_static_length, static_length


def spec_cache_len(prompt_len: int, max_new_tokens: int, k: int, batch: int, round_to: int = 1) -> int:
    """Slots a speculative call may use: the prompt, then per row at most max_new_tokens - 1 kept slots in all, no
    more than K + 1 a round (so at most min(batch, K + 1) * (max_new_tokens - 1) for the rows together), and the
    K + 1 a round writes before its cut; rounded up to a multiple of `round_to` (nearby calls share a shape)."""
    need = prompt_len + min(batch, k + 1) * (max_new_tokens - 1) + k + 1
    return -(-need // round_to) * round_to


def call_model(model, tokens, positions, mask, cache, keyword: str, keep: int) -> torch.Tensor:
    """(B, T) tokens at (B, T) positions through `model` against its `cache` (under `keyword`) with the (B, S)
    attention mask -> the (B, keep, V) logits of the last `keep` (what loop/rounds.py compiles)."""
    out = model(
        input_ids=tokens,
        position_ids=positions,
        attention_mask=mask,
        use_cache=True,
        logits_to_keep=keep,
        **{keyword: cache},
    )
    return out.logits


class RowCache:
    """One model's cache (dynamic or static) and its (B, length) mask of the slots each row attends: the prompt's
    mask, then 1, but 0 on the holes of rejected slots."""

    def __init__(self, model, kind: str, attention_mask: torch.Tensor, length: int):
        B, P = attention_mask.shape
        self.model = model
        self.cache = fresh_cache(model, kind, length)
        self.static = kind == "static"
        self.keyword = cache_keyword(model)
        self.mask = torch.ones((B, length), dtype=torch.long, device=attention_mask.device)
        self.mask[:, :P] = attention_mask
        self.used = 0  # slots written (the cache's length; a static cache's counter holds it on the device)
        self.length = length

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """(B, T) tokens at (B, T) positions, written into the next T slots -> (B, keep, V) logits of the last
        `keep` of them."""
        end = self.used + tokens.shape[1]
        if end > self.length:
            raise RuntimeError(f"internal: a speculative round writes slot {end} of a cache of {self.length}")
        mask = self.mask if self.static else self.mask[:, :end]  # a static cache's mask covers all its slots
        logits = call_model(self.model, tokens, positions, mask, self.cache, self.keyword, keep)
        self.used = end
        return logits

    def feed(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """The tokens written, their logits unread (a Hugging Face model computes its head on the last one)."""
        self.forward(tokens, positions, 1)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The prompt (its mask is already this cache's) -> (B, V) logits of its last token."""
        return self.forward(input_ids, positions, 1)[:, -1]

    def settle(self, start: int, kept: torch.Tensor, keep: int) -> None:
        """After a round that wrote slots start.. of the cache: `kept` (B, T) bool, the slots each row keeps (the
        others become holes); `keep` (host int) the most any row keeps: the cache is cut back to start + keep."""
        T = kept.shape[1]
        self.mask[:, start : start + T] = kept.long()
        drop = self.used - (start + keep)
        if drop > 0:
            cut_back(self.cache, drop)
            self.used -= drop
        self.mask[:, self.used :] = 1  # the next round's slots: attended until that round's cut says otherwise


class StaticRows:
    """A model's StaticCache in the captured rounds (loop/rounds.py): RowCache's slots, mask and holes, but cut back on
    the device: after a round, the cache's counter is set to the round's first slot plus the most slots any row kept
    (a 0-d tensor, never read by the host). `forward`: call_model, or its compiled form (the rounds pass it)."""

    def __init__(self, model, attention_mask: torch.Tensor, length: int, forward=call_model):
        B, P = attention_mask.shape
        self.model, self.length, self.call = model, length, forward
        self.cache = fresh_cache(model, "static", length)
        self.keyword = cache_keyword(model)
        self.mask = torch.ones((B, length), dtype=torch.long, device=attention_mask.device)
        self.mask[:, :P] = attention_mask
        torch._dynamo.mark_static_address(self.mask)  # a compiled forward reads it in place
        self.slots = torch.arange(length, device=attention_mask.device)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The prompt, uncompiled (as the compiled presets' prefill) -> (B, V) logits of its last token."""
        return call_model(self.model, input_ids, positions, self.mask, self.cache, self.keyword, 1)[:, -1]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """(B, T) tokens at (B, T) positions into the next T slots -> (B, keep, V) logits of the last `keep`."""
        return self.call(self.model, tokens, positions, self.mask, self.cache, self.keyword, keep)

    def feed(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """The tokens written, their logits unread (the forward of `keep` 1: the graph the drafts already compiled)."""
        self.forward(tokens, positions, 1)

    def settle_rows(self, kept: torch.Tensor, width: int) -> None:
        """After a round that wrote the last `width` slots: each row keeps its first kept[i] of them (the others
        become holes), and the cache is cut back to the most any row kept, all on the device."""
        B = kept.shape[0]
        start = static_length(self.cache) - width
        ahead = torch.arange(width, device=kept.device)
        cols = (start + ahead)[None, :].expand(B, width)
        self.mask.scatter_(1, cols, (ahead[None, :] < kept[:, None]).long())
        end = start + kept.max()
        set_static_length(self.cache, end)
        self.mask.masked_fill_(self.slots >= end, 1)  # the next round's slots: attended until its cut says otherwise
