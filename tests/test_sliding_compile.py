"""Sliding-window and mixed global/local models under compiled and interleaved (sliding_cache.py): Hugging Face
generate()'s tokens with windows shorter than the call, one decode-step graph per shape (no recompilation per
step: Hugging Face's own sliding static layer keeps a Python counter, which recompiled every step)."""

from __future__ import annotations

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM

import overlapdecode as od
from helpers import eos_hit_midway, hf_generate, make_batch
from overlapdecode.architecture import describe
from tiny_archs import VOCAB, tiny_model

N = 20  # prompt 8 + 20 tokens: windows of 6 slide over most of the call


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
                sliding_window=6,
                tie_word_embeddings=False,
                initializer_range=0.1,
            )
        ).eval()
    model, why = tiny_model(name)  # gemma2: local and global layers alternate (config.layer_types)
    assert model is not None, why
    return model


@pytest.mark.parametrize("name", ["mistral-window", "gemma2"])
def test_sliding_window_models_compile_once_and_match_hf(name):
    model = _model(name)
    arch = describe(model)
    assert arch.local_layers and arch.window == 6
    ids, mask = make_batch(4, seed=11, high=VOCAB)
    eos = eos_hit_midway(model, ids, mask, N, [0, 2])
    assert eos is not None, "no usable EOS for this batch; change the seed"
    for eos_ids in ([], eos):
        ref = hf_generate(model, ids, mask, N, eos_ids, 0)
        before = od.compile_count()
        for strategy in ("compiled", "interleaved", "compiled"):
            out = od.generate(
                model,
                ids,
                attention_mask=mask,
                max_new_tokens=N,
                strategy=strategy,
                eos_token_id=eos_ids,
                pad_token_id=0,
            )
            assert torch.equal(out, ref), (strategy, eos_ids)
        # one graph for the shape (a count of EOS ids is another shape): none per step, none per call
        assert od.compile_count() - before == 1
    # the eager static preset keeps Hugging Face's window-sized layers, and gives the same tokens
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[], pad_token_id=0
    )
    assert torch.equal(out, hf_generate(model, ids, mask, N, [], 0))
