"""Rotary embeddings whose tables change with the length under compile (rope.py): dynamic NTK and LongRoPE give
Hugging Face generate()'s tokens under compiled and interleaved, with one decode-step graph per shape; for
LongRoPE one graph serves calls before and past original_max_position_embeddings (the table chosen on the
device), and a call that crosses it is refused for every cache (baseline recomputes it). Without rope.py these
compiles ended in a compiler traceback (Hugging Face picks the table with Python branches on the positions)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

import overlapdecode as od
from support.helpers import hf_generate, make_batch, naive_generate

SMALL = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    eos_token_id=2,
    tie_word_embeddings=False,
    initializer_range=0.1,
)
ORIGINAL = 16  # LongRoPE's original_max_position_embeddings: an 8-token prompt + 20 tokens crosses it
# (Phi3Config copies its own original_max_position_embeddings field into rope_parameters: both are set)


def _longrope(rotary_dims: int, long_factor=None, partial: float = 1.0) -> dict:
    short = [1.0 + 0.1 * i for i in range(rotary_dims // 2)]
    return dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=short,
        partial_rotary_factor=partial,
        long_factor=long_factor or [2.0 + 0.5 * i for i in range(rotary_dims // 2)],
        original_max_position_embeddings=ORIGINAL,
    )


def _model(name: str, long_factor=None):
    torch.manual_seed(0)
    if name == "llama-dynamic":
        rope = dict(rope_type="dynamic", factor=4.0, rope_theta=10000.0)
        return LlamaForCausalLM(LlamaConfig(**SMALL, rope_parameters=rope)).eval()
    if name == "phi3-longrope":
        config = Phi3Config(
            **SMALL,
            rope_parameters=_longrope(16, long_factor),
            original_max_position_embeddings=ORIGINAL,
            pad_token_id=0,
        )
        return Phi3ForCausalLM(config).eval()
    if name == "phi4-style":  # partial rotary (12 of 16 dims), LongRoPE: Phi-4-mini's shape of rotary config
        config = Phi3Config(
            **SMALL,
            rope_parameters=_longrope(12, long_factor, 0.75),
            partial_rotary_factor=0.75,
            original_max_position_embeddings=ORIGINAL,
            pad_token_id=0,
        )
        return Phi3ForCausalLM(config).eval()
    raise AssertionError(name)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _generate(model, ids, mask, n, strategy):
    return od.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[], pad_token_id=0
    )


def test_dynamic_ntk_matches_hf_compiled_with_one_graph():
    model = _model("llama-dynamic")
    ids, mask = make_batch(4, seed=3, prompt_len=8, high=512)
    ref = hf_generate(model, ids, mask, 20, [], 0)
    before = od.compile_count()
    for strategy in ("compiled", "interleaved", "compiled"):
        assert torch.equal(_generate(model, ids, mask, 20, strategy), ref), strategy
    assert od.compile_count() - before == 1
    assert torch.equal(hf_generate(model, ids, mask, 20, [], 0), ref)  # Hugging Face's own forward is untouched


@pytest.mark.parametrize("name", ["phi3-longrope", "phi4-style"])
def test_longrope_short_and_long_calls_share_one_graph_and_match_hf(name):
    """A call before original_max_position_embeddings (short factors) and one past it (long factors) have the same
    shape: one compiled graph, whose table is chosen on the device, gives Hugging Face's tokens on both sides."""
    model = _model(name)
    short_ids, short_mask = make_batch(4, seed=3, prompt_len=8, high=512)  # lengths 8 .. 15: short factors
    long_ids, long_mask = make_batch(4, seed=4, prompt_len=ORIGINAL + 4, high=512)  # 20 ..: long factors
    refs = [hf_generate(model, short_ids, short_mask, 8, [], 0), hf_generate(model, long_ids, long_mask, 8, [], 0)]
    before = od.compile_count()
    for strategy in ("compiled", "interleaved"):
        assert torch.equal(_generate(model, short_ids, short_mask, 8, strategy), refs[0]), strategy
        assert torch.equal(_generate(model, long_ids, long_mask, 8, strategy), refs[1]), strategy
    assert od.compile_count() - before == 1  # the cache length rounds both calls to 64 slots
    # the long factors matter: with them equal to the short ones, Hugging Face gives other tokens past the switch
    rotary = len(model.config.rope_parameters["short_factor"])
    twin = _model(name, long_factor=[1.0 + 0.1 * i for i in range(rotary)])
    assert not torch.equal(hf_generate(twin, long_ids, long_mask, 8, [], 0), refs[1])
    assert torch.equal(hf_generate(twin, short_ids, short_mask, 8, [], 0), refs[0])


def test_a_call_crossing_the_longrope_switch_is_refused_for_caches_and_baseline_recomputes():
    """Crossing original_max_position_embeddings within a call, the cached keys would keep the short factors'
    rotation while the model means every position rotated with the long ones: every cache strategy is refused;
    the no-cache loop recomputes each step, and gives the naive loop's tokens."""
    model = _model("phi3-longrope")
    ids, mask = make_batch(4, seed=3, prompt_len=8, high=512)
    for strategy in ("kv", "static", "compiled", "interleaved"):
        with pytest.raises(
            ValueError,
            match=rf"strategy '{strategy}': Phi3ForCausalLM's LongRoPE switches from its "
            r"short to its long factors past 16 positions, and this call crosses it "
            r"\(a prompt of 8 \+ 20 new tokens\).*use strategy='baseline'",
        ):
            _generate(model, ids, mask, 20, strategy)
    assert torch.equal(_generate(model, ids, mask, 20, "baseline"), naive_generate(model, ids, mask, 20, [], 0))
    assert torch.equal(_generate(model, ids, mask, 8, "kv"), hf_generate(model, ids, mask, 8, [], 0))  # 8 + 8: no
