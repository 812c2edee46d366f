"""The sampled-choice kernels (fused/kernels/sample.py) against their torch reference: in Triton's interpreter on
CPU (tests/conftest.py sets TRITON_INTERPRET=1), compiled on a GPU."""

from __future__ import annotations

import pytest
import torch
import triton
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from overlapdecode.fused.kernels import sample as sample_module
from overlapdecode.fused.kernels import top_k as top_k_module
from overlapdecode.fused.kernels.greedy import StepLog
from overlapdecode.fused.kernels.sample import default_block_v, sample_choice, sample_finish_ref
from overlapdecode.fused.kernels.top_k import TOP_K_MAX, row_max_and_threshold, row_max_and_threshold_ref
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


def tied_logits(B, V, g, masked=0.0):
    """Half-integer logits (many ties, at any top-k threshold), a fraction `masked` of them -inf, and the last
    row's only finite logits its first 5 (a top-k of more keeps all of them: the threshold is -inf)."""
    logits = torch.round(torch.randn(B, V, generator=g) * 6) / 2
    drop = torch.rand(B, V, generator=g) < masked
    if B > 1:
        drop[-1] = torch.arange(V) >= 5
    return logits.masked_fill(drop, float("-inf"))


def run_both(B, V, setting, seed, block_v=None, eos=(), finished=(), log_length=0, pdl=False, masked=None):
    """The kernels' choice and the loop's on the same random logits (`masked` not None: tied_logits')."""
    g = torch.Generator().manual_seed(seed)
    if masked is None:
        logits = (torch.randn(B, V, generator=g) * 3).to(DEVICE)
        logits[0, 5:9] = logits[0].max()  # ties at the top of row 0
    else:
        logits = tied_logits(B, V, g, masked).to(DEVICE)
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
        """The launches with programmatic dependent launch (each waits for the one ahead before its first
        load), as the fused step launches them."""
        for setting in (dict(top_p=0.9), SETTINGS[-1]):
            for seed in range(3):
                got = run_both(8, 128256, setting, seed, pdl=True)
                assert torch.equal(got["kernel"][0], got["ref"][0]) and torch.equal(got["kernel"][1], got["ref"][1])

    def test_top_k_at_a_real_vocabulary_with_bfloat16_ties():
        """Hugging Face's default top-k 50 at Llama-3's vocabulary, the logits rounded to bfloat16 (ties at the
        threshold, as a 16-bit LM head makes them), batch 1 and 8 at the default tiles, with PDL: the threshold is
        torch.topk's (without the penalty) and the choice the loop's."""
        V = 128256
        for B in (1, 8):
            for setting in (dict(top_k=50), dict(top_k=50, repetition_penalty=1.2)):
                params = params_of(setting)
                g = torch.Generator(device=DEVICE).manual_seed(B)
                logits = (torch.randn(B, V, generator=g, device=DEVICE) * 3).bfloat16().float()
                seen = torch.rand(B, V, generator=g, device=DEVICE) < 0.01 if params.uses_seen else None
                block_m = min(16, triton.next_power_of_2(B))
                _, kth = row_max_and_threshold(logits, seen, params, block_m, default_block_v(B), 8, pdl=True)
                if seen is None:  # with the penalty the kernels' x / penalty is PTX's div.full, within 2 ulp of torch's
                    assert torch.equal(kth, row_max_and_threshold_ref(logits, seen, params)[1])
                for seed in range(3):
                    got = run_both(B, V, setting, seed, pdl=True, masked=0.0)  # half-integers: more ties
                    assert torch.equal(got["kernel"][0], got["ref"][0])


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


