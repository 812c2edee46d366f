"""The fused model in speculative decoding's captured rounds (loop/rounds.py): as the model that verifies, and as
the draft model.

Its cache needs no cut: a token's slot is its position plus the row's left padding, so a row writes each round's
tokens at its own slots, and the slots of the drafts it rejected are written again by its next round before any
query reads them (a query attends to its row's slots up to its own). Rows advance by different counts with no
hole and no host read. One token per row runs the fused decode step (the Triton kernels on CUDA, their torch
twins elsewhere); several, the verify step (forward.verify_step), runs the same step's operations over the B * T
tokens as rows, each token writing its K/V at its slot of its row's cache and reading that row's cache up to it: the
weights are read once for all the tokens, a row's cache once per token (the attention's many-query form,
kernels/decode_attention.py, reads it once for all of them: off by default, faster only where the cache reads
dominate, results/h100/llama-1b-verify-many-query). Within each layer the tokens' K/V are written (one norm_qkv
launch) before the attention launch reads them, so a token sees its row's earlier tokens of the same verify.
"""

from __future__ import annotations

import torch

from . import forward
from .cache import FusedCache
from .kernels.greedy import GreedyFinish
from .model import FusedModel


class FusedRows:
    """A FusedModel and a cache of `length` slots for `batch` rows, kept by the model (`tag` keeps a draft's apart
    when a model drafts for itself): the interface of spec/cache.py's caches (prefill, forward, feed, settle_rows)."""

    def __init__(self, fused: FusedModel, batch: int, length: int, tag: str = ""):
        limit = fused.max_positions  # the slots never pass the model's positions (spec/state.py feed_positions)
        self.fused = fused
        self.cache: FusedCache = fused.cache_for(batch, length if limit is None else min(length, limit), tag)
        self._choices = {}  # draft index -> the GreedyFinish that `choose` writes its tokens into (one per draft)

    def prefill(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The prompt (FusedModel.prefill: compiled per bucket on CUDA; it writes the rows' padding) -> (B, V)."""
        return self.fused.prefill(self.cache, input_ids, attention_mask, positions)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, keep: int) -> torch.Tensor:
        """(B, T) tokens at (B, T) positions, written at their slots -> (B, keep, V) float32 logits of the last
        `keep`: the decode step for one token, the verify step for more."""
        W, c = self.fused.weights, self.cache
        if tokens.shape[1] == 1:
            logits = forward.decode_step(W, c.k, c.v, c.pad, tokens[:, 0], positions[:, 0], self.fused.ops)[:, None]
        else:
            logits = forward.verify_step(W, c.k, c.v, c.pad, tokens, positions, self.fused.ops)
        return logits[:, logits.shape[1] - keep :]

    def choose(self, tokens: torch.Tensor, positions: torch.Tensor, j: int) -> torch.Tensor:
        """(B, 1) tokens at (B, 1) positions written at their slots -> (B,) the greedy token after each (the
        first index of its logits' maximum, as sampling.pick_next greedy with no repetition penalty): the decode
        step with the step's own greedy choice (ops.greedy, one launch on CUDA) in place of a chunked argmax's
        six torch kernels. The token is a view of draft `j`'s own state (B, 3), which no other draft writes, so
        the K tokens of a round stay apart without a copy; its position and finished columns are scratch (no
        EOS: no row finishes)."""
        B = tokens.shape[0]
        finish = self._choices.get(j)
        if finish is None or finish.state.shape[0] != B:
            state = torch.zeros((B, 3), dtype=torch.long, device=tokens.device)
            no_eos = torch.zeros(0, dtype=torch.long, device=tokens.device)
            finish = GreedyFinish(state, no_eos, 0, torch.zeros((), dtype=torch.bool, device=tokens.device))
            self._choices[j] = finish
        W, c = self.fused.weights, self.cache
        forward.decode_step(W, c.k, c.v, c.pad, tokens[:, 0], positions[:, 0], self.fused.ops, finish)
        return finish.state[:, 0]

    def feed(self, tokens: torch.Tensor, positions: torch.Tensor) -> None:
        """(B, 1) tokens at (B, 1) positions written at their slots, no logits: the decode step without its LM head
        (a draft's last token of a round, whose logits nothing reads)."""
        W, c = self.fused.weights, self.cache
        forward.decode_step(W, c.k, c.v, c.pad, tokens[:, 0], positions[:, 0], self.fused.ops, head=False)

    def settle_rows(self, kept: torch.Tensor, width: int) -> None:
        """Nothing to cut: a rejected slot is written again before it is read."""
