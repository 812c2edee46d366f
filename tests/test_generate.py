"""Every preset returns exactly Hugging Face generate()'s tokens (greedy, CPU, float32) and the naive loop's."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import eos_hit_midway, hf_generate, make_batch, naive_generate

N = 24
PRESETS = list(od.PRESETS) + list(od.VARIANTS)


@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("preset", PRESETS)
def test_matches_hf_with_eos_midway(tiny_model, preset, batch):
    ids, mask = make_batch(batch, seed=batch)
    # batch 1: the row stops mid-way; batch 4: rows 0 and 2 stop mid-way, rows 1 and 3 never do
    rows = [0] if batch == 1 else [0, 2]
    eos = eos_hit_midway(tiny_model, ids, mask, N, rows)
    assert eos is not None, "test batch has no usable EOS; change the seed"
    pad = 5
    ref = hf_generate(tiny_model, ids, mask, N, eos, pad)
    assert torch.equal(ref, naive_generate(tiny_model, ids, mask, N, eos, pad))
    out = od.generate(
        tiny_model, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=eos, pad_token_id=pad
    )
    assert out.shape == ref.shape
    assert torch.equal(out, ref)
    if batch == 1:
        assert out.shape[1] < ids.shape[1] + N  # the stop really happened early
    else:
        assert (out[[0, 2], -1] == pad).all()  # stopped rows continue with pad


@pytest.mark.parametrize("preset", PRESETS)
def test_every_row_stops_at_a_different_step(tiny_gpt2, preset):
    ids, mask = make_batch(4, seed=4)
    eos = eos_hit_midway(tiny_gpt2, ids, mask, N, [0, 1, 2, 3])
    assert eos is not None
    ref = naive_generate(tiny_gpt2, ids, mask, N, eos, eos[0])
    assert ref.shape[1] < ids.shape[1] + N, "the batch should stop before max_new_tokens"
    assert torch.equal(ref, hf_generate(tiny_gpt2, ids, mask, N, eos, eos[0]))
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=eos)
    assert torch.equal(out, ref)  # pad defaults to the first EOS id, as in Hugging Face


@pytest.mark.parametrize("preset", ["baseline", "kv", "static", "interleaved"])
def test_eos_disabled_runs_full_length(tiny_gpt2, preset):
    ids, mask = make_batch(4, seed=7)
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=[])
    assert out.shape == (4, ids.shape[1] + N)
    ref = naive_generate(tiny_gpt2, ids, mask, N, [], 0)
    assert torch.equal(out, ref)


def test_default_eos_comes_from_the_model(tiny_gpt2):
    ids, mask = make_batch(2, seed=3)
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy="kv")
    ref = hf_generate(
        tiny_gpt2, ids, mask, N, tiny_gpt2.generation_config.eos_token_id, tiny_gpt2.generation_config.eos_token_id
    )
    assert torch.equal(out, ref)


@pytest.mark.parametrize("preset", ["kv", "static", "fused"])
def test_default_pad_is_the_generation_configs_pad_id(preset):
    """Without pad_token_id, rows past their EOS hold the generation config's pad id (not the first EOS id), as in
    Hugging Face generate(); a model of its own, as its generation config is changed."""
    model = od.load_model("tiny-llama", device="cpu")
    ids, mask = make_batch(4, seed=1)
    eos = eos_hit_midway(model, ids, mask, N, [0, 2])
    assert eos is not None
    model.generation_config.pad_token_id = 5
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=N, do_sample=False, eos_token_id=eos)
    assert (ref[[0, 2], -1] == 5).all()
    out = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=eos)
    assert torch.equal(out, ref)


@pytest.mark.parametrize("preset", ["kv", "static", "fused"])
def test_a_missing_mask_is_inferred_from_the_pad_id(tiny_llama, preset):
    """Without attention_mask, a prompt holding a pad id that is no EOS id is masked where it holds it, as Hugging
    Face generate() infers the mask."""
    ids, mask = make_batch(4, seed=6)
    ids = ids.masked_fill(mask == 0, 7)  # left padding with the pad id, as a tokenizer pads
    ref = tiny_llama.generate(ids, max_new_tokens=N, do_sample=False, eos_token_id=2, pad_token_id=7)
    assert torch.equal(ref, hf_generate(tiny_llama, ids, mask, N, 2, 7))
    out = od.generate(tiny_llama, ids, max_new_tokens=N, strategy=preset, eos_token_id=2, pad_token_id=7)
    assert torch.equal(out, ref)


def test_a_pad_id_inside_a_prompt_without_a_mask_is_refused(tiny_llama):
    ids, _ = make_batch(2, seed=6)
    ids[1, 3] = 7
    with pytest.raises(ValueError, match="pad id 7 other than as left padding.*attention_mask"):
        od.generate(tiny_llama, ids, max_new_tokens=4, strategy="kv", eos_token_id=2, pad_token_id=7)


def test_mask_none_means_all_ones(tiny_gpt2):
    ids, _ = make_batch(2, seed=11)
    a = od.generate(tiny_gpt2, ids, max_new_tokens=8, strategy="static", eos_token_id=[])
    b = od.generate(
        tiny_gpt2, ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, strategy="static", eos_token_id=[]
    )
    assert torch.equal(a, b)


def test_custom_strategy_object(tiny_llama):
    ids, mask = make_batch(4, seed=2)
    strat = od.Strategy(cache="dynamic", stop_check="deferred", lag=2)
    out = od.generate(tiny_llama, ids, attention_mask=mask, max_new_tokens=N, strategy=strat, eos_token_id=[])
    assert torch.equal(out, naive_generate(tiny_llama, ids, mask, N, [], 0))


def test_compiled_step_compiles_once_per_shape():
    """The first compiled call of a model compiles (the count rises: a step that silently ran eagerly would not),
    and later calls of the same shape, by either compiled preset and with 0, 1 or 2 EOS ids (the EOS tensor has one
    width for up to 4: sampling.eos_tensor), compile nothing more and give Hugging Face's tokens. A model of its
    own, so that no other test has compiled its shape before, and a shape no other test uses (5 rows of 13 tokens,
    N + 3 new ones: a worker process of `-n` runs other tests first, and dynamo's cache serves any model of a shape
    it has compiled)."""
    model = od.load_model("tiny-gpt2", device="cpu")
    ids, mask = make_batch(5, seed=4, prompt_len=13)
    start = od.compile_count()
    od.generate(model, ids, attention_mask=mask, max_new_tokens=N + 3, strategy="compiled", eos_token_id=[])
    before = od.compile_count()
    assert before > start
    two = eos_hit_midway(model, ids, mask, N + 3, [0, 3])  # rows 0 and 3 stop mid-way, each at its own id
    assert two is not None and len(set(two)) == 2, "no usable EOS ids for this batch; change the seed"
    for eos in ([], two[:1], two):
        ref = hf_generate(model, ids, mask, N + 3, eos, 0)
        for preset in ("compiled", "interleaved", "compiled"):
            out = od.generate(
                model, ids, attention_mask=mask, max_new_tokens=N + 3, strategy=preset, eos_token_id=eos, pad_token_id=0
            )
            assert torch.equal(out, ref), (preset, eos)
    assert od.compile_count() == before


def test_streamer_receives_each_steps_tokens(tiny_gpt2):
    ids, mask = make_batch(4, seed=4)
    eos = eos_hit_midway(tiny_gpt2, ids, mask, N, [0, 1, 2, 3])
    for preset in PRESETS:
        got = []
        out = od.generate(
            tiny_gpt2,
            ids,
            attention_mask=mask,
            max_new_tokens=N,
            strategy=preset,
            eos_token_id=eos,
            streamer=got.append,
        )
        streamed = torch.stack(got, dim=1)
        assert streamed.device.type == "cpu"
        assert torch.equal(streamed, out[:, ids.shape[1] :]), preset


def test_inference_mode_then_plain_call(tiny_gpt2):
    """A kept static cache made under inference_mode holds inference tensors, which cannot be reset outside it:
    the decoder keeps one per mode, and each mode's later calls reuse their own."""
    ids, mask = make_batch(2, seed=12)
    ref = naive_generate(tiny_gpt2, ids, mask, 10, [], 0)
    dec = od.Decoder(tiny_gpt2)
    kw = dict(attention_mask=mask, max_new_tokens=10, strategy="static", eos_token_id=[])
    with torch.inference_mode():
        a = dec.generate(ids, **kw)
    b = dec.generate(ids, **kw)  # would raise if it reset the inference-mode cache
    with torch.inference_mode():
        c = dec.generate(ids, **kw)
    d = dec.generate(ids, **kw)
    assert all(torch.equal(x, ref) for x in (a, b, c, d))
    assert len(dec.static_caches) == 2  # one per mode, reused, not one per call
