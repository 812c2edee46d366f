"""`od.Decoder`: state owned by the decoder, one call at a time, streamers of both kinds, kept caches."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

import overlapdecode as od
from support.helpers import eos_hit_midway, make_batch, naive_generate

N = 12


def test_a_second_thread_is_refused_at_once(tiny_gpt2):
    dec = od.Decoder(tiny_gpt2)
    ids, mask = make_batch(2, seed=50)
    inside, release = threading.Event(), threading.Event()

    def hold(tokens):  # the first call parks in its streamer until the second call has been refused
        inside.set()
        assert release.wait(timeout=30)

    first = {}

    def run_first():
        first["out"] = dec.generate(
            ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[], streamer=hold
        )

    t = threading.Thread(target=run_first)
    t.start()
    try:
        assert inside.wait(timeout=30)
        with pytest.raises(RuntimeError, match="already generating"):
            dec.generate(ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[])
    finally:
        release.set()
        t.join(timeout=60)
    assert not t.is_alive()
    ref = naive_generate(tiny_gpt2, ids, mask, N, [], 0)
    assert torch.equal(first["out"], ref)  # the refused call did not disturb the running one
    assert torch.equal(
        dec.generate(ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[]), ref
    )  # and the decoder is free again


@pytest.mark.parametrize("strategy", ["static", od.Strategy(cache="static", stop_check="pingpong")])
def test_a_streamer_calling_generate_again_is_refused(tiny_gpt2, strategy):
    ids, mask = make_batch(2, seed=51)

    def reenter(tokens):
        od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=2, strategy=strategy)

    with pytest.raises(RuntimeError, match="already generating"):
        od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=strategy, streamer=reenter)
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=strategy, eos_token_id=[])
    assert torch.equal(out, naive_generate(tiny_gpt2, ids, mask, N, [], 0))


def test_a_server_shares_one_model_with_a_lock(tiny_llama):
    """The README's recipe: threads serve requests on one model, serialised by a lock; every answer is right."""
    dec, lock = od.Decoder(tiny_llama), threading.Lock()
    batches = [make_batch(1 + i % 3, seed=60 + i) for i in range(6)]
    results, errors = {}, []

    def serve(i):
        ids, mask = batches[i]
        try:
            with lock:
                results[i] = dec.generate(
                    ids,
                    attention_mask=mask,
                    max_new_tokens=N,
                    strategy=od.Strategy(cache="static", stop_check="pingpong"),
                    eos_token_id=[],
                )
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(batches))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    for i, (ids, mask) in enumerate(batches):
        assert torch.equal(results[i], naive_generate(tiny_llama, ids, mask, N, [], 0)), i


def test_state_lives_on_the_decoder_not_the_model(tiny_gpt2):
    ids, mask = make_batch(2, seed=52)
    before = set(vars(tiny_gpt2))
    a, b = od.Decoder(tiny_gpt2), od.Decoder(tiny_gpt2)
    a.generate(ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[])
    assert set(vars(tiny_gpt2)) == before  # nothing stuck on the model
    assert len(a.static_caches) == 1 and len(b.static_caches) == 0
    a.clear()
    assert len(a.static_caches) == 0
    assert od.decoder_for(tiny_gpt2) is od.decoder_for(tiny_gpt2)


def test_evicted_shapes_are_rebuilt_right(tiny_gpt2):
    """With one kept shape, alternating shapes evicts and re-creates the static cache every call."""
    dec = od.Decoder(tiny_gpt2, keep_static=1)
    cases = [make_batch(2, seed=53), make_batch(3, seed=54)]
    refs = [naive_generate(tiny_gpt2, ids, mask, N, [], 0) for ids, mask in cases]
    for _ in range(2):
        for (ids, mask), ref in zip(cases, refs):
            out = dec.generate(ids, attention_mask=mask, max_new_tokens=N, strategy="static", eos_token_id=[])
            assert torch.equal(out, ref)
            assert len(dec.static_caches) == 1


