"""The KV-cache kinds of the presets, and the only module that knows Hugging Face cache classes.

Each cache kind turns "decode step j" into the keyword arguments of one model forward. Step 0 is the
prefill (the whole prompt); step j >= 1 feeds token j-1 and yields the logits of token j.

Hugging Face 5.17 quirks handled here:
- there is no `cache_position` argument any more: the query offset is `cache.get_seq_length()`, and
  `StaticCache` writes at its own device counter (`layer.cumulative_length`), so a late-stop extra step
  advances it and a cache reused across calls must be `reset()`;
- `StaticCache` sizes the attention mask to `max_cache_len`, and pads a shorter 2D mask with zeros, so the
  2D mask of a decode step covers the whole cache: the prompt's mask, then ones (causality hides the future);
  with recurrent layers the prefill's is the prompt's alone (they read its last P columns as its padding);
- `StaticCache` allocates lazily, on the first update (the prefill), on the prefill's stream;
- the forward's cache keyword: `past_key_values` up to 5.23, `cache` from 5.24 (which still takes
  `past_key_values` with a FutureWarning at every call); `cache_keyword` reads which one from the forward's
  signature (5.17 has no `cache` parameter: its `**kwargs` would swallow one and run without a cache).
"""

from __future__ import annotations

import functools
import inspect
from collections import OrderedDict

import torch
from transformers import DynamicCache, StaticCache

from ..inputs import position_ids_for_prompt
from . import rope
from .architecture import describe
from .sliding_cache import static_cache_for_compile


def positions_for(model, attention_mask: torch.Tensor) -> torch.Tensor:
    """The positions a call feeds `model`: Hugging Face generate's where the forward takes `position_ids`; where it
    does not, generate passes none and the model counts every slot, left padding included (Whisper's decoder
    reads ours through its **kwargs), so the same count is passed."""
    if describe(model).takes_position_ids:
        return position_ids_for_prompt(attention_mask)
    return torch.arange(attention_mask.shape[1], device=attention_mask.device).expand(attention_mask.shape)


@functools.cache
def _cache_keyword_of(cls) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_keyword(model) -> str:
    """The keyword under which `model`'s forward takes its KV cache (see the module docstring)."""
    return _cache_keyword_of(type(model))


class NoCache:
    """`baseline`: every step re-runs the whole sequence, read from the output buffer (O(N^2) work)."""

    def used_on(self, streams: list) -> None:
        """Nothing made by the prefill is freed during the loop."""

    def __init__(self, model, out: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int):
        self.out = out  # (B, P + N): prompt, then each step's token, written by the loop
        total = out.shape[1]
        # Generated tokens are always attended (as Hugging Face extends the mask with ones).
        full_mask = torch.ones_like(out)
        full_mask[:, :prompt_len] = attention_mask
        self.mask = full_mask
        self.position_ids = positions_for(model, full_mask)  # (B, P + N)
        self.prompt_len = prompt_len
        assert self.position_ids.shape[1] == total

    def model_kwargs(self, step: int) -> dict:
        end = self.prompt_len + step  # step j sees the prompt and tokens 0 .. j-1
        return dict(
            input_ids=self.out[:, :end],
            attention_mask=self.mask[:, :end],
            position_ids=self.position_ids[:, :end],
            use_cache=False,
            logits_to_keep=1,
        )


