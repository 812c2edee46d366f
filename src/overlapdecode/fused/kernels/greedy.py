"""The greedy token choice and stop bookkeeping of a decode step in one kernel launch, after the LM head.

What it computes, per row b (the contract of `greedy_finish_ref`, which is the decode loop's own
`choose_next` for greedy decoding):

    token = argmax(logits[b])            first index of the row maximum, NaN counting as the maximum
    token = pad_id if finished[b]        a finished row emits padding
    finished[b] |= token in eos_ids
    state[b] = (token, position[b] + 1, finished[b]);  done = all rows finished
    with a step log (StepLog), c = log.count: log.tokens[b, c] = token; log.flags[c] = done (nothing
    where c is outside the log); log.count += 1. One launch per step: the count is the step's column.

Why: after the head, the step used to launch the chunked argmax and the finished/EOS bookkeeping (inductor's
kernels of `choose_next`) and two copies into the step's state and flag: five small kernels, none with
programmatic dependent launch. Here one launch (with PDL, pdl.py) does it all. Grid (cdiv(V, BLOCK_V),
cdiv(B, BLOCK_M)): each program loads its (BLOCK_M, BLOCK_V) tile of float32 logits and stores each row's
maximum and first column holding it (NaN first), (NBLK, B) partials; in each row block the program that takes the
block's last ticket reduces its rows' partials in column-block order (the first block holding a row's maximum
wins: the first index, whichever program came last) and writes their state; of those, the last (a second ticket)
writes the flag. Why per row block: one program reducing every row block in turn was slower at many rows
(docs/KERNELS.md, "greedy_choice"); the flag needs only a count of the rows still running, added by each block's
reduction before its second ticket.

Folding the same partials and reduction into the LM head's own programs saves the launch but makes the step
slower: the head, the one kernel at full bandwidth, loses more than the launch saves (CHANGELOG.md, "tried and
dropped").

Where: FusedModel.greedy_step (the fused path's greedy step) with the Triton kernels; elsewhere its torch twin.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ...sampling import SamplingParams, choose_next
from .linear_residual import Tickets, last_of_split, take_tickets
from .pdl import pdl_launch, pdl_release, pdl_start

GREEDY = SamplingParams()  # greedy, no repetition penalty: the choice this kernel makes
BIG_INDEX = tl.constexpr(2**31 - 1)  # above any column: "no candidate"
REDUCE_BLOCKS = tl.constexpr(256)  # column blocks the last program reduces per iteration


# Logits per row per program: 2048 at one row, fewer as rows are added (a program's tile stays small), down to 512
# (docs/KERNELS.md, "greedy_choice").
def block_v_for(rows: int) -> int:
    return max(512, 2048 // min(16, triton.next_power_of_2(rows)))


class StepLog(NamedTuple):
    """What each step writes where the decode loop reads it, so that no copy follows the step: the step writes
    its tokens into column `count` of `tokens` and its all-finished flag into `flags[count]`, then advances
    `count`.

    `tokens` (B, L) long on the device: the call's output (the decoder writes the prompt into its first columns
    and sets `count` to the prompt length + 1 before the call's first graph step). `flags` (L,) bool: pinned
    host memory on CUDA, which the GPU writes directly (with unified addressing a pinned allocation is mapped
    into the device's address space); the host reads a step's slot once the event recorded after that step
    has completed (loop/stopping.py). `count` (1,) int32 on the device. Why: the copy of the token into the
    output and of the flag to pinned memory after each replay were two more operations on the GPU's queue per
    token (docs/KERNELS.md, "Graphs and launches")."""

    tokens: torch.Tensor
    flags: torch.Tensor
    count: torch.Tensor

    @classmethod
    def empty(cls, batch: int, length: int, device: torch.device) -> StepLog:
        cuda = device.type == "cuda"
        return cls(
            torch.zeros((batch, length), dtype=torch.long, device=device),
            torch.zeros(length, dtype=torch.bool, pin_memory=cuda),
            torch.zeros(1, dtype=torch.int32, device=device),
        )


class GreedyFinish(NamedTuple):
    """What a step's greedy finish reads and writes in place: `state` (B, 3) long (last token, its position,
    finished), `eos` (E,) long (E may be 0: never stop), `pad_id`, `done` 0-d bool (all rows finished), and
    optionally `log` (StepLog), where the tokens and done are also written, at column log.count (then
    advanced): the call's output, and pinned host memory the host reads without a copy after the step."""

    state: torch.Tensor
    eos: torch.Tensor
    pad_id: int
    done: torch.Tensor
    log: StepLog | None = None