class Recorder(BaseStreamer):
    """A Hugging Face streamer object (put/end), as TextStreamer and TextIteratorStreamer are."""

    def __init__(self, fail_after=None):
        self.puts, self.ends, self.fail_after = [], 0, fail_after

    def put(self, value):
        self.puts.append(value.clone())
        if self.fail_after is not None and len(self.puts) > self.fail_after:
            raise KeyError("client went away")

    def end(self):
        self.ends += 1


@pytest.mark.parametrize(
    "strategy",
    [
        "static",
        od.Strategy(cache="static", stop_check="pingpong", lag=2),
        od.Strategy(cache="static", stop_check="end"),
    ],
)
def test_hugging_face_streamer_objects(tiny_gpt2, strategy):
    ids, mask = make_batch(2, seed=55)
    eos = eos_hit_midway(tiny_gpt2, ids, mask, N, [0, 1])
    rec = Recorder()
    out = od.generate(
        tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=strategy, eos_token_id=eos, streamer=rec
    )
    assert out.shape[1] < ids.shape[1] + N
    assert torch.equal(rec.puts[0], ids)  # the prompt first, as from Hugging Face generate()
    assert torch.equal(torch.stack(rec.puts[1:], 1), out[:, ids.shape[1] :])  # then each kept step's tokens
    assert rec.ends == 1


def test_streamer_end_is_called_when_the_call_fails(tiny_gpt2):
    """An iterator streamer's reader waits for end(): a failing call must still send it, or the reader hangs."""
    ids, mask = make_batch(1, seed=56)
    rec = Recorder(fail_after=3)
    with pytest.raises(KeyError):
        od.generate(tiny_gpt2, ids, max_new_tokens=N, strategy="static", streamer=rec)
    assert rec.ends == 1


def test_streamer_that_is_neither_callable_nor_a_streamer():
    model = od.load_model("tiny-gpt2", device="cpu")
    ids, _ = make_batch(1, seed=57)
    with pytest.raises(TypeError, match="streamer must be callable"):
        od.generate(model, ids, max_new_tokens=2, streamer=42)


def test_fused_model_is_made_again_after_the_model_moved():
    """`.to()` replaces the parameters (the fused views break): the decoder must not keep decoding from the
    old fused tensors, which the Hugging Face model no longer uses."""
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(2, seed=58)
    kw = dict(
        attention_mask=mask,
        max_new_tokens=6,
        eos_token_id=[],
        strategy=od.Strategy(cache="fused", stop_check="pingpong"),
    )
    assert torch.equal(dec.generate(ids, **kw), naive_generate(model, ids, mask, 6, [], 0))
    first = dec.fused_model()
    model.to(torch.float64)  # new parameter tensors
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(3)  # and different weights, so stale ones would show
    assert dec.fused_model() is not first
    assert dec.fused_model().weights.embed.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert torch.equal(dec.generate(ids, **kw), naive_generate(model, ids, mask, 6, [], 0))


def test_keep_static_is_checked_when_the_decoder_is_made(tiny_gpt2):
    """keep_static=-1 ended the first static call in KeyError('dictionary is empty') from the cache eviction, and
    1.5 was taken; 0 keeps nothing and works."""
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"keep_static must be an int >= 0"):
            od.Decoder(tiny_gpt2, keep_static=bad)
    ids, _ = make_batch(1, seed=3)
    out = od.Decoder(tiny_gpt2, keep_static=0).generate(ids, max_new_tokens=2, strategy="static")
    assert torch.equal(out, od.generate(tiny_gpt2, ids, max_new_tokens=2, strategy="kv"))


def test_sampling_without_a_seed_is_refused_only_for_a_shard(tiny_gpt2, monkeypatch):
    """Under tensor parallelism each rank would draw from its own global generator: ranks could pick different
    tokens and then wait for each other's collectives for ever. So a shard refuses seedless sampling (on two gloo
    ranks: tests/tp/test_tp.py); a whole model in a process of a larger world (torchrun without tp) has no
    collective to wait in, and samples."""
    ids, _ = make_batch(1, seed=59)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    out = od.generate(tiny_gpt2, ids, max_new_tokens=2, strategy="static", do_sample=True)
    assert out.shape == (1, ids.shape[1] + 2)


