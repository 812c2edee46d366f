"""Beyond GPT-2 and Llama: other Hugging Face causal LMs, loaded from a local directory, give HF's tokens."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import transformers
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import overlapdecode as od
from overlapdecode.hf.architecture import describe
from support.helpers import hf_generate, make_batch

SMALL = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    eos_token_id=2,
)
ARCHS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "gpt-neox": (GPTNeoXConfig, GPTNeoXForCausalLM, {}),
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(pad_token_id=0)),
    "mistral-sliding": (MistralConfig, MistralForCausalLM, dict(sliding_window=16)),  # window < sequence
}
EAGER = ["baseline", "kv", "static", od.Strategy(cache="static", stop_check="pingpong", lag=2)]


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_model(request, tmp_path_factory):
    cfg_cls, model_cls, extra = ARCHS[request.param]
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    model_cls(cfg_cls(**SMALL, **extra)).save_pretrained(path)
    return request.param, od.load_model(str(path), device="cpu")


def test_eager_strategies_match_hf(arch_model):
    name, model = arch_model
    ids, mask = make_batch(4, seed=40)
    ref = hf_generate(model, ids, mask, 30, [], 0)
    for s in EAGER:
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy=s, eos_token_id=[])
        assert torch.equal(out, ref), (name, s)


# --- what architecture.py finds, and the one error each refusal is ----------------------------------------


def _tiny(model_type):
    from support.tiny_archs import tiny_model

    model, why = tiny_model(model_type)
    assert model is not None, why
    return model


def _run(model, strategy, n=12, eos=()):
    from support.tiny_archs import VOCAB

    ids, mask = make_batch(4, seed=7, high=VOCAB)
    ref = hf_generate(model, ids, mask, n, list(eos), 0)
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=list(eos), pad_token_id=0
    )
    return out, ref


def test_local_layers_the_static_cache_does_not_know_are_refused_and_kv_matches():
    model = _tiny("gpt_neo")  # config.attention_layers ['global', 'local'], window 6 < prompt + new tokens
    for strategy in ("static", "compiled", "interleaved"):
        with pytest.raises(
            ValueError,
            match=rf"strategy '{strategy}': GPTNeoForCausalLM's local attention layer 1 "
            r"\(GPTNeoAttention.attention_type='local'\) need a sliding-window cache"
            r".*use strategy='kv' or 'baseline'",
        ):
            _run(model, strategy)
    for strategy in ("kv", "baseline"):
        out, ref = _run(model, strategy)
        assert torch.equal(out, ref), strategy


@pytest.mark.parametrize("model_type", ["lfm2", "jamba", "qwen3_next"])
def test_hybrid_recurrent_models_match_hf_under_static(model_type):
    """The prefill of a model with recurrent layers gets the prompt's mask alone: with the whole-cache mask its
    padded rows leaked their padding into the recurrent state (silently other tokens)."""
    model = _tiny(model_type)
    assert describe(model).recurrent_layers
    out, ref = _run(model, "static")
    assert torch.equal(out, ref)


NEW_CACHE_NAME = "cache" in inspect.signature(transformers.GPT2LMHeadModel.forward).parameters


def test_a_forward_that_takes_its_cache_by_another_name_is_refused_for_caches():
    model = _tiny("rwkv")  # its own state, as `state`
    with pytest.raises(
        ValueError,
        match="strategy 'kv': RwkvForCausalLM's forward takes its cache as `state`, "
        "not `past_key_values`.*use strategy='baseline'",
    ):
        _run(model, "kv")


def test_mamba_takes_hf_caches_where_its_forward_does():
    """transformers 5.17's Mamba keeps its state in `cache_params` (refused for our caches); from 5.24 its forward
    takes Hugging Face's cache as `cache`, with config.layer_types giving every layer a state: kv gives Hugging
    Face's tokens."""
    model = _tiny("mamba")
    if not NEW_CACHE_NAME:
        with pytest.raises(
            ValueError,
            match="strategy 'kv': MambaForCausalLM's forward takes its cache as `cache_params`, "
            "not `past_key_values`.*use strategy='baseline'",
        ):
            _run(model, "kv")
    else:
        out, ref = _run(model, "kv")
        assert torch.equal(out, ref)
    out, ref = _run(model, "baseline")
    assert torch.equal(out, ref)


