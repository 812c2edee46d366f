"""The sampled token choice of a decode step in three to six launches after the LM head, with its stop bookkeeping.

What it computes, per row b (the contract of `sample_finish_ref`, which is the decode loop's own `choose_next`
for sampling: sampling.choose_next, which is sampling.pick_next then mark_finished):

    token = the kept token with the largest exp(score) / noise     the exponential race over Hugging Face's
                                                                   kept set (sampling.py: penalty, temperature,
                                                                   top-k, top-p, min-p)
    token = pad_id if finished[b];  finished[b] |= token in eos_ids
    state[b] = (token, position[b] + 1, finished[b]);  done = all rows finished;  seen[b, token] = True

Why not sampling.pick_next compiled: its top-p bisection is KEY_ROUNDS masked sums over the vocabulary, one
kernel each; here top-p needs no search at all. The race winner over every top-k and min-p token, `x0`, is the
answer whenever top-p keeps it (the winner over a set is the winner over any subset holding it), which it does
with probability about top_p. Otherwise every token scored at or below x0 is dropped too (top-p keeps an upper
set of scores), and the answer is the race winner among the tokens scored above x0: the next candidate, checked
the same way. Each check is one masked sum. The launches but the threshold's and the finish's are each over a
(BLOCK_M, BLOCK_V) tile of the (B, V) logits per program, grid (cdiv(V, BLOCK_V), cdiv(B, BLOCK_M)), each
storing (NBLK, B) partials:

    1. _max_kernel        (kernels/top_k.py) the row maximum of the penalised logits; with top-k also each
                          tile's own k largest of them
    2. _threshold_kernel  (kernels/top_k.py, only with top-k) one program per row: the k-th largest penalised
                          logit, from the tiles' k largest (no sort)
    3. _race_kernel       scores, the top-k set's mass Z, and the race winner x0 of the top-k and min-p tokens
    4. _check_kernel      (only with top-p) the mass of the tokens scored <= x0 and the race winner x1 among
                          those scored above
    5. _check_kernel      (only with top-p; round 2) the same for x1 where x0 was dropped, giving x2
    6. _finish_kernel     one program: the first of x0, x1 kept, else (about one row in a thousand at top_p 0.9)
                          the chain continued from x2 over the whole row; then the state, the flag, the seen mask
                          and the step log

So: temperature alone 3 launches (1, 3, 6); top-k (Hugging Face's default sampling, top-k 50) 4; top-p 5;
top-k and top-p 6. Each kernel reduces the partials of the ones before when it starts (NBLK per row, from L2): no
tickets, no cross-program waits. A top-k above top_k.TOP_K_MAX takes its threshold from `torch.topk` instead of
launch 2. With a step log (greedy.StepLog) the finish writes the tokens and the flag where the decode loop reads
them, as the greedy choice does.

Ties: the race takes the first index of the largest exp(score) / noise, as `argmax` does; blocks are reduced in
column order, so the reduction order never changes the winner.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...sampling import SamplingParams, choose_next, mark_seen
from .greedy import BIG_INDEX, REDUCE_BLOCKS, GreedyFinish, StepLog, advance_rows, check_finish, greedy_finish_ref_log
from .pdl import pdl_launch, pdl_release, pdl_start
from .top_k import penalised, row_max_and_threshold


def sample_finish_ref(
    logits, noise, params: SamplingParams, seen, state, eos, pad_id: int, done, log: StepLog | None = None
) -> None:
    """The decode loop's sampled choice on (B, V) logits, written into state (B, 3), done (0-d) and seen (and
    the step log, on CPU, as kernels/greedy.py's twin writes it)."""
    new_state, all_done = choose_next(logits, state[:, 1], state, eos, pad_id, noise, params, seen)
    state.copy_(new_state)
    done.copy_(all_done)
    if seen is not None:
        mark_seen(seen, state[:, 0])
    if log is not None:
        greedy_finish_ref_log(log, state[:, 0], all_done)


@triton.jit
def _row_max(pmax_ptr, NBLK, B, rows, row_ok, BLOCK_M: tl.constexpr):
    """Each row's maximum from the (NBLK, B) partial maxima."""
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    for c0 in range(0, NBLK, REDUCE_BLOCKS):
        blk = c0 + tl.arange(0, REDUCE_BLOCKS)
        ok = (blk < NBLK)[:, None] & row_ok[None, :]
        m = tl.maximum(m, tl.max(tl.load(pmax_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=float("-inf")), 0))
    return m


