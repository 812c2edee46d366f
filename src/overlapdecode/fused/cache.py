"""The fused path's KV cache: per-layer (B, Hkv, S, D) tensors in the kernels' layout, and the per-call
adapter that gives the decode loop its model keyword arguments.

The slot of position p in row b is p + pad[b] (pad[b]: the row's left padding, written by the prefill into
a tensor of fixed address), so a decode step derives its slot on the device and the CUDA graph of a shape
is replayed unchanged at every step.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch


@dataclass
class FusedCache:
    """The cache of one (batch, length, dtype): kept by the FusedModel and reused call after call, with the
    captured decode steps that read it (`graphs`: steps.GraphStep, one per stop/sampling setting; they go when
    the cache goes) and the prompt lengths its prefill has met (`prefilled`: a compiled prefill
    compiles for a new one)."""

    k: list[torch.Tensor]  # per layer (B, Hkv, S, D)
    v: list[torch.Tensor]
    pad: torch.Tensor  # (B,) long: left padding of each row of the current call
    graphs: OrderedDict = field(default_factory=OrderedDict)
    prefilled: set = field(default_factory=set)  # (padded prompt length, inference mode, grad mode)
    drafts_watched: set = field(default_factory=set)  # ids of draft fused models whose rounds `graphs` keeps

    @classmethod
    def empty(cls, n_layers: int, batch: int, n_kv: int, length: int, head_dim: int, dtype, device):
        def zeros():
            # zeros, not empty: the reference attention multiplies masked slots by 0, and 0 * NaN is NaN
            t = torch.zeros((batch, n_kv, length, head_dim), dtype=dtype, device=device)
            torch._dynamo.mark_static_address(t)  # CUDA graphs read it in place, never copy it
            return t

        pad = torch.zeros((batch,), dtype=torch.long, device=device)
        torch._dynamo.mark_static_address(pad)
        return cls([zeros() for _ in range(n_layers)], [zeros() for _ in range(n_layers)], pad)

    @property
    def length(self) -> int:
        return self.k[0].shape[2]


class FusedKV:
    """`fused`: the decode loop's cache object. Step 0 passes the prompt (with its mask, from which the
    prefill derives the padding); later steps pass only the cache: the token and its position come from
    the loop's device state."""

    def __init__(self, fused_model, input_ids, attention_mask, cache_len: int, position_ids, max_new_tokens=None):
        B, P = input_ids.shape
        switch = fused_model.weights.rope_switch
        if switch is not None and max_new_tokens is not None and P <= switch and P + max_new_tokens >= switch + 2:
            # Hugging Face's Phi-3 drops its cache at the forward whose input reaches switch + 1 tokens and runs the
            # whole sequence again with the long table (prepare_inputs_for_generation); the step keeps its cache
            raise ValueError(
                f"max_new_tokens: this model's LongRoPE switches from its short to its long table past {switch} "
                f"positions, where Hugging Face recomputes the whole cache with the long one, which the fused path "
                f"does not; this call ({P} prompt + {max_new_tokens} new tokens) would cross it: keep prompt + "
                f"max_new_tokens within {switch + 1}, start with a prompt longer than {switch}, or use another strategy"
            )
        self.model = fused_model  # what the loop calls instead of the Hugging Face model
        # the call's length rounded up (nearby calls share a cache and its graphs), but never past the model's
        # positions: the request was checked to fit them
        limit = getattr(fused_model, "max_positions", None)
        self.cache = fused_model.cache_for(B, cache_len if limit is None else min(cache_len, limit))
        self.input_ids = input_ids
        self.attention_mask = attention_mask
        self.position_ids = position_ids

    def used_on(self, streams: list) -> None:
        """The cache is kept by the FusedModel: nothing the prefill made is freed during the loop."""

    def model_kwargs(self, step: int) -> dict:
        if step == 0:
            return dict(
                decode_kwargs(self.cache),
                input_ids=self.input_ids,
                attention_mask=self.attention_mask,
                position_ids=self.position_ids,
            )
        return decode_kwargs(self.cache)


def decode_kwargs(cache: FusedCache) -> dict:
    """A decode step's keyword arguments (the loop adds the token and its position from its device state)."""
    return dict(past_key_values=cache, use_cache=True, logits_to_keep=1)
