"""spec/options.py through od.generate: every mistake in the speculation arguments is one error naming the argument,
before the model runs; a strategy no round loop runs is refused, naming the presets that speculate."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import overlapdecode as od
from overlapdecode.spec.options import SPEC_PRESETS, check_speculation


@pytest.fixture
def no_forward(tiny_llama, monkeypatch):
    """The model, whose forward fails the test if it runs: every refusal comes before any device work."""

    def forward(*a, **k):
        raise AssertionError("the model ran before the arguments were checked")

    monkeypatch.setattr(tiny_llama, "forward", forward)
    return tiny_llama


def _refused(model, match, error=ValueError, **kw):
    kw.setdefault("strategy", "kv")
    with pytest.raises(error, match=match):
        od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=4, **kw)


@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(prompt_lookup_num_tokens=0), ValueError, "^prompt_lookup_num_tokens must be >= 1"),
        (dict(prompt_lookup_num_tokens=True), TypeError, "^prompt_lookup_num_tokens must be an int"),
        (dict(prompt_lookup_num_tokens=2.0), TypeError, "^prompt_lookup_num_tokens must be an int"),
        (dict(num_assistant_tokens=3), ValueError, "^num_assistant_tokens is given without assistant_model"),
        (dict(num_assistant_tokens=-1), ValueError, "^num_assistant_tokens must be >= 1"),
        (dict(prompt_lookup_num_tokens=2, assistant_model="x"), ValueError, "^prompt_lookup_num_tokens and assistant"),
        (dict(assistant_model="a draft"), TypeError, "^assistant_model: model must be a Hugging Face causal LM"),
    ],
)
def test_bad_speculation_arguments_are_named(no_forward, kw, error, match):
    _refused(no_forward, match, error, **kw)


@pytest.mark.parametrize(
    "strategy, label",
    [
        ("baseline", "'baseline'"),
        (od.Strategy(cache="dynamic", stop_check="deferred"), "Strategy"),  # no round loop reads a dynamic cache late
        (od.Strategy(cache="static", stop_check="pingpong"), "Strategy"),  # nor an uncompiled static one
    ],
)
def test_strategies_without_a_round_loop_name_the_presets_that_speculate(no_forward, strategy, label):
    assert SPEC_PRESETS == ("kv", "static", "compiled", "interleaved", "fused")
    for kw in (dict(prompt_lookup_num_tokens=2), dict(assistant_model=no_forward)):
        _refused(
            no_forward,
            f"^strategy {label}.*: speculative decoding .* presets 'kv', 'static', 'compiled', 'interleaved' and 'fused'",
            **kw,
            strategy=strategy,
        )


def test_a_draft_of_another_vocabulary_is_refused(no_forward):
    config = LlamaConfig(
        vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    draft = LlamaForCausalLM(config).eval()
    _refused(no_forward, "^assistant_model scores 500 token ids and the model 1000", assistant_model=draft)
    draft.train()
    _refused(no_forward, "^assistant_model: model LlamaForCausalLM is in training mode", assistant_model=draft)


def test_a_draft_on_another_device_is_refused(no_forward, monkeypatch):
    draft = od.load_model("tiny-llama", device="cpu", seed=1)
    monkeypatch.setattr(
        "overlapdecode.spec.options.model_device", lambda m: torch.device("cuda" if m is draft else "cpu")
    )
    _refused(no_forward, "^assistant_model is on cuda but the model is on cpu", assistant_model=draft)


def test_the_defaults_are_hugging_faces(tiny_llama):
    kv = od.PRESETS["kv"]
    assert check_speculation(tiny_llama, kv, "'kv'", None, None, None) is None
    spec = check_speculation(tiny_llama, kv, "'kv'", 3, None, None)
    assert (spec.kind, spec.k, spec.ngram) == ("prompt_lookup", 3, 2)  # max_matching_ngram_size 2
    spec = check_speculation(tiny_llama, kv, "'kv'", None, tiny_llama, None)
    assert (spec.kind, spec.k, spec.assistant) == ("assistant", 20, tiny_llama)  # num_assistant_tokens 20
