"""Norm in the prologue, a GEMV over all B rows, an activation in the epilogue: the MLP up-projection
(gate/up with SiLU(gate)*up, or GPT-2's fc with tanh GELU) and the final norm + LM head (float32 logits).

Why fused: at decode the activations are a few KB and the weights are megabytes; each kernel must read its
weight bytes exactly once, for every row of the batch, and nothing else of note. Normalising in the prologue
saves a launch and a round trip of the normalised activations; the activation in the epilogue saves one of
the (B, 2I) gate/up output. Each program owns BLOCK_N output columns and all of K (K is the hidden size,
short enough that the grid of N / BLOCK_N programs fills the GPU); rows of the batch are padded to 16 so
that the product is one `tl.dot` per K tile. From 17 rows on the tile is swapped (swap_ab.py: the weight rows
as the MMA's M, all rows of the batch as its N, the weights read once for up to 128 rows); its wider weight
tiles make fewer programs, so there K is split as in linear_residual where the grid would leave the GPU short
(float32 partials, the last program of a tile reduces them in a fixed order and runs the epilogue).
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ...quant.packed import dense_weight
from .linear_residual import Tickets, last_of_split, require_32bit, split_k, take_tickets
from .packed_weights import load_weights, weight_launch
from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import (
    acc_dot,
    acc_rows,
    acc_zeros,
    fit_k,
    pair_rows,
    row_tile,
    sm_count,
    split_limit,
    swap_tiles,
    unpair,
    use_prenorm,
    use_swap,
)

ACTS = ("none", "gelu_tanh", "silu_mul", "gelu_tanh_mul")
# norm kinds of the LAYER constexpr past 0 (RMSNorm) and 1 (LayerNorm): see norm_code
NORM_OFFSET = 2
NORM_NONE = 3
NORM_F32 = 4
_ACT_CODE = {a: i for i, a in enumerate(ACTS)}


STYLES = ("rms", "rms_offset", "rms_f32")  # the RMSNorms' roundings, as FusedWeights.norm names them


def norm_ref(x, w, b, eps: float, style: str = "rms"):
    """Hugging Face's norms: RMSNorm where `b` is None, LayerNorm otherwise; `w` None: no norm (x itself: a layer
    that normalises its branches' outputs instead, OLMo2). The RMSNorm's `style`: "rms" (Llama: weight times the
    normalised x rounded to x's dtype), "rms_offset" (Gemma: (1 + weight) times the float32 normalised x, rounded
    once), "rms_f32" (OLMo2: weight times the float32 normalised x, rounded once)."""
    if w is None:
        return x
    if b is None:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        if style == "rms_offset":
            return (xf * (1.0 + w.float())).to(x.dtype)
        if style == "rms_f32":
            return (w * xf).to(x.dtype)
        return w * xf.to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def norm_code(norm_w, norm_b, style: str = "rms") -> int:
    """The kernels' LAYER constexpr: 0 RMSNorm, 1 LayerNorm, 2 Gemma's (1 + w) RMSNorm, 3 no norm, 4 OLMo2's
    RMSNorm (norm_ref's styles)."""
    if style not in STYLES:
        raise ValueError(f"norm_style must be one of {', '.join(STYLES)}, got {style!r}")
    if norm_w is None:
        return NORM_NONE
    if norm_b is not None:
        return 1
    return {"rms": 0, "rms_offset": NORM_OFFSET, "rms_f32": NORM_F32}[style]


def gelu_tanh(y):
    """tanh GELU as the kernels compute it (float32 in, float32 out)."""
    return F.gelu(y, approximate="tanh")


def norm_linear_ref(
    x,
    norm_w,
    norm_b,
    eps: float,
    w,
    b,
    act: str,
    out_dtype=None,
    norm_style: str = "rms",
    logit_div: float | None = None,
    softcap: float | None = None,
):
    """(B, K) -> (B, N): act(norm(x) @ w.T + b); "silu_mul" / "gelu_tanh_mul" split w's rows into gate then up
    (act(gate) * up). `logit_div` (Granite's logits_scaling) divides the projection, `softcap` (Gemma 2's final
    logit soft-capping) makes it tanh(y / cap) * cap, each in the model dtype as Hugging Face's ops round."""
    y = F.linear(norm_ref(x, norm_w, norm_b, eps, norm_style), dense_weight(w), b)
    if act == "silu_mul":
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    elif act == "gelu_tanh_mul":
        gate, up = y.chunk(2, dim=-1)
        y = gelu_tanh(gate) * up
    elif act == "gelu_tanh":
        y = gelu_tanh(y)
    if logit_div is not None:
        y = y / logit_div
    if softcap is not None:
        y = torch.tanh(y / softcap) * softcap
    return y if out_dtype is None else y.to(out_dtype)


class NormSums:
    """Per-row partial sums of squares of the hidden states, handed from the kernel that writes them to the
    kernels that normalise them (RMSNorm only), so that a norm prologue reads NB floats per row instead of all
    of x.

    Why: a norm prologue computes each row's 1/rms before its tiles can be normalised, and every program of a
    norm kernel did it again over all of x (B, K): at batch 8 and Llama-1B, 32 KB per program, 528 programs of
    norm_qkv and 512 of the gate/up projection per layer (docs/KERNELS.md, "RMSNorm sums"). The writers
    (`embed`, `linear_residual`) already hold their output tile in registers: each stores the sum of squares of its tile's rows (of the values as stored, in
    the model dtype), (NB, B) float32, NB = its column blocks; the reader sums those NB in a fixed order.

    The link from a hidden state to its sums is the tensor object itself (`record`, `of`): sums are used only
    for the very tensor their writer returned, unmodified since (its version counter), so a tensor made any
    other way (an all-reduce's output, a caller's own) is normalised from x as before. One per FusedModel's
    kernels; host-side bookkeeping only, at launch (or capture) time, nothing per replay.

    Writers record sums from `min_rows` rows on. At one row the pass over x is 4 KB per program and the sums
    cost more than they save."""

    def __init__(self, min_rows: int = 2):
        self.min_rows = min_rows
        self._last = None  # (weak reference to the hidden state, its version, its sums)

    def wanted(self, rows: int) -> bool:
        """Whether a writer of `rows` rows records its sums."""
        return rows >= self.min_rows

    def buffer(self, blocks: int, rows: int, device, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """The (blocks, rows) float32 buffer a writer of `rows` rows fills with its sums (then `record`), or None
        below min_rows, where the writer records nothing and its `out`, if given, loses any sums it had."""
        if self.wanted(rows):
            return torch.empty((blocks, rows), dtype=torch.float32, device=device)
        if out is not None:
            self.forget(out)  # rewritten without sums
        return None

    def record(self, h: torch.Tensor, sums: torch.Tensor) -> None:
        """`sums` belong to `h` as it is now. The sums are held (strongly) until the next record: the reader
        launches after this writer returns, and a buffer nobody held could be handed out again before."""
        self._last = (weakref.ref(h), _version(h), sums)

    def forget(self, h: torch.Tensor) -> None:
        """`h` is being rewritten without sums (a writer that does not record): its old sums must not be used."""
        if self._last is not None and self._last[0]() is h:
            self._last = None

    def of(self, h: torch.Tensor) -> torch.Tensor | None:
        """The sums recorded for `h`, or None."""
        if self._last is None:
            return None
        ref, version, sums = self._last
        return sums if ref() is h and _version(h) == version else None


class NormedRows:
    """Rows of the hidden states already normalised by the kernel that wrote them, handed to the next launch that
    would normalise them again (`swapped_operand`): the dense epilogue of the O and down projections
    (kernels/residual_norm.py) holds whole rows and writes both h and norm(h) in one launch, so the
    `normalized_rows` launch before the next projection is left out.

    The link is the tensor object and its norm, as for NormSums: `record(h, norm, xn)` after the writer's launch;
    `of(h, norm)` answers xn only for that very h, unmodified since (its version counter), and the same norm
    (weight and bias by identity, eps, style); anything else is normalised as before. Host-side bookkeeping at
    launch (or capture) time, nothing per replay."""

    def __init__(self):
        self._last = None  # (weak reference to h, its version, the norm's key, xn)

    @staticmethod
    def key(norm_w, norm_b, eps: float, norm_style: str) -> tuple:
        return (id(norm_w), id(norm_b), float(eps), norm_style)

    def record(self, h: torch.Tensor, norm: tuple, xn: torch.Tensor) -> None:
        """xn is h normalised by `norm` (NormedRows.key's tuple); held until the next record."""
        self._last = (weakref.ref(h), _version(h), norm, xn)

    def of(self, h: torch.Tensor, norm: tuple) -> torch.Tensor | None:
        """The rows recorded for h under `norm`, or None."""
        if self._last is None:
            return None
        ref, version, key, xn = self._last
        return xn if ref() is h and _version(h) == version and key == norm else None


def _version(h: torch.Tensor) -> int | None:
    """h's version counter; None for an inference tensor (made under torch.inference_mode), which has none:
    for those only the identity is checked (the step never changes a hidden state in place)."""
    return None if h.is_inference() else h._version


def sums_args(norm_sums: NormSums | None, x: torch.Tensor, layer: bool) -> tuple:
    """(sums tensor or a dummy, NB, NB_PAD) of a norm kernel's launch: NB_PAD 0 where it normalises from x."""
    sums = norm_sums.of(x) if norm_sums is not None and not layer else None
    if sums is None:
        return x, 0, 0
    if sums.dtype != torch.float32 or sums.dim() != 2 or sums.shape[1] != x.shape[0] or not sums.is_contiguous():
        raise ValueError(
            f"norm sums must be contiguous float32 (NB, {x.shape[0]}), got {tuple(sums.shape)} {sums.dtype}"
        )
    return sums, sums.shape[0], triton.next_power_of_2(sums.shape[0])


@triton.jit
def norm_stats(
    x_ptr,
    rows,
    row_ok,
    eps,
    K: tl.constexpr,
    LAYER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ss_ptr,
    B,
    NB,
    NB_PAD: tl.constexpr,
):
    """The norm's per-row (mean, 1/std) over all K of x (B, K), float32: the prologue of every kernel that
    starts with a norm. RMSNorm (LAYER false) has mean 0. float32 also where `eps` arrives as fp64 (as a
    Python float does under torch.compile), so that the normalised x is not computed in fp64. With NB_PAD > 0
    (RMSNorm only) the sum of squares is the sum of the NB partial sums at ss_ptr (NB, B) (NormSums), not a
    pass over x. LAYER 3 (no norm): mean 0, 1/std 1, nothing read."""
    if LAYER == 3:
        return tl.zeros((BLOCK_M,), dtype=tl.float32), tl.full((BLOCK_M,), 1.0, tl.float32)
    if NB_PAD > 0:
        nb = tl.arange(0, NB_PAD)
        part = tl.load(ss_ptr + nb[:, None] * B + rows[None, :], mask=(nb < NB)[:, None] & row_ok[None, :], other=0.0)
        rstd = (1.0 / tl.sqrt(tl.sum(part, 0) / K + eps)).to(tl.float32)
        return tl.zeros((BLOCK_M,), dtype=tl.float32), rstd
    ks = tl.arange(0, BLOCK_K)
    mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if LAYER == 1:
        s = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            m = row_ok[:, None] & (k0 + ks < K)[None, :]
            s += tl.sum(tl.load(x_ptr + rows[:, None] * K + k0 + ks[None, :], mask=m, other=0.0).to(tl.float32), 1)
        mean = s / K
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m = row_ok[:, None] & (k0 + ks < K)[None, :]
        xv = tl.load(x_ptr + rows[:, None] * K + k0 + ks[None, :], mask=m, other=0.0).to(tl.float32)
        d = tl.where(m, xv - mean[:, None], 0.0)
        ss += tl.sum(d * d, 1)
    rstd = (1.0 / tl.sqrt(ss / K + eps)).to(tl.float32)
    return mean, rstd


@triton.jit
def norm_tile(
    x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K: tl.constexpr, LAYER: tl.constexpr, dtype: tl.constexpr
):
    """The normalised (BLOCK_M, BLOCK_K) tile of x at columns `kk`, in the model dtype, rounded as Hugging
    Face's norms round (0 where `m` is false): the per-tile half of the norm prologue (`norm_stats`). LAYER: 0
    RMSNorm, 1 LayerNorm, 2 Gemma's RMSNorm ((1 + weight) in float32, one rounding), 3 none (x as it is), 4 OLMo2's
    RMSNorm (weight times the float32 normalised x, one rounding)."""
    if LAYER == 3:  # masked to 0 by the load alone: no register pass, so the tile can reach shared memory directly
        xn = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=m, other=0.0).to(dtype)
    else:
        xv = tl.load(x_ptr + rows[:, None] * K + kk[None, :], mask=m, other=0.0).to(tl.float32)
        xn = norm_values(xv, nw_ptr, nb_ptr, kk, k_ok, m, mean, rstd, LAYER, dtype)
    return xn


@triton.jit
def norm_values(xv, nw_ptr, nb_ptr, kk, k_ok, m, mean, rstd, LAYER: tl.constexpr, dtype: tl.constexpr):
    """x (float32, (BLOCK_M, len(kk))) normalised with the rows' (mean, 1/std) and the norm's weights at columns
    `kk`, rounded as Hugging Face's norms round (0 where `m` is false); LAYER as in norm_tile (not 3)."""
    g = tl.load(nw_ptr + kk, mask=k_ok, other=0.0)
    if LAYER == 1:
        beta = tl.load(nb_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
        xn = ((xv - mean[:, None]) * rstd[:, None] * g.to(tl.float32)[None, :] + beta[None, :]).to(dtype)
    elif LAYER == 2:  # Gemma: (x * rstd) * (1 + weight), in float32, rounded once
        xn = (xv * rstd[:, None] * (g.to(tl.float32) + 1.0)[None, :]).to(dtype)
    elif LAYER == 4:  # OLMo2: (x * rstd) * weight, in float32, rounded once
        xn = (xv * rstd[:, None] * g.to(tl.float32)[None, :]).to(dtype)
    else:  # HF RMSNorm: weight * (x * rstd).to(dtype), the product in dtype
        xn = (g[None, :] * (xv * rstd[:, None]).to(dtype)).to(dtype)
    return tl.where(m, xn, 0.0).to(dtype)


@triton.jit
def _norm_rows_kernel(
    x_ptr,
    nw_ptr,
    nb_ptr,
    out_ptr,
    ss_ptr,
    B,
    NB,
    eps,
    K: tl.constexpr,
    LAYER: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_start(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < B
    ks = tl.arange(0, BLOCK_K)
    dtype = out_ptr.dtype.element_ty
    mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        k_ok = kk < K
        m = row_ok[:, None] & k_ok[None, :]
        xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        tl.store(out_ptr + rows[:, None] * K + kk[None, :], xn, mask=m)
    pdl_release(PDL)


def normalized_rows(x, norm_w, norm_b, eps: float, norm_style: str, sums_arg: tuple, pdl: bool = False) -> torch.Tensor:
    """x (B, K) normalised as the kernels' prologue normalises it (norm_stats, then norm_tile: the same code; the
    same bits where the statistics come from recorded sums, while from x its K tiles of up to 1024 group the sum
    of squares otherwise than a kernel's K tiles, a float32 ulp apart), in x's dtype: what a swapped launch multiplies. Why: inside a swapped program the
    normalised tile is computed in registers, so it reaches the MMA through a register-to-shared store in every
    K step instead of an asynchronous copy, and each program repeats the row statistics over all of K for up to
    128 rows. One launch of (B / 4) programs reads and writes the (B, K) rows once instead (docs/KERNELS.md, "Rows
    normalised beforehand"). Used where swap_ab.use_prenorm says. `sums_arg`: sums_args's (sums, NB, NB_PAD) for x."""
    B, K = x.shape
    sums, nb, nb_pad = sums_arg
    out = torch.empty_like(x)
    block_m = 4
    dummy = norm_w
    _norm_rows_kernel[(triton.cdiv(B, block_m),)](
        x,
        norm_w,
        norm_b if norm_b is not None else dummy,
        out,
        sums,
        B,
        nb,
        eps,
        K,
        LAYER=norm_code(norm_w, norm_b, norm_style),
        BLOCK_M=block_m,
        BLOCK_K=min(1024, triton.next_power_of_2(K)),
        NB_PAD=nb_pad,
        PDL=bool(pdl),
        num_warps=4,
        **pdl_launch(pdl),
    )
    return out


def swapped_operand(
    x,
    norm_w,
    norm_b,
    eps: float,
    norm_style: str,
    sums_arg: tuple,
    pdl: bool,
    swapped: bool,
    prenorm: bool | None,
    normed_rows: NormedRows | None = None,
):
    """What a launch multiplies and how it normalises it: (x, norm_w, norm_b, sums_arg) as given, or, for a swapped
    launch where `prenorm` (None: swap_ab.use_prenorm) says, the rows normalised beforehand with no norm left to the
    kernel: those x's writer recorded in `normed_rows` for this norm, else normalized_rows's (one launch)."""
    if prenorm is None:
        prenorm = use_prenorm(x.shape[0])
    if not (swapped and norm_w is not None and prenorm):
        return x, norm_w, norm_b, sums_arg
    xn = None
    if normed_rows is not None:
        xn = normed_rows.of(x, NormedRows.key(norm_w, norm_b, eps, norm_style))
    if xn is None:
        xn = normalized_rows(x, norm_w, norm_b, eps, norm_style, sums_arg, pdl)
    return xn, None, None, (xn, 0, 0)


@triton.jit
def tanh_f32(x):
    """tanh in float32 (1 - 2 / (e^2x + 1): exact at the limits, ~1e-7 absolute near 0)."""
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def gelu_tanh_f32(y):
    """torch's tanh GELU of float32 y, in float32."""
    z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
    return 0.5 * y * (1.0 + tanh_f32(z))


@triton.jit
def _norm_linear_kernel(
    x_ptr,
    nw_ptr,
    nb_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    ss_ptr,
    part_ptr,
    ticket_ptr,
    B,
    N,
    NB,
    eps,
    K: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr,
    LAYER: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    ROUND_OUT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    NB_PAD: tl.constexpr,
    PDL: tl.constexpr,
    SWAP: tl.constexpr,
    LOGIT_DIV: tl.constexpr,
    SOFTCAP: tl.constexpr,
    s_ptr=None,
    z_ptr=None,
    QUANT: tl.constexpr = 0,
    GROUP: tl.constexpr = 0,
):
    pdl_start(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(2)
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)  # batch rows
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # output columns
    row_ok = rows < B
    col_ok = cols < N
    ks = tl.arange(0, BLOCK_K)
    if QUANT:  # packed_weights.py: the model dtype is the group numbers'
        dtype = s_ptr.dtype.element_ty
    else:
        dtype = w_ptr.dtype.element_ty

    # prologue: per-row statistics over all of K (x is tiny and stays in L1/L2)
    mean, rstd = norm_stats(x_ptr, rows, row_ok, eps, K, LAYER, BLOCK_M, BLOCK_K, ss_ptr, B, NB, NB_PAD)

    k_lo = pid_k * K_CHUNK
    k_hi = tl.minimum(k_lo + K_CHUNK, K)
    PAIRED: tl.constexpr = SWAP and ACT >= 2  # gate and up rows in one swapped tile (swap_ab.pair_rows)
    if PAIRED:
        w_rows = pair_rows(cols, cols + N, BLOCK_N)
        w_ok = pair_rows(col_ok, col_ok, BLOCK_N)
        accp = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = acc_zeros(BLOCK_M, BLOCK_N, SWAP)
        acc2 = acc_zeros(BLOCK_M, BLOCK_N, SWAP)  # the up rows of gate/up
    for k0 in range(0, K_CHUNK, BLOCK_K):
        kk = k_lo + k0 + ks
        k_ok = kk < k_hi
        m = row_ok[:, None] & k_ok[None, :]
        xn = norm_tile(x_ptr, nw_ptr, nb_ptr, rows, kk, k_ok, m, mean, rstd, K, LAYER, dtype)
        if PAIRED:
            wp = load_weights(w_ptr, s_ptr, z_ptr, w_rows, w_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype)
            accp = acc_dot(accp, xn, wp, SWAP)
        else:
            wt = load_weights(w_ptr, s_ptr, z_ptr, cols, col_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype)
            acc = acc_dot(acc, xn, wt, SWAP)
            if ACT >= 2:  # gate/up: the up rows too
                wu = load_weights(
                    w_ptr, s_ptr, z_ptr, cols + N, col_ok, k_lo + k0, k_hi, K, BLOCK_K, QUANT, GROUP, dtype
                )
                acc2 = acc_dot(acc2, xn, wu, SWAP)

    pdl_release(PDL)
    if PAIRED:
        acc, acc2 = unpair(accp, BLOCK_N, BLOCK_M)
    acc = acc_rows(acc, SWAP)  # (BLOCK_M, BLOCK_N) from here on
    acc2 = acc_rows(acc2, SWAP)
    if SPLIT > 1:  # partial sums (SPLIT, B, N or 2N) float32; the last program of the tile finishes it
        n_part = 2 * N if ACT >= 2 else N
        ok = row_ok[:, None] & col_ok[None, :]
        base = part_ptr + (pid_k * B + rows[:, None]) * n_part + cols[None, :]
        tl.store(base, acc, mask=ok)
        if ACT >= 2:
            tl.store(base + N, acc2, mask=ok)
        tile = tl.program_id(1) * tl.num_programs(0) + pid_n
        if last_of_split(ticket_ptr, tile, SPLIT):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in range(SPLIT):  # fixed order: deterministic, whichever program came last
                base = part_ptr + (s * B + rows[:, None]) * n_part + cols[None, :]
                acc += tl.load(base, mask=ok, other=0.0, cache_modifier=".cg")
                if ACT >= 2:
                    acc2 += tl.load(base + N, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(ticket_ptr + tile, 0)  # back to zero for the next launch
            _norm_linear_finish(
                acc,
                acc2,
                rows,
                cols,
                row_ok,
                col_ok,
                b_ptr,
                out_ptr,
                N,
                HAS_BIAS,
                ACT,
                ROUND_OUT,
                dtype,
                LOGIT_DIV,
                SOFTCAP,
            )
    else:
        _norm_linear_finish(
            acc,
            acc2,
            rows,
            cols,
            row_ok,
            col_ok,
            b_ptr,
            out_ptr,
            N,
            HAS_BIAS,
            ACT,
            ROUND_OUT,
            dtype,
            LOGIT_DIV,
            SOFTCAP,
        )


@triton.jit
def _norm_linear_finish(
    acc,
    acc2,
    rows,
    cols,
    row_ok,
    col_ok,
    b_ptr,
    out_ptr,
    N,
    HAS_BIAS: tl.constexpr,
    ACT: tl.constexpr,
    ROUND_OUT: tl.constexpr,
    dtype: tl.constexpr,
    LOGIT_DIV: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Bias, activation, rounding and the store of one (BLOCK_M, BLOCK_N) output tile. Without an activation,
    LOGIT_DIV (a float) divides the projection and SOFTCAP (a float) soft-caps it, tanh(y / cap) * cap, each op
    rounded to dtype as Hugging Face's ops round (None: neither)."""
    if HAS_BIAS:
        acc += tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        if ACT >= 2:
            acc2 += tl.load(b_ptr + N + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACT == 1:  # tanh GELU, on the projection rounded to dtype as the unfused model has it
        y = acc.to(dtype).to(tl.float32)
        z = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        t = 1.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)
        acc = 0.5 * y * (1.0 + t)
    elif ACT == 2:  # SiLU(gate) * up, each rounded to dtype as the unfused model has them
        gt = acc.to(dtype).to(tl.float32)
        up = acc2.to(dtype).to(tl.float32)
        acc = (gt * tl.sigmoid(gt)).to(dtype).to(tl.float32) * up
    elif ACT == 3:  # GeGLU: tanh GELU(gate) * up, each rounded to dtype as the unfused model has them
        gt = acc.to(dtype).to(tl.float32)
        up = acc2.to(dtype).to(tl.float32)
        acc = gelu_tanh_f32(gt).to(dtype).to(tl.float32) * up
    else:  # the projection in dtype, as the unfused model has it, even where the output is float32 (the logits)
        acc = acc.to(dtype).to(tl.float32)
        if LOGIT_DIV is not None:  # Granite's logits_scaling
            acc = (acc / LOGIT_DIV).to(dtype).to(tl.float32)
        if SOFTCAP is not None:  # Gemma 2's final soft-capping: each op in dtype
            acc = (acc / SOFTCAP).to(dtype).to(tl.float32)
            acc = tanh_f32(acc).to(dtype).to(tl.float32)
            acc = (acc * SOFTCAP).to(dtype).to(tl.float32)
    if ROUND_OUT:
        out = acc.to(out_ptr.dtype.element_ty)
    else:
        out = acc
    tl.store(out_ptr + rows[:, None] * N + cols[None, :], out, mask=row_ok[:, None] & col_ok[None, :])


def norm_linear(
    x,
    norm_w,
    norm_b,
    eps: float,
    w,
    b,
    act: str,
    out_dtype=None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    pdl: bool = False,
    norm_sums: NormSums | None = None,
    swap: bool | None = None,
    programs: int | None = None,
    tickets: Tickets | None = None,
    norm_style: str = "rms",
    logit_div: float | None = None,
    softcap: float | None = None,
    prenorm: bool | None = None,
    normed_rows: NormedRows | None = None,
):
    """The Triton kernel of `norm_linear_ref` (`norm_w` None: no norm; `norm_style`, `logit_div`, `softcap`: as
    there, constexprs of the launch): x (B, K) contiguous, w (N or 2N, K) row-major. The default
    tile (32 x 256, 4 warps, 3 stages) is the one near the best at both Llama shapes of scripts/kernel_sweep.py
    (docs/KERNELS.md, "Tiles").
    `swap`: the swapped tile (swap_ab.py; default from 17 rows on), whose tile keywords left None are
    swap_ab.swap_tiles's, and whose K is split until the grid reaches `programs` (default swap_tiles's, one program
    per SM; the row-block tile never splits) with the counters of `tickets` (linear_residual.Tickets; default fresh zeros).
    `norm_sums`: where x's RMSNorm sums of squares may have been recorded by its writer (NormSums). `prenorm`: whether
    a swapped launch multiplies rows normalised beforehand (None: swap_ab.use_prenorm); `normed_rows`: where its
    writer may have recorded them (NormedRows). `w` may be a PackedWeight (quant/packed.py: int4, int8 or fp8,
    dequantized in registers after each load, packed_weights.py)."""
    w, packed = weight_launch(w)
    require_32bit(x=x, norm_w=norm_w, norm_b=norm_b, w=w, b=b)
    sums, nb, nb_pad = sums_args(norm_sums if norm_w is not None else None, x, norm_b is not None)
    B, K = x.shape
    gated = act in ("silu_mul", "gelu_tanh_mul")
    n_out = w.shape[0] // 2 if gated else w.shape[0]
    out = torch.empty((B, n_out), dtype=out_dtype or x.dtype, device=x.device)
    swapped = use_swap(B, swap)
    x, norm_w, norm_b, (sums, nb, nb_pad) = swapped_operand(
        x, norm_w, norm_b, eps, norm_style, (sums, nb, nb_pad), pdl, swapped, prenorm, normed_rows
    )
    accs = 2 if gated else 1
    if swapped:
        tiles = swap_tiles(B, n_out, K, x.element_size(), accs, sm_count(x.device))
    else:
        block_m = row_tile(B, w.element_size())
        tiles = dict(block_m=block_m, block_n=32, block_k=fit_k(block_m, 32, 256), num_warps=4, num_stages=3)
    block_m = tiles["block_m"]
    block_n = block_n or tiles["block_n"]
    block_k = block_k or tiles["block_k"]
    n_blocks, row_blocks = triton.cdiv(n_out, block_n), triton.cdiv(B, block_m)
    split = 1
    if swapped:
        if programs is None:
            programs = tiles["programs"] if x.is_cuda else 1
        split = min(split_k(n_blocks, K, block_k, programs), split_limit(B, K, x.element_size()))
    k_chunk = triton.cdiv(triton.cdiv(K, split), block_k) * block_k
    if split > 1:
        part = torch.empty((split, B, accs * n_out), dtype=torch.float32, device=x.device)
        counters = take_tickets(tickets, n_blocks * row_blocks, x.device)
    else:  # never written with one split: pass read-only inputs
        part, counters = w, w
    dummy = norm_w if norm_w is not None else w
    _norm_linear_kernel[(n_blocks, row_blocks, split)](
        x,
        dummy,
        norm_b if norm_b is not None else dummy,
        w,
        b if b is not None else dummy,
        out,
        sums,
        part,
        counters,
        B,
        n_out,
        nb,
        eps,
        K,
        k_chunk,
        split,
        LAYER=norm_code(norm_w, norm_b, norm_style),
        HAS_BIAS=b is not None,
        ACT=_ACT_CODE[act],
        ROUND_OUT=out.dtype != torch.float32,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        NB_PAD=nb_pad,
        PDL=bool(pdl),
        SWAP=swapped,
        LOGIT_DIV=None if logit_div is None else float(logit_div),
        SOFTCAP=None if softcap is None else float(softcap),
        num_warps=num_warps or tiles["num_warps"],
        num_stages=num_stages or tiles["num_stages"],
        **packed,
        **pdl_launch(pdl),
    )
    return out
