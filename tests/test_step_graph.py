"""StepGraph (the fused step's own CUDA graph) on CPU: the buffers it owns are advanced in place, the fused
preset keeps one per cache and setting and reuses it call after call, and its tokens stay Hugging Face's.
The capture itself runs on the GPU (tests/gpu/test_gpu_fused.py)."""

from __future__ import annotations

import torch

import overlapdecode as od
from helpers import hf_generate, make_batch
from overlapdecode.loop.step_graph import StepGraph
from overlapdecode.sampling import SamplingParams


def test_run_advances_the_owned_buffers_in_place_and_draws_the_noise_from_the_calls_sequence():
    seen, noises = [], []

    def step(state, eos, noise, done, log):
        assert log is None  # made without a step log
        seen.append((state.data_ptr(), eos.data_ptr(), noise.data_ptr(), done.data_ptr()))
        noises.append(noise.clone())
        state[:, 0] += 2
        state[:, 1] += 1
        done.copy_((state[:, 0] >= eos[0]).all())

    g = StepGraph(step, batch=2, eos_count=1, noise_shape=(2, 3), device=torch.device("cpu"))
    g.eos.fill_(5)
    call = torch.Generator().manual_seed(7)
    torch.empty(4).exponential_(generator=call)  # the call has drawn before (its prefill)
    g.seed_from(call)
    addresses = (g.state.data_ptr(), g.done.data_ptr())
    for _ in range(3):
        g.run()
    assert g.state.tolist() == [[6, 3, 0], [6, 3, 0]] and bool(g.done)
    assert (g.state.data_ptr(), g.done.data_ptr()) == addresses  # in place: a graph reads fixed addresses
    assert len(set(seen)) == 1  # every step read the same buffers
    assert g.graph is None and g.eager_runs == 3  # no capture on CPU
    # each run drew its step's noise first, continuing the call's sequence, as sampling.draw_noise would
    ref = torch.Generator().manual_seed(7)
    torch.empty(4).exponential_(generator=ref)
    for noise in noises:
        assert torch.equal(noise, torch.empty(2, 3).exponential_(generator=ref))


def test_a_step_log_is_owned_by_the_graph_and_passed_to_its_step():
    logs = []

    def step(state, eos, noise, done, log):
        logs.append(log)
        state[:, 0] += 1
        done.fill_(True)
        log.tokens.index_copy_(1, log.count.long(), state[:, :1])
        log.flags.index_copy_(0, log.count.long(), done.view(1))
        log.count.add_(1)

    g = StepGraph(step, batch=2, eos_count=0, noise_shape=None, device=torch.device("cpu"), log_length=5)
    g.log.count.fill_(2)
    g.run()
    g.run()
    assert all(log is g.log for log in logs)
    assert g.log.flags.tolist() == [False, False, True, True, False] and g.log.count.tolist() == [4]
    assert g.log.tokens.tolist() == [[0, 0, 1, 2, 0]] * 2
    assert g.log.count.dtype == torch.int32 and g.log.flags.dtype == torch.bool and g.log.tokens.dtype == torch.long


def test_the_fused_greedy_output_and_stop_are_read_from_the_steps_own_log():
    """Greedy `fused` steps write their tokens and flag into the graph's StepLog, and the loop reads them there (no
    copy per step): the log holds the call's output and every step's flag, and the call returns a copy of it that
    equals Hugging Face's, stopping where it does; a later call does not change an earlier call's output."""
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(2, seed=3)
    free = dec.generate(ids, attention_mask=mask, max_new_tokens=12, strategy="fused", eos_token_id=[], pad_token_id=0)
    P = ids.shape[1]
    eos = [int(free[0, P + 4]), int(free[1, P + 6])]  # row 0 stops at step 4 or before, row 1 at step 6 or before
    ref = hf_generate(model, ids, mask, 12, eos, 0)
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=12, strategy="fused", eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, ref) and out.shape[1] < P + 12
    (cache,) = dec.fused_model()._caches.values()
    graph = cache.graphs[(2, 0, SamplingParams())]
    n = out.shape[1] - P
    # steps 1 .. n (the last one run late by the ping-pong's lag of 1) wrote columns P + 1 .. P + n
    assert graph.log.count.tolist() == [P + n + 1]
    assert graph.log.flags[P + 1 : P + n].tolist() == [False] * (n - 2) + [True]
    assert torch.equal(graph.log.tokens[:, : P + n], out) and out.data_ptr() != graph.log.tokens.data_ptr()
    kept = out.clone()
    dec.generate(
        ids[:, 1:], attention_mask=mask[:, 1:], max_new_tokens=12, strategy="fused", eos_token_id=[], pad_token_id=0
    )
    assert torch.equal(out, kept)


def test_a_call_that_stops_late_is_remembered_for_the_next_calls_host_wait():
    """After a late stop (steps still queued when the call returns) the decoder's next call waits for the last
    call's end on the host before it may evict what those steps use; after a call whose steps all completed,
    it does not."""
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(1, seed=3)
    P = ids.shape[1]
    free = dec.generate(ids, attention_mask=mask, max_new_tokens=8, strategy="fused", eos_token_id=[])
    assert not dec._late_steps
    eos = int(free[0, P + 2])
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=8, strategy="fused:3", eos_token_id=[eos])
    assert out.shape[1] <= P + 3 and dec._late_steps
    dec.generate(ids, attention_mask=mask, max_new_tokens=8, strategy="fused", eos_token_id=[])
    assert not dec._late_steps


def test_fused_keeps_one_graph_per_setting_and_matches_hf():
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(2, seed=3)
    n = 10
    ref = hf_generate(model, ids, mask, n, [], 0)
    for _ in range(2):  # the second call reuses the first call's StepGraph
        out = dec.generate(
            ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[], pad_token_id=0
        )
        assert torch.equal(out, ref)
    (cache,) = dec.fused_model()._caches.values()
    assert list(cache.graphs) == [(0, 0, SamplingParams())]
    graph = next(iter(cache.graphs.values()))
    assert graph.eager_runs == 2 * (n - 1)  # CPU: every decode step eager, over the same buffers
    dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[1, 2], pad_token_id=0)
    assert len(cache.graphs) == 2  # another EOS count: another step


def test_clearing_caches_frees_them_without_the_cycle_collector():
    """A StepGraph's step refers back to its cache: clear_caches (and Decoder.clear) must drop the graphs
    first, or the cache's memory would wait for Python's cycle collector."""
    import gc
    import weakref

    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(1, seed=5)
    dec.generate(ids, attention_mask=mask, max_new_tokens=4, strategy="fused", eos_token_id=[])
    (cache,) = dec.fused_model()._caches.values()
    assert cache.graphs
    alive = weakref.ref(cache.k[0])
    del cache
    gc.disable()
    try:
        dec.clear()
        assert alive() is None  # freed by reference counting alone
    finally:
        gc.enable()