def greedy_finish_ref(logits: torch.Tensor, finish: GreedyFinish) -> None:
    """The decode loop's greedy choice on float32 logits (B, V), written into finish.state and finish.done."""
    state = finish.state
    new_state, done = choose_next(logits, state[:, 1], state, finish.eos, finish.pad_id, None, GREEDY)
    state.copy_(new_state)
    finish.done.copy_(done)
    if finish.log is not None:
        greedy_finish_ref_log(finish.log, state[:, 0], done)


def greedy_finish_ref_log(log: StepLog, tokens: torch.Tensor, done: torch.Tensor) -> None:
    """The torch twins' step log: tokens (B,) and done into column log.count, then the count advanced."""
    if log.count.device.type != "cpu":
        raise ValueError("finish.log: the torch twin writes a step log on CPU only (the kernel on any device)")
    column = int(log.count)  # host memory: no sync
    if 0 <= column < log.flags.numel():  # as the kernel: nothing written past the log's end
        log.tokens[:, column] = tokens
        log.flags[column] = done
    log.count.add_(1)


@triton.jit
def block_argmax(y, rows, cols, row_ok, col_ok, val_ptr, idx_ptr, pid_n, B):
    """Store the per-row maximum of the (BLOCK_M, BLOCK_N) tile `y` (float32) and the first column holding it
    (NaN counting as the maximum, the first NaN then) at (pid_n, row) of the (NBLK, B) partials."""
    live = row_ok[:, None] & col_ok[None, :]
    v = tl.where(live, y, float("-inf"))
    nan = v != v
    any_nan = tl.max(nan.to(tl.int32), 1) > 0
    key = tl.where(nan, float("inf"), v)
    m = tl.max(key, 1)
    cand = tl.where(any_nan[:, None], nan, key == m[:, None]) & live
    first = tl.min(tl.where(cand, cols[None, :], BIG_INDEX), 1)
    tl.store(val_ptr + pid_n * B + rows, tl.where(any_nan, float("nan"), m), mask=row_ok)
    tl.store(idx_ptr + pid_n * B + rows, first, mask=row_ok)


@triton.jit
def advance_rows(token, rows, row_ok, state_ptr, eos_ptr, E, pad_id):
    """The stop bookkeeping of the rows' chosen tokens (int64): a finished row emits pad_id, an EOS token finishes
    its row; each row's state (token, position + 1, finished) written. -> (token, finished) of the rows."""
    fin = tl.load(state_ptr + rows * 3 + 2, mask=row_ok, other=1) != 0
    pos = tl.load(state_ptr + rows * 3 + 1, mask=row_ok, other=0)
    token = tl.where(fin, pad_id, token)
    is_eos = rows < 0  # all false
    for e in range(E):
        is_eos = is_eos | (token == tl.load(eos_ptr + e))
    fin = fin | is_eos
    tl.store(state_ptr + rows * 3, token, mask=row_ok)
    tl.store(state_ptr + rows * 3 + 1, pos + 1, mask=row_ok)
    tl.store(state_ptr + rows * 3 + 2, fin.to(tl.int64), mask=row_ok)
    return token, fin


@triton.jit
def greedy_finish(
    val_ptr,
    idx_ptr,
    NBLK,
    B,
    r0,
    state_ptr,
    eos_ptr,
    E,
    pad_id,
    tokens_ptr,
    count_ptr,
    L,
    BLOCK_M: tl.constexpr,
    RB: tl.constexpr,
    LOG: tl.constexpr,
):
    """Run by the program that takes the last ticket of the row block at r0: reduce its rows' (NBLK,) partials of
    block_argmax to each row's token, write their new state (and log column) and return how many of them are still
    running (see the module docstring). Its loads of the partials bypass L1 (the other programs stored them;
    linear_residual.last_of_split)."""
    rows = r0 + tl.arange(0, BLOCK_M)
    row_ok = rows < B
    best_nan = tl.zeros((BLOCK_M,), tl.int32)
    best_val = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    best_idx = tl.full((BLOCK_M,), BIG_INDEX, tl.int32)
    for c0 in range(0, NBLK, RB):  # column blocks in order: an earlier block wins a tie
        blk = c0 + tl.arange(0, RB)
        ok = (blk < NBLK)[:, None] & row_ok[None, :]
        pv = tl.load(val_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=float("-inf"), cache_modifier=".cg")
        pi = tl.load(idx_ptr + blk[:, None] * B + rows[None, :], mask=ok, other=BIG_INDEX, cache_modifier=".cg")
        pn = (pv != pv) & ok
        c_nan = tl.max(pn.to(tl.int32), 0)
        key = tl.where(pn, float("inf"), pv)
        c_max = tl.max(key, 0)
        cand = tl.where((c_nan > 0)[None, :], pn, key == c_max[None, :]) & ok
        c_idx = tl.min(tl.where(cand, pi, BIG_INDEX), 0)
        # take this chunk's candidate unless an earlier chunk already holds a NaN or an equal or larger max
        take = (best_nan == 0) & ((c_nan > 0) | (c_max > best_val) | (best_idx == BIG_INDEX))
        best_val = tl.where(take, c_max, best_val)
        best_idx = tl.where(take, c_idx, best_idx)
        best_nan = tl.maximum(best_nan, c_nan)
    token, fin = advance_rows(best_idx.to(tl.int64), rows, row_ok, state_ptr, eos_ptr, E, pad_id)
    if LOG:  # the log's column: the previous launch's flag writer advanced the count, this launch's only after
        # every row block's reduction has taken its second ticket, i.e. after this load (read past L1)
        column = tl.load(count_ptr, cache_modifier=".cg")
        in_log = (column >= 0) & (column < L)  # never past the log's end
        tl.store(tokens_ptr + rows.to(tl.int64) * L + column, token, mask=row_ok & in_log)
    return tl.sum(tl.where(row_ok & (fin == 0), 1, 0), 0)


