"""The late stop checks (ping-pong, deferred, end) return exactly what the sync loop returns.

On CPU the streams and events are trivially complete, so these tests exercise the late-stop bookkeeping:
the steps enqueued past the one where every row finished, their dropped tokens, the flags owed after the
loop, and the streamer fed one step late.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import overlapdecode as od
from overlapdecode.loop.stopping import Slots, make_check, steps_until_all_finished
from overlapdecode.sampling import mark_finished
from support.helpers import hf_generate, make_batch, naive_generate

N = 12
LATE = [
    od.Strategy(cache="static", stop_check="pingpong", lag=1),
    od.Strategy(cache="static", stop_check="pingpong", lag=3),
    od.Strategy(cache="static", stop_check="deferred", lag=1),
    od.Strategy(cache="dynamic", stop_check="deferred", lag=2),
    od.Strategy(cache="none", stop_check="pingpong", lag=1),
    od.Strategy(cache="static", stop_check="end"),
    "interleaved",  # compiled, shares the graph of test_generate
]
IDS = [s if isinstance(s, str) else f"{s.cache}-{s.stop_check}-lag{s.lag}" for s in LATE]


def free_run(model, ids, mask, n=N):
    return naive_generate(model, ids, mask, n, [], 0)[:, ids.shape[1] :]


def check_against_sync(model, ids, mask, n, eos, strategy, pad=0):
    sync = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, strategy="static", eos_token_id=eos, pad_token_id=pad
    )
    assert torch.equal(sync, hf_generate(model, ids, mask, n, eos, pad))
    got = []
    out = od.generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        strategy=strategy,
        eos_token_id=eos,
        pad_token_id=pad,
        streamer=got.append,
    )
    assert torch.equal(out, sync)
    assert torch.equal(torch.stack(got, 1), out[:, ids.shape[1] :])  # streamed = returned, nothing extra
    return out


@pytest.mark.parametrize("strategy", LATE, ids=IDS)
def test_eos_on_the_first_generated_token(tiny_gpt2, strategy):
    ids, mask = make_batch(4, seed=21)
    first = free_run(tiny_gpt2, ids, mask)[:, 0]
    out = check_against_sync(tiny_gpt2, ids, mask, N, first.unique().tolist(), strategy)
    assert out.shape[1] == ids.shape[1] + 1


@pytest.mark.parametrize("strategy", LATE, ids=IDS)
def test_eos_on_the_last_allowed_token(tiny_gpt2, strategy):
    for seed in range(100, 200):  # a prompt whose last free-run token appears nowhere before it
        ids, mask = make_batch(1, seed=seed)
        row = free_run(tiny_gpt2, ids, mask)[0].tolist()
        last = [t for t in row[-1:] if t not in row[:-1]]
        if last:
            break
    assert last, "no prompt found whose last token is new"
    out = check_against_sync(tiny_gpt2, ids, mask, N, last, strategy)
    assert out.shape[1] == ids.shape[1] + N and out[0, -1] == last[0]


@pytest.mark.parametrize("strategy", LATE, ids=IDS)
def test_max_new_tokens_one(tiny_gpt2, strategy):
    ids, mask = make_batch(4, seed=23)
    if not isinstance(strategy, str) and strategy.stop_check in ("pingpong", "deferred") and strategy.lag > 1:
        with pytest.raises(
            ValueError, match=f"strategy: a stop check {strategy.lag} steps late"
        ):  # a lag beyond the steps
            od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=1, strategy=strategy)
        strategy = dataclasses.replace(strategy, lag=1)
    out = check_against_sync(tiny_gpt2, ids, mask, 1, [999], strategy)
    assert out.shape[1] == ids.shape[1] + 1


@pytest.mark.parametrize("strategy", LATE, ids=IDS)
def test_rows_finish_at_different_steps(tiny_gpt2, strategy):
    ids, mask = make_batch(4, seed=24)
    free = free_run(tiny_gpt2, ids, mask)
    # row r stops at step 2r+1 at the latest: EOS = its token there
    eos = sorted({int(free[r, 2 * r + 1]) for r in range(4)})
    out = check_against_sync(tiny_gpt2, ids, mask, N, eos, strategy, pad=7)
    assert out.shape[1] < ids.shape[1] + N


@pytest.mark.parametrize("strategy", LATE, ids=IDS)
def test_late_stop_with_seeded_sampling(tiny_gpt2, strategy):
    if strategy == "interleaved":
        pytest.skip("compiled sampling is covered by test_sampling (one compile per sampling setting on CPU)")
    ids, mask = make_batch(4, seed=25)
    kw = dict(attention_mask=mask, max_new_tokens=N, do_sample=True, temperature=1.3, seed=5)
    free = od.generate(tiny_gpt2, ids, strategy="static", eos_token_id=[], **kw)[:, ids.shape[1] :]
    eos = sorted({int(free[r, r + 1]) for r in range(4)})
    sync = od.generate(tiny_gpt2, ids, strategy="static", eos_token_id=eos, **kw)
    assert sync.shape[1] < ids.shape[1] + N
    assert torch.equal(od.generate(tiny_gpt2, ids, strategy=strategy, eos_token_id=eos, **kw), sync)


def test_mark_finished_pads_after_eos():
    fin = torch.tensor([False, True, False])
    tok, fin2, done = mark_finished(torch.tensor([4, 4, 9]), fin, torch.tensor([9]), pad_id=0)
    assert tok.tolist() == [4, 0, 9] and fin2.tolist() == [False, True, True] and not bool(done)


def test_steps_until_all_finished():
    eos = torch.tensor([9, 8])
    gen = torch.tensor([[1, 9, 0, 0], [1, 2, 8, 0]])
    assert steps_until_all_finished(gen, eos) == 3
    assert steps_until_all_finished(torch.tensor([[1, 2, 3, 4], [9, 0, 0, 0]]), eos) == 4
    assert steps_until_all_finished(torch.tensor([[9, 1, 1, 1]]), eos) == 1


@pytest.mark.parametrize("strategy", LATE[:3], ids=IDS[:3])
def test_streamer_error_propagates_and_the_next_call_is_clean(tiny_gpt2, strategy):
    ids, mask = make_batch(2, seed=26)

    def boom(tokens):
        raise KeyError("client went away")

    with pytest.raises(KeyError, match="client went away"):
        od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=strategy, streamer=boom)
    out = od.generate(tiny_gpt2, ids, attention_mask=mask, max_new_tokens=N, strategy=strategy, eos_token_id=[])
    assert torch.equal(out, naive_generate(tiny_gpt2, ids, mask, N, [], 0))


def test_lag_by_name(tiny_gpt2):
    assert od.resolve_strategy("interleaved:3") == od.Strategy(
        cache="static", compile=True, stop_check="pingpong", lag=3
    )
    assert od.resolve_strategy("deferred:2").lag == 2
    for bad in ("kv:2", "interleaved:0", "interleaved:x", "nope:2"):
        with pytest.raises(ValueError):
            od.resolve_strategy(bad)
    ids, mask = make_batch(4, seed=27)
    free = free_run(tiny_gpt2, ids, mask)
    eos = sorted({int(free[r, r + 2]) for r in range(4)})
    check_against_sync(tiny_gpt2, ids, mask, N, eos, "interleaved:3")


def run_protocol(check, n_steps, stop_at):
    """Drive a check as the decode loop does, with step j's flag = (j >= stop_at) and its token = j."""
    for j in range(n_steps):
        with check.step(j):
            check.publish(j, torch.tensor(j >= stop_at), torch.tensor([j]))
        n = check.after_step(j)
        if n is not None:
            return n, j
    return check.drain(), None