@triton.jit
def _row_sum(part_ptr, NBLK, B, rows, row_ok, BLOCK_M: tl.constexpr):
    """Each row's sum of the (NBLK, B) partial sums, in block order."""
    z = tl.zeros((BLOCK_M,), tl.float32)
    for c0 in range(0, NBLK, REDUCE_BLOCKS):
        blk = c0 + tl.arange(0, REDUCE_BLOCKS)
        ok = (blk < NBLK)[:, None] & row_ok[None, :]
        z += tl.sum(tl.load(part_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=0.0), 0)
    return z


@triton.jit
def _row_best(val_ptr, idx_ptr, NBLK, B, rows, row_ok, BLOCK_M: tl.constexpr):
    """Each row's largest race value and its first index from the (NBLK, B) partials (blocks in column order:
    an earlier block wins a tie)."""
    best = tl.full((BLOCK_M,), -2.0, tl.float32)
    best_idx = tl.full((BLOCK_M,), BIG_INDEX, tl.int32)
    for c0 in range(0, NBLK, REDUCE_BLOCKS):
        blk = c0 + tl.arange(0, REDUCE_BLOCKS)
        ok = (blk < NBLK)[:, None] & row_ok[None, :]
        v = tl.load(val_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=-2.0)
        i = tl.load(idx_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=BIG_INDEX)
        c_max = tl.max(v, 0)
        c_idx = tl.min(tl.where(v == c_max[None, :], i, BIG_INDEX), 0)
        take = c_max > best
        best = tl.where(take, c_max, best)
        best_idx = tl.where(take, c_idx, best_idx)
    return best, best_idx


@triton.jit
def _scores(x, m, kth_l, temperature, TOP_K: tl.constexpr):
    """Penalised logits -> (scores, top-k membership), as sampling.scaled_scores computes them (the shift
    by the row maximum, the division, + 0.0 for -0.0); the k-th largest logit scored the same way."""
    s = (x - m[:, None]) / temperature + 0.0
    in_k = s > float("-inf")
    if TOP_K:
        kth = (kth_l - m) / temperature + 0.0
        in_k = in_k & (s >= kth[:, None])
    return s, in_k


@triton.jit
def _block_best(r, cols, val_ptr, idx_ptr, pid_n, B, rows, row_ok):
    """Store the tile's largest race value per row and its first column at (pid_n, row)."""
    b = tl.max(r, 1)
    first = tl.min(tl.where(r == b[:, None], cols[None, :], BIG_INDEX), 1)
    tl.store(val_ptr + pid_n * B + rows, b, mask=row_ok)
    tl.store(idx_ptr + pid_n * B + rows, first, mask=row_ok)


@triton.jit
def _race_kernel(
    logits_ptr,
    seen_ptr,
    noise_ptr,
    kth_ptr,
    pmax_ptr,
    pz_ptr,
    pr_ptr,
    pi_ptr,
    B,
    V,
    row_stride,
    rep,
    temperature,
    min_p,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)  # before any load: the kernel ahead's partials are final
    pid_n = tl.program_id(0)
    nblk = tl.num_programs(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < B
    ok = row_ok[:, None] & (cols < V)[None, :]
    # the tile first: its loads need nothing from the partials, so they run while the row maxima are reduced
    x = penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY)
    noise = tl.load(noise_ptr + rows[:, None].to(tl.int64) * V + cols[None, :], mask=ok, other=1.0)
    m = _row_max(pmax_ptr, nblk, B, rows, row_ok, BLOCK_M)
    kth_l = tl.load(kth_ptr + rows, mask=row_ok, other=0.0) if TOP_K else m
    s, in_k = _scores(x, m, kth_l, temperature, TOP_K)
    e = tl.where(in_k & ok, tl.exp(s), 0.0)
    tl.store(pz_ptr + pid_n * B + rows, tl.sum(e, 1), mask=row_ok)
    r = tl.where(in_k & ok & (e >= min_p), e / noise, -1.0)
    pdl_release(PDL)
    _block_best(r, cols, pr_ptr, pi_ptr, pid_n, B, rows, row_ok)


