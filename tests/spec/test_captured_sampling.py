"""Speculative sampling on `compiled`, `interleaved` and `fused` (CPU, float32): a seed gives the tokens `kv` and
`static` give with the same speculation (the same draws in the same order: spec/state.py play_round), under every
warper and the repetition penalty, with a row stopping mid-way; so their law is the reference's, which
tests/spec/test_sampling_rounds.py checks against the model's distribution. The rounds' Hugging Face forwards,
compiled as CUDA compiles them, trace whole (a CPU compile forced once)."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.loop import rounds
from support.helpers import make_batch
from support.spec_checks import spec_generate

N = 12
ALL = dict(temperature=0.8, top_k=30, top_p=0.8, min_p=0.05, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def unrelated_llama():
    return od.load_model("tiny-llama", device="cpu", seed=1)


def _sample(model, ids, mask, preset, seed, eos, **spec):
    return spec_generate(model, ids, mask, preset, eos, N, do_sample=True, seed=seed, **ALL, **spec)[0]


def test_a_seed_gives_the_tokens_of_the_reference_loop(tiny_llama, unrelated_llama):
    ids, mask = make_batch(4, seed=30)
    P = ids.shape[1]
    for kind, spec in {
        "lookup": dict(prompt_lookup_num_tokens=3),
        "self": dict(assistant_model=tiny_llama, num_assistant_tokens=3),
        "unrelated": dict(assistant_model=unrelated_llama, num_assistant_tokens=2),
    }.items():
        free = _sample(tiny_llama, ids, mask, "kv", 5, [], **spec)
        eos = [int(free[0, P + 3])]  # row 0 stops mid-way
        want = _sample(tiny_llama, ids, mask, "kv", 5, eos, **spec)
        assert want.shape[1] < P + N or (want[0, P + 4 :] == 0).all(), kind
        for preset in ("compiled", "interleaved", "fused"):
            assert torch.equal(_sample(tiny_llama, ids, mask, preset, 5, eos, **spec), want), (kind, preset)
        assert not torch.equal(_sample(tiny_llama, ids, mask, "fused", 6, eos, **spec), want), kind


def test_a_seed_gives_the_same_tokens_on_gpt2_with_a_sampling_draft(tiny_gpt2):
    """GPT-2's learned positions, the model drafting for itself by sampling (each draft's noise drawn in the round)."""
    ids, mask = make_batch(3, seed=31)
    spec = dict(assistant_model=tiny_gpt2, num_assistant_tokens=4)
    want = _sample(tiny_gpt2, ids, mask, "static", 2, [], **spec)
    for preset in ("interleaved", "fused"):
        assert torch.equal(_sample(tiny_gpt2, ids, mask, preset, 2, [], **spec), want), preset
    assert od.decoder_for(tiny_gpt2).last_speculation.acceptance_rate > 0.9  # p and q the same up to rounding


def test_the_rounds_forwards_compile_whole(monkeypatch):
    """On CUDA the compiled presets' rounds run their Hugging Face forwards compiled (fullgraph: a graph break is an
    error), the verify over K + 1 tokens against a cache with holes, the draft's over one; forced on this CPU once.
    A later call of the same shapes compiles nothing more. A model of its own, so that the compile count rises here."""
    monkeypatch.setattr(rounds, "COMPILED_ON", ("cuda", "cpu"))
    model = od.load_model("tiny-gpt2", device="cpu")
    ids, mask = make_batch(2, seed=9)
    ref, _ = spec_generate(model, ids, mask, "kv", [], 10)
    start = od.compile_count()
    for spec in (dict(assistant_model=model, num_assistant_tokens=2), dict(prompt_lookup_num_tokens=2)):
        out, _ = spec_generate(model, ids, mask, "compiled", [], 10, **spec)
        assert torch.equal(out, ref), list(spec)
    assert od.compile_count() >= start + 2  # the verify (B, 3) and the draft's step (B, 1)
    done = od.compile_count()
    for spec in (dict(assistant_model=model, num_assistant_tokens=2), dict(prompt_lookup_num_tokens=2)):
        out, _ = spec_generate(model, ids, mask, "interleaved", [], 10, **spec)  # new caches, the same shapes
        assert torch.equal(out, ref), list(spec)
    assert od.compile_count() == done
