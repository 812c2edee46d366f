"""Speculative decoding on `compiled`, `interleaved` and `fused` (loop/rounds.py; CPU, float32, the round run eagerly
as CUDA would capture it): greedy tokens exactly those of the same preset without speculation for K = 1..5 at batch
1 and 3 with left padding and an EOS mid-way, for prompt lookup, the model as its own draft (every draft accepted)
and an unrelated draft (about none); an EOS accepted inside a run; the last allowed token; the repetition penalty
over accepted drafts; stop checks read 1, 3 or every round late; a draft of a family `fused` lacks."""

from __future__ import annotations

import pytest
import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

import overlapdecode as od
from support.helpers import eos_hit_midway, make_batch
from support.spec_checks import all_accepted_but_past_eos, expected_drafts, spec_generate

N = 16
CAPTURED = ["compiled", "interleaved", "fused"]


@pytest.fixture(scope="module")
def unrelated():
    """name -> the tiny model of that name with other random weights (seed 1): a draft that is about never right."""
    return {name: od.load_model(name, device="cpu", seed=1) for name in ("tiny-gpt2", "tiny-llama")}


def _name(model) -> str:
    return "tiny-gpt2" if model.config.model_type == "gpt2" else "tiny-llama"


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("preset", CAPTURED)
def test_greedy_tokens_are_those_of_the_preset_without_speculation(tiny_model, unrelated, preset, batch):
    ids, mask = make_batch(batch, seed=20 + batch)
    eos = eos_hit_midway(tiny_model, ids, mask, N, [0])  # row 0 stops mid-way, the others run to the end
    assert eos is not None, "the batch has no usable EOS; change the seed"
    ref, none = spec_generate(tiny_model, ids, mask, preset, eos, N)
    assert none is None or none.k > 0  # a call without speculation leaves the last one's counts
    assert ref.shape[1] == ids.shape[1] + N if batch > 1 else ref.shape[1] < ids.shape[1] + N
    drafts = {"lookup": {}, "self": dict(assistant_model=tiny_model), "unrelated": {}}
    drafts["unrelated"] = dict(assistant_model=unrelated[_name(tiny_model)])
    for k in (1, 2, 3, 4, 5):
        for kind, spec in drafts.items():
            spec = dict(spec, **({"prompt_lookup_num_tokens": k} if kind == "lookup" else {"num_assistant_tokens": k}))
            out, stats = spec_generate(tiny_model, ids, mask, preset, eos, N, **spec)
            assert torch.equal(out, ref), (k, kind)
            assert stats.k == k and stats.rounds < N
            if kind == "self":  # every draft accepted, but those after an EOS accepted in the row's last round
                assert all_accepted_but_past_eos(stats), (k, stats.drafted, stats.accepted)
            if kind == "unrelated":
                assert stats.acceptance_rate < 0.1, (k, stats.accepted)


@pytest.mark.parametrize("preset", ["interleaved", "fused"])
@pytest.mark.parametrize("k, n", [(2, N), (5, N), (4, 7), (3, 5)])
def test_the_model_as_its_own_draft_accepts_every_draft(tiny_llama, preset, k, n):
    ids, mask = make_batch(3, seed=24)
    ref, _ = spec_generate(tiny_llama, ids, mask, "kv", [], n)
    out, stats = spec_generate(tiny_llama, ids, mask, preset, [], n, assistant_model=tiny_llama, num_assistant_tokens=k)
    assert torch.equal(out, ref) and out.shape[1] == ids.shape[1] + n  # up to the last allowed token
    want = expected_drafts(k, n)
    assert stats.drafted == [[d] * 3 for d in want] and stats.accepted == stats.drafted
    assert stats.active == [[True] * 3] * len(want)  # the rounds run late by the stop check are not counted


