"""The norm before a projection, shared by norm_linear, norm_qkv and residual_norm: Hugging Face's norms as torch
references (`norm_ref`), the kernels' LAYER code for them, each row's statistics over all of K (`norm_stats`, or
the sums of squares its writer recorded: `NormSums`), the normalised x tile of a K loop (`norm_tile`), and the rows
normalised once before a swapped launch (`normalized_rows`, `NormedRows`).

Why a module: every projection that starts with a norm runs the same prologue, and each kernel's K loop takes its
x tile from `norm_tile`; at one row of the batch that tile is the one row normalised and the dot's other 15 rows
zeros, so the K loop normalises one row, not 16.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .pdl import pdl_launch, pdl_release, pdl_start
from .swap_ab import use_prenorm

# norm kinds of the LAYER constexpr past 0 (RMSNorm) and 1 (LayerNorm): see norm_code
NORM_OFFSET = 2
NORM_NONE = 3
NORM_F32 = 4

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
    x_ptr,
    nw_ptr,
    nb_ptr,
    rows,
    kk,
    k_ok,
    m,
    mean,
    rstd,
    K: tl.constexpr,
    LAYER: tl.constexpr,
    dtype: tl.constexpr,
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
    packed: bool = False,
):
    """What a launch multiplies and how it normalises it: (x, norm_w, norm_b, sums_arg) as given, or, for a swapped
    launch or one of `packed` (quantized) weights, where `prenorm` (None: swap_ab.use_prenorm) says, the rows
    normalised beforehand with no norm left to the kernel: those x's writer recorded in `normed_rows` for this
    norm, else normalized_rows's (one launch)."""
    if prenorm is None:
        prenorm = use_prenorm(x.shape[0], packed)
    if not ((swapped or packed) and norm_w is not None and prenorm):
        return x, norm_w, norm_b, sums_arg
    xn = None
    if normed_rows is not None:
        xn = normed_rows.of(x, NormedRows.key(norm_w, norm_b, eps, norm_style))
    if xn is None:
        xn = normalized_rows(x, norm_w, norm_b, eps, norm_style, sums_arg, pdl)
    return xn, None, None, (xn, 0, 0)
