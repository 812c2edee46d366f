"""What a model's layers and config are, as the decode strategies need to know: `describe(model)`, read from its
modules and config once and kept with the model.

A preset either gives Hugging Face generate()'s tokens or is refused before any device work, with one
ValueError naming what the model has or lacks (refusals.py reads what is found here). What this module looks
for, from the modules first (they are what runs) and the config second (what Hugging Face's caches are built
from), never from a list of names:

- local layers (a sliding window, local attention, attention chunks): an attention module's `sliding_window` /
  `is_sliding` / `attention_type` / `layer_type`, or the config's `layer_types`-like lists and window fields.
  Hugging Face's static cache gives a layer a window only where `config.layer_types` (or a model-wide
  `sliding_window` / `attention_chunk_size`) says so; a local layer it does not mark is kept as a global one
  (refused: the model's own local mask then disagrees with the cache). Compiled, the marked ones get
  sliding_cache.py's rings (or its whole-length layers where a ring does not fit);
- state-space, linear-attention, convolution and recurrent layers (a mixer's `layer_type`, `A_log` / `dt_bias` /
  `time_decay` parameters, a causal depthwise convolution, the config's layer kinds): their state lives in the
  cache only where `config.layer_types` gives the layer a state-holding kind;
- the forward's cache keyword: a model that takes its cache as `cache_params` or `state` (Mamba, RWKV) or
  has none never sees `past_key_values`, and a model that defines a cache class of its own refuses ours;
- how the attention mask is made: transformers' masking utilities size it to a static cache, a model's own
  mask code does not;
- causality: attention modules marked `is_causal`, the causal mask utilities, a lower-triangular mask buffer,
  or no attention at all (a recurrence); a model with none of these, or one that sets bidirectional attention,
  is refused whatever the strategy (its prompt would see later tokens);
- rotary embeddings whose tables change with the length (dynamic NTK, LongRoPE): under compile they run on
  rope.py's in-graph choice of table, where it gives Hugging Face's (refused where it cannot).

(The generation_config settings that change greedy tokens are plan.py's: a UserWarning, not a refusal.)
"""

from __future__ import annotations

import inspect
import re
import sys
import weakref
from dataclasses import dataclass, field

import torch

# Layer kinds, as `config.layer_types` (and its older spellings) name them.
LOCAL_WORDS = ("sliding", "local", "chunk", "swa", "compressed")
RECURRENT_KINDS = {
    "linear_attention",
    "mamba",
    "mamba2",
    "conv",
    "hybrid",
    "hybrid_sliding",
    "recurrent",
    "rwkv",
    "mlstm",
    "slstm",
    "ssm",
    "linear",
}
# the kinds Hugging Face's caches keep a layer's state for (hybrid: state and attention)
STATE_KINDS = {"linear_attention", "conv", "hybrid", "hybrid_sliding"}
# the kinds of those whose cache layer holds a state and no keys and values
STATE_ONLY_KINDS = {"linear_attention", "conv"}
# kinds whose cache layer Hugging Face's StaticCache knows
STATIC_KINDS = {
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "linear_attention",
    "conv",
    "hybrid",
    "hybrid_sliding",
    "deepseek_sparse_attention",
    "qwen_sparse_attention",
    "moe",
    "mlp",
}
KIND_LISTS = ("layer_types", "layers_block_type", "attention_layers", "block_types", "layer_block_types")
WINDOW_FIELDS = ("sliding_window", "window_size", "attention_chunk_size", "sliding_window_size", "local_window_size")
# rotary types whose tables Hugging Face recomputes from the positions of each forward
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


