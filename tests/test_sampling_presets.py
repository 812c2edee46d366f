"""Sampling and the repetition penalty through od.generate, under every preset: Hugging Face's tokens for greedy
decoding with a penalty, every sampled token inside Hugging Face's kept set of its step, and one seed giving the
same tokens under every preset, with left padding and EOS mid-way."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import assert_inside_hf_kept_sets, make_batch

N = 12
EAGER = ("baseline", "kv", "static", "fused")
ALL = dict(temperature=0.8, top_k=30, top_p=0.8, min_p=0.05, repetition_penalty=1.3)


def stopping_eos(model, ids, mask, kw) -> list[int]:
    """EOS ids that stop rows at different steps, picked from a free run (row r at step 2r + 2 at the latest)."""
    free = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[], **kw)[
        :, ids.shape[1] :
    ]
    return sorted({int(free[r, 2 * r + 2]) for r in range(ids.shape[0])})


@pytest.mark.parametrize("penalty", [1.5, 0.8])
def test_greedy_with_repetition_penalty_is_hugging_faces(tiny_model, penalty):
    ids, mask = make_batch(3, seed=41)
    eos = stopping_eos(tiny_model, ids, mask, dict(repetition_penalty=penalty))
    ref = tiny_model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=N,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        repetition_penalty=penalty,
    )
    assert ref.shape[1] < ids.shape[1] + N, "the batch should stop before max_new_tokens"
    for preset in EAGER:
        out = od.generate(
            tiny_model,
            ids,
            attention_mask=mask,
            max_new_tokens=N,
            strategy=preset,
            eos_token_id=eos,
            pad_token_id=0,
            repetition_penalty=penalty,
        )
        assert torch.equal(out, ref), preset
    plain = od.generate(tiny_model, ids, attention_mask=mask, max_new_tokens=N, strategy="kv", eos_token_id=[])
    assert not torch.equal(plain[:, : ref.shape[1]], ref), "the penalty should change some token"


@pytest.mark.parametrize(
    "setting", [dict(top_p=0.7), dict(min_p=0.2), ALL], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())
)
def test_every_sampled_token_is_inside_hugging_faces_kept_set(tiny_llama, setting):
    ids, mask = make_batch(4, seed=42)
    for seed in (1, 2):
        out = od.generate(
            tiny_llama,
            ids,
            attention_mask=mask,
            max_new_tokens=N,
            strategy="static",
            eos_token_id=[],
            do_sample=True,
            seed=seed,
            **setting,
        )
        assert_inside_hf_kept_sets(tiny_llama, out, mask, ids.shape[1], setting)


def test_the_kept_set_check_fails_a_sampler_without_top_p(tiny_llama):
    ids, mask = make_batch(4, seed=42)
    out = od.generate(
        tiny_llama,
        ids,
        attention_mask=mask,
        max_new_tokens=N,
        strategy="static",
        eos_token_id=[],
        do_sample=True,
        seed=1,
        temperature=1.5,
        top_k=0,  # every token kept
    )
    with pytest.raises(AssertionError):
        assert_inside_hf_kept_sets(tiny_llama, out, mask, ids.shape[1], dict(temperature=1.5, top_p=0.3))


@pytest.mark.parametrize("setting", [dict(min_p=0.1), ALL], ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_one_seed_gives_the_same_tokens_under_every_eager_preset(tiny_model, setting):
    ids, mask = make_batch(4, seed=43)
    kw = dict(do_sample=True, seed=9, **setting)
    eos = stopping_eos(tiny_model, ids, mask, kw)
    outs = {
        p: od.generate(tiny_model, ids, attention_mask=mask, max_new_tokens=N, strategy=p, eos_token_id=eos, **kw)
        for p in EAGER
    }
    outs["pingpong"] = od.generate(
        tiny_model,
        ids,
        attention_mask=mask,
        max_new_tokens=N,
        eos_token_id=eos,
        strategy=od.Strategy(stop_check="pingpong", lag=2),
        **kw,
    )
    ref = outs["baseline"]
    assert ref.shape[1] < ids.shape[1] + N, "the batch should stop before max_new_tokens"
    for name, out in outs.items():
        assert torch.equal(out, ref), name


def test_generate_names_bad_sampling_values(tiny_gpt2):
    ids, mask = make_batch(1, seed=45)
    for kwargs, name in (
        (dict(do_sample=True, min_p=2.0), "min_p"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(do_sample=True, min_p="x"), "min_p"),
    ):
        with pytest.raises((ValueError, TypeError), match=f"^{name}"):
            od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=2, strategy="kv", **kwargs)
