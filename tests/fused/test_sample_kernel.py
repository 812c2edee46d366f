"""The sampled-choice kernels (fused/kernels/sample.py) against their torch reference: in Triton's interpreter on
CPU (tests/conftest.py sets TRITON_INTERPRET=1), compiled on a GPU."""

from __future__ import annotations

import pytest
import torch

from overlapdecode.fused.kernels.greedy import StepLog
from overlapdecode.fused.kernels.sample import sample_choice, sample_finish_ref
from overlapdecode.sampling import check_sampling, seen_tokens
from support.triton_interpreter import interpreter_patches  # noqa: F401 (a fixture)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SETTINGS = [
    dict(temperature=0.8),
    dict(top_k=7),
    dict(top_p=0.9),
    dict(top_p=0.2),
    dict(min_p=0.2),
    dict(repetition_penalty=1.4),
    dict(temperature=0.7, top_k=40, top_p=0.95),
    dict(temperature=1.3, top_k=30, top_p=0.5, min_p=0.05, repetition_penalty=1.2),
]


def params_of(s):
    return check_sampling(
        True,
        s.get("temperature", 1.0),
        s.get("top_k"),
        s.get("top_p"),
        None,
        s.get("min_p"),
        s.get("repetition_penalty"),
    )


def run_both(B, V, setting, seed, block_v=None, eos=(), finished=(), log_length=0, pdl=False):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(B, V, generator=g) * 3).to(DEVICE)
    logits[0, 5:9] = logits[0].max()  # ties at the top of row 0
    noise = torch.empty(B, V).exponential_(generator=g).to(DEVICE)
    params = params_of(setting)
    seen = seen_tokens(torch.randint(0, V, (B, 6), generator=g).to(DEVICE), V) if params.uses_seen else None
    state = torch.zeros(B, 3, dtype=torch.long, device=DEVICE)
    state[:, 1] = torch.arange(B) + 10
    for r in finished:
        state[r, 2] = 1
    eos_t = torch.tensor(list(eos), dtype=torch.long, device=DEVICE)
    out = {}
    for name, fn in (("ref", sample_finish_ref), ("kernel", sample_choice)):
        st, done = state.clone(), torch.zeros((), dtype=torch.bool, device=DEVICE)
        sn = seen.clone() if seen is not None else None
        kw = dict(block_v=block_v, pdl=pdl) if name == "kernel" else {}
        log = None
        if log_length and (name == "kernel" or DEVICE == "cpu"):
            log = StepLog.empty(B, log_length, torch.device(DEVICE))
            log.count.fill_(log_length - 2)
        fn(logits, noise, params, sn, st, eos_t, 0, done, log=log, **kw)
        out[name] = (st, done, sn, log)
    return out


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("B,V,block_v", [(1, 1000, 128), (3, 2051, 256), (5, 300, 64)])
def test_sample_choice_equals_the_loops_choice(setting, B, V, block_v):
    for seed in range(3):
        got = run_both(B, V, setting, seed, block_v)
        (rs, rd, rn, _), (ks, kd, kn, _) = got["ref"], got["kernel"]
        assert torch.equal(ks, rs), (setting, seed, ks[:, 0], rs[:, 0])
        assert torch.equal(kd, rd)
        if rn is not None:
            assert torch.equal(kn, rn)


PDL_ON_GPU = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9

if PDL_ON_GPU:  # programmatic dependent launch needs an sm_90+ GPU (the interpreter has no launch to overlap)

    def test_sample_choice_with_pdl_equals_the_loops_choice():
        """The five launches with programmatic dependent launch (each waits for the one ahead before its first
        load), as the fused step launches them."""
        for setting in (dict(top_p=0.9), SETTINGS[-1]):
            for seed in range(3):
                got = run_both(8, 128256, setting, seed, pdl=True)
                assert torch.equal(got["kernel"][0], got["ref"][0]) and torch.equal(got["kernel"][1], got["ref"][1])


def test_sample_choice_pads_finished_rows_and_stops_on_eos():
    got = run_both(4, 500, dict(top_p=0.9), 1, 64, finished=(1,))
    tokens = got["ref"][0][:, 0]
    eos = (int(tokens[0]), int(tokens[2]))
    got = run_both(4, 500, dict(top_p=0.9), 1, 64, eos=eos, finished=(1, 3))
    (rs, rd, _, _), (ks, kd, _, _) = got["ref"], got["kernel"]
    assert torch.equal(ks, rs) and torch.equal(kd, rd)
    assert ks[1, 0] == 0 and ks[:, 2].tolist() == [1, 1, 1, 1] and bool(kd)


def test_sample_choice_writes_the_step_log():
    """As the greedy choice: the tokens and the flag at column log.count, then the count advanced; nothing past
    the log's end."""
    got = run_both(3, 400, dict(top_p=0.8, repetition_penalty=1.2), 2, 64, log_length=6)
    (rs, rd, _, _), (ks, kd, _, log) = got["ref"], got["kernel"]
    assert torch.equal(ks, rs) and torch.equal(kd, rd)
    assert torch.equal(log.tokens[:, 4], ks[:, 0]) and int(log.count) == 5 and bool(log.flags[4]) == bool(kd)
    assert int(log.tokens[:, :4].abs().sum()) == 0 and int(log.tokens[:, 5].abs().sum()) == 0


def test_sample_choice_runs_the_chain_when_candidates_are_rejected():
    """top_p small: the first two candidates are usually outside the nucleus, so the finish kernel's chain runs;
    over many rows it must still make the reference's choice."""
    got = run_both(16, 700, dict(top_p=0.05), 4, 128)
    assert torch.equal(got["kernel"][0], got["ref"][0])


def test_sample_choice_refuses_bad_buffers():
    params = params_of(dict(top_p=0.9))
    logits = torch.zeros(2, 10, device=DEVICE)
    state = torch.zeros(2, 3, dtype=torch.long, device=DEVICE)
    done = torch.zeros((), dtype=torch.bool, device=DEVICE)
    eos = torch.zeros(0, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="noise"):
        sample_choice(logits, torch.zeros(2, 9, device=DEVICE), params, None, state, eos, 0, done)
    with pytest.raises(ValueError, match="seen"):
        sample_choice(
            logits, torch.ones(2, 10, device=DEVICE), params_of(dict(repetition_penalty=1.1)), None, state, eos, 0, done
        )


def test_sample_choice_takes_the_second_candidate_when_the_first_is_dropped():
    """Two tokens hold most of the mass and top-p keeps only them: when the race winner is outside, the next
    candidate (round 2 of the checks) is usually one of the two and must be the reference's pick; token 0 is one of
    them, so a round that left its candidate unset (index 0) would pick it wrongly half the time."""
    B, V = 32, 500
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(B, V, generator=g) * 0.5
    logits[:, 0] = logits[:, 7] = 6.5  # p ~ 0.35 each: the nucleus of 0.5 is {0, 7}
    noise = torch.empty(B, V).exponential_(generator=g)
    params = params_of(dict(top_p=0.5))
    picks = {}
    for name, fn in (("ref", sample_finish_ref), ("kernel", sample_choice)):
        state = torch.zeros(B, 3, dtype=torch.long, device=DEVICE)
        fn(
            logits.to(DEVICE),
            noise.to(DEVICE),
            params,
            None,
            state,
            torch.zeros(0, dtype=torch.long, device=DEVICE),
            0,
            torch.zeros((), dtype=torch.bool, device=DEVICE),
        )
        picks[name] = state[:, 0].cpu()
    assert set(picks["ref"].tolist()) == {0, 7}
    assert torch.equal(picks["kernel"], picks["ref"])
