"""The start of a decode step in one launch: the token embedding (+ GPT-2's learned position embedding) of
each row and the row's cache slot (position + left padding) and attention length (slot + 1).

Why a kernel for so little work: done with torch ops these are three to five tiny launches per step (gather,
gather, add, add, add), outside the chain of programmatic dependent launches (pdl.py) that the rest of the
step's kernels form, so the first layer's kernel could not start early behind them. At GPT-2, where a whole
step is ~70 launches of a few microseconds, that is a few percent of the step.

Grid (B, ceil(H / BLOCK)): one program per row and block of the hidden size; the first block of a row also
writes its slot and length. Token ids of a decode step are the step's own choices or the pad id, both inside
the vocabulary (check_request refuses a pad id outside it), and positions stay below the model's limit
(checked too); an id outside [0, V) would still read zeros rather than memory past the table (where the torch
twin raises).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .linear_residual import require_contiguous
from .pdl import pdl_launch, pdl_release, pdl_start


def embed_rows(wte, wpe, ids, pos, scale: float | None = None):
    """The hidden state of tokens `ids` at positions `pos` (any shape): the token embedding `wte` (V, H), plus
    the position embedding `wpe` where the model has one (GPT-2; None otherwise), times `scale` where the model
    scales it (Granite's embedding_multiplier, Gemma's sqrt(hidden) rounded to the dtype), rounded to the dtype."""
    h = F.embedding(ids, wte)
    h = h if wpe is None else h + F.embedding(pos, wpe)
    return h if scale is None else h * scale


def embed_ref(wte, wpe, ids, pos, pad, scale: float | None = None):
    """ids, pos, pad (B,) long -> h (B, H) in the table's dtype, slot and length (B,) long."""
    slot = pos + pad
    return embed_rows(wte, wpe, ids, pos, scale), slot, slot + 1


@triton.jit
def _embed_kernel(
    ids_ptr,
    pos_ptr,
    pad_ptr,
    wte_ptr,
    wpe_ptr,
    h_ptr,
    slot_ptr,
    len_ptr,
    ss_ptr,
    B,
    V,
    H,
    ids_stride,
    pos_stride,
    pad_stride,
    HAS_POS: tl.constexpr,
    SUMS: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr,
    SCALE: tl.constexpr,
):
    pdl_start(PDL)
    b = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    tok = tl.load(ids_ptr + b * ids_stride).to(tl.int64)
    p = tl.load(pos_ptr + b * pos_stride).to(tl.int64)
    x = tl.load(wte_ptr + tok * H + cols, mask=ok & (tok >= 0) & (tok < V), other=0.0)
    if HAS_POS:  # rounded to the table's dtype after the add, as torch's add of two such tensors
        x = (x.to(tl.float32) + tl.load(wpe_ptr + p * H + cols, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
    if SCALE is not None:  # the embedding times the model's scale, rounded to the table's dtype
        x = (x.to(tl.float32) * SCALE).to(x.dtype)
    pdl_release(PDL)
    tl.store(h_ptr + b * H + cols, x, mask=ok)
    if SUMS:  # the row's sum of squares over this block, for the first layer's RMSNorm (NormSums)
        xf = tl.where(ok, x.to(tl.float32), 0.0)
        tl.store(ss_ptr + tl.program_id(1) * B + b, tl.sum(xf * xf, 0))
    if tl.program_id(1) == 0:
        slot = p + tl.load(pad_ptr + b * pad_stride).to(tl.int64)
        tl.store(slot_ptr + b, slot)
        tl.store(len_ptr + b, slot + 1)


def embed(wte, wpe, ids, pos, pad, scale: float | None = None, block: int = 1024, pdl: bool = False, norm_sums=None):
    """The Triton kernel of `embed_ref` (tables contiguous (rows, H); ids, pos, pad (B,) of any stride: the
    decode loop's tokens and positions are columns of its (B, 3) state); `scale`: as there, a constexpr of the
    launch; `pdl`: programmatic dependent launch (pdl.py); `norm_sums` (norm_prologue.NormSums): record h's sums of
    squares per block there (of the scaled values), for the first RMSNorm."""
    require_contiguous(wte=wte, wpe=wpe)
    B = ids.shape[0]
    V, H = wte.shape
    h = torch.empty((B, H), dtype=wte.dtype, device=wte.device)
    slot = torch.empty(B, dtype=torch.long, device=wte.device)
    length = torch.empty_like(slot)
    block = min(block, triton.next_power_of_2(H))
    blocks = triton.cdiv(H, block)
    sums = norm_sums.buffer(blocks, B, wte.device) if norm_sums is not None else None
    _embed_kernel[(B, blocks)](
        ids,
        pos,
        pad,
        wte,
        wpe if wpe is not None else wte,
        h,
        slot,
        length,
        sums if sums is not None else slot,
        B,
        V,
        H,
        ids.stride(0),
        pos.stride(0),
        pad.stride(0),
        HAS_POS=wpe is not None,
        SUMS=sums is not None,
        BLOCK=block,
        PDL=bool(pdl),
        SCALE=None if scale is None else float(scale),
        num_warps=4,
        **pdl_launch(pdl),
    )
    if sums is not None:
        norm_sums.record(h, sums)
    return h, slot, length
