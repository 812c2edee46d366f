"""On a real GPU: speculative decoding's round loop (spec/rounds.py) on `kv` and `static`, GPT-2 124M's shape with
random weights. float32 greedy: the tokens of the same preset without speculation, batch 1 and 4 with left padding,
for prompt lookup, the model as its own draft (every draft accepted) and an unrelated draft; sampling with a seed
gives the same tokens under both presets, every one inside Hugging Face's kept set; bfloat16 runs."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import assert_inside_hf_kept_sets, make_batch

DEV = "cuda"
N = 32


@pytest.fixture(scope="module")
def gpt2():
    return od.load_model("gpt2-random", device=DEV)


@pytest.fixture(scope="module")
def other_gpt2():
    return od.load_model("gpt2-random", device=DEV, seed=1)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("preset", ["kv", "static"])
def test_greedy_tokens_are_those_without_speculation(gpt2, other_gpt2, preset, batch):
    ids, mask = make_batch(batch, seed=batch, device=DEV)
    kw = dict(attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=[])
    ref = od.generate(gpt2, ids, **kw)
    for k in (1, 4, 7):
        for spec in (
            dict(prompt_lookup_num_tokens=k),
            dict(assistant_model=gpt2, num_assistant_tokens=k),
            dict(assistant_model=other_gpt2, num_assistant_tokens=k),
        ):
            assert torch.equal(od.generate(gpt2, ids, **kw, **spec), ref), (k, list(spec))
            stats = od.decoder_for(gpt2).last_speculation
            if spec.get("assistant_model") is gpt2:
                assert stats.accepted == stats.drafted, k


def test_sampling_with_a_seed_is_the_same_under_both_presets(gpt2, other_gpt2):
    ids, mask = make_batch(4, seed=7, device=DEV)
    setting = dict(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.2)
    kw = dict(attention_mask=mask, max_new_tokens=N, eos_token_id=[], do_sample=True, seed=3, **setting)
    for spec in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=other_gpt2, num_assistant_tokens=3)):
        outs = [od.generate(gpt2, ids, strategy=p, **kw, **spec) for p in ("kv", "static")]
        assert torch.equal(outs[0], outs[1]), list(spec)
        assert_inside_hf_kept_sets(gpt2, outs[0].cpu(), mask.cpu(), ids.shape[1], setting, model_device=DEV)


def test_bfloat16_runs_and_the_model_as_its_own_draft_is_mostly_accepted():
    """bfloat16 makes no exactness promise (a K + 1-token forward rounds otherwise than a one-token one)."""
    model = od.load_model("gpt2-random", device=DEV, dtype="bfloat16")
    ids, mask = make_batch(4, seed=8, device=DEV)
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[],
        assistant_model=model, num_assistant_tokens=4,
    )  # fmt: skip
    assert out.shape == (4, ids.shape[1] + N)
    assert od.decoder_for(model).last_speculation.acceptance_rate > 0.5
