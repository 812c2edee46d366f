"""A model's Hugging Face cache in a speculative call, whose rows keep different numbers of slots.

A round writes K + 1 slots for every row (the row's last token and its K drafts) and each row keeps the first
n + 1 of them, n its accepted drafts. The rows share the cache's slots, so a row that keeps fewer has holes: its
attention mask is 0 there, as on left padding, and the positions are given per row (they count a row's own tokens,
never the slots). After each round the cache is cut back (`Cache.crop`) to the most slots any row kept, so at
batch 1 there are no holes at all. Static caches are sized by `spec_cache_len`, for the most slots a call can use.
"""

from __future__ import annotations

import torch

from ..hf.caches import cache_keyword, fresh_cache


def spec_cache_len(prompt_len: int, max_new_tokens: int, k: int, batch: int) -> int:
    """Slots a speculative call may use: the prompt, then per row at most max_new_tokens - 1 kept slots in all, no
    more than K + 1 a round (so at most min(batch, K + 1) * (max_new_tokens - 1) for the rows together), and the
    K + 1 a round writes before its cut."""
    return prompt_len + min(batch, k + 1) * (max_new_tokens - 1) + k + 1


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
        out = self.model(
            input_ids=tokens,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            logits_to_keep=keep,
            **{self.keyword: self.cache},
        )
        self.used = end
        return out.logits

    def settle(self, start: int, kept: torch.Tensor, keep: int) -> None:
        """After a round that wrote slots start.. of the cache: `kept` (B, T) bool, the slots each row keeps (the
        others become holes); `keep` (host int) the most any row keeps: the cache is cut back to start + keep."""
        T = kept.shape[1]
        self.mask[:, start : start + T] = kept.long()
        drop = self.used - (start + keep)
        if drop > 0:
            self.cache.crop(-drop)
            self.used -= drop
        self.mask[:, self.used :] = 1  # the next round's slots: attended until that round's cut says otherwise
