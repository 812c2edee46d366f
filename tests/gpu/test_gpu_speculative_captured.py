"""On a real GPU: speculative decoding's captured rounds (loop/rounds.py) on `compiled`, `interleaved` and `fused`,
GPT-2 124M's shape and a two-layer Llama at Llama-3.2-1B's widths, random weights, float32. Greedy: for 200 tokens
the tokens of the same preset without speculation at batch 1 and 4 (left padding), for prompt lookup, the model as
its own draft (its drafts accepted) and an unrelated draft, a divergence accepted only after a near tie of Hugging
Face's top two logits (the verify step's matrix shapes differ from the one-token step's: float32 rounds otherwise);
no host sync inside a round (the round captured, and run under torch.cuda.set_sync_debug_mode("error")); sampling
with a seed gives the tokens of `kv` and `static` with the same speculation; bfloat16 runs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import overlapdecode as od
from overlapdecode.loop.step_graph import GraphCapture
from support.fused_steps import hf_greedy
from support.greedy_checks import near_ties
from support.helpers import make_batch

DEV = "cuda"
N = 200
CAPTURED = ["compiled", "interleaved", "fused"]


def _small_llama(seed: int):
    """Llama-3.2-1B's widths and vocabulary, two layers, Hugging Face's initial weights."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=2, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, max_position_embeddings=4096, rope_theta=500000.0,
        tie_word_embeddings=True,
    )  # fmt: skip
    return LlamaForCausalLM(cfg).to(DEV).eval()


@pytest.fixture(scope="module", params=["gpt2-random", "llama-1b-small"])
def pair(request):
    """(model, an unrelated draft of its vocabulary)."""
    if request.param == "gpt2-random":
        return od.load_model("gpt2-random", device=DEV), od.load_model("gpt2-random", device=DEV, seed=1)
    return _small_llama(0), _small_llama(1)


def _same_or_after_a_tie(model, ids, mask, out, ref, label: str) -> None:
    """`out` equals `ref`, or first differs after a step where Hugging Face's top two logits were within a tie."""
    if torch.equal(out, ref):
        return
    P = ids.shape[1]
    diff = (out[:, P:] != ref[:, P:]).any(0).nonzero().flatten()
    first = int(diff[0])
    ties = near_ties(hf_greedy(model, ids, mask, N).logits)
    print(f"{label}: first divergence {first}, near-tie steps {ties}")
    assert any(t <= first for t in ties), f"{label}: diverged at step {first} with no near tie before"


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("preset", CAPTURED)
@torch.no_grad()
def test_greedy_200_tokens_are_those_without_speculation(pair, preset, batch):
    model, other = pair
    vocab = model.config.vocab_size
    ids, mask = make_batch(batch, seed=batch, prompt_len=16, low=0, high=vocab - 1, device=DEV)
    kw = dict(attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=[])
    ref = od.generate(model, ids, **kw)
    for label, spec in (
        ("lookup", dict(prompt_lookup_num_tokens=4)),
        ("self", dict(assistant_model=model, num_assistant_tokens=4)),
        ("unrelated", dict(assistant_model=other, num_assistant_tokens=3)),
    ):
        out = od.generate(model, ids, **kw, **spec)
        _same_or_after_a_tie(model, ids, mask, out, ref, f"{preset} B={batch} {label}")
        stats = od.decoder_for(model).last_speculation
        print(f"{preset} B={batch} {label}: {stats.rounds} rounds, acceptance {stats.acceptance_rate:.3f}")
        if label == "self":  # one forward of K + 1 tokens against K + 1 of one: equal up to float32 rounding
            assert stats.acceptance_rate > 0.98 and stats.rounds <= -(-(N - 1) // 5) + 2
        if label == "unrelated":
            assert stats.acceptance_rate < 0.1


@pytest.mark.parametrize("preset", CAPTURED)
@torch.no_grad()
def test_no_host_sync_inside_a_round(preset, monkeypatch):
    """A warm call compiles what the rounds run; the next call's rounds (the eager first, the capture, every replay)
    run under set_sync_debug_mode("error"), which raises at any host sync; the capture itself would fail on one. A
    third call of `fused` replays the round the second captured and kept."""
    model = od.load_model("gpt2-random", device=DEV)
    ids, mask = make_batch(2, seed=3, prompt_len=16, low=0, high=50000, device=DEV)
    kw = dict(attention_mask=mask, max_new_tokens=48, strategy=preset, eos_token_id=[])
    run, runs = GraphCapture.run, []

    def strict(self, fn, *first):
        def checked():
            torch.cuda.set_sync_debug_mode("error")
            try:
                fn()
            finally:
                torch.cuda.set_sync_debug_mode("default")

        runs.append(self)
        run(self, checked, *first)

    for spec in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=model, num_assistant_tokens=3)):
        warm = od.generate(model, ids, **kw, **spec)
        _drop_kept_rounds(model, preset)  # so that the next call runs its first round eagerly and captures it again
        monkeypatch.setattr(GraphCapture, "run", strict)
        out = od.generate(model, ids, **kw, **spec)
        assert torch.equal(out, warm), list(spec)
        assert len(runs) >= 3 and runs[-1].graph is not None and runs[-1].eager_runs == 1  # captured, replayed
        graph = runs[-1]
        runs.clear()
        again = od.generate(model, ids, **kw, **spec)  # `fused` keeps its round: every round a replay
        monkeypatch.setattr(GraphCapture, "run", run)
        assert torch.equal(again, warm), list(spec)
        if preset == "fused":
            assert all(r is graph for r in runs) and graph.eager_runs == 1
        runs.clear()


def _drop_kept_rounds(model, preset: str) -> None:
    """Forget the captured rounds `fused` keeps with its caches (loop/rounds.py Round)."""
    if preset == "fused":
        for cache in od.decoder_for(model).fused_model()._caches.values():
            for key in [k for k in cache.graphs if k[0] == "round"]:
                del cache.graphs[key]


@torch.no_grad()
def test_sampling_with_a_seed_gives_the_reference_loops_tokens(pair):
    model, other = pair
    ids, mask = make_batch(4, seed=7, prompt_len=16, low=0, high=model.config.vocab_size - 1, device=DEV)
    setting = dict(temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.2)
    kw = dict(attention_mask=mask, max_new_tokens=32, eos_token_id=[], do_sample=True, seed=3, **setting)
    for spec in (dict(prompt_lookup_num_tokens=4), dict(assistant_model=other, num_assistant_tokens=3)):
        want = od.generate(model, ids, strategy="kv", **kw, **spec)
        for preset in ("static", *CAPTURED):
            assert torch.equal(od.generate(model, ids, strategy=preset, **kw, **spec), want), (preset, list(spec))
        # again: `fused` replays the round it kept (prompt lookup), its generator reseeded from the call's
        assert torch.equal(od.generate(model, ids, strategy="fused", **kw, **spec), want), list(spec)


@torch.no_grad()
def test_bfloat16_runs_and_the_model_as_its_own_draft_is_mostly_accepted():
    """bfloat16 makes no exactness promise (a K + 1-token forward rounds otherwise than a one-token one)."""
    model = od.load_model("gpt2-random", device=DEV, dtype="bfloat16")
    ids, mask = make_batch(4, seed=8, device=DEV)
    for preset in CAPTURED:
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=64, strategy=preset, eos_token_id=[],
            assistant_model=model, num_assistant_tokens=4,
        )  # fmt: skip
        assert out.shape == (4, ids.shape[1] + 64), preset
        assert od.decoder_for(model).last_speculation.acceptance_rate > 0.5, preset