# (B, V, block_v, setting): top-k at the edges, on tied_logits (ties at every threshold, -inf logits); 17 rows are
# two row blocks; V never a multiple of the block
TOP_K_CASES = [
    (1, 1000, 128, dict(top_k=1)),
    (3, 2051, 256, dict(top_k=50)),
    (17, 300, 64, dict(top_k=TOP_K_MAX, repetition_penalty=1.3)),
    (3, 300, 64, dict(top_k=3, top_p=0.7, repetition_penalty=0.8)),
    (3, 300, 32, dict(top_k=40, min_p=0.1)),  # k > BLOCK_V: a tile stores all its logits
    (3, 50, 16, dict(top_k=49, temperature=0.6)),  # k = V - 1
    (3, 300, 64, dict(top_k=TOP_K_MAX + 1, repetition_penalty=1.3)),  # beyond the kernels' bound: torch.topk
    (3, 300, 64, dict(top_k=300)),  # k = V: no top-k
    (17, 300, 64, dict(top_k=301, top_p=0.9)),  # k > V: no top-k
]


def _case_id(case):
    B, V, block_v, setting = case
    return f"{B}x{V}/{block_v}-" + ",".join(f"{k}={v}" for k, v in setting.items())


@pytest.mark.parametrize("case", TOP_K_CASES, ids=_case_id)
def test_top_k_cases_equal_the_loops_choice(case):
    B, V, block_v, setting = case
    for seed in range(2):
        got = run_both(B, V, setting, seed, block_v, masked=0.1)
        (rs, rd, rn, _), (ks, kd, kn, _) = got["ref"], got["kernel"]
        assert torch.equal(ks, rs), (setting, seed, ks[:, 0], rs[:, 0])
        assert torch.equal(kd, rd)
        if rn is not None:
            assert torch.equal(kn, rn)


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.parametrize("case", TOP_K_CASES, ids=_case_id)
def test_the_threshold_is_the_k_th_largest_penalised_logit(case, resident, monkeypatch):
    """kernels/top_k.py's two launches: each row's maximum and k-th largest penalised logit, as torch computes
    them; `resident` False: the threshold kernel reads the candidates again for each count, in chunks of 32."""
    if not resident:
        monkeypatch.setattr(top_k_module, "RESIDENT_KEYS", 16)
        monkeypatch.setattr(top_k_module, "KEY_CHUNK", 32)
    B, V, block_v, setting = case
    params = params_of(setting)
    g = torch.Generator().manual_seed(3)
    logits = tied_logits(B, V, g, masked=0.2).to(DEVICE)
    logits[0, 7] = -0.0  # a -0.0 among the 0.0s
    seen = seen_tokens(torch.randint(0, V, (B, 9), generator=g).to(DEVICE), V) if params.uses_seen else None
    block_m = min(16, 1 << (B - 1).bit_length())
    pmax, kth = row_max_and_threshold(logits, seen, params, block_m, block_v, num_warps=4)
    row_max, ref_kth = row_max_and_threshold_ref(logits, seen, params)
    assert torch.equal(pmax.amax(dim=0), row_max)
    assert (kth is None) == (ref_kth is None) == (params.top_k >= V)
    if kth is not None:
        assert torch.equal(kth, ref_kth), (kth, ref_kth)
        if B > 1 and params.top_k > 5:  # the last row has 5 finite logits
            assert kth[-1] == float("-inf")


def _pick(logits, noise, setting):
    """The token each row's kernels and the loop choose: (kernel's, loop's), (B,) each."""
    params = params_of(setting)
    B = logits.shape[0]
    picks = []
    for fn in (sample_choice, sample_finish_ref):
        state = torch.zeros(B, 3, dtype=torch.long, device=DEVICE)
        eos = torch.zeros(0, dtype=torch.long, device=DEVICE)
        fn(logits.to(DEVICE), noise.to(DEVICE), params, None, state, eos, 0, torch.zeros((), dtype=torch.bool))
        picks.append(state[:, 0].cpu())
    return picks


