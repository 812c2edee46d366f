"""Seeded sampling: the same tokens under every strategy, different tokens for another seed."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.sampling import SamplingParams, pick_next
from support.helpers import make_batch

N = 16
SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.2, top_p=0.8),
    dict(temperature=0.9, top_k=50, top_p=0.9),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_seed_gives_the_same_tokens_for_every_eager_strategy(tiny_model, setting):
    ids, mask = make_batch(4, seed=31)
    kw = dict(attention_mask=mask, max_new_tokens=N, do_sample=True, eos_token_id=[], **setting)
    outs = {p: od.generate(tiny_model, ids, strategy=p, seed=123, **kw) for p in ("baseline", "kv", "static")}
    outs["pingpong"] = od.generate(tiny_model, ids, strategy=od.Strategy(stop_check="pingpong"), seed=123, **kw)
    ref = outs["baseline"]
    for name, out in outs.items():
        assert torch.equal(out, ref), name
    other = od.generate(tiny_model, ids, strategy="static", seed=124, **kw)
    assert not torch.equal(other, ref)
    greedy = od.generate(tiny_model, ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[])
    assert not torch.equal(greedy, ref)


def test_seed_gives_the_same_tokens_compiled_with_a_late_stop(tiny_gpt2):
    """Compiled sampling with every control (one graph for compiled and interleaved) and the late stop of the
    ping-pong: the rows stop at different steps, chosen from a free sampled run, and interleaved drops the tokens
    of its late step."""
    ids, mask = make_batch(4, seed=32)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=N,
        do_sample=True,
        temperature=0.9,
        top_k=50,
        top_p=0.9,
        min_p=0.02,
        repetition_penalty=1.2,
        seed=7,
    )
    free = od.generate(tiny_gpt2, ids, strategy="static", eos_token_id=[], **kw)[:, ids.shape[1] :]
    eos = sorted({int(free[r, 2 * r + 2]) for r in range(4)})  # row r stops at step 2r+2 at the latest
    ref = od.generate(tiny_gpt2, ids, strategy="static", eos_token_id=eos, **kw)
    assert ref.shape[1] < ids.shape[1] + N, "the batch should stop before max_new_tokens"
    for preset in ("compiled", "interleaved"):
        got = []
        out = od.generate(tiny_gpt2, ids, strategy=preset, eos_token_id=eos, streamer=got.append, **kw)
        assert torch.equal(out, ref), preset
        assert torch.equal(torch.stack(got, 1), out[:, ids.shape[1] :]), preset  # no late token streamed


def test_global_seed_governs_seed_none(tiny_gpt2):
    ids, mask = make_batch(2, seed=33)
    kw = dict(attention_mask=mask, max_new_tokens=N, do_sample=True, eos_token_id=[], strategy="kv")
    torch.manual_seed(0)
    a = od.generate(tiny_gpt2, ids, **kw)
    torch.manual_seed(0)
    assert torch.equal(od.generate(tiny_gpt2, ids, **kw), a)


@pytest.mark.parametrize("preset", ["kv", "fused"])
def test_sampling_without_a_top_k_keeps_hugging_faces_default_of_50(preset):
    """do_sample=True without top_k samples among the 50 most likely tokens, as Hugging Face generate() does where
    the generation config sets no top-k: near-uniform logits over 1000 tokens put most draws outside them
    otherwise; top_k=0 keeps every token."""
    model = od.load_model("tiny-llama", device="cpu")
    with torch.no_grad():
        model.lm_head.weight.mul_(0.01)
    ids, mask = make_batch(8, seed=34)
    with torch.no_grad():
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
    top50 = logits.topk(50).indices
    kw = dict(attention_mask=mask, max_new_tokens=1, strategy=preset, do_sample=True, eos_token_id=[])
    for seed in range(3):
        first = od.generate(model, ids, seed=seed, **kw)[:, -1]
        assert (top50 == first[:, None]).any(dim=1).all()
    everywhere = torch.cat([od.generate(model, ids, seed=s, top_k=0, **kw)[:, -1] for s in range(3)])
    assert not (top50.repeat(3, 1) == everywhere[:, None]).any(dim=1).all()


@pytest.mark.parametrize("preset", ["kv", "fused"])
def test_sampling_reads_the_generation_configs_warpers(preset):
    """The temperature, top_k, top_p and min_p a call does not give come from the model's generation config, as in
    Hugging Face generate(): a top-k of 1 there samples the greedy tokens; the call's own value wins."""
    model = od.load_model("tiny-llama", device="cpu")
    model.generation_config.top_k = 1
    model.generation_config.temperature = 0.5
    ids, mask = make_batch(4, seed=35)
    kw = dict(attention_mask=mask, max_new_tokens=8, strategy=preset, eos_token_id=[])
    greedy = od.generate(model, ids, **kw)
    assert torch.equal(od.generate(model, ids, do_sample=True, seed=3, **kw), greedy)
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=True, eos_token_id=None)
    assert torch.equal(ref, greedy)
    assert not torch.equal(od.generate(model, ids, do_sample=True, seed=3, top_k=0, temperature=1.0, **kw), greedy)