@pytest.mark.parametrize("name,lag", [("sync", 0), ("pingpong", 1), ("pingpong", 3), ("deferred", 2)])
def test_the_stop_protocol_reads_each_flag_lag_steps_late(name, lag):
    n_steps = 6
    for stop_at in range(n_steps + 1):  # n_steps: never
        got = []
        check = make_check(
            name,
            lag,
            n_steps,
            None,
            None,
            Slots(lag + 1, 1, torch.device("cpu")),
            torch.zeros(1, n_steps, dtype=torch.long),
            torch.tensor([9]),
            got.append,
        )
        n, broke_at = run_protocol(check, n_steps, stop_at)
        assert n == min(stop_at + 1, n_steps)  # what the sync loop runs
        # the loop stops enqueuing `lag` steps after the stop, or drains the owed flags at the end
        assert broke_at == (stop_at + lag if stop_at + lag < n_steps else None)
        assert [int(t) for t in got] == list(range(n))  # tokens of the kept steps only, in order
        check.finish()


@pytest.mark.parametrize("name,lag", [("sync", 0), ("pingpong", 1), ("deferred", 2)])
def test_a_flag_the_step_wrote_to_host_memory_is_what_a_late_check_reads(name, lag):
    """publish(..., host_flag): a late check reads the flag from that host slot (where a captured fused step wrote
    it, step_graph.StepLog), not from the device flag; the sync check reads the device flag."""
    n_steps, stop_at = 6, 2
    host = torch.zeros(n_steps, dtype=torch.bool)
    check = make_check(
        name,
        lag,
        n_steps,
        None,
        None,
        Slots(lag + 1, 1, torch.device("cpu")),
        torch.zeros(1, n_steps, dtype=torch.long),
        torch.tensor([9]),
        None,
    )
    for j in range(n_steps):
        host[j] = j >= stop_at
        with check.step(j):  # the device flag says the opposite of the host slot
            check.publish(j, torch.tensor(j < stop_at), torch.tensor([j]), host[j])
        n = check.after_step(j)
        if n is not None:
            break
    else:
        n = check.drain()
    assert n == (1 if name == "sync" else stop_at + 1)


def test_end_check_finds_the_stop_after_the_loop():
    generated = torch.tensor([[1, 9, 0, 0, 0], [1, 2, 3, 9, 0]])  # row 0 stops at step 1, row 1 at step 3
    got = []
    check = make_check("end", 1, 5, None, None, None, generated, torch.tensor([9]), got.append)
    n, broke_at = run_protocol(check, 5, stop_at=3)
    assert (n, broke_at) == (4, None)
    assert torch.equal(torch.stack(got, 1), generated[:, :4])
