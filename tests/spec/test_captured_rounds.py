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


@pytest.mark.parametrize("preset", ["interleaved", "fused"])
@pytest.mark.parametrize("k, n", [(4, N), (3, 9), (2, 2)])
def test_no_round_runs_past_the_last_allowed_token(tiny_llama, unrelated, preset, k, n, monkeypatch):
    """Rounds read one round late (`interleaved`, `fused`): where the rounds enqueued could stop every row (each K + 1
    tokens or fewer from its last), their last report is read before another is enqueued. A round emits at most K + 1
    tokens, so a call that runs to its last allowed token plays no round past it: the rounds played are the rounds
    counted, whether every draft is accepted (the model as its own draft) or about none (an unrelated draft), and the
    tokens are those without speculation."""
    from overlapdecode.loop import rounds

    played = []
    play = rounds.Round.play
    monkeypatch.setattr(rounds.Round, "play", lambda self, generator: (played.append(1), play(self, generator)))
    ids, mask = make_batch(3, seed=26)
    ref, _ = spec_generate(tiny_llama, ids, mask, "kv", [], n)
    for draft in (tiny_llama, unrelated["tiny-llama"]):
        played.clear()
        out, stats = spec_generate(tiny_llama, ids, mask, preset, [], n, assistant_model=draft, num_assistant_tokens=k)
        assert torch.equal(out, ref)
        assert len(played) == stats.rounds, (draft is tiny_llama, len(played), stats.rounds)


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


def _kept_rounds(model) -> dict:
    """id -> Round, the captured rounds `fused` keeps with the caches of `model` (loop/rounds.py)."""
    caches = od.decoder_for(model).fused_model()._caches.values()
    return {id(r): r for c in caches for key, r in c.graphs.items() if key[0] == "round"}


def _drop_kept_rounds(model) -> None:
    for cache in od.decoder_for(model).fused_model()._caches.values():
        for key in [k for k in cache.graphs if k[0] == "round"]:
            del cache.graphs[key]


def _counts(stats):
    return stats.drafted, stats.accepted, stats.active


def test_a_later_fused_call_of_its_shape_replays_the_kept_round(tiny_llama):
    """The round kept with the fused cache (loop/rounds.py Round) serves the next call of its shape: its buffers
    take the new prompt's state (tokens, padding, the rows' histories and seen tokens), so that every call gives
    the tokens without speculation and the rounds' counts (drafts offered, accepted) of a round made for it alone;
    a seed gives the same sampled tokens after another call in between."""
    _drop_kept_rounds(tiny_llama)
    prompts = []
    for seed, pads in ((30, [0, 2, 5]), (31, [3, 0, 1]), (32, [0, 0, 4])):
        ids, mask = make_batch(3, seed=seed)
        for row, n in enumerate(pads):  # each call its own left padding
            mask[row] = 0
            mask[row, n:] = 1
            ids[row, :n] = 0
        prompts.append((ids, mask))
    for spec in (
        dict(prompt_lookup_num_tokens=3),
        dict(prompt_lookup_num_tokens=2, repetition_penalty=0.7),  # < 1: repeats, so lookup's drafts are taken
        dict(assistant_model=tiny_llama, num_assistant_tokens=2),
    ):
        plain = {k: v for k, v in spec.items() if k == "repetition_penalty"}
        first = None
        for ids, mask in prompts:
            ref, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **plain)
            before = _kept_rounds(tiny_llama)
            out, stats = spec_generate(tiny_llama, ids, mask, "fused", [], N, **spec)
            new = set(_kept_rounds(tiny_llama)) - set(before)
            assert torch.equal(out, ref), spec
            if first is None:
                (first,) = new  # made by the first call of this shape and these drafts, kept
            else:
                assert not new and first in _kept_rounds(tiny_llama), spec  # the kept one replayed
            counts = _counts(stats)
            _drop_kept_rounds(tiny_llama)
            again, fresh = spec_generate(tiny_llama, ids, mask, "fused", [], N, **spec)  # a round of its own
            assert torch.equal(again, ref) and _counts(fresh) == counts, spec
            (first,) = _kept_rounds(tiny_llama)  # that one, kept for the next prompt
        if spec.get("repetition_penalty") or "assistant_model" in spec:  # drafts taken: the histories, seen tokens
            assert sum(map(sum, stats.accepted)) > 0, spec  # and draft cache mattered
        ids, mask = prompts[0]
        sampled = dict(do_sample=True, temperature=1.3, top_k=50, seed=7, **spec)
        once, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **sampled)
        spec_generate(tiny_llama, *prompts[1], "fused", [], N, **dict(sampled, seed=8))
        twice, _ = spec_generate(tiny_llama, ids, mask, "fused", [], N, **sampled)
        assert torch.equal(once, twice), spec


