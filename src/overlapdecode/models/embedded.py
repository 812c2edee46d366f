"""The embedded random-weight models: one list of their names, each with the published model whose shape it has.

loading.py builds them (their shapes: shapes.py); `generate --help`, the errors that list them and the README's list (checked by
tests/test_readme.py) are made from this one list. No torch here, so that `overlapdecode --help` stays fast.
"""

from __future__ import annotations

# name -> the published model whose architecture and size it has (random weights: the text is meaningless)
EMBEDDED_MODELS = {
    "gpt2-random": "GPT-2 124M",
    "llama-1b-random": "Llama-3.2-1B",
    "llama-3b-random": "Llama-3.2-3B",
    "llama-8b-random": "Llama-3-8B",
    "llama-70b-random": "Llama-3-70B",
    "smollm2-360m-random": "SmolLM2-360M",
    "qwen2.5-0.5b-random": "Qwen2.5-0.5B",
    "qwen2.5-1.5b-random": "Qwen2.5-1.5B",
    "smollm2-1.7b-random": "SmolLM2-1.7B",
    "qwen3-0.6b-random": "Qwen3-0.6B",
    "qwen3-1.7b-random": "Qwen3-1.7B",
    "qwen2.5-7b-random": "Qwen2.5-7B",
    "gemma3-1b-random": "Gemma-3-1B",
    "qwen3-moe-random": "12 of Qwen3-30B-A3B's 48 layers, 32 of its 128 experts",
    "phi3-mini-random": "Phi-3.5-mini",
    "olmo2-1b-random": "OLMo-2-0425-1B",
    "smollm3-3b-random": "SmolLM3-3B",
    "granite-2b-random": "Granite-3.1-2B",
    "gemma2-2b-random": "Gemma-2-2B",
    "mixtral-random": "8 of Mixtral-8x7B's 32 layers",
    "gpt-oss-random": "12 of gpt-oss-20b's 24 layers",
    "tiny-gpt2": "a 2-layer GPT-2, 64 wide, for CPU tests",
    "tiny-llama": "a 2-layer Llama, 64 wide, for CPU tests",
}
EMBEDDED = tuple(EMBEDDED_MODELS)


def embedded_list() -> str:
    """The embedded names, comma-separated, for help texts and errors."""
    return ", ".join(EMBEDDED)
