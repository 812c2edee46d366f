"""StepGraph (the fused step's own CUDA graph) on CPU: the buffers it owns keep their addresses, the fused
preset keeps one step per cache and setting and reuses it call after call, and its tokens stay Hugging Face's.
The capture itself runs on the GPU (tests/gpu/test_gpu_fused.py)."""

from __future__ import annotations

import torch

import overlapdecode as od
from overlapdecode.loop.step_graph import StepGraph
from overlapdecode.sampling import EOS_WIDTH, SamplingParams
from support.helpers import hf_generate, make_batch


def test_a_cpu_graph_captures_nothing_and_its_buffers_keep_their_addresses():
    g = StepGraph(batch=2, eos_count=1, noise_shape=(2, 3), device=torch.device("cpu"), seen_vocab=4)
    assert not g.capturable and not g.replay() and g.graph is None  # nothing captured: the owner runs eagerly
    assert g.state.shape == (2, 3) and g.eos.shape == (1,) and g.done.shape == () and g.seen.shape == (2, 4)
    assert g.log is None  # made without a step log
    addresses = (g.state.data_ptr(), g.noise.data_ptr(), g.done.data_ptr())
    for _ in range(3):
        g.draw_noise()
        g.state[:, 0] += 1
    assert addresses == (g.state.data_ptr(), g.noise.data_ptr(), g.done.data_ptr())  # in place: fixed addresses
    assert StepGraph(batch=1, eos_count=0, noise_shape=None, device=torch.device("cpu")).noise is None


def test_the_noise_continues_the_calls_sequence():
    g = StepGraph(batch=2, eos_count=1, noise_shape=(2, 3), device=torch.device("cpu"))
    call = torch.Generator().manual_seed(7)
    torch.empty(4).exponential_(generator=call)  # the call has drawn before (its prefill)
    g.seed_from(call)
    noises = []
    for _ in range(3):
        g.draw_noise()
        noises.append(g.noise.clone())
    # each draw is the step's noise, continuing the call's sequence, as sampling.draw_noise would
    ref = torch.Generator().manual_seed(7)
    torch.empty(4).exponential_(generator=ref)
    for noise in noises:
        assert torch.equal(noise, torch.empty(2, 3).exponential_(generator=ref))


def test_a_kept_step_runs_eagerly_over_its_graphs_buffers_on_cpu():
    """The fused GraphStep runs its step over its StepGraph's buffers, eagerly on CPU (no capture), writing its
    step log where the loop reads it."""
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model)
    ids, mask = make_batch(2, seed=3)
    dec.generate(ids, attention_mask=mask, max_new_tokens=4, strategy="fused", eos_token_id=[], pad_token_id=0)
    (cache,) = dec.fused_model()._caches.values()
    (kept,) = cache.graphs.values()
    g = kept.graph
    assert g.graph is None and g.eager_runs == 3 and g.log is not None
    addresses = (g.state.data_ptr(), g.done.data_ptr(), g.log.tokens.data_ptr())
    count = int(g.log.count)
    kept.run()
    assert int(g.log.count) == count + 1 and g.eager_runs == 4
    assert addresses == (g.state.data_ptr(), g.done.data_ptr(), g.log.tokens.data_ptr())


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
    graph = cache.graphs[(EOS_WIDTH, 0, SamplingParams())].graph  # 2 EOS ids, in a tensor of EOS_WIDTH
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
    assert list(cache.graphs) == [(EOS_WIDTH, 0, SamplingParams())]  # no EOS id: a tensor of EOS_WIDTH all the same
    graph = next(iter(cache.graphs.values())).graph
    assert graph.eager_runs == 2 * (n - 1)  # CPU: every decode step eager, over the same buffers
    # other EOS ids, as many as the EOS tensor holds: the same step, their ids copied into its buffer
    eos = [int(ref[0, ids.shape[1] + 3]), int(ref[1, ids.shape[1] + 5])]
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=eos, pad_token_id=0)
    assert torch.equal(out, hf_generate(model, ids, mask, n, eos, 0)) and len(cache.graphs) == 1
    dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[], pad_token_id=5)
    assert len(cache.graphs) == 2  # another pad id: another step


def test_clearing_caches_frees_them_without_the_cycle_collector():
    """A kept step refers back to its cache: clear_caches (and Decoder.clear) must drop the graphs
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