@dataclass(frozen=True)
class Architecture:
    """What decoding `model` needs, found once per model (describe)."""

    name: str  # the model's class, for messages
    num_layers: int
    local_layers: tuple[int, ...] = ()  # layers that attend to a window or chunk only
    local_from: str = ""  # where they were found (a module attribute or a config field)
    window: int | None = None  # the local layers' window (None: unknown)
    cache_local_layers: tuple[int, ...] = ()  # the layers Hugging Face's caches give a window
    recurrent_layers: tuple[int, ...] = ()  # state-space / linear-attention / convolution / recurrent layers
    recurrent_from: str = ""
    cache_state_layers: tuple[int, ...] = ()  # the layers Hugging Face's caches keep a state for
    static_unknown_kinds: tuple[str, ...] = ()  # layer kinds the static cache has no layer for
    attention_free: bool = False  # every layer recurrent, and Hugging Face's caches keep no keys for any
    cache_keyword: str | None = "past_key_values"  # the forward's cache argument (None: it takes none)
    takes_position_ids: bool = True  # the forward names `position_ids` (Hugging Face generate passes them)
    own_cache: str | None = None  # a cache class the model's code defines (it refuses others)
    mask_utils: bool = True  # builds its attention mask with transformers' masking utilities
    causal: bool = True
    causal_why: str = ""  # why it is not (or cannot be shown to be) causal
    rope: tuple[str, ...] = ()  # length-dependent rotary types of its rotary modules
    rope_modules: tuple = field(default=(), compare=False, repr=False)  # (name, module) of those rotary modules
    static_compiles: bool = True  # Hugging Face declares the model compilable with a static cache

    @property
    def local_unknown_to_cache(self) -> tuple[int, ...]:
        return tuple(i for i in self.local_layers if i not in self.cache_local_layers)

    @property
    def state_unknown_to_cache(self) -> tuple[int, ...]:
        return tuple(i for i in self.recurrent_layers if i not in self.cache_state_layers)

    def features(self) -> tuple[str, ...]:
        """The detector's findings as short names (the test sweep groups models by them)."""
        out = []
        if self.local_layers:
            out.append("local" if not self.local_unknown_to_cache else "local-unknown-to-cache")
        if self.recurrent_layers:
            out.append("recurrent" if not self.state_unknown_to_cache else "recurrent-unknown-to-cache")
        if self.attention_free:
            out.append("attention-free")
        if self.static_unknown_kinds:
            out.append("static-unknown-kind")
        if self.cache_keyword != "past_key_values":
            out.append("no-past-key-values")
        if self.own_cache:
            out.append("own-cache")
        if not self.static_compiles:
            out.append("not-compilable")
        if not self.mask_utils:
            out.append("own-mask")
        if not self.causal:
            out.append("non-causal")
        out += [f"rope-{r}" for r in self.rope]
        return tuple(out)


_DESCRIBED: weakref.WeakKeyDictionary[torch.nn.Module, Architecture] = weakref.WeakKeyDictionary()


def describe(model) -> Architecture:
    """The Architecture of `model`, found from its modules and config on first use and kept (weakly) with it."""
    arch = _DESCRIBED.get(model)
    if arch is None:
        arch = _DESCRIBED[model] = _describe(model)
    return arch


def text_config(model):
    """The decoder's config (a multimodal model's text config)."""
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _decoder_layers(model, n: int | None):
    """The decoder's layer list: the largest ModuleList of `n` blocks (None where none is found)."""
    best = None
    for _, module in model.named_modules():
        if (
            isinstance(module, torch.nn.ModuleList)
            and len(module) > 0
            and (n is None or len(module) == n)
            and (best is None or sum(1 for _ in module.modules()) > sum(1 for _ in best.modules()))
        ):
            best = module
    return best


def _kind_list(config, n: int) -> tuple[str, list[str]] | None:
    """(field, per-layer kinds) from the first layer-kind list of `n` strings the config has."""
    for name in KIND_LISTS:
        values = getattr(config, name, None)
        if isinstance(values, (list, tuple)) and len(values) == n and all(isinstance(v, str) for v in values):
            return name, [v.lower() for v in values]
    return None


def _is_local_word(value) -> bool:
    return isinstance(value, str) and any(w in value.lower() for w in LOCAL_WORDS)


def _module_local(layer) -> tuple[bool, str, int | None]:
    """Whether an attention module under `layer` attends locally, the attribute that says so, its window."""
    for module in layer.modules():
        attrs = vars(module)
        window = attrs.get("sliding_window")
        window = window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None
        if isinstance(attrs.get("is_sliding"), bool):  # decides where present (some keep the window on every layer)
            if attrs["is_sliding"]:
                return True, f"{type(module).__name__}.is_sliding", window
            continue
        kinds = [(n, attrs[n]) for n in ("attention_type", "layer_type") if isinstance(attrs.get(n), str)]
        if kinds:
            local = [(n, v) for n, v in kinds if _is_local_word(v)]
            if local:
                return True, f"{type(module).__name__}.{local[0][0]}={local[0][1]!r}", window
            continue
        if window is not None:
            return True, f"{type(module).__name__}.sliding_window", window
    return False, "", None