class _WithCache:
    """Shared by the dynamic and static kinds: prefill the prompt, then one token per step."""

    def __init__(self, model, cache, input_ids: torch.Tensor, full_mask: torch.Tensor, prompt_len: int):
        self.cache = cache
        self.model = model
        self.attention_free = describe(model).attention_free
        self.keyword = cache_keyword(model)
        self.input_ids = input_ids  # (B, P)
        self.full_mask = full_mask  # (B, P + N) or (B, max_cache_len)
        self.prompt_len = prompt_len

    def mask_for_step(self, step: int) -> torch.Tensor:
        raise NotImplementedError

    def used_on(self, streams: list) -> None:
        """The prefill's cache tensors (made on the caller's stream) are read, and freed, by later steps on
        `streams`: tell the allocator, so that their blocks are not reused before those steps ran."""

    def model_kwargs(self, step: int) -> dict:
        """Step 0: the prompt. Later steps: everything but the token and its position, which the decode step
        takes from its state (so that a compiled step reads them inside its graph)."""
        if step == 0:
            return dict(
                input_ids=self.input_ids,
                attention_mask=self.mask_for_step(0),
                position_ids=positions_for(self.model, self.full_mask[:, : self.prompt_len]),
                use_cache=True,
                logits_to_keep=1,
                **{self.keyword: self.cache},
            )
        # a model without attention (every layer a state-space / recurrent one, no keys cached) reads a mask only
        # as the padding of the tokens it is fed: a one-token step's token is never padding, and a mask of the
        # whole sequence would be broadcast over it (Mamba); Hugging Face generate passes none there either
        mask = None if self.attention_free else self.mask_for_step(step)
        return dict(attention_mask=mask, use_cache=True, logits_to_keep=1, **{self.keyword: self.cache})


class DynamicKV(_WithCache):
    """`kv`: Hugging Face `DynamicCache`, grown by concatenation every step; the mask grows with it."""

    def __init__(self, model, input_ids, attention_mask, max_new_tokens: int):
        B, P = input_ids.shape
        full = torch.ones((B, P + max_new_tokens), dtype=attention_mask.dtype, device=input_ids.device)
        full[:, :P] = attention_mask
        super().__init__(model, DynamicCache(config=model.config), input_ids, full, P)

    def mask_for_step(self, step: int) -> torch.Tensor:
        return self.full_mask[:, : self.prompt_len + step]

    def used_on(self, streams: list) -> None:
        # Each step concatenates a new key/value block and drops the old one, on its own side stream;
        # the prefill's blocks come from the caller's stream's pool, which does not wait for the side
        # streams until the loop ends (a streamer may allocate on it meanwhile).
        for layer in self.cache.layers:
            for t in (layer.keys, layer.values):
                if isinstance(t, torch.Tensor):
                    for s in streams:
                        t.record_stream(s)  # stream hand-off: freed blocks wait for this stream's work


class StaticKV(_WithCache):
    """`static`: Hugging Face `StaticCache` pre-allocated for prompt + max_new_tokens; one fixed-shape mask."""

    def __init__(
        self, model, input_ids, attention_mask, max_cache_len: int, store: StaticCaches, compiled: bool = False
    ):
        B, P = input_ids.shape
        cache, full = store.get(model, B, max_cache_len, compiled)
        full.fill_(1)
        full[:, :P] = attention_mask
        super().__init__(model, cache, input_ids, full, P)
        # a state-space or linear-attention layer zeroes the prompt's padding by the mask's last P columns (all
        # ones in the whole-cache mask): its prefill gets the prompt's columns only, which the attention layers
        # pad with zeros (hidden by causality anyway; a model that sizes ALiBi by the mask needs the whole one)
        self.prefill_mask = full[:, :P] if describe(model).recurrent_layers else full
        if compiled and describe(model).rope:
            rope.prepare(describe(model).rope_modules)  # dynamic NTK / LongRoPE tables chosen inside the graph

    def mask_for_step(self, step: int) -> torch.Tensor:
        if step == 0:
            return self.prefill_mask
        return self.full_mask  # fixed shape and address: what a CUDA graph needs