@pytest.mark.parametrize("preset", CAPTURED)
def test_a_row_that_accepts_its_eos_stops_there(tiny_gpt2, preset):
    """EOS chosen as the third token of row 0, which with the model as its own draft (K = 4) is the second draft of
    the first round: that round accepts it and stops the row there; the other rows go on."""
    ids, mask = make_batch(3, seed=25)
    free, _ = spec_generate(tiny_gpt2, ids, mask, preset, [], N)
    P = ids.shape[1]
    eos = int(free[0, P + 2])
    assert eos not in free[0, P : P + 2].tolist() and eos not in free[1:, P:].flatten().tolist(), "change the seed"
    ref, _ = spec_generate(tiny_gpt2, ids, mask, preset, [eos], N)
    assert ref[0, P + 2] == eos and (ref[0, P + 3 :] == 0).all() and ref.shape[1] == P + N
    for spec in (dict(assistant_model=tiny_gpt2, num_assistant_tokens=4), dict(prompt_lookup_num_tokens=4)):
        out, stats = spec_generate(tiny_gpt2, ids, mask, preset, [eos], N, **spec)
        assert torch.equal(out, ref), list(spec)
        if "assistant_model" in spec:
            assert stats.drafted[0] == [4, 4, 4] and stats.accepted[0] == [2, 4, 4]  # the EOS and the draft before
            assert stats.active[1] == [False, True, True]


@pytest.mark.parametrize("preset", ["compiled", "fused"])
def test_prompt_lookup_on_a_prompt_whose_continuation_repeats_it(tiny_llama, preset):
    start = torch.full((1, 8), 669)
    prompt = od.generate(tiny_llama, start, max_new_tokens=28, strategy="kv", eos_token_id=[])[:, :28]
    ref, _ = spec_generate(tiny_llama, prompt, None, preset, [], 24)
    tail, cont = prompt[0].tolist(), ref[0, 28:36].tolist()
    assert any(tail[i : i + 8] == cont for i in range(len(tail) - 7)), "the continuation should repeat the prompt"
    for k in (1, 3, 5):
        out, stats = spec_generate(tiny_llama, prompt, None, preset, [], 24, prompt_lookup_num_tokens=k)
        assert torch.equal(out, ref), k
        assert stats.acceptance_rate > 0.6 and stats.rounds <= 24 - 8, (k, stats.accepted)


@pytest.mark.parametrize("preset", CAPTURED)
def test_greedy_with_a_repetition_penalty_over_the_accepted_tokens(tiny_gpt2, unrelated, preset):
    ids, mask = make_batch(3, seed=26)
    kw = dict(repetition_penalty=0.7)  # < 1 favours repeats, so drafts repeat tokens
    ref, _ = spec_generate(tiny_gpt2, ids, mask, preset, [], N, **kw)
    for spec in (
        dict(prompt_lookup_num_tokens=3),
        dict(assistant_model=tiny_gpt2, num_assistant_tokens=4),
        dict(assistant_model=unrelated["tiny-gpt2"], num_assistant_tokens=2),
    ):
        out, _ = spec_generate(tiny_gpt2, ids, mask, preset, [], N, **kw, **spec)
        assert torch.equal(out, ref), spec


@pytest.mark.parametrize("strategy", ["interleaved:3", "deferred", "nocheck", "fused:2"])
def test_a_stop_read_late_gives_the_same_tokens_and_counts(tiny_gpt2, strategy):
    """Rounds enqueued past the one after which every row stopped change nothing (every row stops mid-way here)."""
    ids, mask = make_batch(4, seed=4)
    eos = eos_hit_midway(tiny_gpt2, ids, mask, N, [0, 1, 2, 3])
    assert eos is not None
    ref, _ = spec_generate(tiny_gpt2, ids, mask, "kv", eos, N)
    assert ref.shape[1] < ids.shape[1] + N
    for spec in (dict(prompt_lookup_num_tokens=2), dict(assistant_model=tiny_gpt2, num_assistant_tokens=3)):
        want, counts = spec_generate(tiny_gpt2, ids, mask, "static", eos, N, **spec)
        out, stats = spec_generate(tiny_gpt2, ids, mask, strategy, eos, N, **spec)
        assert torch.equal(out, ref) and torch.equal(out, want), spec
        assert (stats.drafted, stats.accepted, stats.active) == (counts.drafted, counts.accepted, counts.active)