# class-name words of state-space / linear-attention / recurrent mixers, as whole CamelCase words
# (not "LinearAttention": a model named "...Linear" has a "...LinearAttention" softmax attention)
RECURRENT_MODULE_NAMES = re.compile(
    r"(Mamba2?|Lstm|LSTM|Rwkv|RWKV|Recurrent|DeltaNet|ShortConv|Ssm|SSM)(?=[A-Z0-9_]|$)"
)


def _module_recurrent(layer) -> tuple[bool, str]:
    for module in layer.modules():
        if RECURRENT_MODULE_NAMES.search(type(module).__name__):
            return True, type(module).__name__
        kind = vars(module).get("layer_type")
        if isinstance(kind, str) and kind.lower() in RECURRENT_KINDS:
            return True, f"{type(module).__name__}.layer_type={kind!r}"
        for pname, _ in module.named_parameters(recurse=False):
            if pname in ("A_log", "dt_bias", "time_decay", "time_first"):
                return True, f"{type(module).__name__}.{pname}"
        if (
            isinstance(module, torch.nn.Conv1d)
            and module.groups > 1
            and module.groups == module.in_channels
            and module.padding
            and module.padding[0] == module.kernel_size[0] - 1
        ):
            return True, f"{type(module).__name__} (a causal depthwise convolution)"
    return False, ""


def _cache_layer_kinds(config, n: int) -> list[str]:
    """The layer kinds Hugging Face's caches are built from (cache_utils.get_layer_types_and_kwargs)."""
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        if getattr(config, "sliding_window", None) is not None:
            return ["sliding_attention"] * n
        if getattr(config, "attention_chunk_size", None) is not None:
            return ["chunked_attention"] * n
        return ["full_attention"] * n
    kinds = list(kinds)
    shared = getattr(config, "num_kv_shared_layers", None)
    return kinds[:-shared] if shared else kinds


def _config_window(config) -> tuple[int | None, str]:
    for name in WINDOW_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None, ""


def _model_modules(model) -> list:
    """The Python modules that define the model's class and its transformers bases (their imports say how the
    model masks and caches)."""
    out = []
    for cls in type(model).__mro__:
        mod = sys.modules.get(cls.__module__)
        if (
            mod is not None
            and mod not in out
            and (cls is type(model) or cls.__module__.startswith("transformers.models."))
        ):
            out.append(mod)
    return out


