"""On a real GPU: eager presets equal each other and Hugging Face exactly (float32); compiled ones equal
them up to the first step whose top-two logits are within tolerance; a shape compiles once.

Why compiled output may differ at all: inductor fuses and reorders float32 reductions, so logits differ
from eager in the last bits; where the two best logits are that close, argmax may flip and the sequences
part. That is not a bug, so the test accepts a first divergence only at such a near-tie.
"""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import hf_positions, make_batch

DEV = "cuda"
EAGER = [
    "baseline",
    "kv",
    "static",
    od.Strategy(cache="static", stop_check="pingpong"),
    od.Strategy(cache="static", stop_check="deferred", lag=2),
    od.Strategy(cache="static", stop_check="end"),
]
TIE_TOL = 1e-3  # top-two logit gap below which float32 compiled and eager may pick differently


@pytest.fixture(scope="module", params=["tiny-gpt2", "tiny-llama", "gpt2-random"])
def model(request):
    return od.load_model(request.param, dtype="float32", device=DEV)


def batch(model, B, P=16, seed=0):
    return make_batch(B, seed, P, low=0, high=model.config.vocab_size - 1, device=DEV)


def midway_eos(model, ids, mask, n):
    free = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="kv", eos_token_id=[])
    row0 = free[0, ids.shape[1] :].tolist()
    return [row0[n // 2]]


def hf(model, ids, mask, n, eos, pad):
    return model.generate(
        ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=pad
    )


@pytest.mark.parametrize("B", [1, 4])
def test_eager_presets_equal_each_other_and_hf(model, B):
    ids, mask = batch(model, B)
    n = 40
    eos = midway_eos(model, ids, mask, n)
    ref = hf(model, ids, mask, n, eos, 0)
    for s in EAGER:
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=n, strategy=s, eos_token_id=eos, pad_token_id=0
        )
        assert torch.equal(out, ref), s


def first_divergence_is_a_near_tie(model, ids, mask, out, ref):
    """True if out == ref, or at their first differing step the eager top-two logits are within TIE_TOL."""
    if torch.equal(out, ref):
        return True
    P = ids.shape[1]
    L = min(out.shape[1], ref.shape[1])
    diff = (out[:, :L] != ref[:, :L]).nonzero()
    if diff.numel() == 0:  # one stopped earlier: only possible after a divergence in a later row
        return False
    row, col = (int(v) for v in diff[0])
    assert col >= P
    prefix = ref[row : row + 1, :col]
    m = torch.cat([mask[row : row + 1], torch.ones((1, col - P), dtype=mask.dtype, device=DEV)], 1)
    pos = hf_positions(m)
    with torch.no_grad():
        logits = model(input_ids=prefix, attention_mask=m, position_ids=pos).logits[0, -1].float()
    top2 = logits.topk(2).values
    gap = float(top2[0] - top2[1])
    print(f"first divergence at row {row}, step {col - P}: top-two gap {gap:.2e}")
    return gap < TIE_TOL * max(1.0, float(top2[0].abs()))


@pytest.mark.parametrize("B", [1, 4])
def test_compiled_equals_eager_up_to_near_ties(model, B):
    ids, mask = batch(model, B)
    n = 40
    eos = midway_eos(model, ids, mask, n)
    ref = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="static", eos_token_id=eos)
    for preset in ("compiled", "interleaved", "deferred", "nocheck"):
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=preset, eos_token_id=eos)
        assert first_divergence_is_a_near_tie(model, ids, mask, out, ref), preset


def test_no_recompilation_for_the_same_shape(model):
    ids, mask = batch(model, 4, seed=1)
    od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy="compiled", eos_token_id=[])
    before = od.compile_count()
    for preset in ("compiled", "interleaved", "compiled", "interleaved"):
        od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy=preset, eos_token_id=[])
    # a new prompt of the same shape, and a length that rounds to the same cache size
    ids2, mask2 = batch(model, 4, seed=2)
    od.generate(model, ids2, attention_mask=mask2, max_new_tokens=28, strategy="interleaved", eos_token_id=[])
    assert od.compile_count() == before


def test_seeded_sampling_identical_across_presets(model):
    ids, mask = batch(model, 4, seed=3)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=24,
        do_sample=True,
        temperature=0.8,
        top_k=40,
        top_p=0.95,
        eos_token_id=[],
        seed=11,
    )
    ref = od.generate(model, ids, strategy="kv", **kw)
    for s in ["baseline", "static", od.Strategy(cache="static", stop_check="pingpong")]:
        assert torch.equal(od.generate(model, ids, strategy=s, **kw), ref), s
    assert not torch.equal(od.generate(model, ids, strategy="kv", **dict(kw, seed=12)), ref)


def test_bad_input_fails_before_the_gpu(model):
    ids, _ = batch(model, 1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        od.generate(model, ids + 10**6, max_new_tokens=4, strategy="interleaved")
    with pytest.raises(ValueError, match="input_ids is on cpu but the model is on cuda"):
        od.generate(model, ids.cpu(), max_new_tokens=4)
    torch.cuda.synchronize()  # the context is healthy: no device-side assert happened