@triton.jit
def write_flag(running_ptr, done_ptr, flags_ptr, count_ptr, L, LOG: tl.constexpr):
    """Run by the last of the row blocks' reductions (their second ticket): done = no row still running (the count
    they added), written with the log's flag; the count goes back to 0 and the log's column advances."""
    running = tl.atomic_xchg(running_ptr, 0, sem="acq_rel", scope="gpu")
    flag = (running == 0).to(tl.uint8)
    tl.store(done_ptr, flag)
    if LOG:  # pinned host memory on CUDA: the host reads it after the step's event
        column = tl.load(count_ptr, cache_modifier=".cg")
        tl.store(flags_ptr + column, flag, mask=(column >= 0) & (column < L))
        tl.store(count_ptr, column + 1)


@triton.jit
def _greedy_kernel(
    logits_ptr,
    val_ptr,
    idx_ptr,
    ticket_ptr,
    state_ptr,
    eos_ptr,
    E,
    pad_id,
    done_ptr,
    tokens_ptr,
    flags_ptr,
    count_ptr,
    L,
    B,
    V,
    row_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    LOG: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_V + tl.arange(0, BLOCK_V)
    row_ok = rows < B
    col_ok = cols < V
    y = tl.load(
        logits_ptr + rows[:, None].to(tl.int64) * row_stride + cols[None, :],
        mask=row_ok[:, None] & col_ok[None, :],
        other=float("-inf"),
    )
    pdl_release(PDL)
    block_argmax(y, rows, cols, row_ok, col_ok, val_ptr, idx_ptr, pid_n, B)
    # counters: [0, NR) one per row block (its column programs), NR the row blocks' reductions, NR + 1 the rows
    # still running. No program waits on another (tickets only), so nothing can deadlock.
    pid_m = tl.program_id(1)
    NR = tl.num_programs(1)
    if last_of_split(ticket_ptr, pid_m, tl.num_programs(0)):
        running = greedy_finish(
            val_ptr,
            idx_ptr,
            tl.num_programs(0),
            B,
            pid_m * BLOCK_M,
            state_ptr,
            eos_ptr,
            E,
            pad_id,
            tokens_ptr,
            count_ptr,
            L,
            BLOCK_M,
            REDUCE_BLOCKS,
            LOG,
        )
        tl.store(ticket_ptr + pid_m, 0)  # back to zero for the next launch
        tl.atomic_add(ticket_ptr + NR + 1, running, sem="relaxed", scope="gpu")  # ordered by the ticket below
        if last_of_split(ticket_ptr, NR, NR):
            write_flag(ticket_ptr + NR + 1, done_ptr, flags_ptr, count_ptr, L, LOG)
            tl.store(ticket_ptr + NR, 0)


def check_finish(finish: GreedyFinish, batch: int, device) -> None:
    """The buffers a kernel writes in place, checked from their metadata (no device read)."""
    if not isinstance(finish, GreedyFinish):
        raise TypeError(f"finish must be a GreedyFinish, got {type(finish).__name__}")
    state, eos, done = finish.state, finish.eos, finish.done
    if state.shape != (batch, 3) or state.dtype != torch.long or not state.is_contiguous():
        raise ValueError(
            f"finish.state must be a contiguous ({batch}, 3) long tensor, got {tuple(state.shape)} {state.dtype}"
        )
    if eos.dim() != 1 or eos.dtype != torch.long or not eos.is_contiguous():
        raise ValueError(f"finish.eos must be a contiguous 1-d long tensor, got {tuple(eos.shape)} {eos.dtype}")
    if done.shape != () or done.dtype != torch.bool:
        raise ValueError(f"finish.done must be a 0-d bool tensor, got {tuple(done.shape)} {done.dtype}")
    for name, t in (("state", state), ("eos", eos), ("done", done)):
        if t.device != device:
            raise ValueError(f"finish.{name} is on {t.device}, the logits on {device}")
    log = finish.log
    if log is None:
        return
    if not isinstance(log, StepLog):
        raise TypeError(f"finish.log must be a StepLog or None, got {type(log).__name__}")
    tokens, flags, count = log
    L = flags.numel()
    if flags.dim() != 1 or flags.dtype != torch.bool or not flags.is_contiguous() or L == 0:
        raise ValueError(
            f"finish.log.flags must be a contiguous non-empty 1-d bool tensor, got {tuple(flags.shape)} {flags.dtype}"
        )
    if device.type == "cuda" and not flags.is_pinned():
        raise ValueError("finish.log.flags must be in pinned host memory (the kernel writes it from the GPU)")
    if device.type != "cuda" and flags.device != device:
        raise ValueError(f"finish.log.flags is on {flags.device}, the logits on {device}")
    if (
        tokens.shape != (batch, L)
        or tokens.dtype != torch.long
        or not tokens.is_contiguous()
        or tokens.device != device
    ):
        raise ValueError(
            f"finish.log.tokens must be a contiguous ({batch}, {L}) long tensor on {device}, got "
            f"{tuple(tokens.shape)} {tokens.dtype} on {tokens.device}"
        )
    if count.shape != (1,) or count.dtype != torch.int32 or count.device != device:
        raise ValueError(
            f"finish.log.count must be a (1,) int32 tensor on {device}, got {tuple(count.shape)} "
            f"{count.dtype} on {count.device}"
        )


def greedy_choice(
    logits: torch.Tensor,
    finish: GreedyFinish,
    tickets: Tickets | None = None,
    pdl: bool = False,
    block_v: int | None = None,
) -> None:
    """The Triton kernel of `greedy_finish_ref`: logits (B, V) float32 with contiguous rows (a column slice,
    such as the vocabulary-parallel head's gathered logits, is read in place); writes finish.state and
    finish.done (and finish.log) in place. `tickets`: the launch's counters, one per row block and two more
    (linear_residual.Tickets; default fresh zeros); `pdl`: programmatic dependent launch (pdl.py); `block_v`: logits
    per row per program (a power of two; default block_v_for(B))."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(
            f"logits must be a (B, V) float32 tensor, got {getattr(logits, 'shape', logits)!r} "
            f"{getattr(logits, 'dtype', '')}"
        )
    if logits.stride(1) != 1 or logits.shape[0] * logits.stride(0) >= 2**31:
        raise ValueError(
            f"logits must have contiguous rows and fewer than 2**31 elements' span, got shape "
            f"{tuple(logits.shape)} strides {logits.stride()}"
        )
    B, V = logits.shape
    if B == 0 or V == 0:
        raise ValueError(f"logits must have at least one row and one column, got shape {tuple(logits.shape)}")
    if block_v is None:
        block_v = block_v_for(B)
    if not isinstance(block_v, int) or block_v < 16 or block_v & (block_v - 1):
        raise ValueError(f"block_v must be a power of two >= 16, got {block_v!r}")
    check_finish(finish, B, logits.device)
    block_m = min(16, triton.next_power_of_2(B))
    grid = (triton.cdiv(V, block_v), triton.cdiv(B, block_m))
    vals = torch.empty((grid[0], B), dtype=torch.float32, device=logits.device)
    idx = torch.empty((grid[0], B), dtype=torch.int32, device=logits.device)
    eos = finish.eos if finish.eos.numel() else finish.state  # never read when E == 0
    done = finish.done.view(torch.uint8)
    log = finish.log
    if log is not None:
        tokens, flags, count = log.tokens, log.flags.view(torch.uint8), log.count
    else:
        tokens, flags, count = finish.state, done, done  # never read or written without a log
    _greedy_kernel[grid](
        logits,
        vals,
        idx,
        take_tickets(tickets, grid[1] + 2, logits.device),
        finish.state,
        eos,
        finish.eos.numel(),
        int(finish.pad_id),
        done,
        tokens,
        flags,
        count,
        flags.numel(),
        B,
        V,
        logits.stride(0),
        BLOCK_M=block_m,
        BLOCK_V=block_v,
        LOG=log is not None,
        PDL=bool(pdl),
        num_warps=4,
        **pdl_launch(pdl),
    )