@triton.jit
def _candidate_score(
    logits_ptr, seen_ptr, token, rows, row_ok, m, V, row_stride, rep, temperature, PENALTY: tl.constexpr
):
    """The score of each row's candidate `token` (BLOCK_M,), computed as the tiles compute it."""
    t = tl.where(row_ok & (token < V), token, 0)
    x = tl.load(logits_ptr + rows.to(tl.int64) * row_stride + t, mask=row_ok, other=float("-inf"))
    if PENALTY:
        seen = tl.load(seen_ptr + rows.to(tl.int64) * V + t, mask=row_ok, other=0) != 0
        x = tl.where(seen, tl.where(x < 0, x * rep, x / rep), x)
    return (x - m) / temperature + 0.0


@triton.jit
def _check_tile(
    logits_ptr,
    seen_ptr,
    noise_ptr,
    kth_l,
    rows,
    cols,
    row_ok,
    m,
    z,
    pivot,
    V,
    row_stride,
    rep,
    temperature,
    min_p,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
):
    """Over one tile: the probability of the tokens scored <= pivot (B,), and the race values of the
    tokens scored above it (-1 elsewhere)."""
    ok = row_ok[:, None] & (cols < V)[None, :]
    x = penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY)
    noise = tl.load(noise_ptr + rows[:, None].to(tl.int64) * V + cols[None, :], mask=ok, other=1.0)
    return _check_scores(x, noise, ok, kth_l, m, z, pivot, temperature, min_p, TOP_K)


@triton.jit
def _check_scores(x, noise, ok, kth_l, m, z, pivot, temperature, min_p, TOP_K: tl.constexpr):
    """_check_tile on a loaded tile of penalised logits `x` and its `noise` (`ok`: the tile's live entries)."""
    s, in_k = _scores(x, m, kth_l, temperature, TOP_K)
    e = tl.where(in_k & ok, tl.exp(s), 0.0)
    mass = tl.sum(tl.where(s <= pivot[:, None], e / z[:, None], 0.0), 1)
    r = tl.where(in_k & ok & (e >= min_p) & (s > pivot[:, None]), e / noise, -1.0)
    return mass, r


@triton.jit
def _check_kernel(
    logits_ptr,
    seen_ptr,
    noise_ptr,
    kth_ptr,
    pmax_ptr,
    pz_ptr,
    pr_ptr,
    pi_ptr,
    pmass_ptr,
    pr2_ptr,
    pi2_ptr,
    pmass_out,
    pr_out,
    pi_out,
    B,
    V,
    row_stride,
    rep,
    temperature,
    min_p,
    limit,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
    ROUND: tl.constexpr,
    PDL: tl.constexpr,
):
    """Round 1: the mass at or below x0 and the winner x1 above it. Round 2: where round 1 dropped x0, the same
    for x1 (x2 above it); rows already decided store nothing that counts (mass 0, no candidate)."""
    pid_n = tl.program_id(0)
    nblk = tl.num_programs(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < B
    ok = row_ok[:, None] & (cols < V)[None, :]
    pdl_start(PDL)  # before any load: the kernels ahead's partials are final
    if ROUND == 1:
        # the tile first: its loads need nothing from the partials, so they run while those are reduced
        x = penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY)
        noise = tl.load(noise_ptr + rows[:, None].to(tl.int64) * V + cols[None, :], mask=ok, other=1.0)
        live = row_ok
        _, cand = _row_best(pr_ptr, pi_ptr, nblk, B, rows, row_ok, BLOCK_M)
    else:
        # only the rows whose x0 the first check dropped (about 1 - top_p of them) load the tile
        live = row_ok & (_row_sum(pmass_ptr, nblk, B, rows, row_ok, BLOCK_M) <= limit)
        ok = ok & live[:, None]
        x = penalised(logits_ptr, seen_ptr, rows, cols, ok, V, row_stride, rep, PENALTY)
        noise = tl.load(noise_ptr + rows[:, None].to(tl.int64) * V + cols[None, :], mask=ok, other=1.0)
        _, cand = _row_best(pr2_ptr, pi2_ptr, nblk, B, rows, row_ok, BLOCK_M)
    m = _row_max(pmax_ptr, nblk, B, rows, row_ok, BLOCK_M)
    z = _row_sum(pz_ptr, nblk, B, rows, row_ok, BLOCK_M)
    pivot = _candidate_score(logits_ptr, seen_ptr, cand, rows, live, m, V, row_stride, rep, temperature, PENALTY)
    kth_l = tl.load(kth_ptr + rows, mask=row_ok, other=0.0) if TOP_K else m
    mass, r = _check_scores(x, noise, ok, kth_l, m, z, pivot, temperature, min_p, TOP_K)
    pdl_release(PDL)
    tl.store(pmass_out + pid_n * B + rows, mass, mask=row_ok)
    _block_best(r, cols, pr_out, pi_out, pid_n, B, rows, row_ok)


