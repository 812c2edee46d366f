"""A static cache for compiled steps of models with sliding-window or chunked attention layers.

Hugging Face's `StaticSlidingWindowLayer` keeps a Python int of the tokens it has seen (`cumulative_length_int`):
its mask sizes and its writes depend on it, so a compiled step guards on it and recompiles at every step (and
gives up after the recompile limit). Here a sliding-window layer is a ring buffer (`RingLayer`) of `window`
slots instead, where it fits (`ring_refusal`):

- a one-token write goes to slot (position mod window), the index computed on the device from the layer's device
  counter (`cumulative_length`), and the slot's position is recorded in a device tensor (`slot_positions`, -1 for
  an empty slot): no Python int changes from step to step, so the compiled step is one graph per shape;
- the decode step's mask for the ring layers is built on the device from those slot positions (`decode_masks`,
  called by steps.decode_step): a slot is attended where it holds one of the last `window` positions (counted as
  Hugging Face counts them, left padding included) and is not padding, which are exactly the keys Hugging Face's
  dynamic sliding layer keeps; the other layer kinds get the model's own mask functions, and the model takes the
  masks prebuilt (a dict keyed by layer kind where the config has `layer_types`, as Hugging Face's generate passes
  them to a compiled forward; else the one 4D mask, every layer being a sliding one);
- the prefill (several tokens, the call's first write) is attended over its own keys with the model's normal
  sliding-window mask (`get_mask_sizes` answers the query's length and offset 0), then its last `window` tokens
  are kept in the ring.

Memory: a ring layer holds `window` slots, not the whole call (Gemma 3 at 32K tokens: its 5 of 6 local layers hold
512 or 1024 slots each). Where a ring does not fit, each local layer is a whole-length `StaticLayer` written at
the device counter, slot i holding position i, and the model's own mask function for the layer builds the window
on the device from that counter (exact, one graph per shape, but the layer holds the whole call): chunked-attention
layers (Llama 4: a chunk is no window), hybrid layers (their state stays Hugging Face's), layer kinds other than
full and sliding attention, attention implementations other than sdpa and eager (their masks are other objects),
configs that share key/value layers, and calls no longer than the window. The eager static preset keeps Hugging
Face's window-sized layers.
"""

from __future__ import annotations

import torch
from transformers import StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer
from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING
from transformers.utils import is_torchdynamo_compiling

RING_KINDS = ("full_attention", "sliding_attention")
RING_ATTENTION = ("sdpa", "eager")


