"""A static cache for compiled steps of models with sliding-window or chunked attention layers.

Hugging Face's `StaticSlidingWindowLayer` keeps a Python int of the tokens it has seen (`cumulative_length_int`):
its mask sizes and its writes depend on it, so a compiled step guards on it and recompiles at every step (and
gives up after the recompile limit). Here each local layer is a whole-length `StaticLayer` instead, as the
global layers are: it writes at its device counter (`cumulative_length`), slot i holding position i, and the
model's own mask function for the layer (create_sliding_window_causal_mask / create_chunked_causal_mask, chosen
by config.layer_types) builds the window on the device from that counter: one compiled graph per shape.

Tokens: the window mask keeps exactly the keys Hugging Face's dynamic sliding layer keeps (the last `window`
positions, counted as Hugging Face counts them, left padding included); the other slots are masked out.
Memory: a local layer holds the whole call (as a global layer does) instead of its window; the eager static
preset keeps Hugging Face's window-sized layers.
"""

from __future__ import annotations

from transformers import StaticCache
from transformers.cache_utils import StaticLayer, StaticSlidingWindowLayer


def static_cache_for_compile(config, max_cache_len: int, local_layers) -> StaticCache:
    """A StaticCache whose `local_layers` (indices) are whole-length StaticLayers written at a device counter."""
    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    for i in local_layers:
        if type(cache.layers[i]) is StaticSlidingWindowLayer:  # not a hybrid layer's (its state stays)
            cache.layers[i] = StaticLayer(max_cache_len=max_cache_len)
    return cache
