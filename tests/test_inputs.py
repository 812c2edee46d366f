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
        (dict(do_sample=True, top_k=0), ValueError, "top_k must be >= 1"),
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