class RingLayer(StaticLayer):
    """A sliding-window layer's keys and values in `capacity` slots, slot (position mod capacity) holding the
    position in `slot_positions` (-1: empty); see the module docstring."""

    is_sliding = True
    is_croppable = False  # an overwritten slot cannot be given back

    def __init__(self, capacity: int):
        super().__init__(max_cache_len=capacity)
        self.capacity = capacity
        self.slot_positions = torch.full((capacity,), -1, dtype=torch.long)
        self._prefilled = False

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.slot_positions = self.slot_positions.to(key_states.device)
        if not is_torchdynamo_compiling():
            torch._dynamo.mark_static_address(self.slot_positions)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if n == 1:  # a decode step: written first, then the whole ring is attended (decode_masks)
            slot = self.cumulative_length.remainder(self.capacity).view(1)
            self.keys.index_copy_(2, slot, key_states)
            self.values.index_copy_(2, slot, value_states)
            self.slot_positions.index_copy_(0, slot, self.cumulative_length.view(1))
            self.cumulative_length.add_(1)
            return self.keys, self.values
        if self._prefilled:
            raise RuntimeError("internal: a ring layer takes several tokens only as its first write after reset()")
        self._prefilled = True
        kept = min(n, self.capacity)
        positions = torch.arange(n - kept, n, device=self.keys.device) + self.cumulative_length
        slots = positions.remainder(self.capacity)
        self.keys.index_copy_(2, slots, key_states[:, :, n - kept :])
        self.values.index_copy_(2, slots, value_states[:, :, n - kept :])
        self.slot_positions.index_copy_(0, slots, positions)
        self.cumulative_length.add_(n)
        return key_states, value_states  # the prefill attends over its own keys

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The prefill: its own keys, from position 0. A decode step: the ring (whose mask decode_masks builds)."""
        return (query_length, 0) if query_length > 1 else (self.capacity, 0)

    def crop(self, tokens_to_remove: int) -> None:
        raise RuntimeError("a ring layer cannot be cropped: its overwritten slots are gone")

    def reset(self) -> None:
        super().reset()
        self.slot_positions.fill_(-1)
        self._prefilled = False


class RingCache(StaticCache):
    """A StaticCache whose sliding-window layers are RingLayers (the others Hugging Face's static layers)."""

    def __init__(self, config, max_cache_len: int, ring_layers, window: int):
        super().__init__(config=config, max_cache_len=max_cache_len)
        self.text_config = config.get_text_config(decoder=True)
        self.ring_layers = tuple(ring_layers)
        self.window = window
        for i in self.ring_layers:
            self.layers[i] = RingLayer(window)

    def ring_mask(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The (B, 1, 1, window) mask of a one-token step's ring layers: bool for sdpa, additive for eager."""
        layer = self.layers[self.ring_layers[0]]  # every ring layer sees the same writes
        dtype = layer.keys.dtype  # the attention's
        written = layer.cumulative_length  # this step's position
        slots = torch.arange(layer.capacity, device=written.device)
        positions = torch.where(slots == written.remainder(layer.capacity), written, layer.slot_positions)
        in_window = (positions >= 0) & (positions > written - self.window)
        real = attention_mask.gather(1, positions.clamp(min=0).expand(attention_mask.shape[0], -1)).bool()
        keep = (in_window & real)[:, None, None, :]
        if self.text_config._attn_implementation == "eager":
            zero = torch.zeros((), dtype=dtype, device=keep.device)
            return torch.where(keep, zero, torch.finfo(dtype).min)
        return keep

    def decode_masks(self, attention_mask: torch.Tensor, position_ids: torch.Tensor):
        """The masks a one-token step's forward takes prebuilt (see the module docstring)."""
        ring = self.ring_mask(attention_mask)
        kinds = getattr(self.text_config, "layer_types", None)
        if kinds is None:  # every layer a sliding one
            return ring
        dtype = self.layers[self.ring_layers[0]].keys.dtype
        embeds = torch.empty((attention_mask.shape[0], 1, 0), dtype=dtype, device=attention_mask.device)
        masks = {}
        for kind in dict.fromkeys(kinds):
            if kind == "sliding_attention":
                masks[kind] = ring
            else:
                build = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[kind]
                masks[kind] = build(self.text_config, embeds, attention_mask, self, position_ids)
        return masks


def ring_refusal(config, max_cache_len: int) -> str | None:
    """Why the local layers cannot be ring buffers (see the module docstring), or None."""
    cfg = config.get_text_config(decoder=True)
    if cfg._attn_implementation not in RING_ATTENTION:
        return f"attention implementation {cfg._attn_implementation!r}"
    kinds = getattr(cfg, "layer_types", None)
    if kinds is not None and not set(kinds) <= set(RING_KINDS):
        return f"layer kinds {sorted(set(kinds) - set(RING_KINDS))}"
    if getattr(cfg, "num_kv_shared_layers", None) or getattr(cfg, "kv_sharing_modes", None):
        return "shared key/value layers"
    window = getattr(cfg, "sliding_window", None)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return "no config.sliding_window"
    if max_cache_len <= window:
        return "a call no longer than the window"
    return None


def static_cache_for_compile(config, max_cache_len: int, local_layers) -> StaticCache:
    """A StaticCache whose `local_layers` (indices) are ring buffers where they fit, else whole-length StaticLayers
    written at a device counter (see the module docstring)."""
    probe = StaticCache(config=config, max_cache_len=max_cache_len)
    sliding = [i for i in local_layers if type(probe.layers[i]) is StaticSlidingWindowLayer]  # not hybrid layers
    every = [i for i, layer in enumerate(probe.layers) if type(layer) is StaticSlidingWindowLayer]
    if sliding and sliding == every and ring_refusal(config, max_cache_len) is None:
        window = config.get_text_config(decoder=True).sliding_window
        return RingCache(config, max_cache_len, sliding, window)
    for i in sliding:
        probe.layers[i] = StaticLayer(max_cache_len=max_cache_len)
    return probe


def decode_masks(model_kwargs: dict) -> dict:
    """A one-token step's keyword arguments with its masks prebuilt where its cache has ring layers (unchanged
    otherwise)."""
    cache = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
    if not isinstance(cache, RingCache):
        return model_kwargs
    masks = cache.decode_masks(model_kwargs["attention_mask"], model_kwargs["position_ids"])
    return dict(model_kwargs, attention_mask=masks)
