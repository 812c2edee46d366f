"""The task list of one decoder layer for the persistent layer kernel (persistent_layer.py), built once on the
host as data, and the checks that it cannot deadlock.

A layer is five phases of tile-sized tasks: QKV tiles (norm, GEMV, RoPE, cache write), attention pieces per
(row, KV head, split), O-projection tiles (+ residual), gate/up tiles (norm, GEMV, SiLU), down tiles (+ residual).
Each task is one row of an int32 table (FIELDS): what it computes (op, tile, split, row or row block), the
dependency counter it waits on and the count to wait for (`wait`, `need`), the counters it adds 1 to once its
output is final (`signal`, `n_signal`: consecutive counters), and the ticket of its split tile (`ticket`, -1
where the tile is not split): of the tasks of a split tile only the one that draws the last ticket finishes the
tile (sums the partials in a fixed order, runs the epilogue) and signals, as in linear_residual.

Counters (one int32 buffer, zero between launches: the kernel's last program to leave puts every one back to 0):
CLAIM (the next task to hand out), EXIT (programs done), then the dependency groups, then the tickets:
- qkv_done[r, g]: the QKV tiles of row block r whose heads belong to KV group g (its G query heads, its key and
  value head) that are final; attention of a row of r and KV head g waits for all (G + 2) x parts of them;
- att_done[r, s]: (row of r, KV head) pairs whose attention is final and whose heads overlap the O-projection's
  K range s; an O task of range s waits for all of them;
- o_done[r]: O-projection column blocks of r final (h after attention); a gate/up task of r waits for all;
- up_done[r, s]: gate/up column blocks of r final that overlap the down-projection's K range s; a down task of
  range s waits for those.
The split counts, K ranges and tiles are those the five kernels choose (split_k, choose_num_splits), so the
persistent layer adds the same partial sums in the same order.

Why it cannot deadlock: every wait is on tasks of a smaller index (the phases come in order; `check_schedule`
checks it), tasks are handed out in index order (a global CLAIM ticket, or program p taking p, p + P, ...),
and a claimed task belongs to a running program. So the unfinished task of the smallest index has all its
inputs and its program is running it (with the claim ticket a program holds at most the task it runs and the
next, larger, one). The static hand-out also needs every program resident at once; the claim ticket does not
(a program not yet started has claimed nothing). `simulate` runs a schedule with P programs under random
interleavings and fails on a state where no program can move.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import triton

from .decode_attention import block_sizes, choose_num_splits
from .linear_residual import split_k

QKV, ATTENTION, O_PROJ, GATE_UP, DOWN = range(5)
OPS = ("qkv", "attention", "o_proj", "gate_up", "down")
FIELDS = ("op", "tile", "split", "row", "wait", "need", "signal", "n_signal", "ticket")
OP, TILE, SPLIT, ROW, WAIT, NEED, SIGNAL, N_SIGNAL, TICKET = range(len(FIELDS))
CLAIM, EXIT = 0, 1  # the first two counters
BLOCK_M = 16  # batch rows per GEMV tile, as in the five kernels


@dataclass(frozen=True)
class LayerPlan:
    """Shapes and tiles of one layer at one batch and cache length, each split chosen as the five kernels choose
    it (make_plan)."""

    batch: int
    hidden: int
    n_heads: int
    n_kv: int
    head_dim: int
    inter: int  # the MLP's width (the down projection's K)
    cache_len: int
    half: int  # QKV: dimensions of each half of a head per tile
    qkv_block_k: int
    qkv_split: int
    qkv_chunk: int
    att_block_n: int
    att_block_d: int
    att_splits: int
    o_block_n: int
    o_block_k: int
    o_split: int
    o_chunk: int
    up_block_n: int
    up_block_k: int
    down_block_n: int
    down_block_k: int
    down_split: int
    down_chunk: int

    @property
    def row_blocks(self) -> int:
        return -(-self.batch // BLOCK_M)

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv

    @property
    def qkv_parts(self) -> int:
        return -(-(self.head_dim // 2) // self.half)

    @property
    def qkv_tiles(self) -> int:
        return (self.n_heads + 2 * self.n_kv) * self.qkv_parts

    @property
    def o_blocks(self) -> int:
        return -(-self.hidden // self.o_block_n)

    @property
    def up_blocks(self) -> int:
        return -(-self.inter // self.up_block_n)

    @property
    def down_blocks(self) -> int:
        return -(-self.hidden // self.down_block_n)


def _chunk(K: int, split: int, block_k: int) -> int:
    return triton.cdiv(triton.cdiv(K, split), block_k) * block_k


def make_plan(
    batch: int,
    hidden: int,
    n_heads: int,
    n_kv: int,
    head_dim: int,
    inter: int,
    cache_len: int,
    dtype: torch.dtype,
    sms: int,
    half: int | None = None,
    qkv_block_k: int = 256,
    qkv_programs: int | None = None,
    o_block_n: int = 32,
    o_block_k: int = 128,
    o_programs: int | None = None,
    up_block_n: int = 32,
    up_block_k: int = 256,
    down_block_n: int = 32,
    down_block_k: int = 128,
    down_programs: int | None = None,
    att_splits: int | None = None,
    att_block_n: int | None = None,
    att_programs: int | None = None,
) -> LayerPlan:
    """The plan of the five kernels' defaults on a GPU of `sms` SMs: norm_qkv splits K for 4 x sms programs,
    linear_residual for 2 x sms, the attention's splits come from the shapes within 2 x sms programs
    (choose_num_splits, as decode_attention.default_programs on that GPU)."""
    for name, v in (
        ("batch", batch),
        ("hidden", hidden),
        ("n_heads", n_heads),
        ("n_kv", n_kv),
        ("head_dim", head_dim),
        ("inter", inter),
        ("cache_len", cache_len),
        ("sms", sms),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if n_heads % n_kv:
        raise ValueError(f"n_heads ({n_heads}) must be a multiple of n_kv ({n_kv})")
    if head_dim % 2:
        raise ValueError(f"head_dim must be even (rotary pairs), got {head_dim}")
    if half is None:
        half = min(32, triton.next_power_of_2(max(head_dim // 2, 1)))
    tiles = (n_heads + 2 * n_kv) * triton.cdiv(head_dim // 2, half)
    qkv_split = split_k(tiles, hidden, qkv_block_k, qkv_programs or 4 * sms)
    K_o = n_heads * head_dim
    o_split = split_k(triton.cdiv(hidden, o_block_n), K_o, o_block_k, o_programs or 2 * sms)
    down_split = split_k(triton.cdiv(hidden, down_block_n), inter, down_block_k, down_programs or 2 * sms)
    default_n, block_d = block_sizes(head_dim, dtype)
    att_block_n = att_block_n or default_n
    if att_splits is None:
        att_splits = choose_num_splits(batch, n_kv, cache_len, att_block_n, att_programs or 2 * sms)
    return LayerPlan(
        batch,
        hidden,
        n_heads,
        n_kv,
        head_dim,
        inter,
        cache_len,
        half,
        qkv_block_k,
        qkv_split,
        _chunk(hidden, qkv_split, qkv_block_k),
        att_block_n,
        block_d,
        att_splits,
        o_block_n,
        o_block_k,
        o_split,
        _chunk(K_o, o_split, o_block_k),
        up_block_n,
        up_block_k,
        down_block_n,
        down_block_k,
        down_split,
        _chunk(inter, down_split, down_block_k),
    )


@dataclass
class Schedule:
    """The task table (n_tasks, len(FIELDS)) int32 on the host, and where each counter group starts."""

    plan: LayerPlan
    table: torch.Tensor
    bases: dict  # group name -> first counter
    n_counters: int

    @property
    def n_tasks(self) -> int:
        return self.table.shape[0]


def _overlapping(lo: int, hi: int, chunk: int, n_chunks: int) -> range:
    """The K ranges [s * chunk, (s + 1) * chunk) of n_chunks that overlap [lo, hi)."""
    return range(lo // chunk, min((hi - 1) // chunk, n_chunks - 1) + 1)


def build_schedule(plan: LayerPlan) -> Schedule:
    """The tasks of one layer in a topological order: QKV, attention, O, gate/up, down (module docstring). Within
    a phase the tasks come in the order their consumers need them: KV group by KV group for QKV and attention, K
    range by K range for the O and down projections (their split tasks of one range together)."""
    p = plan
    B, RB, G, Hkv = p.batch, p.row_blocks, p.group, p.n_kv
    K_o = p.n_heads * p.head_dim
    bases, n = {}, 2
    for name, size in (
        ("qkv_done", RB * Hkv),
        ("att_done", RB * p.o_split),
        ("o_done", RB),
        ("up_done", RB * p.down_split),
        ("qkv_ticket", p.qkv_tiles * RB if p.qkv_split > 1 else 0),
        ("att_ticket", B * Hkv if p.att_splits > 1 else 0),
        ("o_ticket", p.o_blocks * RB if p.o_split > 1 else 0),
        ("down_ticket", p.down_blocks * RB if p.down_split > 1 else 0),
    ):
        bases[name], n = n, n + size
    rows_in = [min(BLOCK_M, B - r * BLOCK_M) for r in range(RB)]
    tasks = []

    def add(op, tile, split, row, wait=-1, need=0, signal=-1, n_signal=0, ticket=-1):
        if need == 0:  # an empty K range waits for nothing
            wait = -1
        tasks.append((op, tile, split, row, wait, need, signal, n_signal, ticket))

    # QKV: heads of group g are its query heads g*G .. g*G+G-1, its key head Hq + g, its value head Hq + Hkv + g
    for g in range(Hkv):
        for r in range(RB):
            for head in [*range(g * G, g * G + G), p.n_heads + g, p.n_heads + Hkv + g]:
                for part in range(p.qkv_parts):
                    tile = head * p.qkv_parts + part
                    ticket = bases["qkv_ticket"] + tile * RB + r if p.qkv_split > 1 else -1
                    for s in range(p.qkv_split):
                        add(QKV, tile, s, r, signal=bases["qkv_done"] + r * Hkv + g, n_signal=1, ticket=ticket)
    # attention: (row b, KV head g, split); its output heads g*G .. g*G+G-1 feed the O ranges they overlap
    for g in range(Hkv):
        chunks = _overlapping(g * G * p.head_dim, (g + 1) * G * p.head_dim, p.o_chunk, p.o_split)
        for b in range(B):
            r = b // BLOCK_M
            ticket = bases["att_ticket"] + b * Hkv + g if p.att_splits > 1 else -1
            for s in range(p.att_splits):
                add(
                    ATTENTION,
                    g,
                    s,
                    b,
                    bases["qkv_done"] + r * Hkv + g,
                    (G + 2) * p.qkv_parts,
                    bases["att_done"] + r * p.o_split + chunks.start,
                    len(chunks),
                    ticket,
                )
    # O projection + residual: (column block, K range s, row block)
    for s in range(p.o_split):
        lo, hi = s * p.o_chunk, min((s + 1) * p.o_chunk, K_o)
        groups = len(range(lo // (G * p.head_dim), -(-hi // (G * p.head_dim)))) if hi > lo else 0
        for r in range(RB):
            for j in range(p.o_blocks):
                ticket = bases["o_ticket"] + j * RB + r if p.o_split > 1 else -1
                add(
                    O_PROJ,
                    j,
                    s,
                    r,
                    bases["att_done"] + r * p.o_split + s,
                    rows_in[r] * groups,
                    bases["o_done"] + r,
                    1,
                    ticket,
                )
    # gate/up + activation: (column block, row block); each feeds the down ranges it overlaps
    for r in range(RB):
        for j in range(p.up_blocks):
            chunks = _overlapping(j * p.up_block_n, min((j + 1) * p.up_block_n, p.inter), p.down_chunk, p.down_split)
            add(
                GATE_UP,
                j,
                0,
                r,
                bases["o_done"] + r,
                p.o_blocks,
                bases["up_done"] + r * p.down_split + chunks.start,
                len(chunks),
            )
    # down projection + residual: (column block, K range s, row block); the layer's output, nothing waits on it
    for s in range(p.down_split):
        lo, hi = s * p.down_chunk, min((s + 1) * p.down_chunk, p.inter)
        blocks = len(range(lo // p.up_block_n, -(-hi // p.up_block_n))) if hi > lo else 0
        for r in range(RB):
            for j in range(p.down_blocks):
                ticket = bases["down_ticket"] + j * RB + r if p.down_split > 1 else -1
                add(DOWN, j, s, r, bases["up_done"] + r * p.down_split + s, blocks, ticket=ticket)
    return Schedule(plan, torch.tensor(tasks, dtype=torch.int32), bases, n)


def _splits_of(schedule: Schedule) -> dict:
    """ticket -> the task indices that take it."""
    out: dict = {}
    for i, task in enumerate(schedule.table.tolist()):
        if task[TICKET] >= 0:
            out.setdefault(task[TICKET], []).append(i)
    return out


def check_schedule(schedule: Schedule) -> None:
    """ValueError unless: every field is in range, every wait is on tasks of smaller index only, and every
    counter's expected count equals the number of tiles that signal it (a split tile signals once, from the
    task that finishes it)."""
    table = schedule.table.tolist()
    n_dep = schedule.bases["qkv_ticket"]  # dependency counters are [2, n_dep)
    sources: dict = {}  # counter -> {source: the largest task index of the source}
    for i, (op, _tile, _split, _row, wait, need, signal, n_signal, ticket) in enumerate(table):
        if not 0 <= op < len(OPS):
            raise ValueError(f"task {i}: op {op} is not one of {OPS}")
        if n_signal < 0 or (n_signal and not 2 <= signal <= signal + n_signal <= n_dep):
            raise ValueError(
                f"task {i} ({OPS[op]}): signals counters [{signal}, {signal + n_signal}), outside the "
                f"dependency counters [2, {n_dep})"
            )
        if (wait >= 0) != (need > 0) or (wait >= 0 and not 2 <= wait < n_dep):
            raise ValueError(f"task {i} ({OPS[op]}): waits on counter {wait} for {need}")
        if ticket != -1 and not n_dep <= ticket < schedule.n_counters:
            raise ValueError(f"task {i} ({OPS[op]}): ticket {ticket} is not a ticket counter")
        source = ("ticket", ticket) if ticket >= 0 else ("task", i)
        for c in range(signal, signal + n_signal):
            sources.setdefault(c, {})[source] = i
    for i, task in enumerate(table):
        wait, need = task[WAIT], task[NEED]
        if wait < 0:
            continue
        srcs = sources.get(wait, {})
        late = [j for j in srcs.values() if j >= i]
        if late:
            raise ValueError(
                f"task {i} ({OPS[task[OP]]}) waits on counter {wait}, which task {late[0]} (not of a "
                "smaller index) signals"
            )
        if len(srcs) != need:
            raise ValueError(
                f"task {i} ({OPS[task[OP]]}) waits for {need} signals of counter {wait}, which {len(srcs)} tiles give"
            )


def live_pieces(plan: LayerPlan, start: int, length: int) -> int:
    """How many of a row's attention splits hold slots, as the kernel counts them (n_live); the row attends to
    [start, length), which must not be empty."""
    if length <= start:
        raise ValueError(f"a row attends to slots [start, length), which must not be empty: got [{start}, {length})")
    n_blocks = -(-(length - start) // plan.att_block_n)
    per_split = -(-n_blocks // plan.att_splits)
    return -(-n_blocks // per_split)


def simulate(
    schedule: Schedule,
    programs: int,
    claim: str = "dynamic",
    seed: int = 0,
    spans: list[tuple[int, int]] | None = None,
    resident: int | None = None,
) -> list[int]:
    """The order the tasks ran in: see `_execute`."""
    return _execute(schedule, programs, claim, seed, spans, resident)[0]


def final_counters(
    schedule: Schedule, programs: int, claim: str = "dynamic", spans: list[tuple[int, int]] | None = None
) -> list[int]:
    """Every counter after a launch of `programs` programs, before the last program puts them back to 0: CLAIM
    n_tasks + P with the claim ticket (each program claims one task more than it runs), 0 otherwise; EXIT P; each
    dependency counter the number of tiles that signal it; each ticket the number of tasks that take it."""
    counters = _execute(schedule, programs, claim, 0, spans, None)[1]
    counters[EXIT] = programs
    return counters


def _execute(schedule: Schedule, programs: int, claim: str, seed: int, spans, resident) -> tuple[list, list]:
    """Run the schedule as the kernel would with `programs` programs, one action of a random program at a time,
    and return the order the tasks ran in. A program's actions: claim its first task; with the claim ticket
    (`claim="dynamic"`) claim the next one before waiting (as the kernel does, one ahead); run its task once the
    wait is met (at once: its ticket, its signals); take the next. `claim="static"`: program p runs p, p + P, ...
    `resident`: at most this many programs run at once, the others start as running ones leave (a GPU with
    fewer slots than programs). `spans`: each row's attention (start, length), by default the whole cache.
    RuntimeError where no program can act and tasks are left (a deadlock)."""
    if claim not in ("dynamic", "static"):
        raise ValueError(f"claim must be 'dynamic' or 'static', got {claim!r}")
    plan, table = schedule.plan, schedule.table.tolist()
    spans = spans or [(0, plan.cache_len)] * plan.batch
    lives = [live_pieces(plan, *span) for span in spans]
    counters = [0] * schedule.n_counters
    n, rng, done = len(table), random.Random(seed), []
    split_count = {QKV: plan.qkv_split, O_PROJ: plan.o_split, DOWN: plan.down_split}
    resident = programs if resident is None else resident

    def finishes(i: int) -> bool:
        op, _, split, row, *_, ticket = table[i]
        need = lives[row] if op == ATTENTION else split_count[op] if ticket >= 0 else 1
        if op == ATTENTION and split >= lives[row]:
            return False  # an empty piece: no ticket, no signal
        if ticket < 0:
            return True
        counters[ticket] += 1
        return counters[ticket] == need

    def claim_one() -> int:
        counters[CLAIM] += 1
        return counters[CLAIM] - 1

    # per program: the task it runs (None before it starts, >= n once it has left) and the one claimed ahead
    cur: list = [None] * programs
    ahead: list = [None] * programs
    while True:
        running = sum(1 for c in cur if c is not None and c < n)
        actions = []
        for p in range(programs):
            if cur[p] is None:
                if running < resident:
                    actions.append(p)
            elif cur[p] < n:
                if claim == "dynamic" and ahead[p] is None:
                    actions.append(p)
                else:
                    wait, need = table[cur[p]][WAIT], table[cur[p]][NEED]
                    if need <= 0 or counters[wait] >= need:
                        actions.append(p)
        if not actions:
            left = [c for c in cur if c is None or c < n]
            if not left:
                return done, counters
            raise RuntimeError(
                f"deadlock: programs wait at tasks {sorted(c for c in left if c is not None)} with "
                f"{len(done)} of {n} tasks done ({left.count(None)} programs not started)"
            )
        p = rng.choice(actions)
        if cur[p] is None:
            cur[p] = claim_one() if claim == "dynamic" else p
        elif claim == "dynamic" and ahead[p] is None:
            ahead[p] = claim_one()
        else:
            i = cur[p]
            if finishes(i):
                for c in range(table[i][SIGNAL], table[i][SIGNAL] + table[i][N_SIGNAL]):
                    counters[c] += 1
            done.append(i)
            cur[p], ahead[p] = (ahead[p], None) if claim == "dynamic" else (i + programs, None)