def test_top_k_keeps_every_tie_at_the_threshold_and_nothing_below():
    """Hugging Face's TopKLogitsWarper keeps every token whose logit is >= the k-th largest: with k = 5, three
    tokens at 3.0 and five tied at 2.0 in five tiles (row 0), or six tied at 2.0 in one tile with k = 3 (row 2), all
    are kept; the token just below 2.0 is not (row 1). The token whose tiny noise wins the race if kept tells."""
    V = 300
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(1)) * 0.1 - 5
    noise = torch.empty(3, V).exponential_(generator=torch.Generator().manual_seed(2))
    for r in (0, 1):
        logits[r, [10, 70, 130]] = 3.0
        logits[r, [20, 80, 140, 200, 260]] = 2.0
    logits[1, 150] = torch.nextafter(torch.tensor(2.0), torch.tensor(0.0))
    logits[2, 1:7] = 2.0
    noise[0, 260] = noise[1, 150] = noise[2, 6] = 1e-30
    for k, rows in ((5, [0, 1]), (3, [2])):
        kernel, loop = _pick(logits[rows], noise[rows], dict(top_k=k))
        assert torch.equal(kernel, loop)
        if k == 5:
            assert kernel[0] == 260 and kernel[1] in (10, 70, 130, 20, 80, 140, 200, 260)
        else:
            assert kernel[0] == 6


class _Counted:
    """A kernel whose launches are logged by name, run with no dispatch mode (the interpreter's own tensor ops
    are not the path's)."""

    def __init__(self, kernel, name, log):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.log.append(self.name)
            with _disable_current_modes():
                return self.kernel[grid](*args, **kwargs)

        return launch


class _AtenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "setting,launches",
    [
        (dict(temperature=0.8), ["max", "race", "finish"]),
        (dict(top_k=50), ["max", "threshold", "race", "finish"]),  # Hugging Face's defaults
        (dict(top_k=50, repetition_penalty=1.2), ["max", "threshold", "race", "finish"]),
        (dict(top_p=0.9), ["max", "race", "check", "check", "finish"]),
        (dict(top_k=TOP_K_MAX, top_p=0.9), ["max", "threshold", "race", "check", "check", "finish"]),
        (dict(top_k=TOP_K_MAX + 1), ["max", "race", "finish"]),  # and torch.topk
    ],
    ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else None,
)
def test_the_sampled_choice_launches_its_kernels_and_sorts_nothing(setting, launches, monkeypatch):
    """Per step: the kernels launched, in order, and no other op but allocations and views (no topk, no sort, no
    penalised copy): the top-k threshold comes from kernels/top_k.py up to TOP_K_MAX, from torch.topk beyond."""
    log = []
    for module, attr, name in (
        (top_k_module, "_max_kernel", "max"),
        (top_k_module, "_threshold_kernel", "threshold"),
        (sample_module, "_race_kernel", "race"),
        (sample_module, "_check_kernel", "check"),
        (sample_module, "_finish_kernel", "finish"),
    ):
        monkeypatch.setattr(module, attr, _Counted(getattr(module, attr), name, log))
    B, V = 3, 500
    g = torch.Generator().manual_seed(5)
    logits = tied_logits(B, V, g).to(DEVICE)
    noise = torch.empty(B, V).exponential_(generator=g).to(DEVICE)
    params = params_of(setting)
    seen = seen_tokens(torch.randint(0, V, (B, 6), generator=g).to(DEVICE), V) if params.uses_seen else None
    states = [torch.zeros(B, 3, dtype=torch.long, device=DEVICE) for _ in range(2)]
    eos = torch.zeros(0, dtype=torch.long, device=DEVICE)
    done = torch.zeros((), dtype=torch.bool, device=DEVICE)
    sample_finish_ref(logits, noise, params, None if seen is None else seen.clone(), states[0], eos, 0, done.clone())
    with _AtenOps() as aten:
        sample_choice(logits, noise, params, seen, states[1], eos, 0, done, block_v=64)
    assert torch.equal(states[1], states[0])
    assert log == launches
    others = set(aten.ops) - {"empty", "view", "detach"}  # allocations and views: no launch
    if (params.top_k or 0) > TOP_K_MAX:
        assert "topk" in others
    else:
        assert not others, others
