"""Rotary embeddings whose tables change with the length (dynamic NTK, LongRoPE), made traceable for a compiled
decode step, with Hugging Face's values.

Hugging Face picks such a table in the rotary module's forward from `torch.max(position_ids)` with Python
branches (`dynamic_rope_update`): a fullgraph compile cannot trace them (a compiler traceback). Here the rotary
module's forward is wrapped, once per module: eager calls (Hugging Face's generate(), the eager presets, every
prefill) run Hugging Face's own forward unchanged; while torch.compile traces, the same choice is made on the
device, from the same tables, by the module's undecorated forward run on views of the module that hold them:

- LongRoPE: the long factors' table where the step's largest position + 1 exceeds
  `original_max_position_embeddings`, the short factors' (the original) table elsewhere, as
  `longrope_frequency_update` picks: one graph serves calls on either side (a call that crosses it is refused
  for every cache by refusals.py: its cached keys would keep the short factors' rotation);
- dynamic NTK: the original table, which is Hugging Face's at every length up to the module's
  `original_max_seq_len` (refusals.py refuses a compiled call that could go past it).

The wrapper keeps the module's state as Hugging Face leaves it after each eager forward; the compiled step
reads tables and writes nothing.
"""

from __future__ import annotations

import copy
import inspect

import torch

_WRAPPED = "_overlapdecode_rope_tables"  # the attribute that marks a wrapped rotary module


def compiles(module) -> str | None:
    """None where `module`'s length-dependent table can be chosen in a compiled step, else why not."""
    kind = vars(module).get("rope_type")
    if not isinstance(kind, str):
        return "per-layer-type rotary parameters"
    if "dynamic" not in kind and kind != "longrope":
        return f"rotary type {kind!r}"
    if not hasattr(module, "original_inv_freq") or not hasattr(type(module).forward, "__wrapped__"):
        return "a rotary module without Hugging Face's dynamic_rope_update"
    if kind == "longrope" and "original_max_position_embeddings" not in (module.config.rope_parameters or {}):
        return "LongRoPE without original_max_position_embeddings"
    return None


def longrope_threshold(module) -> int | None:
    """The length past which a LongRoPE module uses its long factors (None for other types)."""
    if vars(module).get("rope_type") != "longrope":
        return None
    return int(module.config.rope_parameters["original_max_position_embeddings"])


def dynamic_limit(module) -> int | None:
    """The length up to which a dynamic-NTK module keeps its original table (None for other types)."""
    kind = vars(module).get("rope_type")
    return int(module.original_max_seq_len) if isinstance(kind, str) and "dynamic" in kind else None


def _view(module, inv_freq: torch.Tensor):
    """A shallow copy of `module` whose `inv_freq` is `inv_freq` (the other attributes are the module's)."""
    view = copy.copy(module)
    view._buffers = dict(module._buffers)
    view._buffers["inv_freq"] = inv_freq
    return view


def prepare(modules) -> None:
    """Wrap each rotary module of `modules` ((name, module) pairs) once; again where the module's original table
    is no longer the one its views hold (the model was moved or cast since)."""
    for _, module in modules:
        views = getattr(module, _WRAPPED, None)
        if views is not None and views[0].inv_freq is module.original_inv_freq:
            continue
        if views is not None:
            del module.forward  # back to Hugging Face's, wrapped again below
        _wrap(module)


def _wrap(module) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kind = module.rope_type
    raw = inspect.unwrap(type(module).forward)  # the forward without torch.no_grad and dynamic_rope_update
    short = module.original_inv_freq
    views = [_view(module, short)]
    threshold = None
    if kind == "longrope":
        threshold = longrope_threshold(module)
        long_freq, _ = ROPE_INIT_FUNCTIONS[kind](module.config, short.device, seq_len=threshold + 1)
        views.append(_view(module, long_freq.to(short.device)))
    eager_forward = module.forward  # bound: Hugging Face's decorated forward

    def forward(x, position_ids, *args, **kwargs):
        if not torch.compiler.is_compiling():
            return eager_forward(x, position_ids, *args, **kwargs)
        with torch.no_grad():
            cos, sin = raw(views[0], x, position_ids)
            if threshold is None:
                return cos, sin
            long_cos, long_sin = raw(views[1], x, position_ids)
            use_long = (position_ids.max() + 1) > threshold  # 0-d, on the device: no host sync
            return torch.where(use_long, long_cos, cos), torch.where(use_long, long_sin, sin)

    module.forward = forward
    setattr(module, _WRAPPED, views)
