"""overlapdecode: fast token generation in native PyTorch, every step of it measured.

    import overlapdecode as od
    model = od.load_model("tiny-gpt2")
    out = od.generate(model, input_ids, max_new_tokens=32, strategy="interleaved")
"""

from .decode import Decoder, compile_count, decoder_for, generate
from .strategy import PRESETS, VARIANTS, Strategy, resolve_strategy
from .models import EMBEDDED, load_model, load_tokenizer

__all__ = [
    "Decoder",
    "EMBEDDED",
    "PRESETS",
    "VARIANTS",
    "Strategy",
    "compile_count",
    "decoder_for",
    "generate",
    "load_model",
    "load_tokenizer",
    "resolve_strategy",
]
__version__ = "0.1.0"
