"""A whole MLP block in one persistent launch: h + down(act(up(norm(h)))), the work of `norm_linear` (the
up-projection with its norm prologue and activation) then `linear_residual` (the down-projection with bias
and residual), with a grid-wide barrier between the two instead of a kernel boundary.

Why: at decode each of those kernels is a few microseconds while its weights need about one of bandwidth
(GPT-2 on an H200: fc 4.5 us, down 4.8 us for 9.4 MB in all); the rest is launch, ramp-up and drain, paid
at every kernel boundary. One launch pays it once, and the down-projection's first weight tile of every
program is already on its way from DRAM while the programs wait at the barrier: the down-projection's
weights do not depend on the up-projection, only its activations do.

Grid: G programs, all resident at once (G <= the SMs' capacity; on CUDA a cooperative launch, which the
driver refuses rather than run a grid that cannot be co-resident), each looping over work items
pid, pid + G, ...
- Phase A: items are (row block of 16 rows, column tile of the up-projection's output); each is
  norm_linear's program (`norm_stats`, `norm_gemv`, `act_epilogue`, the same roundings): the activation
  m (B, I), in the model dtype, goes to a scratch buffer.
- Grid barrier (phases 3 only; see below).
- Phase B: items are (row block, column block of the output, K range of SPLIT); each is linear_residual's
  split program: the partial sums of its K range to a float32 buffer (SPLIT, B, H); the program that takes the
  last ticket of a tile (`last_of_split`) adds the partials in the fixed order 0 .. SPLIT-1 (deterministic),
  then the bias and the residual x (`bias_residual`), and puts the ticket back to 0. With SPLIT = 1 the one
  program of a tile finishes it directly. m is read past L1 (.cg): other SMs wrote it.

The barrier, on two int32 counters that are 0 before and after every launch (so a CUDA graph can replay
the launch, and the counters can share a Tickets buffer with other kernels):
1. arrive: a CTA barrier (every thread's stores of m issued), then one atomic add of 1 to `arrive` with
   release semantics at GPU scope: this program's m is visible to whoever acquires a value it wrote;
2. prefetch: the program's first phase-B weight tile (PRE_K columns of its first item) is loaded into
   registers, independent of m, so its DRAM latency overlaps the wait;
3. spin: `tl.atomic_add(arrive, 0, sem="acquire")` until it reads G; Triton compiles it to one thread's
   `ld.acquire.gpu` (L2, past L1) broadcast to the CTA through shared memory, so one request per program per
   turn reaches the counter's L2 slice. The load that reads G synchronizes with every program's arrive (all
   of them read-modify-writes of one word: one release sequence); then a CTA barrier, so that the whole
   CTA's loads of m come after it (the pattern of CUDA's cooperative groups: one thread waits, then
   __syncthreads);
4. depart: after its phase B, each program adds 1 to `depart` (acquire-release); the one that draws G - 1
   is the last: every program has left its spin by then (its depart comes after its spin in program order,
   and the acquire-release chain orders those reads before this store), so it can store 0 to both counters
   and no spinning program can miss the value G. The next launch on the stream starts after this one has
   finished (under PDL its `gdc_wait` comes before it touches anything), and sees zeros.
The extra atomic of the depart costs one L2 round trip at the end of each program; a counter that flips its
top bit (CUDA's cooperative groups) needs none but is not 0 after every launch.

Deadlock freedom: the barrier needs all G programs resident. G is at most what fits on the GPU, and the
cooperative launch makes the driver refuse a grid that would not fit. A kernel ahead of this one on the stream
always finishes; a kernel after it (programmatic dependent launch) is released only after the barrier
(`pdl_release` there in mode LATE), when every program of this grid has been resident for a while; PDL's
EARLY mode (release at the start) is refused here (a dependent is in fact launched only once every program has
released, but the rule is kept simple). Triton's interpreter runs programs one after another, so the
barrier would wait for ever there: off CUDA the wrapper launches phase A alone then phase B alone (PHASES 1
then 2), two launches that need no barrier; the barrier code is compiled out of those.

Status: written and tested without a GPU (the interpreter for the math, sm_90 PTX for the barrier's
instructions and their order); scripts/norm_mlp_ab.py is its first run on one, and measures whether it wins.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .linear_residual import bias_residual, last_of_split, linear_residual_ref, require_32bit, sum_partials, \
    take_tickets, Tickets
from .norm_linear import ACTS, _ACT_CODE, act_epilogue, norm_gemv, norm_linear_ref, norm_stats
from .pdl import EARLY, pdl_launch, pdl_release, pdl_start

BLOCK_M = 16  # batch rows per item, padded for tl.dot (as the two kernels it fuses)
BARRIER_COUNTERS = 2  # arrive, depart: after the split's tickets in the same counter buffer


def norm_mlp_ref(x, norm_w, norm_b, eps: float, w_up, b_up, act: str, w_down, b_down):
    """x + down(act(up(norm(x)))): `norm_linear_ref` then `linear_residual_ref` with x as the residual."""
    return linear_residual_ref(norm_linear_ref(x, norm_w, norm_b, eps, w_up, b_up, act), w_down, b_down, x)


@triton.jit
def _down_item(item, N_BLOCKS: tl.constexpr, SPLIT: tl.constexpr):
    """Phase B's item -> (column block, K range, row block): column blocks vary fastest."""
    return item % N_BLOCKS, (item // N_BLOCKS) % SPLIT, item // (N_BLOCKS * SPLIT)


@triton.jit
def _first_w(wd_ptr, item, ITEMS: tl.constexpr, H: tl.constexpr, I: tl.constexpr, K_CHUNK: tl.constexpr,
             N_BLOCKS: tl.constexpr, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, PRE_K: tl.constexpr):
    """The first PRE_K columns of phase-B item `item`'s weight tile (zeros past the last item): the tile a
    program loads before it needs it (at the barrier, and during the item before)."""
    j, s, r = _down_item(item, N_BLOCKS, SPLIT)
    cols = j * BLOCK_N + tl.arange(0, BLOCK_N)
    kk = s * K_CHUNK + tl.arange(0, PRE_K)
    k_hi = tl.minimum(s * K_CHUNK + K_CHUNK, I)
    ok = (cols < H)[:, None] & (kk < k_hi)[None, :] & (item < ITEMS)
    return tl.load(wd_ptr + cols[:, None] * I + kk[None, :], mask=ok, other=0.0)


@triton.jit
def _norm_mlp_kernel(
    x_ptr, nw_ptr, nb_ptr, wu_ptr, bu_ptr, wd_ptr, bd_ptr, m_ptr, part_ptr, ticket_ptr, bar_ptr, out_ptr,
    B, eps, H: tl.constexpr, I: tl.constexpr, K_CHUNK: tl.constexpr, SPLIT: tl.constexpr, G: tl.constexpr,
    ROW_BLOCKS: tl.constexpr, PHASES: tl.constexpr, LAYER: tl.constexpr, HAS_BIAS_UP: tl.constexpr,
    HAS_BIAS_DOWN: tl.constexpr, ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N_UP: tl.constexpr,
    BLOCK_K_UP: tl.constexpr, BLOCK_N_DOWN: tl.constexpr, BLOCK_K_DOWN: tl.constexpr, PRE_K: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    dtype = wu_ptr.dtype.element_ty
    N_BLOCKS: tl.constexpr = (H + BLOCK_N_DOWN - 1) // BLOCK_N_DOWN
    ITEMS_B: tl.constexpr = N_BLOCKS * SPLIT * ROW_BLOCKS

    if PHASES != 2:  # phase A: m = act(norm(x) @ w_up.T + b_up), in the model dtype
        N_TILES: tl.constexpr = (I + BLOCK_N_UP - 1) // BLOCK_N_UP
        if ROW_BLOCKS == 1:  # the norm's statistics once, not per item
            rows = tl.arange(0, BLOCK_M)
            mean, rstd = norm_stats(x_ptr, rows, rows < B, eps, H, LAYER, BLOCK_M, BLOCK_K_UP, x_ptr, B, 0, 0)
        for item in range(pid, N_TILES * ROW_BLOCKS, G):
            rows = (item // N_TILES) * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = (item % N_TILES) * BLOCK_N_UP + tl.arange(0, BLOCK_N_UP)
            row_ok = rows < B
            col_ok = cols < I
            if ROW_BLOCKS > 1:
                mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, H, LAYER, BLOCK_M, BLOCK_K_UP, x_ptr, B, 0, 0)
            acc, acc2 = norm_gemv(x_ptr, nw_ptr, nb_ptr, wu_ptr, rows, row_ok, cols, col_ok, mean, rstd, I, H,
                                  LAYER, ACT, BLOCK_M, BLOCK_N_UP, BLOCK_K_UP)
            acc = act_epilogue(acc, acc2, bu_ptr, cols, col_ok, I, HAS_BIAS_UP, ACT, dtype)
            tl.store(m_ptr + rows[:, None] * I + cols[None, :], acc.to(dtype),
                     mask=row_ok[:, None] & col_ok[None, :])
        if PHASES == 1:
            pdl_release(PDL)

    if PHASES == 3:  # the grid barrier (module docstring), the first weight tile loaded during the wait
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
        if PRE_K > 0:
            w_pre = _first_w(wd_ptr, pid, ITEMS_B, H, I, K_CHUNK, N_BLOCKS, SPLIT, BLOCK_N_DOWN, PRE_K)
        # Triton makes this one thread's acquire load, its value handed to the CTA through shared memory
        while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < G:
            pass
        tl.debug_barrier()
    elif PHASES == 2:
        if PRE_K > 0:
            w_pre = _first_w(wd_ptr, pid, ITEMS_B, H, I, K_CHUNK, N_BLOCKS, SPLIT, BLOCK_N_DOWN, PRE_K)

    if PHASES != 1:  # phase B: out = x + (m @ w_down.T + b_down)
        pdl_release(PDL)
        for item in range(pid, ITEMS_B, G):
            j, s, r = _down_item(item, N_BLOCKS, SPLIT)
            rows = r * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = j * BLOCK_N_DOWN + tl.arange(0, BLOCK_N_DOWN)
            row_ok = rows < B
            col_ok = cols < H
            k_lo = s * K_CHUNK
            k_hi = tl.minimum(k_lo + K_CHUNK, I)
            acc = tl.zeros((BLOCK_M, BLOCK_N_DOWN), dtype=tl.float32)
            if PRE_K > 0:  # the tile loaded ahead, then the next item's
                kk = k_lo + tl.arange(0, PRE_K)
                mv = tl.load(m_ptr + rows[:, None] * I + kk[None, :], mask=row_ok[:, None] & (kk < k_hi)[None, :],
                             other=0.0, cache_modifier=".cg")
                acc += tl.dot(mv, tl.trans(w_pre), input_precision="ieee")
                w_pre = _first_w(wd_ptr, item + G, ITEMS_B, H, I, K_CHUNK, N_BLOCKS, SPLIT, BLOCK_N_DOWN, PRE_K)
            ks = tl.arange(0, BLOCK_K_DOWN)
            for k0 in range(PRE_K, K_CHUNK, BLOCK_K_DOWN):  # constant trip count
                kk = k_lo + k0 + ks
                k_ok = kk < k_hi
                mv = tl.load(m_ptr + rows[:, None] * I + kk[None, :], mask=row_ok[:, None] & k_ok[None, :],
                             other=0.0, cache_modifier=".cg")
                wt = tl.load(wd_ptr + cols[:, None] * I + kk[None, :], mask=col_ok[:, None] & k_ok[None, :],
                             other=0.0)
                acc += tl.dot(mv, tl.trans(wt), input_precision="ieee")
            out_ok = row_ok[:, None] & col_ok[None, :]
            finish = True
            if SPLIT > 1:
                tl.store(part_ptr + (s * B + rows[:, None]) * H + cols[None, :], acc, mask=out_ok)
                tile = r * N_BLOCKS + j
                finish = last_of_split(ticket_ptr, tile, SPLIT)
                if finish:
                    acc = sum_partials(part_ptr, rows, cols, out_ok, B, H, SPLIT, BLOCK_M, BLOCK_N_DOWN)
                    tl.store(ticket_ptr + tile, 0)  # back to zero for the next launch
            if finish:
                bias_residual(acc, bd_ptr, x_ptr, out_ptr, rows, cols, col_ok, out_ok, H, HAS_BIAS_DOWN)

    if PHASES == 3:  # depart; the last program puts both counters back to zero
        if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu") == G - 1:
            tl.store(bar_ptr, 0)
            tl.store(bar_ptr + 1, 0)


def _on_gpu(x: torch.Tensor) -> bool:
    """A real GPU launch, where a grid barrier can work: CUDA and not Triton's interpreter (which runs
    programs one after another)."""
    interpreting = not isinstance(tl.cdiv, triton.runtime.jit.JITFunction)
    return x.is_cuda and not interpreting


def _check(x, norm_w, norm_b, w_up, b_up, act, w_down, b_down, out):
    if act not in ACTS:
        raise ValueError(f"act must be one of {ACTS}, got {act!r}")
    if x.dim() != 2:
        raise ValueError(f"x must be (B, H), got shape {tuple(x.shape)}")
    B, H = x.shape
    if w_down.dim() != 2 or w_down.shape[0] != H:
        raise ValueError(f"w_down must be (H={H}, I), got shape {tuple(w_down.shape)}")
    I = w_down.shape[1]
    up_rows = 2 * I if act == "silu_mul" else I
    shapes = dict(norm_w=(norm_w, (H,)), norm_b=(norm_b, (H,)), w_up=(w_up, (up_rows, H)),
                  b_up=(b_up, (up_rows,)), b_down=(b_down, (H,)), out=(out, (B, H)))
    for name, (t, shape) in shapes.items():
        if t is None:
            continue
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} must have shape {shape} (x {tuple(x.shape)}, w_down {tuple(w_down.shape)}, "
                             f"act {act!r}), got {tuple(t.shape)}")
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} must be {x.dtype} on {x.device} like x, got {t.dtype} on {t.device}")
    if w_down.dtype != x.dtype or w_down.device != x.device:
        raise ValueError(f"w_down must be {x.dtype} on {x.device} like x, got {w_down.dtype} on {w_down.device}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    require_32bit(x=x, norm_w=norm_w, norm_b=norm_b, w_up=w_up, b_up=b_up, w_down=w_down, b_down=b_down, out=out)
    return B, H, I


def norm_mlp(x, norm_w, norm_b, eps: float, w_up, b_up, act: str, w_down, b_down, *, phases=None,
             grid_programs: int | None = None, split: int | None = None, tickets: Tickets | None = None,
             pdl: int = 0, block_n_up: int = 32, block_k_up: int = 256, block_n_down: int = 32,
             block_k_down: int = 128, prefetch_k: int | None = None, num_warps: int = 4, num_stages: int = 3,
             cooperative: bool = True, out: torch.Tensor | None = None):
    """The Triton kernel of `norm_mlp_ref`: x (B, H) the hidden state and residual; norm_b None for RMSNorm;
    w_up (I, H), or (2I, H) gate rows then up rows for "silu_mul"; w_down (H, I); biases optional.

    `phases`: the launches, each the kernel's PHASES: (3,) (or 3) one launch with the grid barrier (CUDA only),
    (1, 2) phase A then phase B as two launches; default (3,) on a GPU, (1, 2) in Triton's interpreter.
    `grid_programs`: G (default: the SMs, or fewer where there are fewer items; at most 4 x SMs with the
    barrier, where the cooperative launch refuses a grid that cannot be resident at once). `split`: K ranges of
    the down-projection (default: as many as fill G, each at least 4 K tiles). `prefetch_k`: columns of each
    program's first down-projection tile loaded ahead (a power of 2 >= 16, at most the K range; 0: none;
    default block_k_down). `tickets`: the counters of the split and the barrier (zeros; default: fresh). `pdl`:
    pdl.py's mode, not EARLY (module docstring). `cooperative`: the barrier launch as a cooperative launch. `out`:
    a contiguous tensor like x to write into (x itself is allowed), returned."""
    B, H, I = _check(x, norm_w, norm_b, w_up, b_up, act, w_down, b_down, out)
    gpu = _on_gpu(x)
    phases = ((3,) if gpu else (1, 2)) if phases is None else ((phases,) if isinstance(phases, int) else tuple(phases))
    if phases not in ((3,), (1, 2)):
        raise ValueError(f"phases must be (3,) (one launch with the grid barrier) or (1, 2), got {phases!r}")
    if phases == (3,) and not gpu:
        raise ValueError("phases=3 needs a CUDA GPU: Triton's interpreter runs programs one after another and "
                         "a grid barrier would wait for ever; use phases=(1, 2)")
    if pdl == EARLY:
        raise ValueError("pdl EARLY would release dependent kernels before the grid barrier; use 0, 1 or 3")
    for name, v in dict(block_n_up=block_n_up, block_k_up=block_k_up, block_n_down=block_n_down,
                        block_k_down=block_k_down).items():
        if v < 16 or v & (v - 1):
            raise ValueError(f"{name} must be a power of 2 >= 16, got {v}")
    row_blocks = triton.cdiv(B, BLOCK_M)
    n_tiles = triton.cdiv(I, block_n_up) * row_blocks
    n_blocks = triton.cdiv(H, block_n_down)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else None
    if grid_programs is None:
        G = max(n_tiles, n_blocks * row_blocks * max(1, I // (4 * block_k_down)))
        G = min(G, sms) if sms is not None else G
    else:
        G = int(grid_programs)
    limit = 4 * sms if (sms is not None and phases == (3,)) else None
    if G < 1 or (limit is not None and G > limit) or (limit is not None and not cooperative and G > sms):
        raise ValueError(f"grid_programs must be >= 1, with the barrier at most the {sms} SMs (4x with a "
                         f"cooperative launch), got {G}")
    if split is None:
        split = max(1, min(G // (n_blocks * row_blocks), I // (4 * block_k_down)))
    if split < 1:
        raise ValueError(f"split must be >= 1, got {split}")
    k_chunk = triton.cdiv(triton.cdiv(I, split), block_k_down) * block_k_down
    if triton.cdiv(I, k_chunk) != split:
        raise ValueError(f"split {split} leaves K ranges of {k_chunk} (block_k_down {block_k_down}) empty at I={I}")
    pre_k = block_k_down if prefetch_k is None else prefetch_k
    if pre_k and (pre_k < 16 or pre_k & (pre_k - 1) or pre_k > k_chunk):
        raise ValueError(f"prefetch_k must be 0 or a power of 2 in [16, {k_chunk}] (the K range), got {pre_k}")

    if out is None:
        out = torch.empty_like(x)
    m = torch.empty((B, I), dtype=x.dtype, device=x.device)
    n_tickets = n_blocks * row_blocks
    counters = take_tickets(tickets, n_tickets + BARRIER_COUNTERS, x.device)
    part = torch.empty((split, B, H), dtype=torch.float32, device=x.device) if split > 1 else m
    dummy = norm_w
    for p in phases:
        launch = dict(pdl_launch(pdl))
        if p == 3 and cooperative:
            launch["launch_cooperative_grid"] = True
        _norm_mlp_kernel[(G,)](
            x, norm_w, norm_b if norm_b is not None else dummy, w_up, b_up if b_up is not None else dummy,
            w_down, b_down if b_down is not None else dummy, m, part, counters, counters[n_tickets:], out,
            B, eps, H, I, k_chunk, SPLIT=split, G=G, ROW_BLOCKS=row_blocks, PHASES=p, LAYER=norm_b is not None,
            HAS_BIAS_UP=b_up is not None, HAS_BIAS_DOWN=b_down is not None, ACT=_ACT_CODE[act], BLOCK_M=BLOCK_M,
            BLOCK_N_UP=block_n_up, BLOCK_K_UP=block_k_up, BLOCK_N_DOWN=block_n_down, BLOCK_K_DOWN=block_k_down,
            PRE_K=pre_k, PDL=int(pdl), num_warps=num_warps, num_stages=num_stages, **launch,
        )
    return out