def test_a_streamer_gets_each_steps_tokens_as_without_speculation(tiny_gpt2):
    """Rows advance by different counts; a step's tokens go out once every row's is read. Row 1 stops at step 0."""
    ids, mask = make_batch(3, seed=5)
    free, _ = spec_generate(tiny_gpt2, ids, mask, "static", [], 12)
    eos = [int(free[1, ids.shape[1]])]
    streams = []
    for strategy, spec in (
        ("kv", {}),
        ("interleaved", dict(prompt_lookup_num_tokens=3)),
        ("fused", dict(assistant_model=tiny_gpt2, num_assistant_tokens=3)),
        ("compiled", dict(assistant_model=tiny_gpt2, num_assistant_tokens=5)),
    ):
        got = []
        kw = dict(attention_mask=mask, max_new_tokens=12, strategy=strategy, eos_token_id=eos, pad_token_id=0)
        out = od.generate(tiny_gpt2, ids, streamer=lambda t, got=got: got.append(t.tolist()), **kw, **spec)
        assert torch.stack([torch.tensor(t) for t in got], dim=1).equal(out[:, ids.shape[1] :]), strategy
        streams.append(got)
    assert all(s == streams[0] for s in streams) and len(streams[0]) == 12


def test_a_draft_of_a_family_fused_lacks_runs_on_a_static_cache(tiny_llama, monkeypatch):
    torch.manual_seed(0)
    config = GPTNeoXConfig(
        vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=256,
    )  # fmt: skip
    draft = GPTNeoXForCausalLM(config).eval()
    calls = []
    forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    ids, mask = make_batch(3, seed=21)
    ref, _ = spec_generate(tiny_llama, ids, mask, "fused", [], 12)
    out, stats = spec_generate(tiny_llama, ids, mask, "fused", [], 12, assistant_model=draft, num_assistant_tokens=3)
    assert torch.equal(out, ref)
    assert len(calls) == 1 + 4 * stats.rounds  # its prefill, then K + 1 one-token forwards a round
    assert od.decoder_for(draft)._fused.fused is None  # never fused


def test_a_later_fused_call_of_its_shape_replays_the_kept_round(tiny_llama):
    """The round kept with the fused cache (loop/rounds.py Round) serves the next call of its shape: its buffers
    take the new prompt's state (tokens, lengths, padding), greedy gives the tokens without speculation, and a seed
    the same sampled tokens after another call in between."""
    fused = od.decoder_for(tiny_llama).fused_model()

    def kept():
        return {id(r): r for c in fused._caches.values() for key, r in c.graphs.items() if key[0] == "round"}

    for spec in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=tiny_llama, num_assistant_tokens=2)):
        first = None
        for seed in (30, 31, 32):
            ids, mask = make_batch(3, seed=seed)
            ref, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N)
            before = kept()
            out, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **spec)
            assert torch.equal(out, ref), (spec, seed)
            new = set(kept()) - set(before)
            if first is None:
                (first,) = new  # one Round made by the first call of this shape and these drafts
            assert not new or new == {first}, (spec, seed)
            assert first in kept()
        ids, mask = make_batch(3, seed=33)
        sampled = dict(do_sample=True, temperature=1.3, top_k=50, seed=7, **spec)
        once, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **sampled)
        spec_generate(tiny_llama, *make_batch(3, seed=34), "fused", [], N, **dict(sampled, seed=8))
        again, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **sampled)
        assert torch.equal(once, again), spec


def test_the_compiled_bookkeeping_takes_the_same_tokens(tiny_llama, monkeypatch):
    """Where the rounds compile (COMPILED_ON: CUDA; here the CPU too), prompt lookup and a greedy round's end run
    compiled by inductor: the tokens stay those without speculation (repetition penalty included), and dynamo
    compiled them (fullgraph: a graph break would raise)."""
    from overlapdecode.loop import rounds
    from overlapdecode.loop.compiling import compile_count

    monkeypatch.setattr(rounds, "COMPILED_ON", ("cuda", "cpu"))
    before = compile_count()
    ids, mask = make_batch(3, seed=40)
    for kw in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=tiny_llama, num_assistant_tokens=2)):
        for extra in ({}, dict(repetition_penalty=0.7)):
            ref, _ = spec_generate(tiny_llama, ids, mask, "kv", [5, 7], N, **extra)
            out, _ = spec_generate(tiny_llama, ids, mask, "fused", [5, 7], N, **kw, **extra)
            assert torch.equal(out, ref), (list(kw), extra)
    assert compile_count() > before
