"""On a real GPU: a decoder's state between calls. A call that stopped late still has steps running when it
returns; the next call, from any stream, must not reset the cache under them. A kept static cache shape that
is evicted and made again must not be replayed by a CUDA graph recorded on the freed one.

Run the eager case under `TORCH_CUDA_SANITIZER=1` too: the sanitizer reports the cross-stream access that
an unordered cache reset would be.
"""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.bench.workloads import ForcedEOS
from support.helpers import make_batch

DEV = "cuda"


@pytest.fixture(scope="module")
def model():
    m = od.load_model("gpt2-random", dtype="float32", device=DEV)  # steps long enough to still run after a return
    forced = ForcedEOS(m, m.config.eos_token_id, 64, DEV)
    with forced:
        yield m, forced


def prompt(B, P=16, seed=0, vocab=50000, pad=True):
    ids, mask = make_batch(B, seed, P, low=0, high=vocab, device=DEV)
    return (ids, mask) if pad else (ids, torch.ones_like(mask))


@pytest.mark.parametrize(
    "late,sync",
    [
        (od.Strategy(cache="static", stop_check="pingpong", lag=2), od.Strategy(cache="static", stop_check="sync")),
        ("interleaved:2", "compiled"),
    ],
)
def test_a_second_call_on_another_stream_follows_a_late_stop(model, late, sync):
    m, forced = model
    eos = m.config.eos_token_id
    dec = od.Decoder(m)
    # No padding; the first prompt has 16 tokens, the second 24: EOS is forced at position 16 (the first call's
    # generated token 1), which the second call never reaches, so nothing is set between the two calls (a
    # host-to-device copy there would wait for the late steps). Both use the kept cache of shape (4, 64).
    ids1, mask1 = prompt(4, P=16, seed=1, pad=False)
    ids2, mask2 = prompt(4, P=24, seed=2, pad=False)
    forced.set_steps([1, 1, 1, 1], [16] * 4)
    ref2 = dec.generate(ids2, attention_mask=mask2, max_new_tokens=30, strategy=sync, eos_token_id=eos)
    assert ref2.shape[1] == 24 + 30
    for _ in range(3):
        first = dec.generate(ids1, attention_mask=mask1, max_new_tokens=30, strategy=late, eos_token_id=eos)
        assert first.shape[1] == 16 + 2  # the stop was seen two steps late: two steps may still be running
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):  # no synchronisation in between
            second = dec.generate(ids2, attention_mask=mask2, max_new_tokens=30, strategy=late, eos_token_id=eos)
        torch.cuda.current_stream().wait_stream(other)
        assert torch.equal(second, ref2)


def test_an_evicted_shape_is_recorded_again_under_cuda_graphs(model):
    m, forced = model
    eos = m.config.eos_token_id
    cases = [prompt(2, P=16, seed=3), prompt(3, P=16, seed=4)]  # two shapes, one kept at a time
    kept = od.Decoder(m)  # keeps both shapes: the reference
    refs = []
    for ids, mask in cases:
        forced.set_steps([40] * ids.shape[0], mask.sum(1).tolist())
        refs.append(
            kept.generate(ids, attention_mask=mask, max_new_tokens=24, strategy="interleaved", eos_token_id=eos)
        )
    dec = od.Decoder(m, keep_static=1)
    for _ in range(3):
        for (ids, mask), ref in zip(cases, refs):
            forced.set_steps([40] * ids.shape[0], mask.sum(1).tolist())
            out = dec.generate(ids, attention_mask=mask, max_new_tokens=24, strategy="interleaved", eos_token_id=eos)
            assert torch.equal(out, ref)
            assert len(dec.static_caches) == 1