class StaticCaches:
    """The static caches (and their masks) kept by one decoder, a few shapes, most recently used last.

    Kept so that a second call of the same shape neither reallocates nor recompiles: a compiled graph sees
    the same tensors call after call (the cache's are marked static addresses by Hugging Face, the mask's
    here, so neither is copied into the graph at each replay). Evicting a shape frees its tensors; a graph
    recorded on them is then re-recorded for new ones (tested under CUDA graphs in tests/gpu).
    """

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._entries: OrderedDict = OrderedDict()

    def get(
        self, model, batch_size: int, max_cache_len: int, compiled: bool = False
    ) -> tuple[StaticCache, torch.Tensor]:
        """A reset `StaticCache` and its (B, max_cache_len) mask buffer for this shape. `compiled`: for a compiled
        step, local (sliding-window, chunked) layers are rings of `window` slots, or whole-length layers, written at
        a device counter (sliding_cache.py)."""
        param = next(model.parameters())
        local = describe(model).local_layers if compiled else ()
        # a cache made under inference_mode holds inference tensors, which cannot be reset outside it
        key = (batch_size, max_cache_len, param.dtype, param.device, torch.is_inference_mode_enabled(), bool(local))
        entry = self._entries.pop(key, None)
        if entry is None:
            if local:
                cache = static_cache_for_compile(model.config, max_cache_len, local)
            else:
                cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
            mask = torch.ones((batch_size, max_cache_len), dtype=torch.long, device=param.device)
            torch._dynamo.mark_static_address(mask)
            entry = (cache, mask)
        else:
            entry[0].reset()  # writes restart at 0: the counter lives on the device, not in our step index
        self._entries[key] = entry
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)
        return entry

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def fresh_cache(model, kind: str, max_cache_len: int):
    """A new Hugging Face cache of `kind` (dynamic | static, `max_cache_len` slots) that no store keeps: the
    speculative round loop's (spec/cache.py), which cuts it back to each round's accepted slots."""
    if kind == "dynamic":
        return DynamicCache(config=model.config)
    return StaticCache(config=model.config, max_cache_len=max_cache_len)


def static_length(cache: StaticCache) -> torch.Tensor:
    """The slots a StaticCache has written, its 0-d device counter (every layer's is the same), without a host read."""
    return cache.layers[0].cumulative_length


# A static layer's device counters of the slots it wrote: the keys' and values', and a sparse-attention layer's
# indexer keys' (StaticIndexedLayer), which it counts apart.
COUNTERS = ("cumulative_length", "indexer_cumulative_length")


def cut_back(cache, drop: int) -> None:
    """Forget the last `drop` slots a cache wrote: a DynamicCache's tensors cropped; a StaticCache's device counters
    lowered in place, as set_static_length sets them (the next update overwrites the slots; transformers 5.17's
    StaticLayer has no crop)."""
    if not isinstance(cache, StaticCache):
        cache.crop(-drop)
        return
    for layer in cache.layers:
        for counter in COUNTERS:
            if isinstance(getattr(layer, counter, None), torch.Tensor):
                getattr(layer, counter).sub_(drop)


def set_static_length(cache: StaticCache, length: torch.Tensor) -> None:
    """Cut a StaticCache back to `length` slots (a 0-d device tensor) without a host read: each layer's counter set in
    place, at the address a compiled step reads it from; the next update writes from there."""
    for layer in cache.layers:
        for counter in COUNTERS:
            if isinstance(getattr(layer, counter, None), torch.Tensor):
                getattr(layer, counter).copy_(length)


def make_cache(model, plan, out: torch.Tensor, store: StaticCaches):
    """The cache object of one call (plan.Plan) on the Hugging Face model; static caches come from the decoder's
    `store`. The no-cache kind reads the call's output buffer `out` (B, P + N)."""
    req = plan.request
    if plan.cache == "none":
        return NoCache(model, out, req.attention_mask, req.input_ids.shape[1])
    if plan.cache == "dynamic":
        return DynamicKV(model, req.input_ids, req.attention_mask, req.max_new_tokens)
    return StaticKV(model, req.input_ids, req.attention_mask, plan.cache_len, store, plan.step == "compiled")
