"""On a real GPU: the two-stream ping-pong (and deferred) stop checks return exactly the sync loop's tokens.

Each late-check strategy is compared with the sync check that runs the *same* step (same compiled graph or
same eager kernels), so any difference is a stop-check bug, not numerics. EOS is forced per row at chosen
steps with the benchmark's ForcedEOS hook, so the cases are exact: the first token, the last allowed one,
rows at different steps. `TORCH_CUDA_SANITIZER=1 pytest tests/gpu -k eager` runs the eager ping-pong cases
under PyTorch's CUDA sanitizer, which raises on any unsynchronised cross-stream access.
"""

from __future__ import annotations

import random

import pytest
import torch

import overlapdecode as od
from overlapdecode.bench.workloads import ForcedEOS
from support.helpers import make_batch

DEV = "cuda"
PAIRS = {  # late check -> the sync strategy running the same step
    "interleaved": "compiled",
    "deferred": "compiled",
    "eager-pingpong": od.Strategy(cache="static", stop_check="sync"),
    "eager-pingpong-lag2": od.Strategy(cache="static", stop_check="sync"),
    "eager-deferred": od.Strategy(cache="static", stop_check="sync"),
    "eager-kv-pingpong": "kv",
}
LATE = {
    "interleaved": "interleaved",
    "deferred": "deferred",
    "eager-pingpong": od.Strategy(cache="static", stop_check="pingpong"),
    "eager-pingpong-lag2": od.Strategy(cache="static", stop_check="pingpong", lag=2),
    "eager-deferred": od.Strategy(cache="static", stop_check="deferred", lag=1),
    "eager-kv-pingpong": od.Strategy(cache="dynamic", stop_check="pingpong"),
}
P = 16


@pytest.fixture(scope="module")
def model():
    m = od.load_model("tiny-gpt2", dtype="float32", device=DEV)
    # one hook for the whole module (re-registering would make dynamo recompile): rows stop where told
    m._forced = ForcedEOS(m, m.config.eos_token_id, 64, DEV)
    with m._forced:
        yield m


def prompt(B, seed=0):
    return make_batch(B, seed, P, low=0, high=998, device=DEV)


def run_pair(model, name, ids, mask, n, stops, **kw):
    """Run the late check and its sync twin with EOS forced at `stops` (generated-token index per row)."""
    eos = model.config.eos_token_id
    model._forced.set_steps(stops, mask.sum(1).tolist())
    got = []
    sync = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=PAIRS[name], eos_token_id=eos, **kw)
    late = od.generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        strategy=LATE[name],
        eos_token_id=eos,
        streamer=got.append,
        **kw,
    )
    assert torch.equal(late, sync)
    assert torch.equal(torch.stack(got, 1), late[:, P:].cpu())
    return late


@pytest.mark.parametrize("name", list(LATE))
def test_eos_on_first_token(model, name):
    ids, mask = prompt(4)
    out = run_pair(model, name, ids, mask, 20, [0, 0, 0, 0])
    assert out.shape[1] == P + 1


@pytest.mark.parametrize("name", list(LATE))
def test_eos_on_last_allowed_token(model, name):
    ids, mask = prompt(4)
    out = run_pair(model, name, ids, mask, 20, [19, 3, 7, 19])
    assert out.shape[1] == P + 20


@pytest.mark.parametrize("name", list(LATE))
def test_rows_finish_at_different_steps(model, name):
    ids, mask = prompt(8, seed=1)
    out = run_pair(model, name, ids, mask, 30, [2, 5, 9, 11, 12, 3, 17, 8])
    assert out.shape[1] == P + 18


@pytest.mark.parametrize("name", list(LATE))
def test_max_new_tokens_one(model, name):
    ids, mask = prompt(2)
    if name == "eager-pingpong-lag2":  # a lag beyond max_new_tokens is refused before any work
        with pytest.raises(ValueError, match="2 steps late"):
            od.generate(model, ids, attention_mask=mask, max_new_tokens=1, strategy=LATE[name])
        return
    assert run_pair(model, name, ids, mask, 1, [5, 5]).shape[1] == P + 1


@pytest.mark.parametrize("name", ["eager-pingpong", "eager-deferred", "interleaved", "deferred"])
def test_seeded_sampling_with_late_stop(model, name):
    ids, mask = prompt(4, seed=2)
    run_pair(model, name, ids, mask, 25, [4, 9, 13, 6], do_sample=True, temperature=1.1, top_p=0.9, seed=3)


def test_stress_200_generations(model):
    """200 random generations (batch 1-64, random lengths and stop steps): zero mismatches vs sync."""
    rng = random.Random(0)
    batches = [1, 3, 8, 17, 64]  # each batch size is one compiled graph; lengths keep the cache at 64
    mismatches = []
    for i in range(200):
        B = rng.choice(batches)
        n = rng.randint(1, 48)
        stops = [rng.randint(0, n + 5) for _ in range(B)]  # some rows never stop within n
        ids, mask = prompt(B, seed=100 + i)
        name = "interleaved" if i % 2 == 0 else "eager-pingpong"
        try:
            run_pair(model, name, ids, mask, n, stops)
        except AssertionError as err:
            mismatches.append((i, B, n, name, str(err)[:200]))
    assert not mismatches, mismatches[:5]


def test_pingpong_does_not_raise_peak_reserved():
    big = od.load_model("gpt2-random", dtype="float32", device=DEV)
    ids, mask = prompt(8, seed=5)
    peaks = {}
    for preset in ("compiled", "interleaved"):
        od.generate(big, ids, attention_mask=mask, max_new_tokens=100, strategy=preset, eos_token_id=[])  # warm
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        od.generate(big, ids, attention_mask=mask, max_new_tokens=100, strategy=preset, eos_token_id=[])
        torch.cuda.synchronize()
        peaks[preset] = torch.cuda.max_memory_reserved()
    print({k: v / 2**20 for k, v in peaks.items()})
    assert peaks["interleaved"] <= peaks["compiled"] * 1.02 + 2 * 2**20, peaks


@pytest.mark.skipif(not __import__("os").environ.get("TORCH_CUDA_SANITIZER"), reason="run under TORCH_CUDA_SANITIZER=1")
def test_eager_sanitizer_catches_a_planted_race():
    """Proof that the sanitizer run can fail: an unordered write on two streams must be reported."""
    from torch.cuda._sanitizer import CUDASanitizerErrors

    a = torch.ones(1 << 20, device=DEV)
    side = torch.cuda.Stream()
    with pytest.raises(CUDASanitizerErrors):
        with torch.cuda.stream(side):
            a.add_(1)  # written on the side stream ...
        a.mul_(2)  # ... and on the default stream, with no event between them
    torch.cuda.synchronize()
