"""Hugging Face's mixture-of-experts layers inside a captured (CUDA graph) step.

Why: transformers runs a MoE model's experts by `config._experts_implementation`, and two of its implementations
copy routing counts to the host in every forward: "grouped_mm" under torch.compile in any dtype but bfloat16
(its fallback loops over `offs.tolist()`), and "eager" (a `nonzero()` over the experts hit). A CUDA graph cannot
hold a host copy, so the compiled presets' captured step would fail there (float32 gpt-oss, Mixtral or Qwen3-MoE
on a GPU). "batched_mm" gathers each token's chosen experts and multiplies with one bmm per projection: the
same math, no host copy, no data-dependent shape. For a compiled call on CUDA the experts run it; the model's
own choice is restored when the call ends, so eager calls and the model outside overlapdecode are untouched.
"""

from __future__ import annotations

import contextlib

import torch

GRAPH_SAFE = "batched_mm"


def _implementations(model) -> dict | None:
    get = getattr(model, "get_experts_implementation", None)
    if get is None or getattr(model, "set_experts_implementation", None) is None:
        return None  # a transformers without selectable experts, or not a PreTrainedModel
    try:
        return get()
    except AttributeError:  # a config without the field
        return None


def _experts_dtypes(model) -> set:
    """The parameter dtypes of the modules that run through transformers' experts interface (they read
    config._experts_implementation at each forward); empty where there are none."""
    dtypes = set()
    for module in model.modules():
        if hasattr(type(module), "_apply_gate") and hasattr(module, "config") and module is not model:
            dtypes.update(p.dtype for p in module.parameters(recurse=False))
    return dtypes


def needs_graph_safe(model, compile_: bool, device_type: str) -> bool:
    """Whether a call's captured step would run an experts implementation that copies to the host: compiled on
    CUDA, experts chosen as "eager", or as "grouped_mm" in a dtype other than bfloat16."""
    if not compile_ or device_type != "cuda":
        return False
    impls = _implementations(model)
    dtypes = _experts_dtypes(model) if impls else set()
    if not dtypes:
        return False
    chosen = {v for v in impls.values() if v is not None}
    if "eager" in chosen:
        return True
    return "grouped_mm" in chosen and dtypes != {torch.bfloat16}


@contextlib.contextmanager
def graph_safe_experts(model, compile_: bool, device_type: str):
    """Run the experts as "batched_mm" for the duration of a compiled CUDA call where the model's own choice
    would copy to the host (needs_graph_safe); the model's choice is put back after, on an exception too."""
    if not needs_graph_safe(model, compile_, device_type):
        yield
        return
    before = _implementations(model)
    model.set_experts_implementation(GRAPH_SAFE)
    try:
        yield
    finally:
        model.set_experts_implementation(before)
