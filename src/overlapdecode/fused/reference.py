"""The fused step's math in plain PyTorch on the fused layout: the CPU proof and the prefill.

`decode_step` is the one-token step, composed of the `*_ref` twins of the Triton kernels (same layout,
same roundings, same cache writes), so that float32 on CPU can be compared token for token and logit for
logit with Hugging Face. `prefill` runs the whole prompt with ordinary torch ops on the same weights and
fills the cache at slots 0 .. P-1 (slot = position + the row's left padding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..tp import reduce_residual
from .kernels.embed import embed_rows
from .kernels.norm_linear import norm_linear_ref, norm_ref
from .kernels.norm_qkv import apply_rope, rope_cos_sin
from .layout import FusedWeights


def decode_attention_torch(q, k_cache, v_cache, start, length, scale: float):
    """The contract of kernels.decode_attention in torch: q (B, Hq, D), caches (B, Hkv, S, D); row b attends
    to slots [start[b], length[b]); softmax in float32; output in q's dtype."""
    B, Hq, D = q.shape
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    k = k_cache.repeat_interleave(Hq // Hkv, dim=1).float()  # (B, Hq, S, D)
    v = v_cache.repeat_interleave(Hq // Hkv, dim=1).float()
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), k) * scale
    slots = torch.arange(S, device=q.device)
    keep = (slots[None, :] >= start[:, None].long()) & (slots[None, :] < length[:, None].long())  # (B, S)
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), v).to(q.dtype)


def decode_step(W: FusedWeights, k_caches, v_caches, pad, ids, pos, ops, finish=None):
    """One token per row: ids, pos (B,) long -> float32 logits (B, V); writes K/V at slot pos + pad.
    `ops` (model.StepOps): the operations, Triton kernels or their `*_ref` twins. `finish`
    (kernels/greedy.py GreedyFinish): also choose the greedy tokens and advance its state and flag in place
    (ops.greedy, after the head); ids and pos may be views of that state: they are read before it is written."""
    # slot and length int64 (the attention takes either): a `pad.to(int32)` here was recomputed by inductor
    # before every layer's attention, 16 one-element kernels per step at Llama-1B (its output code, H200)
    h, slot, length = ops.embed(W.embed, W.pos_embed, ids, pos, pad)  # (B, H), (B,), (B,)
    for layer, kc, vc in zip(W.layers, k_caches, v_caches):
        h = decode_layer(W, layer, h, kc, vc, pos, slot, pad, length, ops)
    logits = ops.norm_linear(h, W.norm_w, W.norm_b, W.eps, W.lm_head, None, "none", torch.float32)
    if W.vocab is not None:
        logits = W.vocab.gather_logits(logits)  # under tp: this rank's vocabulary rows
    if finish is not None:
        ops.greedy(logits, finish)
    return logits


def decode_layer(W: FusedWeights, layer, h, k_cache, v_cache, pos, slot, start, length, ops):
    """One decoder layer of the one-token step: h (B, H) -> the layer's output (B, H); writes K/V at `slot` of
    its cache; row b attends to slots [start[b], length[b]). Five operations of `ops` (model.StepOps)."""
    B = h.shape[0]
    q = ops.norm_qkv(
        h,
        layer.norm1_w,
        layer.norm1_b,
        W.eps,
        layer.w_qkv,
        layer.b_qkv,
        W.inv_freq,
        W.rope_scale,
        pos,
        slot,
        k_cache,
        v_cache,
        W.n_heads,
        W.n_kv_heads,
        W.head_dim,
    )
    a = ops.attention(q, k_cache, v_cache, start, length, layer.scale)
    # under tp (W.tp), w_o and w_down hold 1/tp of their inputs: reduce_residual sums the ranks' parts
    # (ops.symmetric: over symmetric memory; None: the functional collective)
    h = reduce_residual(ops.linear_residual, a.reshape(B, -1), layer.w_o, layer.b_o, h, W.tp, ops.symmetric)
    m = ops.norm_linear(h, layer.norm2_w, layer.norm2_b, W.eps, layer.w_up, layer.b_up, W.act)
    return reduce_residual(ops.linear_residual, m, layer.w_down, layer.b_down, h, W.tp, ops.symmetric)


def _add_linear(x, w, b, residual):
    return residual + F.linear(x, w, b)


def prefill(W: FusedWeights, k_caches, v_caches, pad, ids, pos, last):
    """The prompt (B, T) through every layer; K/V written at slots 0 .. T-1; -> float32 logits (B, V) of
    token `last` ((1,) long, a tensor so that one compiled prefill serves every prompt length of a bucket). Row b's keys start at slot pad[b]; a padding query sees itself only (no empty softmax)."""
    B, T = ids.shape
    h = embed_rows(W.embed, W.pos_embed, ids, pos)  # (B, T, H)
    i = torch.arange(T, device=ids.device)
    causal = i[None, :] <= i[:, None]  # (T query, T key)
    allowed = causal[None] & ((i[None, None, :] >= pad[:, None, None]) | (i[None, :, None] == i[None, None, :]))
    mask = allowed[:, None]  # (B, 1, T, T)
    D, Hq, Hkv = W.head_dim, W.n_heads, W.n_kv_heads
    cos_sin = None if W.inv_freq is None else rope_cos_sin(W.inv_freq, W.rope_scale, pos, h.dtype)
    for layer, kc, vc in zip(W.layers, k_caches, v_caches):
        qkv = F.linear(norm_ref(h, layer.norm1_w, layer.norm1_b, W.eps), layer.w_qkv, layer.b_qkv)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        if cos_sin is not None:
            q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, Hkv, T, D)
        kc[:, :, :T] = k
        vc[:, :, :T] = v
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k, v, attn_mask=mask, scale=layer.scale, enable_gqa=Hq != Hkv
        )
        h = reduce_residual(_add_linear, a.transpose(1, 2).reshape(B, T, Hq * D), layer.w_o, layer.b_o, h, W.tp)
        m = norm_linear_ref(h, layer.norm2_w, layer.norm2_b, W.eps, layer.w_up, layer.b_up, W.act)
        h = reduce_residual(_add_linear, m, layer.w_down, layer.b_down, h, W.tp)
    logits = norm_linear_ref(
        h.index_select(1, last)[:, 0], W.norm_w, W.norm_b, W.eps, W.lm_head, None, "none", torch.float32
    )
    return logits if W.vocab is None else W.vocab.gather_logits(logits)  # under tp: this rank's vocabulary rows
