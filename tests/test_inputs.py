"""Bad input raises a ValueError/TypeError naming the argument, before any model work."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od

IDS = torch.tensor([[5, 6, 7]])


def call(model, **kw):
    args = dict(input_ids=IDS, max_new_tokens=4, strategy="kv")
    args.update(kw)
    return od.generate(model, **args)


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(input_ids=torch.zeros((1, 0), dtype=torch.long)), ValueError, "input_ids is empty"),
        (dict(input_ids=torch.zeros((0, 3), dtype=torch.long)), ValueError, "input_ids is empty"),
        (dict(input_ids=[[1, 2, 3]]), TypeError, "input_ids must be a torch.Tensor"),
        (dict(input_ids=IDS.float()), TypeError, "input_ids must hold integer"),
        (dict(input_ids=IDS[0]), ValueError, "input_ids must be 2-D"),
        (dict(input_ids=torch.tensor([[5, 1000]])), ValueError, "outside the vocabulary"),
        (dict(input_ids=torch.tensor([[-1, 5]])), ValueError, "outside the vocabulary"),
        (
            dict(input_ids=torch.tensor([[5, 1000]]), attention_mask=torch.tensor([[0, 1]])),
            ValueError,
            "outside the vocabulary",
        ),  # the range is read with the mask's checks too
        (dict(max_new_tokens=0), ValueError, "max_new_tokens must be >= 1"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int"),
        (dict(max_new_tokens=254), ValueError, "exceeds the model's 256 positions"),
        (dict(attention_mask=torch.ones((1, 4), dtype=torch.long)), ValueError, "attention_mask shape"),
        (dict(attention_mask=torch.tensor([[1, 1, 0]])), ValueError, "right padding"),
        (dict(attention_mask=torch.tensor([[1, 0, 1]])), ValueError, "right padding"),
        (dict(attention_mask=torch.tensor([[0, 0, 0]])), ValueError, "right padding"),
        (dict(attention_mask=torch.tensor([[0, 2, 1]])), ValueError, "only 0 and 1"),
        (dict(strategy="fastest"), ValueError, "unknown strategy 'fastest'"),
        (dict(strategy=3), TypeError, "strategy must be"),
        (dict(eos_token_id=1000), ValueError, "eos_token_id [1000] outside the vocabulary"),
        (dict(eos_token_id=[3, -2]), ValueError, "eos_token_id [-2] outside"),
        (dict(eos_token_id="x"), TypeError, "eos_token_id must be"),
        (dict(pad_token_id=5000), ValueError, "pad_token_id [5000] outside"),
        (dict(do_sample=True, temperature=0.0), ValueError, "temperature must be > 0"),
        (dict(do_sample=True, top_k=-1), ValueError, "top_k must be >= 0"),
        (dict(do_sample=True, top_p=1.5), ValueError, "top_p must be in (0, 1]"),
        (dict(seed="1"), TypeError, "seed must be an int"),
        (dict(streamer=5), TypeError, "streamer must be callable"),
    ],
)
def test_bad_input_is_named(tiny_gpt2, kw, exc, words):
    with pytest.raises(exc) as err:
        call(tiny_gpt2, **kw)
    assert words in str(err.value)


def test_bad_strategy_fields():
    with pytest.raises(ValueError, match="strategy.compile needs cache='static'"):
        od.Strategy(cache="dynamic", compile=True)
    with pytest.raises(ValueError, match="strategy.stop_check"):
        od.Strategy(stop_check="sometimes")
    with pytest.raises(ValueError, match="strategy.lag"):
        od.Strategy(stop_check="deferred", lag=0)
    with pytest.raises(ValueError, match="strategy.cache"):
        od.Strategy(cache="paged")


def test_device_mismatch_is_named(tiny_gpt2):
    meta_ids = IDS.to("meta")
    with pytest.raises(ValueError, match="input_ids is on meta but the model is on cpu"):
        call(tiny_gpt2, input_ids=meta_ids)
    with pytest.raises(ValueError, match="attention_mask is on meta"):
        call(tiny_gpt2, attention_mask=torch.ones_like(IDS, device="meta"))


def test_llama_position_limit(tiny_llama):
    with pytest.raises(ValueError, match="exceeds the model's 256 positions"):
        call(tiny_llama, input_ids=torch.full((1, 200), 5), max_new_tokens=57)
    out = call(tiny_llama, input_ids=torch.full((1, 200), 5), max_new_tokens=56, eos_token_id=[])
    assert out.shape == (1, 256)


def _small(cls_cfg, cls_model, **kw):
    torch.manual_seed(0)
    return cls_model(cls_cfg(**kw)).eval()


def _not_causal_lms():
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertModel,
        GPT2Config,
        GPT2Model,
        T5Config,
        T5ForConditionalGeneration,
    )

    bert = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    return {
        "BertForMaskedLM": (_small(BertConfig, BertForMaskedLM, **bert), ValueError, "not a causal LM"),
        "BertModel": (_small(BertConfig, BertModel, **bert), ValueError, "not a causal LM"),
        "GPT2Model": (
            _small(GPT2Config, GPT2Model, vocab_size=1000, n_embd=32, n_layer=1, n_head=2),
            ValueError,
            "not a causal LM",
        ),
        "T5": (
            _small(
                T5Config,
                T5ForConditionalGeneration,
                vocab_size=1000,
                d_model=32,
                d_ff=64,
                num_layers=1,
                num_heads=2,
                d_kv=16,
            ),
            ValueError,
            "encoder-decoder",
        ),
        "str": ("tiny-gpt2", TypeError, "model must be a Hugging Face causal LM"),
        "None": (None, TypeError, "model must be a Hugging Face causal LM"),
        "Linear": (torch.nn.Linear(4, 4), TypeError, "model must be a Hugging Face causal LM"),
    }


@pytest.mark.parametrize("name", ["BertForMaskedLM", "BertModel", "GPT2Model", "T5", "str", "None", "Linear"])
@pytest.mark.parametrize("strategy", ["kv", "static"])
def test_a_model_that_is_not_a_causal_lm_is_refused(name, strategy):
    model, exc, words = _not_causal_lms()[name]
    with pytest.raises(exc) as err:
        od.generate(model, IDS, max_new_tokens=4, strategy=strategy)
    assert words in str(err.value) and "model" in str(err.value)


def test_a_model_on_the_meta_device_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_embd=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match="model GPT2LMHeadModel is on the meta device"):
        od.generate(model, IDS.to("meta"), max_new_tokens=4, strategy="kv")


def test_a_model_in_training_mode_is_refused_and_left_as_it_was():
    model = od.load_model("tiny-gpt2", device="cpu").train()
    with pytest.raises(ValueError, match=r"model GPT2LMHeadModel is in training mode .* model.eval\(\)"):
        call(model)
    assert model.training  # not switched behind the caller's back
    model.eval()
    assert call(model, eos_token_id=[]).shape == (1, 7)


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(seed=2**64), ValueError, "seed must be in [0, 2**64)"),
        (dict(seed=-1), ValueError, "seed must be in [0, 2**64)"),
        (dict(seed=1.0), TypeError, "seed must be an int or None"),
        (dict(seed=True), TypeError, "seed must be an int or None"),
        (dict(temperature=1e-45), ValueError, "temperature 1e-45 is too small to divide by"),
        (dict(temperature=1e-39), ValueError, "too small to divide by"),
        (dict(temperature=float("inf")), ValueError, "temperature must be finite"),
        (dict(temperature=float("nan")), ValueError, "temperature must be > 0"),
    ],
)
def test_bad_sampling_arguments_are_named(tiny_gpt2, kw, exc, words):
    with pytest.raises(exc) as err:
        call(tiny_gpt2, do_sample=True, **kw)
    assert words in str(err.value)


def test_the_largest_seed_a_generator_takes_is_accepted(tiny_gpt2):
    assert call(tiny_gpt2, do_sample=True, seed=2**64 - 1, eos_token_id=[]).shape == (1, 7)


def test_the_shared_batch_builder_pads_odd_rows_on_the_left():
    from support.helpers import make_batch

    ids, mask = make_batch(4, seed=1, prompt_len=5, low=0, high=7)
    assert ids.shape == (4, 5) and 0 <= int(ids.min()) and int(ids.max()) < 7
    assert mask.tolist() == [[1] * 5, [0, 0, 1, 1, 1], [1] * 5, [0, 0, 0, 0, 1]]
    again, _ = make_batch(4, seed=1, prompt_len=5, low=0, high=7)
    assert torch.equal(ids, again)


def test_a_padded_batch_without_a_mask_where_pad_is_eos_warns_and_keeps_hugging_faces_tokens(tiny_gpt2):
    """load_tokenizer's pad id is the EOS id where the tokenizer has no pad token; a padded batch passed without
    its attention_mask is then attended whole, padding included, by Hugging Face generate() too, which warns.
    The tokens were Hugging Face's, but differed from the masked call's without a word."""
    import warnings

    import transformers

    tok = od.load_tokenizer("tiny-gpt2")
    batch = tok(["hello there", "hi"], return_tensors="pt")
    assert tok.pad_token_id == tiny_gpt2.generation_config.eos_token_id and batch.attention_mask[1, 0] == 0
    kw = dict(max_new_tokens=6, strategy="kv", do_sample=False)
    with pytest.warns(UserWarning, match=r"attention_mask is not set and input_ids holds the pad id 999") as seen:
        got = od.generate(tiny_gpt2, batch.input_ids, **kw)
    assert len([w for w in seen if "attention_mask" in str(w.message)]) == 1
    transformers.logging.set_verbosity_error()  # its own warning, on its logger
    try:
        want = tiny_gpt2.generate(batch.input_ids, max_new_tokens=6, do_sample=False)
    finally:
        transformers.logging.set_verbosity_warning()
    assert torch.equal(got, want)  # Hugging Face's tokens: no mask inferred
    masked = od.generate(tiny_gpt2, batch.input_ids, attention_mask=batch.attention_mask, **kw)
    assert not torch.equal(masked, got)  # what the warning is about
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where nothing is ambiguous:
        od.generate(tiny_gpt2, batch.input_ids, attention_mask=batch.attention_mask, **kw)  # the mask given
        od.generate(tiny_gpt2, batch.input_ids[:1], **kw)  # one row: no padding
        od.generate(tiny_gpt2, torch.tensor([[5, 6], [7, 8]]), **kw)  # a batch without the pad id
        od.generate(tiny_gpt2, batch.input_ids, pad_token_id=0, **kw)  # a pad id no EOS id: a mask from it
