"""Sliding-window and mixed global/local models under compiled and interleaved (sliding_cache.py): Hugging Face
generate()'s tokens with prompts longer than the window and generation running past it several times, one
decode-step graph per shape, whatever the EOS ids (no recompilation per step: Hugging Face's own sliding static
layer keeps a Python counter, which recompiled every step), and each sliding layer a ring of `window` slots, not of
the whole call."""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM
from transformers.cache_utils import StaticLayer

import overlapdecode as od
from overlapdecode.hf.architecture import describe
from overlapdecode.hf.sliding_cache import RingCache, RingLayer, static_cache_for_compile
from overlapdecode.plan import static_cache_len
from support.helpers import assert_compiled_once, eos_hit_midway, hf_generate, make_batch
from support.tiny_archs import VOCAB, WINDOW, tiny_model

P = 10  # prompt 10 + 20 tokens, windows of 6: the prefill wraps the ring, the steps go round it four more times
N = 20
# every layer sliding (Mistral without config.layer_types: one 4D mask), sliding and global layers (a dict of
# masks), Gemma's soft-caps, gpt-oss's sinks and Granite's eager attention (additive masks)
NAMES = [
    "mistral-window",
    "gemma2",
    "gemma3_text",
    "cohere2",
    "olmo3",
    "ministral",
    "exaone4",
    "gpt_oss",
    "granite_swa",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(name: str):
    if name == "mistral-window":  # every layer local
        torch.manual_seed(0)
        return MistralForCausalLM(
            MistralConfig(
                vocab_size=VOCAB,
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                sliding_window=WINDOW,
                tie_word_embeddings=False,
                initializer_range=0.1,
            )
        ).eval()
    model, why = tiny_model(name)  # local and global layers alternate (config.layer_types)
    assert model is not None, why
    return model


def _ring_layers(dec, model) -> list:
    """The local layers of the one static cache `dec` kept, checked to be rings of `window` slots (the global
    layers whole-length)."""
    (entry,) = dec.static_caches._entries.values()
    cache = entry[0]
    assert isinstance(cache, RingCache)
    local = describe(model).local_layers
    for i, layer in enumerate(cache.layers):
        if i in local:
            assert type(layer) is RingLayer and layer.keys.shape[2] == WINDOW, i
        else:
            assert type(layer) is StaticLayer and layer.keys.shape[2] == static_cache_len(P, N), i
    return [cache.layers[i] for i in local]


@pytest.mark.parametrize("name", NAMES)
def test_sliding_window_models_compile_once_and_match_hf(name):
    model = _model(name)
    arch = describe(model)
    assert arch.local_layers and arch.window == WINDOW < P
    ids, mask = make_batch(4, seed=11, prompt_len=P, high=VOCAB)
    mask[3, :7] = 0  # rows 1 and 3 left-padded, row 3 into the last window of the prompt (padding in the ring)
    eos = eos_hit_midway(model, ids, mask, N, [0, 2])
    assert eos is not None, "no usable EOS for this batch; change the seed"
    dec = od.Decoder(model)
    assert_compiled_once(dec, ids, mask, N, [(e, hf_generate(model, ids, mask, N, e, 0)) for e in (eos, [])])
    # the last call (no EOS) wrote P + N - 1 positions (not the last token): a ring holds the last 6
    for layer in _ring_layers(dec, model):
        assert sorted(layer.slot_positions.tolist()) == list(range(P + N - 1 - WINDOW, P + N - 1))
    # the eager static preset keeps Hugging Face's window-sized layers, and gives the same tokens
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[], pad_token_id=0
    )
    assert torch.equal(out, hf_generate(model, ids, mask, N, [], 0))


def test_chunked_layers_stay_whole_length_and_calls_within_the_window_need_no_ring():
    model, why = tiny_model("llama4_text")  # chunked attention: a chunk is no window
    assert model is not None, why
    cache = static_cache_for_compile(model.config, 64, describe(model).local_layers)
    assert not isinstance(cache, RingCache)
    assert all(type(layer) is StaticLayer and layer.max_cache_len == 64 for layer in cache.layers)
    model = _model("gemma2")
    assert isinstance(static_cache_for_compile(model.config, 64, describe(model).local_layers), RingCache)
    assert not isinstance(static_cache_for_compile(model.config, WINDOW, describe(model).local_layers), RingCache)


@pytest.mark.parametrize("name", ["mistral-window", "gemma3_text"])
def test_one_ring_cache_serves_prompts_longer_shorter_and_as_long_as_the_window(name):
    """Calls of one shape (batch 2, the same rounded cache length) on one decoder share one ring cache and one graph,
    whatever their prompt: longer than the window (the prefill wraps the ring), shorter than it (the ring not yet
    full, its other slots left over from the call before: reset() must empty them), exactly as long, and one token
    (the prefill a one-token write, through the decode step's path); rows of very different lengths."""
    model = _model(name)
    dec = od.Decoder(model)
    before = od.compile_count()
    for P, real in ((10, (10, 2)), (3, (3, 3)), (WINDOW, (WINDOW, 1)), (WINDOW + 1, (WINDOW + 1, 7)), (1, (1, 1))):
        ids, _ = make_batch(2, seed=P, prompt_len=max(P, 2), high=VOCAB)
        ids = ids[:, :P]
        mask = torch.zeros_like(ids)
        for row, n in enumerate(real):
            mask[row, P - n :] = 1
        ref = hf_generate(model, ids, mask, N, [], 0)
        out = dec.generate(
            ids, attention_mask=mask, max_new_tokens=N, strategy="compiled", eos_token_id=[], pad_token_id=0
        )
        assert torch.equal(out, ref), (P, real)
        assert static_cache_len(P, N) == static_cache_len(10, N)  # the one cache of the shape, reset between calls
    assert len(dec.static_caches) == 1 and od.compile_count() - before == 1
