"""Hugging Face `generate()` as a peer in the benchmark: dynamic cache, static cache, static + auto-compile.

Greedy, the same prompt, EOS and pad as our strategies. `hf-compiled` is Hugging Face's own auto-compile of
the decode forward with a static cache (torch.compile, mode reduce-overhead); Hugging Face only does it on
accelerators, so on CPU it runs like `hf-static`: the JSON says so in `compiled`, and the tables show it as
`hf-compiled (eager on CPU)` (report/markdown.py `label`).
"""

from __future__ import annotations

from transformers import GenerationConfig

from ..loop.compiling import recompile_limits

PEERS = {
    "hf-dynamic": dict(cache_implementation="dynamic", disable_compile=True),
    "hf-static": dict(cache_implementation="static", disable_compile=True),
    "hf-compiled": dict(cache_implementation="static", disable_compile=False),
}


def peer_compiles(name: str, device) -> bool:
    return name == "hf-compiled" and device.type == "cuda"


def run_peer(name: str, model, input_ids, attention_mask, max_new_tokens: int, eos_ids: list[int], pad_id: int):
    """One Hugging Face generate() call; returns (B, P + n) ids like `overlapdecode.generate`."""
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(eos_ids) or None,  # None: no EOS, as eos_token_id=[] in overlapdecode
        pad_token_id=pad_id,
        **PEERS[name],
    )
    # hf-compiled compiles a new specialisation per batch and cache length, as ours do: the same raised limits
    with recompile_limits():
        return model.generate(input_ids, attention_mask=attention_mask, generation_config=config)
