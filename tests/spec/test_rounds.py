"""The speculative round loop through od.generate (CPU, float32): greedy tokens exactly those of the same preset
without speculation for K = 1..5 at batch 1 and 3 with left padding, EOS inside an accepted run and the last
allowed token; every draft accepted when the model drafts for itself, about none from an unrelated model, many by
prompt lookup on a prompt whose continuation repeats it."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import eos_hit_midway, make_batch
from support.spec_checks import all_accepted_but_past_eos, expected_drafts, spec_generate

N = 16


@pytest.fixture(scope="module")
def unrelated():
    """name -> the tiny model of that name with other random weights (seed 1): a draft that is about never right."""
    return {name: od.load_model(name, device="cpu", seed=1) for name in ("tiny-gpt2", "tiny-llama")}


def _name(model) -> str:
    return "tiny-gpt2" if model.config.model_type == "gpt2" else "tiny-llama"


def _generate(model, ids, mask, preset, eos, n=N, **spec):
    return spec_generate(model, ids, mask, preset, eos, n, **spec)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("preset", ["kv", "static"])
def test_greedy_tokens_are_those_without_speculation(tiny_model, unrelated, preset, batch):
    ids, mask = make_batch(batch, seed=20 + batch)
    eos = eos_hit_midway(tiny_model, ids, mask, N, [0])  # row 0 stops mid-way, the others run to the end
    assert eos is not None, "the batch has no usable EOS; change the seed"
    ref, _ = _generate(tiny_model, ids, mask, preset, eos)
    assert ref.shape[1] == ids.shape[1] + N if batch > 1 else ref.shape[1] < ids.shape[1] + N
    drafts = {"lookup": {}, "self": dict(assistant_model=tiny_model), "unrelated": {}}
    drafts["unrelated"] = dict(assistant_model=unrelated[_name(tiny_model)])
    for k in (1, 2, 3, 4, 5) if batch > 1 else (1, 3, 5):
        for kind, spec in drafts.items():
            spec = dict(spec, **({"prompt_lookup_num_tokens": k} if kind == "lookup" else {"num_assistant_tokens": k}))
            out, stats = _generate(tiny_model, ids, mask, preset, eos, **spec)
            assert torch.equal(out, ref), (k, kind)
            assert stats.k == k and stats.rounds < N
            if kind == "self":  # every draft accepted, but those after an EOS accepted in the row's last round
                assert all_accepted_but_past_eos(stats), (k, stats.drafted, stats.accepted)
            if kind == "unrelated":
                assert stats.acceptance_rate < 0.1, (k, stats.accepted)


@pytest.mark.parametrize("k, n", [(2, N), (5, N), (4, 7), (3, 5)])
def test_the_model_as_its_own_draft_accepts_every_draft(tiny_llama, k, n):
    ids, mask = make_batch(3, seed=24)
    ref, _ = _generate(tiny_llama, ids, mask, "kv", [], n=n)
    out, stats = _generate(tiny_llama, ids, mask, "kv", [], n=n, assistant_model=tiny_llama, num_assistant_tokens=k)
    assert torch.equal(out, ref) and out.shape[1] == ids.shape[1] + n  # up to the last allowed token
    want = expected_drafts(k, n)
    assert [row[0] for row in stats.drafted] == want and stats.drafted == [[d] * 3 for d in want]
    assert stats.accepted == stats.drafted


@pytest.mark.parametrize("preset", ["kv", "static"])
def test_a_row_that_accepts_its_eos_stops_there(tiny_gpt2, preset):
    """EOS chosen as the third token of row 0, which with the model as its own draft (K = 4) is the second draft of
    the first round: that round accepts it and stops the row there; the other rows go on."""
    ids, mask = make_batch(3, seed=25)
    free, _ = _generate(tiny_gpt2, ids, mask, preset, [])
    P = ids.shape[1]
    eos = int(free[0, P + 2])
    assert eos not in free[0, P : P + 2].tolist() and eos not in free[1:, P:].flatten().tolist(), "change the seed"
    ref, _ = _generate(tiny_gpt2, ids, mask, preset, [eos])
    assert ref[0, P + 2] == eos and (ref[0, P + 3 :] == 0).all() and ref.shape[1] == P + N
    for kind in ("self", "lookup"):
        spec = dict(assistant_model=tiny_gpt2, num_assistant_tokens=4) if kind == "self" else {}
        spec = spec or dict(prompt_lookup_num_tokens=4)
        out, stats = _generate(tiny_gpt2, ids, mask, preset, [eos], **spec)
        assert torch.equal(out, ref), kind
        if kind == "self":
            assert stats.drafted[0] == [4, 4, 4] and stats.accepted[0] == [2, 4, 4]  # the EOS and the draft before it
            assert stats.active[1] == [False, True, True]


def test_prompt_lookup_on_a_prompt_whose_continuation_repeats_it(tiny_llama):
    """The greedy output of a constant prompt falls into a loop; cut inside the loop, it is a prompt whose greedy
    continuation repeats its own tail, which prompt lookup drafts."""
    start = torch.full((1, 8), 669)
    loop = od.generate(tiny_llama, start, max_new_tokens=28, strategy="kv", eos_token_id=[])
    prompt = loop[:, :28]
    ref, _ = _generate(tiny_llama, prompt, None, "kv", [], n=24)
    tail, cont = prompt[0].tolist(), ref[0, 28:36].tolist()
    assert any(tail[i : i + 8] == cont for i in range(len(tail) - 7)), "the continuation should repeat the prompt"
    for k in (1, 3, 5):
        out, stats = _generate(tiny_llama, prompt, None, "kv", [], n=24, prompt_lookup_num_tokens=k)
        assert torch.equal(out, ref), k
        assert stats.acceptance_rate > 0.6 and stats.rounds <= 24 - 8, (k, stats.accepted)


@pytest.mark.parametrize("penalty", [1.5, 0.7])
def test_greedy_with_a_repetition_penalty_over_the_accepted_tokens(tiny_gpt2, unrelated, penalty):
    """The penalty at each verified position counts the drafts accepted before it (0.7 < 1 favours repeats, so
    drafts repeat tokens)."""
    ids, mask = make_batch(3, seed=26)
    kw = dict(repetition_penalty=penalty)
    ref, _ = _generate(tiny_gpt2, ids, mask, "static", [], **kw)
    for spec in (
        dict(prompt_lookup_num_tokens=3),
        dict(assistant_model=tiny_gpt2, num_assistant_tokens=4),
        dict(assistant_model=unrelated["tiny-gpt2"], num_assistant_tokens=2),
    ):
        out, stats = _generate(tiny_gpt2, ids, mask, "static", [], **kw, **spec)
        assert torch.equal(out, ref), spec
    assert stats.acceptance_rate < 0.1  # the unrelated draft: the penalty's tokens come from the model alone


def test_a_streamer_gets_each_steps_tokens_as_without_speculation(tiny_gpt2):
    """Rows advance by different counts; a step's tokens go out once every row's is known. Row 1 stops at step 0."""
    ids, mask = make_batch(3, seed=5)
    free, _ = _generate(tiny_gpt2, ids, mask, "static", [], n=12)
    eos = [int(free[1, ids.shape[1]])]
    streams = []
    for spec in ({}, dict(prompt_lookup_num_tokens=3), dict(assistant_model=tiny_gpt2, num_assistant_tokens=3)):
        got = []
        kw = dict(attention_mask=mask, max_new_tokens=12, strategy="static", eos_token_id=eos, pad_token_id=0)
        out = od.generate(tiny_gpt2, ids, streamer=lambda t, got=got: got.append(t.tolist()), **kw, **spec)
        assert torch.stack([torch.tensor(t) for t in got], dim=1).equal(out[:, ids.shape[1] :])
        streams.append(got)
    assert streams[0] == streams[1] == streams[2] and len(streams[0]) == 12