def test_a_kept_round_serves_calls_with_other_eos_ids(tiny_llama):
    """The round kept with the fused cache reads the EOS ids from a buffer of one width (sampling.eos_tensor) that
    each call writes: later calls of its shape with no, one or two EOS ids replay it, and stop where their ids say."""
    _drop_kept_rounds(tiny_llama)
    ids, mask = make_batch(3, seed=30)
    two = eos_hit_midway(tiny_llama, ids, mask, N, [0, 2])
    assert two is not None and len(set(two)) == 2, "no usable EOS ids for this batch; change the seed"
    kept = None
    for eos in ([], two[:1], two):
        ref, _ = spec_generate(tiny_llama, ids, mask, "kv", eos, N)
        out, _ = spec_generate(tiny_llama, ids, mask, "fused", eos, N, prompt_lookup_num_tokens=3)
        assert torch.equal(out, ref), eos
        kept = kept or set(_kept_rounds(tiny_llama))
        assert len(kept) == 1 and set(_kept_rounds(tiny_llama)) == kept, eos  # the first call's round, replayed
    _drop_kept_rounds(tiny_llama)


def test_a_kept_round_keeps_no_model_alive():
    """A fused call keeps its round with the model's cache, with the model as its own draft and with another draft
    model, whose round a later call of its shape replays; no kept round keeps a draft model, its fused weights or a
    cache its fused model dropped alive, nor the model once the caller drops it."""
    import gc
    import weakref

    model, draft = (od.load_model("tiny-llama", device="cpu", seed=s) for s in (0, 1))
    ids, mask = make_batch(2, seed=35)
    spec_generate(model, ids, mask, "fused", [], 8, assistant_model=model, num_assistant_tokens=2)
    own = set(_kept_rounds(model))
    assert own
    weights = od.decoder_for(draft).fused_model()

    def draft_rounds(model, fused):
        return [r for i, r in _kept_rounds(model).items() if i not in own and r.draft.fused is fused]

    spec_generate(model, ids, mask, "fused", [], 8, assistant_model=draft, num_assistant_tokens=2)
    (kept,) = draft_rounds(model, weights)
    ids2, mask2 = make_batch(2, seed=36)
    ref, _ = spec_generate(model, ids2, mask2, "kv", [], 8)
    out, _ = spec_generate(model, ids2, mask2, "fused", [], 8, assistant_model=draft, num_assistant_tokens=2)
    assert torch.equal(out, ref) and draft_rounds(model, weights) == [kept], (
        "a later call of its shape replays the kept round"
    )
    weights.clear_caches()  # the draft's fused model drops the cache that round writes: the next call drops the round
    dropped = weakref.ref(kept.draft.cache)
    del kept
    spec_generate(model, *make_batch(3, seed=37), "fused", [], 8, assistant_model=draft, num_assistant_tokens=2)
    gc.collect()
    assert dropped() is None and len(draft_rounds(model, weights)) == 1, (
        "a round kept a cache its draft's fused model dropped"
    )
    gone, weights = weakref.ref(draft), weakref.ref(weights)  # its re-laid-out weights
    del draft
    gc.collect()
    assert gone() is None and weights() is None, "the draft model or its fused weights outlived its caller"
    assert set(_kept_rounds(model)) == own, "a collected draft's round stayed with the model's cache"
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None, "the model outlived its caller"


def test_the_compiled_bookkeeping_takes_the_same_tokens(tiny_llama, monkeypatch):
    """Where the rounds compile (COMPILED_ON: CUDA; here the CPU too), prompt lookup, a round's start, what its
    verify forward is fed, a greedy round's end and the report run compiled by inductor: the tokens stay those
    without speculation (repetition penalty included), the drafts offered and accepted those of the eager rounds,
    and dynamo compiled each of the five (fullgraph: a graph break would raise)."""
    from overlapdecode.loop import rounds
    from overlapdecode.loop.compiling import compile_count

    ids, mask = make_batch(3, seed=40)
    settings = [
        dict(kw, **extra)
        for kw in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=tiny_llama, num_assistant_tokens=2))
        for extra in ({}, dict(repetition_penalty=0.7))
    ]
    eager = []
    for spec in settings:
        _drop_kept_rounds(tiny_llama)
        eager.append(_counts(spec_generate(tiny_llama, ids, mask, "fused", [5, 7], N, **spec)[1]))
    monkeypatch.setattr(rounds, "COMPILED_ON", ("cuda", "cpu"))
    before = compile_count()
    for spec, counts in zip(settings, eager):
        _drop_kept_rounds(tiny_llama)
        plain = {k: v for k, v in spec.items() if k == "repetition_penalty"}
        ref, _ = spec_generate(tiny_llama, ids, mask, "kv", [5, 7], N, **plain)
        out, stats = spec_generate(tiny_llama, ids, mask, "fused", [5, 7], N, **spec)
        assert torch.equal(out, ref) and _counts(stats) == counts, list(spec)  # the same drafts, the same tokens
    assert compile_count() - before >= 5
    _drop_kept_rounds(tiny_llama)  # rounds with compiled bookkeeping: none kept past this test
