"""The `fused` decode path: the project's own one-token step (Triton kernels on CUDA, their torch twins
elsewhere) on weights re-laid out once, for the Llama family, GPT-2 and the decoders of families.DECODERS. See
docs/KERNELS.md.

Its names are resolved on first use (PEP 562): the decoder imports path.py on every call, and Triton (which
the kernels import) only where a fused call runs."""

from __future__ import annotations

import importlib

# exported name -> the module of this package that defines it
_EXPORTS = {
    "SUPPORTED": "families",
    "FusedCache": "cache",
    "FusedKV": "cache",
    "FusedModel": "model",
    "fuse_weights": "layout",
    "model_family": "families",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