@pytest.mark.parametrize("preset", ["kv", "fused"])
def test_whether_to_sample_follows_the_generation_config_where_the_call_does_not_say(preset):
    """do_sample=None (the default): the model's generation_config.do_sample, as Hugging Face generate() reads it
    (instruction-tuned models often set it, with their own temperature and top-p); the call's True or False wins."""
    model = od.load_model("tiny-llama", device="cpu")
    ids, mask = make_batch(4, seed=36)
    kw = dict(attention_mask=mask, max_new_tokens=8, strategy=preset, eos_token_id=[], seed=5)
    greedy = od.generate(model, ids, **kw)
    model.generation_config.do_sample = True
    model.generation_config.temperature = 2.0
    sampled = od.generate(model, ids, **kw)
    assert torch.equal(sampled, od.generate(model, ids, do_sample=True, **kw))
    assert not torch.equal(sampled, greedy)
    assert torch.equal(od.generate(model, ids, do_sample=False, **kw), greedy)


def test_top_k_and_top_p_restrict_the_support():
    torch.manual_seed(0)
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]]).repeat(2000, 1)
    noise = torch.empty_like(logits).exponential_()
    top2 = pick_next(logits, noise, SamplingParams(True, 1.0, top_k=2))
    assert set(top2.tolist()) == {0, 1}
    # softmax of the logits: 0.636, 0.234, 0.086, ... -> top_p 0.8 keeps tokens 0 and 1 only
    topp = pick_next(logits, noise, SamplingParams(True, 1.0, top_p=0.8))
    assert set(topp.tolist()) == {0, 1}
    free = pick_next(logits, noise, SamplingParams(True, 1.0))
    assert set(free.tolist()) == {0, 1, 2, 3, 4}
    # the exponential race samples from softmax: token 0 about 63.6% of the time
    assert abs((free == 0).float().mean().item() - 0.636) < 0.04


@pytest.mark.parametrize("temperature", [5e-37, 1e-37, 1.2e-38])
def test_a_tiny_temperature_samples_the_greedy_token_not_nan(tiny_gpt2, temperature):
    """logit / temperature overflows float32 for these (200 / 5e-37 = 4e38 > 3.4e38; at 5e-37 only the second
    row's): without the shift by the maximum, an overflowing row's probabilities are NaN and its token 0."""
    logits = torch.tensor([[3.0, 50.0, -20.0, 49.999], [-5.0, -4.0, 200.0, 0.0]])
    noise = torch.empty_like(logits).exponential_(generator=torch.Generator().manual_seed(0))
    tokens = pick_next(logits, noise, SamplingParams(do_sample=True, temperature=temperature))
    assert tokens.tolist() == [1, 2]
    ids, mask = make_batch(2, seed=33)
    kw = dict(attention_mask=mask, max_new_tokens=6, eos_token_id=[], strategy="static")
    sampled = od.generate(tiny_gpt2, ids, do_sample=True, temperature=temperature, seed=1, **kw)
    assert torch.equal(sampled, od.generate(tiny_gpt2, ids, **kw))  # the limit of sampling: greedy


@pytest.mark.parametrize("V", [4097, 5000, 50257, 128256])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_argmax_is_torch_argmax(V, dtype):
    """argmax_rows (two stages over chunks) returns exactly torch's argmax: first index of the maximum, ties
    within and across chunks, a NaN, an all -inf row, a maximum in the padded last chunk."""
    from overlapdecode.sampling import ARGMAX_CHUNK, argmax_rows

    torch.manual_seed(V)
    x = torch.randn(8, V).to(dtype)
    x[1] = 0
    x[2] = float("-inf")
    x[3, 100], x[3, V - 1] = float("nan"), float("nan")
    x[4, 3000], x[4, V - 2] = 50, 50
    x[5, V - 1] = 99
    x[6, ARGMAX_CHUNK - 1], x[6, ARGMAX_CHUNK] = float("inf"), float("inf")
    x[7, 2 * ARGMAX_CHUNK + 5], x[7, ARGMAX_CHUNK + 5] = 40, 40
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


@pytest.mark.parametrize(
    "setting",
    [dict(temperature=0.0), dict(temperature=-1.0), dict(top_k=0), dict(top_p=0.0)],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)
def test_greedy_ignores_sampling_values_as_hugging_face_does(tiny_gpt2, setting):
    """Hugging Face generate(do_sample=False, temperature=0.0) decodes greedily (its warpers are only built for
    sampling); od.generate refused it with "temperature must be > 0". Types are still checked."""
    ids, mask = make_batch(2, seed=5)
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=6, strategy="kv", **setting)
    hf = tiny_gpt2.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, **setting)
    assert torch.equal(out, hf)
    with pytest.raises(TypeError, match="top_k must be an int or None"):
        od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=6, strategy="kv", top_k=2.5)


def test_greedy_warns_of_the_sampling_values_it_ignores():
    """Not silently: temperature=0.7 without do_sample=True is usually a forgotten flag (Hugging Face warns too);
    the defaults and temperature=0, the usual way to ask for greedy, give no warning."""
    import warnings

    from overlapdecode.sampling import check_sampling

    with pytest.warns(UserWarning, match=r"do_sample=False: temperature, top_k ignored, the decoding is greedy"):
        check_sampling(False, 0.7, 5, None, None)
    with pytest.warns(UserWarning, match=r"do_sample=False: top_p ignored"):
        check_sampling(False, 1.0, None, 0.9, None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_sampling(False, 1.0, None, None, None)
        check_sampling(False, 0, None, None, None)
        check_sampling(False, 0.0, None, None, 3)
        check_sampling(True, 0.7, 5, 0.9, 3)