@triton.jit
def _chain(
    logits_ptr,
    seen_ptr,
    noise_ptr,
    kth_ptr,
    pmax_ptr,
    pz_ptr,
    token,
    one,
    NBLK,
    B,
    V,
    row_stride,
    rep,
    temperature,
    min_p,
    limit,
    CHAIN_V: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
):
    """Row `one` (a (1,) index)'s chain from its candidate `token` ((1,) int32, to be checked): one pass over the
    row per candidate until top-p keeps one; -> that token, a scalar."""
    one_ok = one < B
    m = _row_max(pmax_ptr, NBLK, B, one, one_ok, 1)
    z = _row_sum(pz_ptr, NBLK, B, one, one_ok, 1)
    kth_l = tl.load(kth_ptr + one, mask=one_ok, other=0.0) if TOP_K else m
    kept = ~one_ok
    while tl.min(kept.to(tl.int32), 0) == 0:
        pivot = _candidate_score(logits_ptr, seen_ptr, token, one, one_ok, m, V, row_stride, rep, temperature, PENALTY)
        mass = tl.zeros((1,), tl.float32)
        best = tl.full((1,), -2.0, tl.float32)
        best_idx = tl.full((1,), BIG_INDEX, tl.int32)
        for c0 in range(0, V, CHAIN_V):
            cols = c0 + tl.arange(0, CHAIN_V)
            mass_c, r = _check_tile(
                logits_ptr,
                seen_ptr,
                noise_ptr,
                kth_l,
                one,
                cols,
                one_ok,
                m,
                z,
                pivot,
                V,
                row_stride,
                rep,
                temperature,
                min_p,
                PENALTY,
                TOP_K,
            )
            mass += mass_c
            c_max = tl.max(r, 1)
            c_idx = tl.min(tl.where(r == c_max[:, None], cols[None, :], BIG_INDEX), 1)
            take = c_max > best
            best = tl.where(take, c_max, best)
            best_idx = tl.where(take, c_idx, best_idx)
        now = mass > limit
        token = tl.where(kept | now, token, best_idx)
        kept = kept | now
    return tl.sum(token, 0)