def test_the_decoder_generate_keeps_does_not_keep_the_model_alive():
    """od.generate keeps one decoder per model in a weakly keyed dictionary: the decoder must hold its model
    weakly too, or every model ever passed to od.generate would stay in memory."""
    import gc
    import weakref

    for strategy in ("static", "fused"):
        model = od.load_model("tiny-llama", device="cpu")
        od.generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=3, strategy=strategy)
        alive = weakref.ref(model)
        del model
        gc.collect()
        assert alive() is None, strategy


def test_fused_options_reach_the_fused_model(tiny_gpt2):
    """Options that differ from what a CPU machine picks by itself (the torch twins, no PDL) reach the model."""
    pytest.importorskip("triton")
    from overlapdecode.fused.model import FusedModel

    assert FusedModel(tiny_gpt2).kernels == "torch"  # the default here
    dec = od.Decoder(tiny_gpt2, fused_options=dict(kernels="triton", compile_prefill=False))
    assert dec.fused_model().kernels == "triton"
    with pytest.raises(TypeError, match="fused_options must be a dict"):
        od.Decoder(tiny_gpt2, fused_options=["pdl"])


@pytest.mark.parametrize(
    "options,match,device_dependent",
    [
        (dict(pdl_mode=3), "unknown fused option.*'pdl_mode'.*the options are kernels, compile_prefill, pdl", False),
        (dict(kernels="cuda"), "kernels must be 'triton' or 'torch'", False),
        (dict(pdl=3), "pdl must be a bool", False),
        (dict(pdl=1.0), "pdl must be a bool", False),
        (dict(compile_prefill="yes"), "compile_prefill must be a bool", False),
        (dict(compile_prefill=1), "compile_prefill must be a bool", False),
        (dict(symmetric_all_reduce="on"), "symmetric_all_reduce must be a bool", False),
        (dict(vocab_parallel=0), "vocab_parallel must be a bool", False),
        (dict(tiles={("norm_qkv", 8): {}}), "tiles must map", False),
        (dict(tiles={("norm_qkv", "8", 4): {}}), "tiles must map", False),
        (dict(tiles={("norm_linear", 8, 4): dict(half=16)}), r"tiles\[\('norm_linear', 8, 4\)\] must be", False),
        (dict(tiles={("linear_residual", 8, 4): dict(blok_n=16)}), "keys among block_n, block_k", False),
        (dict(tiles={("linear_residual", 8, 4): dict(block_n=0)}), "must be a dict of positive ints", False),
        (dict(pdl=True), "pdl needs the Triton kernels", True),
        (dict(symmetric_all_reduce=True), "symmetric_all_reduce needs a tensor-parallel shard", True),
    ],
)
def test_bad_fused_options_are_refused_before_any_weight_is_touched(tiny_gpt2, options, match, device_dependent):
    """A mistaken fused option is a ValueError naming it before any weight is re-laid out (the model's
    parameters untouched: not yet views of fused tensors): when od.Decoder is made, or, for what depends on
    the model's device (which may still change after the decoder is made), when the fused model is made."""
    before = [p.data_ptr() for p in tiny_gpt2.parameters()]
    if device_dependent:
        dec = od.Decoder(tiny_gpt2, fused_options=options)
        with pytest.raises(ValueError, match=match):
            dec.fused_model()
    else:
        with pytest.raises(ValueError, match=match):
            od.Decoder(tiny_gpt2, fused_options=options)
    from overlapdecode.fused.model import OPTION_NAMES, FusedModel

    if set(options) <= set(OPTION_NAMES):  # (an unknown keyword is Python's TypeError there)
        with pytest.raises(ValueError, match=match):
            FusedModel(tiny_gpt2, **options)
    assert [p.data_ptr() for p in tiny_gpt2.parameters()] == before