def _describe(model) -> Architecture:
    config = text_config(model)
    name = type(model).__name__
    n = getattr(config, "num_hidden_layers", None)
    layers = _decoder_layers(model, n if isinstance(n, int) else None)
    n = len(layers) if layers is not None else (n if isinstance(n, int) else 0)
    per_layer = list(layers) if layers is not None else []

    # local layers: the modules first, then the config's layer kinds, then a model-wide window field
    local, local_from, window = [], "", None
    for i, layer in enumerate(per_layer):
        is_local, where, w = _module_local(layer)
        if is_local:
            local.append(i)
            local_from = local_from or where
            window = window or w
    kinds = _kind_list(config, n)
    config_window, window_field = _config_window(config)
    if kinds is not None:
        field_name, values = kinds
        from_config = [i for i, v in enumerate(values) if _is_local_word(v)]
        if from_config and not local:
            local_from = f"config.{field_name}"
        local = sorted(set(local) | set(from_config))
    elif not local and getattr(config, "sliding_window", None) is not None and config_window is not None:
        local, local_from = list(range(n)), f"config.{window_field}"
    if local and window is None:
        window = config_window
    cache_kinds = _cache_layer_kinds(config, n)
    cache_local = [i for i, k in enumerate(cache_kinds) if _is_local_word(k)]

    # state-space / linear-attention / recurrent layers
    recurrent, recurrent_from = [], ""
    for i, layer in enumerate(per_layer):
        found, where = _module_recurrent(layer)
        if found:
            recurrent.append(i)
            recurrent_from = recurrent_from or where
    if kinds is not None:
        from_config = [i for i, v in enumerate(kinds[1]) if v in RECURRENT_KINDS]
        if from_config and not recurrent:
            recurrent_from = f"config.{kinds[0]}"
        recurrent = sorted(set(recurrent) | set(from_config))
    cache_state = [i for i, k in enumerate(cache_kinds) if k in STATE_KINDS]
    unknown = tuple(sorted({k for k in cache_kinds if k not in STATIC_KINDS}))
    attention_free = bool(n) and len(recurrent) == n and all(k in STATE_ONLY_KINDS for k in cache_kinds)

    # the forward's cache keyword, a cache class of the model's own, how it masks
    params = inspect.signature(model.forward).parameters
    # Hugging Face's KV cache, under either of its names (`cache` from transformers 5.24: caches.cache_keyword)
    keyword = (
        "past_key_values"
        if "past_key_values" in params or "cache" in params
        else next((p for p in ("cache_params", "state", "past_buckets_states", "mems") if p in params), None)
    )
    keyword_only = all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params.values())
    if keyword is None and keyword_only:
        keyword = "past_key_values"  # a wrapper's (*args, **kwargs): Hugging Face's own forward takes it
    modules = _model_modules(model)
    from transformers.cache_utils import Cache

    own_cache = next(
        (
            cls.__name__
            for mod in modules
            for cls in vars(mod).values()
            if isinstance(cls, type) and issubclass(cls, Cache) and cls.__module__ == mod.__name__
        ),
        None,
    )
    mask_utils = any(hasattr(mod, "create_causal_mask") for mod in modules)

    causal, causal_why = _causality(model, config, modules, tuple(recurrent), n)
    rope_modules = tuple((mname, m) for mname, m in model.named_modules() if _length_dependent_rope(m))
    rope = tuple(sorted({_rope_kind(m) for _, m in rope_modules}))
    return Architecture(
        name=name,
        num_layers=n,
        local_layers=tuple(local),
        local_from=local_from,
        window=window,
        cache_local_layers=tuple(cache_local),
        recurrent_layers=tuple(recurrent),
        recurrent_from=recurrent_from,
        cache_state_layers=tuple(cache_state),
        static_unknown_kinds=unknown,
        attention_free=attention_free,
        cache_keyword=keyword,
        takes_position_ids="position_ids" in params or keyword_only,
        own_cache=own_cache,
        mask_utils=mask_utils,
        causal=causal,
        causal_why=causal_why,
        rope=rope,
        rope_modules=rope_modules,
        static_compiles=bool(getattr(type(model), "_can_compile_fullgraph", False)),
    )


def _causality(model, config, modules, recurrent: tuple, n: int) -> tuple[bool, str]:
    if getattr(config, "causal", True) is False:
        return False, "config.causal is False"
    if getattr(config, "use_bidirectional_attention", None) is True:
        return False, "config.use_bidirectional_attention is True"
    flags = {vars(m)["is_causal"] for m in model.modules() if isinstance(vars(m).get("is_causal"), bool)}
    if True in flags:
        return True, ""
    if flags and getattr(model.config, "is_decoder", None) is False:
        return False, (
            "its attention modules are not causal (is_causal=False): a BERT-like model attends causally "
            "only as a decoder (config.is_decoder=True)"
        )
    if any(hasattr(mod, "create_causal_mask") for mod in modules):
        return True, ""
    for buf in model.buffers():
        if buf.dim() >= 2 and buf.shape[-1] == buf.shape[-2] > 1 and buf.device.type != "meta":
            tril = torch.ones(buf.shape[-2:], dtype=torch.bool, device=buf.device).tril()
            if torch.equal(buf[(0,) * (buf.dim() - 2)].bool(), tril):  # host sync (once per model)
                return True, ""
    if n and len(recurrent) == n:
        return True, ""  # every layer a recurrence, which reads only the past
    if any(hasattr(mod, "create_bidirectional_mask") for mod in modules):
        return False, "it builds its attention mask with transformers' bidirectional mask"
    return False, "no causal attention found: no causal mask utility, is_causal attention module or causal mask buffer"


def _length_dependent_rope(module) -> bool:
    kind = vars(module).get("rope_type")
    kinds = kind.values() if isinstance(kind, dict) else [kind]
    return any(isinstance(k, str) and any(r in k for r in LENGTH_DEPENDENT_ROPE) for k in kinds)


def _rope_kind(module) -> str:
    kind = vars(module).get("rope_type")
    kinds = kind.values() if isinstance(kind, dict) else [kind]
    return next(r for k in kinds if isinstance(k, str) for r in LENGTH_DEPENDENT_ROPE if r in k)
