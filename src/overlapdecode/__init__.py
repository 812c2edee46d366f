"""overlapdecode: fast token generation in native PyTorch, every step of it measured.

    import overlapdecode as od
    model = od.load_model("tiny-gpt2")
    out = od.generate(model, input_ids, max_new_tokens=32, strategy="interleaved")

The exports are resolved on first use (PEP 562), so that `overlapdecode --help` (the command line, a part of
this package, cli/) does not import torch and transformers: only what a command runs imports them.
"""

import importlib as _importlib
import importlib.util as _importlib_util
import typing as _typing

# exported name -> the module that defines it
_EXPORTS = {
    "EMBEDDED": "models.embedded",
    "ModelFacts": "facts",
    "Decoder": "decode",
    "PRESETS": "strategy",
    "VARIANTS": "strategy",
    "ByteTokenizer": "models.tokenizer",
    "Strategy": "strategy",
    "compile_count": "loop.compiling",
    "decoder_for": "decode",
    "generate": "decode",
    "load_model": "models.loading",
    "load_tokenizer": "models.loading",
    "model_facts": "facts",
    "quantize": "quant.model",
    "resolve_strategy": "strategy",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"

if _typing.TYPE_CHECKING:
    from .decode import Decoder, decoder_for, generate
    from .facts import ModelFacts, model_facts
    from .loop.compiling import compile_count
    from .models.embedded import EMBEDDED
    from .models.loading import load_model, load_tokenizer
    from .models.tokenizer import ByteTokenizer
    from .quant.model import quantize
    from .strategy import PRESETS, VARIANTS, Strategy, resolve_strategy


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value  # resolved once
        return value
    if _importlib_util.find_spec(f"{__name__}.{name}") is not None:  # od.models, od.bench ...
        return _importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    """The exports and `__version__` (with the module's own dunders), not the helpers this file imports, nor
    the submodules (reached as `od.models`, `od.bench`...)."""
    return sorted(set(__all__) | {"__version__"} | {n for n in globals() if n.startswith("__") and n.endswith("__")})
