"""On a real GPU: sliding-window layers as rings (sliding_cache.py) under CUDA graphs. Tiny models in float32 give
Hugging Face generate()'s tokens with the rings replayed from one graph per shape (the slots' positions written
inside the graph, at static addresses); at Gemma-3-1B's size and an 8K-token call, each local layer holds its 512
slots, not the call."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.hf.architecture import describe
from overlapdecode.hf.sliding_cache import RingCache, RingLayer
from overlapdecode.plan import static_cache_len
from support.helpers import assert_compiled_once, hf_generate, make_batch
from support.tiny_archs import VOCAB, WINDOW, tiny_model

DEV = "cuda"
P, N = 10, 40  # windows of 6: the prefill wraps the ring, the steps go round it six more times


def _kept_cache(dec):
    (entry,) = dec.static_caches._entries.values()
    assert isinstance(entry[0], RingCache)
    return entry[0]


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text", "ministral", "gpt_oss"])
def test_tiny_sliding_models_match_hf_under_cuda_graphs(name):
    model, why = tiny_model(name)
    assert model is not None, why
    model = model.to(DEV)
    ids, mask = make_batch(4, seed=11, prompt_len=P, high=VOCAB, device=DEV)
    mask[3, :7] = 0  # padding inside the prompt's last window
    dec = od.Decoder(model)
    free = hf_generate(model, ids, mask, N, [], 0)
    eos = [int(free[0, P + 5])]  # row 0 stops by its sixth token
    assert_compiled_once(dec, ids, mask, N, [([], free), (eos, hf_generate(model, ids, mask, N, eos, 0))])
    cache = _kept_cache(dec)
    for i in describe(model).local_layers:
        assert type(cache.layers[i]) is RingLayer and cache.layers[i].keys.shape[2] == WINDOW


def test_gemma3_1b_local_layers_hold_their_window_at_8k():
    model = od.load_model("gemma3-1b-random", dtype="bfloat16", device=DEV)
    P8, N8 = 8192, 64
    ids = torch.randint(3, 1000, (2, P8), device=DEV)
    mask = torch.ones_like(ids)
    mask[1, :100] = 0
    dec = od.Decoder(model)
    before = od.compile_count()
    for _ in range(2):
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=N8, strategy="compiled", eos_token_id=[])
        assert out.shape == (2, P8 + N8)
    assert od.compile_count() - before == 1
    cache = _kept_cache(dec)
    local = describe(model).local_layers
    assert len(local) == 22
    for i, layer in enumerate(cache.layers):
        assert layer.keys.shape[2] == (512 if i in local else static_cache_len(P8, N8)), i
    # the local layers' share of the cache: 22 * 512 slots against 4 whole-length layers of 8256
    ring_bytes = sum(cache.layers[i].keys.nbytes + cache.layers[i].values.nbytes for i in local)
    total = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    assert ring_bytes < 0.3 * total