@triton.jit
def _finish_kernel(
    logits_ptr,
    seen_ptr,
    noise_ptr,
    kth_ptr,
    pmax_ptr,
    pz_ptr,
    pr_ptr,
    pi_ptr,
    pmass_ptr,
    pr2_ptr,
    pi2_ptr,
    pmass2_ptr,
    pr3_ptr,
    pi3_ptr,
    NBLK,
    B,
    V,
    row_stride,
    rep,
    temperature,
    min_p,
    limit,
    state_ptr,
    eos_ptr,
    E,
    pad_id,
    done_ptr,
    tokens_ptr,
    flags_ptr,
    count_ptr,
    L,
    BLOCK_M: tl.constexpr,
    CHAIN_V: tl.constexpr,
    PENALTY: tl.constexpr,
    TOP_K: tl.constexpr,
    TOP_P: tl.constexpr,
    LOG: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)  # before any load: every partial is final
    all_done = tl.full((BLOCK_M,), 1, tl.int32)
    if LOG:  # the log's column: the previous step's finish advanced the count
        column = tl.load(count_ptr)
        in_log = (column >= 0) & (column < L)  # never past the log's end
    for r0 in range(0, B, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_ok = rows < B
        _, x0 = _row_best(pr_ptr, pi_ptr, NBLK, B, rows, row_ok, BLOCK_M)
        token = x0
        if TOP_P:
            kept0 = _row_sum(pmass_ptr, NBLK, B, rows, row_ok, BLOCK_M) > limit
            kept1 = _row_sum(pmass2_ptr, NBLK, B, rows, row_ok, BLOCK_M) > limit
            _, x1 = _row_best(pr2_ptr, pi2_ptr, NBLK, B, rows, row_ok, BLOCK_M)
            _, x2 = _row_best(pr3_ptr, pi3_ptr, NBLK, B, rows, row_ok, BLOCK_M)
            token = tl.where(kept0, x0, tl.where(kept1, x1, x2))
            kept = kept0 | kept1 | ~row_ok
            # rarely (about one row in 150 at top_p 0.9): x2 is to be checked; continue that row's chain over the
            # whole row, one candidate per pass. It ends: the top-scored token is always kept, and each pass moves
            # to a strictly higher score. One row at a time in (1, CHAIN_V) tiles, so that all of the program's
            # threads load the row that needs it (with the block's rows as the tile's M, a lone live row used one
            # lane in BLOCK_M of each load: at 8 rows, a pass took 8x the loads it needs).
            if tl.min(kept.to(tl.int32), 0) == 0:
                lane = tl.arange(0, BLOCK_M)
                for i in range(BLOCK_M):
                    if tl.sum(tl.where(lane == i, kept.to(tl.int32), 0), 0) == 0:
                        one = r0 + i + tl.arange(0, 1)
                        token = tl.where(
                            lane == i,
                            _chain(
                                logits_ptr,
                                seen_ptr,
                                noise_ptr,
                                kth_ptr,
                                pmax_ptr,
                                pz_ptr,
                                tl.sum(tl.where(lane == i, token, 0), 0) + tl.zeros((1,), tl.int32),
                                one,
                                NBLK,
                                B,
                                V,
                                row_stride,
                                rep,
                                temperature,
                                min_p,
                                limit,
                                CHAIN_V,
                                PENALTY,
                                TOP_K,
                            ),
                            token,
                        )
        token, fin = advance_rows(token.to(tl.int64), rows, row_ok, state_ptr, eos_ptr, E, pad_id)
        if PENALTY:
            tl.store(seen_ptr + rows.to(tl.int64) * V + token, 1, mask=row_ok)
        if LOG:
            tl.store(tokens_ptr + rows.to(tl.int64) * L + column, token, mask=row_ok & in_log)
        all_done = all_done & tl.where(row_ok, fin.to(tl.int32), 1)
    flag = (tl.min(all_done, 0) > 0).to(tl.uint8)
    tl.store(done_ptr, flag)
    if LOG:  # pinned host memory on CUDA: the host reads it after the step's event
        tl.store(flags_ptr + column, flag, mask=in_log)
        tl.store(count_ptr, column + 1)


def default_block_v(rows: int) -> int:
    """Logits per row per program: 1024 up to 8 rows, 512 from 16 (tiles of at most 8K logits): about one program
    per SM of an H200 at a 128K vocabulary (scripts/sample_sweep.py; docs/KERNELS.md, "The sampled choice")."""
    return max(512, min(1024, 8192 // min(16, triton.next_power_of_2(rows))))


def sample_choice(
    logits: torch.Tensor,
    noise: torch.Tensor,
    params: SamplingParams,
    seen,
    state: torch.Tensor,
    eos: torch.Tensor,
    pad_id: int,
    done: torch.Tensor,
    log: StepLog | None = None,
    block_v: int | None = None,
    pdl: bool = False,
) -> None:
    """The Triton kernels of `sample_finish_ref`: logits (B, V) float32 with contiguous rows, noise (B, V)
    float32, seen (B, V) bool when params.uses_seen (else None), state (B, 3) long, eos (E,) long, done 0-d
    bool, log a greedy.StepLog or None; writes state, done, seen and the log in place; `pdl`: the
    launches with programmatic dependent launch (pdl.py: each waits for the one ahead before its first load). No
    host sync: every value stays on the device."""
    if not params.do_sample:
        raise ValueError("params: sample_choice samples; the greedy choice is kernels/greedy.py's")
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be a (B, V) float32 tensor with contiguous rows, got {tuple(logits.shape)} {logits.dtype}"
        )
    B, V = logits.shape
    if noise.shape != (B, V) or noise.dtype != torch.float32 or not noise.is_contiguous():
        raise ValueError(f"noise must be a contiguous ({B}, {V}) float32 tensor, got {tuple(noise.shape)}")
    if params.uses_seen != (seen is not None):
        raise ValueError("seen: the (B, V) seen mask is needed exactly when the repetition penalty is on")
    if seen is not None and (seen.shape != (B, V) or seen.dtype != torch.bool or not seen.is_contiguous()):
        raise ValueError(f"seen must be a contiguous ({B}, {V}) bool tensor, got {tuple(seen.shape)} {seen.dtype}")
    check_finish(GreedyFinish(state, eos, int(pad_id), done, log), B, logits.device)
    block_m = min(16, triton.next_power_of_2(B))
    block_v = block_v or default_block_v(B)
    grid = (triton.cdiv(V, block_v), triton.cdiv(B, block_m))
    dev = logits.device
    num_warps = 4 if block_m * block_v <= 4096 else 8
    # launches 1 and 2 (kernels/top_k.py): the partial row maxima, and with top-k the k-th largest penalised logit,
    # which the kernels score as they score the tiles
    pmax, kth = row_max_and_threshold(logits, seen, params, block_m, block_v, num_warps, pdl)
    top_k = kth is not None
    kth = kth if top_k else pmax  # never read without top-k
    f32 = dict(dtype=torch.float32, device=dev)
    pz, pr, pmass, pr2, pmass2, pr3 = (torch.empty((grid[0], B), **f32) for _ in range(6))
    pi, pi2, pi3 = (torch.empty((grid[0], B), dtype=torch.int32, device=dev) for _ in range(3))
    seen_arg = seen.view(torch.uint8) if seen is not None else state  # never read without the penalty
    rep = params.repetition_penalty or 1.0
    temperature = params.temperature
    min_p = params.min_p or 0.0
    top_p = params.top_p is not None
    limit = 1.0 - params.top_p if top_p else 0.0
    stride = logits.stride(0)
    common = dict(
        BLOCK_M=block_m,
        PENALTY=seen is not None,
        TOP_K=top_k,
        PDL=bool(pdl),
        num_warps=num_warps,
        **pdl_launch(pdl),
    )
    _race_kernel[grid](
        logits, seen_arg, noise, kth, pmax, pz, pr, pi, B, V, stride, rep, temperature, min_p, BLOCK_V=block_v, **common
    )
    if top_p:
        for round_, outs in ((1, (pmass, pr2, pi2)), (2, (pmass2, pr3, pi3))):
            _check_kernel[grid](
                logits,
                seen_arg,
                noise,
                kth,
                pmax,
                pz,
                pr,
                pi,
                pmass,
                pr2,
                pi2,
                *outs,
                B,
                V,
                stride,
                rep,
                temperature,
                min_p,
                limit,
                BLOCK_V=block_v,
                ROUND=round_,
                **common,
            )
    eos_arg = eos if eos.numel() else state  # never read when E == 0
    done_u8 = done.view(torch.uint8)
    if log is not None:
        tokens, flags, count = log.tokens, log.flags.view(torch.uint8), log.count
    else:
        tokens, flags, count = state, done_u8, done_u8  # never read or written without a log
    chain_v = 4096  # one row per pass (_chain)
    _finish_kernel[(1,)](
        logits,
        seen_arg,
        noise,
        kth,
        pmax,
        pz,
        pr,
        pi,
        pmass,
        pr2,
        pi2,
        pmass2,
        pr3,
        pi3,
        grid[0],
        B,
        V,
        stride,
        rep,
        temperature,
        min_p,
        limit,
        state,
        eos_arg,
        eos.numel(),
        int(pad_id),
        done_u8,
        tokens,
        flags,
        count,
        flags.numel(),
        BLOCK_M=block_m,
        CHAIN_V=chain_v,
        PENALTY=seen is not None,
        TOP_K=top_k,
        TOP_P=top_p,
        LOG=log is not None,
        PDL=bool(pdl),
        num_warps=8,
        **pdl_launch(pdl),
    )
