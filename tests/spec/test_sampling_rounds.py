"""Speculative sampling through od.generate (CPU, float32): a seed gives the same tokens on every preset that
speculates; every token lies inside Hugging Face's kept set of its step; the model as its own draft accepts nearly
every draft; and the first speculated token's frequencies over many rows follow the model's distribution (a
chi-square test, which a planted bias in the residual fails)."""

from __future__ import annotations

import copy

import pytest
import torch

import overlapdecode as od
from overlapdecode.spec import accept
from support.helpers import assert_inside_hf_kept_sets, hf_processors, make_batch
from support.stats import chi2_pvalue, chi2_stat

N = 12
ALL = dict(temperature=0.8, top_k=30, top_p=0.8, min_p=0.05, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def unrelated_llama():
    return od.load_model("tiny-llama", device="cpu", seed=1)


def _specs(model, unrelated):
    return {
        "lookup": dict(prompt_lookup_num_tokens=3),
        "self": dict(assistant_model=model, num_assistant_tokens=3),
        "unrelated": dict(assistant_model=unrelated, num_assistant_tokens=2),
    }


def _sample(model, ids, mask, preset, seed, eos, setting=ALL, **spec):
    kw = dict(attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=eos, pad_token_id=0)
    return od.generate(model, ids, do_sample=True, seed=seed, **kw, **setting, **spec)


def test_a_seed_gives_the_same_tokens_on_every_preset_that_speculates(tiny_llama, unrelated_llama):
    ids, mask = make_batch(4, seed=30)
    P = ids.shape[1]
    plain = _sample(tiny_llama, ids, mask, "kv", 5, [])
    for kind, spec in _specs(tiny_llama, unrelated_llama).items():
        free = _sample(tiny_llama, ids, mask, "kv", 5, [], **spec)
        assert torch.equal(free[:, P], plain[:, P]), kind  # step 0 is the prefill's, with the same draw
        eos = [int(free[0, P + 3])]  # row 0 stops mid-way
        outs = [_sample(tiny_llama, ids, mask, p, 5, eos, **spec) for p in ("kv", "static", "kv")]
        assert outs[0].shape[1] < P + N or (outs[0][0, P + 4 :] == 0).all(), kind
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2]), kind
        assert not torch.equal(_sample(tiny_llama, ids, mask, "kv", 6, eos, **spec), outs[0]), kind


def test_sampled_tokens_are_inside_hugging_faces_kept_sets(tiny_llama, unrelated_llama):
    ids, mask = make_batch(3, seed=31)
    for kind, spec in _specs(tiny_llama, unrelated_llama).items():
        out = _sample(tiny_llama, ids, mask, "static", 2, [], **spec)
        assert_inside_hf_kept_sets(tiny_llama, out, mask, ids.shape[1], ALL)
        if kind == "self":  # p and q are the same distributions, up to the rounding of one forward against another
            assert od.decoder_for(tiny_llama).last_speculation.acceptance_rate > 0.9


def _second_token_test(model, draft, rows: int) -> tuple[float, float]:
    """`rows` copies of one prompt, top-k 4, K = 1: token 0 is the prefill's, token 1 the round's (the draft
    accepted, or the residual). Token 1's counts against the model's distribution after (prompt, token 0), summed
    over the values of token 0 -> (the chi-square p-value, the acceptance rate)."""
    prompt = torch.tensor([[11, 12, 13, 14, 15]])
    ids = prompt.expand(rows, -1).contiguous()
    setting = dict(top_k=4)
    out = od.generate(
        model, ids, max_new_tokens=3, strategy="kv", eos_token_id=[], do_sample=True, seed=3, top_k=4,
        assistant_model=draft, num_assistant_tokens=1,
    )  # fmt: skip
    rate = od.decoder_for(model).last_speculation.acceptance_rate
    total, df = 0.0, 0
    for first in out[:, 5].unique():
        seq = torch.cat([prompt, first.view(1, 1)], dim=1)
        with torch.no_grad():
            logits = model(input_ids=seq).logits[:, -1].float()
        probs = torch.softmax(hf_processors(setting)(seq, logits), dim=-1)[0]
        stat, k = chi2_stat(torch.bincount(out[out[:, 5] == first, 6], minlength=probs.shape[0]), probs)
        total, df = total + stat, df + k
    return chi2_pvalue(total, df), rate


@pytest.fixture(scope="module")
def sharper_gpt2(tiny_gpt2):
    """tiny-gpt2 with its final norm scaled: the same ranking of tokens, sharper probabilities (a draft that is
    often but not always right)."""
    draft = copy.deepcopy(tiny_gpt2)
    with torch.no_grad():
        draft.transformer.ln_f.weight.mul_(2.5)
    return draft


def test_the_speculated_token_follows_the_models_distribution(tiny_gpt2, sharper_gpt2):
    pvalue, rate = _second_token_test(tiny_gpt2, sharper_gpt2, 1500)
    assert 0.3 < rate < 0.95, "the draft should be accepted often, and rejected often enough"
    assert pvalue > 1e-3


def test_the_distribution_check_fails_a_planted_bias_in_the_residual(tiny_gpt2, sharper_gpt2, monkeypatch):
    monkeypatch.setattr(accept, "residual", lambda p, q: p)  # a rejection samples p itself: the draft's share twice
    pvalue, _ = _second_token_test(tiny_gpt2, sharper_gpt2, 1500)
    assert pvalue < 1e-6