def test_a_model_with_a_cache_class_of_its_own_is_refused_for_caches():
    model = _tiny("minimax")
    with pytest.raises(
        ValueError,
        match=r"strategy 'static': MiniMaxForCausalLM keeps its state in a cache class of "
        r"its own \(MiniMaxCache\)",
    ):
        _run(model, "static")


def test_non_causal_models_are_refused_whatever_the_strategy():
    from transformers import BertConfig, BertLMHeadModel

    torch.manual_seed(0)
    model = BertLMHeadModel(
        BertConfig(vocab_size=1000, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    ).eval()  # is_decoder=False: bidirectional
    for strategy in ("baseline", "kv", "interleaved"):  # refused from its config before any strategy is asked
        with pytest.raises(ValueError, match=r"model BertLMHeadModel is an encoder \(bert with is_decoder=False"):
            _run(model, strategy)


def test_generation_config_processors_are_named_in_a_warning():
    model = _tiny("bart")  # generation_config.forced_eos_token_id = 2: Hugging Face forces EOS at the last step
    ids, mask = make_batch(4, seed=7, high=model.config.vocab_size)
    with pytest.warns(
        UserWarning,
        match=r"BartForCausalLM's generation_config asks Hugging Face generate\(\) for "
        r"forced_eos_token_id=2, which overlapdecode does not apply",
    ):
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=12, strategy="kv", eos_token_id=[], pad_token_id=0
        )
    assert not torch.equal(out, hf_generate(model, ids, mask, 12, [], 0))  # Hugging Face forced the EOS
    model.generation_config.forced_eos_token_id = None
    assert torch.equal(out, hf_generate(model, ids, mask, 12, [], 0))


@pytest.mark.parametrize("strategy", ["kv", "compiled"])
def test_generation_config_repetition_penalty_is_applied_without_a_warning(strategy):
    """od.generate implements the repetition penalty: the model's generation_config's applies where the call
    gives none, as in Hugging Face generate(); the call's own argument wins."""
    model = _tiny("llama")
    ids, mask = make_batch(4, seed=7, high=model.config.vocab_size)
    plain = hf_generate(model, ids, mask, 12, [], 0)
    model.generation_config.repetition_penalty = 3.0
    ref = hf_generate(model, ids, mask, 12, [], 0)
    assert not torch.equal(ref, plain)  # the penalty changes these tokens
    kwargs = dict(attention_mask=mask, max_new_tokens=12, strategy=strategy, eos_token_id=[], pad_token_id=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert torch.equal(od.generate(model, ids, **kwargs), ref)
        assert torch.equal(od.generate(model, ids, repetition_penalty=1.0, **kwargs), plain)
    assert not [w for w in caught if "generation_config" in str(w.message)]  # applied, so not warned of


def test_a_bidirectional_mask_builder_is_seen_as_not_causal():
    """RoFormer as a decoder (is_decoder=True): transformers 5.17's builds a bidirectional mask all the same (its
    module imports no causal mask utility), 5.24's a causal one; each is described as its code attends."""
    import transformers.models.roformer.modeling_roformer as roformer

    model = _tiny("roformer")
    if hasattr(roformer, "create_causal_mask"):
        assert describe(model).causal
        out, ref = _run(model, "kv")
        assert torch.equal(out, ref)
    else:
        assert describe(model).causal_why == "it builds its attention mask with transformers' bidirectional mask"
        with pytest.raises(ValueError, match="strategy 'kv': RoFormerForCausalLM does not attend causally"):
            _run(model, "kv")
    assert describe(_tiny("xlm")).causal_why == "config.causal is False"  # XLM's masked-LM default
