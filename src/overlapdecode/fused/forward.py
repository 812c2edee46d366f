"""The fused step's math in plain PyTorch on the fused layout: the CPU proof and the prefill.

`decode_step` is the one-token step, composed of the `*_ref` twins of the Triton kernels (same layout,
same roundings, same cache writes), so that float32 on CPU can be compared token for token and logit for
logit with Hugging Face. `prefill` runs the whole prompt with ordinary torch ops on the same weights and
fills the cache at slots 0 .. P-1 (slot = position + the row's left padding). `verify_step`, speculative decoding's
verify step of T tokens per row, is decode_step itself over the B * T tokens as rows (the Triton kernels on CUDA),
each token writing its K/V at its own slot of its row's cache and attending to that row's slots up to its own
(`cache_group` T: row r's cache row is r // T). Its cost: the weights are read once for all B * T rows, as by one
step of B * T rows; a row's cache once per token, T times (the attention's many-query form,
kernels/decode_attention.py many_queries_tile, reads it once for the T: off by default, as it wins only where the
cache reads dominate: results/h100/llama-1b-verify-many-query).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..quant.packed import dense_weight
from ..tp import reduce_residual
from .kernels.decode_attention import with_sink_softmax
from .kernels.embed import embed_rows
from .kernels.linear_residual import linear_residual_ref, require_cache_group
from .kernels.moe import moe_dense_ref
from .kernels.norm_linear import norm_linear_ref
from .kernels.norm_prologue import norm_ref
from .kernels.norm_qkv import qk_norm_ref
from .kernels.norm_residual import norm_residual_ref
from .kernels.rope import apply_rope, rope_cos_sin
from .kernels.swap_ab import use_swap
from .weights import FusedWeights


def decode_attention_torch(
    q, k_cache, v_cache, start, length, scale: float, softcap: float | None = None, sinks=None, cache_group: int = 1
):
    """The contract of kernels.decode_attention in torch: q (B, Hq, D), caches (B / cache_group, Hkv, S, D); row b
    attends to slots [start[b], length[b]) of cache row b // cache_group; softmax in float32; output in q's dtype;
    `softcap`: scores cap * tanh(scores / cap) (Gemma 2); `sinks` (Hq,): a logit per head in the softmax, no value
    (gpt-oss)."""
    B, Hq, D = q.shape
    require_cache_group(cache_group, B, k_cache)
    if cache_group != 1:  # each query row's cache row
        k_cache = k_cache.repeat_interleave(cache_group, dim=0)
        v_cache = v_cache.repeat_interleave(cache_group, dim=0)
    Hkv, S = k_cache.shape[1], k_cache.shape[2]
    k = k_cache.repeat_interleave(Hq // Hkv, dim=1).float()  # (B, Hq, S, D)
    v = v_cache.repeat_interleave(Hq // Hkv, dim=1).float()
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    slots = torch.arange(S, device=q.device)
    keep = (slots[None, :] >= start[:, None].long()) & (slots[None, :] < length[:, None].long())  # (B, S)
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    probs = scores.softmax(-1) if sinks is None else with_sink_softmax(scores, sinks.float().view(1, Hq, 1))
    return torch.einsum("bhs,bhsd->bhd", probs, v).to(q.dtype)


def step_ropes(W: FusedWeights, pos) -> dict:
    """The rotary tables of one forward, by LayerWeights.rope: {"global": (inv_freq, scale), "local": ...}.
    LongRoPE (W.long_inv_freq): the long table where the forward's largest position + 1 exceeds W.rope_switch,
    else the short one, as Hugging Face switches per forward; chosen on the device (no host sync)."""
    inv = W.inv_freq
    if W.long_inv_freq is not None:
        inv = torch.where(pos.max() + 1 > W.rope_switch, W.long_inv_freq, W.inv_freq)
    ropes = {"global": (inv, W.rope_scale), None: (None, 1.0)}
    if W.local_inv_freq is not None:
        ropes["local"] = (W.local_inv_freq, W.local_rope_scale)
    return ropes


def whole_qk_norms(W: FusedWeights, layer) -> bool:
    """Whether the layer normalises Q and K over their whole projections (OLMo2): then RoPE follows those norms
    (ops.qk_norm_rope), not norm_qkv."""
    return layer.q_norm is not None and layer.q_norm.numel() != W.head_dim


def step_rope_tables(W: FusedWeights, ropes: dict, pos, ops, dtype) -> dict:
    """ops.rope_table's cos and sin of this step's positions in `dtype` (the hidden states'), one per rotary table
    of step_ropes that a layer's norm_qkv reads, instead of each of its programs computing them: from ROW_TILE + 1
    rows (swap_ab.use_swap's), where norm_qkv runs the dense form (kernels/dense.py, its epilogue over 16-row
    tiles) or, asked, swapped tiles; {} below that, or where the ops have no table (the torch twins). The table was
    made for the swapped programs, which hold 64-128 rows each, so that their precise sin and cos cost microseconds
    per launch (kernels/rope.py rope_table). Below 17 rows the table's launch costs more than it saves
    (docs/KERNELS.md, "norm_qkv"; results/h200/llama-1b-dense-rows/rope-table-rows)."""
    if ops.rope_table is None or not use_swap(pos.shape[0]):
        return {}
    kinds = {layer.rope for layer in W.layers if not whole_qk_norms(W, layer)}
    return {
        kind: ops.rope_table(inv, scale, pos, dtype)
        for kind, (inv, scale) in ropes.items()
        if inv is not None and kind in kinds
    }


def window_start(start, length, window: int | None):
    """The first slot a row attends to in a layer of sliding window `window` (None: `start`, the row's first):
    keys at slots > the query's slot - window, as Hugging Face's sliding-window mask keeps them."""
    return start if window is None else torch.maximum(start, length - window)


def decode_step(
    W: FusedWeights, k_caches, v_caches, pad, ids, pos, ops, finish=None, cache_group: int = 1, head: bool = True
):
    """One token per row: ids, pos (B,) long -> float32 logits (B, V); writes K/V at slot pos + pad. `head=False`:
    the K/V writes alone, no LM head read and None returned (a draft model's last token of a round).
    `ops` (model.StepOps): the operations, Triton kernels or their `*_ref` twins. `finish`
    (kernels/greedy.py GreedyFinish): also choose the greedy tokens and advance its state and flag in place
    (ops.greedy, after the head); ids and pos may be views of that state: they are read before it is written.
    `cache_group`: rows per cache row (verify_step's tokens per row): row r writes and reads cache row
    r // cache_group, the caches holding B / cache_group rows and pad B values (a row's, for each of its tokens);
    given to the three operations that address the cache by row (norm_qkv, qk_norm_rope, attention) alone."""
    # slot and length int64 (the attention takes either): a `pad.to(int32)` here was recomputed by inductor
    # before every layer's attention, 16 one-element kernels per step at Llama-1B (inductor's output code)
    scale = {} if W.embed_scale is None else dict(scale=W.embed_scale)
    h, slot, length = ops.embed(W.embed, W.pos_embed, ids, pos, pad, **scale)  # (B, H), (B,), (B,)
    ropes = step_ropes(W, pos)
    tables = step_rope_tables(W, ropes, pos, ops, h.dtype)
    reads = [(L.norm1_w, L.norm1_b) for L in W.layers[1:]] + [(W.norm_w, W.norm_b)]  # the norm after each layer
    for layer, kc, vc, read in zip(W.layers, k_caches, v_caches, reads):
        after = then_norm(W, *read)
        h = decode_layer(W, layer, h, kc, vc, pos, slot, pad, length, ops, ropes, tables, after, cache_group)
    if not head:
        return None
    logits = ops.norm_linear(h, W.norm_w, W.norm_b, W.eps, W.lm_head, None, "none", torch.float32, **W.head_options())
    if W.vocab is not None:
        logits = W.vocab.gather_logits(logits)  # under tp: this rank's vocabulary rows
    if finish is not None:
        ops.greedy(logits, finish)
    return logits


def then_norm(W: FusedWeights, norm_w, norm_b) -> tuple | None:
    """The `then_norm` of a residual projection whose output the norm (norm_w, norm_b) reads next: (norm_w,
    norm_b, eps, the kernels' norm_style), for ops.linear_residual (kernels/residual_norm.py); None without a norm
    or under tensor parallelism (an all-reduce sits between the two)."""
    if norm_w is None or W.tp is not None:
        return None
    return (norm_w, norm_b, W.eps, W.norm_options().get("norm_style", "rms"))


def decode_layer(
    W: FusedWeights,
    layer,
    h,
    k_cache,
    v_cache,
    pos,
    slot,
    start,
    length,
    ops,
    ropes=None,
    rope_tables=None,
    after=None,
    cache_group: int = 1,
):
    """One decoder layer of the one-token step: h (B, H) -> the layer's output (B, H); writes K/V at `slot` of
    its cache; row b attends to slots [start[b], length[b]). Five operations of `ops` (model.StepOps), seven
    where the layer normalises its branches before adding them (ops.norm_residual). `ropes`: step_ropes's
    tables (None: W's own); `rope_tables`: step_rope_tables's (None or no entry: QKV computes cos and sin).
    `after`: then_norm's tuple of the norm that reads the layer's output (the next layer's or the final norm).
    `cache_group`: decode_step's (rows per cache row), for norm_qkv, qk_norm_rope and the attention."""
    B = h.shape[0]
    group = {} if cache_group == 1 else dict(cache_group=cache_group)  # the one-token step's calls unchanged
    inv_freq, rope_scale = (W.inv_freq, W.rope_scale) if ropes is None else ropes[layer.rope]
    whole = whole_qk_norms(W, layer)  # OLMo2: norms after the projection
    table = None if whole or not rope_tables else rope_tables.get(layer.rope)
    q = ops.norm_qkv(
        h,
        layer.norm1_w,
        layer.norm1_b,
        W.eps,
        layer.w_qkv,
        layer.b_qkv,
        None if whole else inv_freq,
        rope_scale,
        pos,
        slot,
        k_cache,
        v_cache,
        W.n_heads,
        W.n_kv_heads,
        W.head_dim,
        **W.qkv_options(layer),
        **({} if table is None else dict(rope_table=table)),
        **group,
    )
    if whole:  # normalise Q and the slot's K over their whole projections, then rotate them
        q = ops.qk_norm_rope(
            q, k_cache, slot, layer.q_norm, layer.k_norm, W.eps, inv_freq, rope_scale, pos, W.norm, **group
        )
    attn = dict(group) if W.attn_softcap is None else dict(group, softcap=W.attn_softcap)
    if layer.sinks is not None:
        attn["sinks"] = layer.sinks
    a = ops.attention(q, k_cache, v_cache, window_start(start, length, layer.window), length, layer.scale, **attn)
    if layer.post_attn_w is not None:  # normalised before the add (OLMo2, Gemma 2/3); unsharded
        branch = ops.linear_residual(a.reshape(B, -1), layer.w_o, layer.b_o, None)
        h = ops.norm_residual(branch, layer.post_attn_w, W.eps, h, W.norm)
    elif W.tp is None:  # Granite: the branch times residual_multiplier
        mlp_norm = None if layer.router is not None else then_norm(W, layer.norm2_w, layer.norm2_b)
        h = ops.linear_residual(
            a.reshape(B, -1), layer.w_o, layer.b_o, h, res_scale=W.residual_scale, then_norm=mlp_norm
        )
    else:
        # under tp (W.tp), w_o and w_down hold 1/tp of their inputs: reduce_residual sums the ranks' parts
        # (ops.symmetric: over symmetric memory; None: the functional collective)
        h = reduce_residual(ops.linear_residual, a.reshape(B, -1), layer.w_o, layer.b_o, h, W.tp, ops.symmetric)
    if layer.router is not None:  # routed experts (kernels/moe.py): the router logits, then the chosen experts
        norm = W.norm_options()
        logits = ops.norm_linear(h, layer.norm2_w, None, W.eps, layer.router, layer.router_b, "none", **norm)
        return ops.moe(
            h,
            layer.norm2_w,
            W.eps,
            logits,
            layer.w_up,
            layer.w_down,
            layer.top_k,
            layer.renorm,
            W.norm,
            **layer.moe_options(),
        )
    m = ops.norm_linear(h, layer.norm2_w, layer.norm2_b, W.eps, layer.w_up, layer.b_up, W.act, **W.norm_options())
    if layer.post_ffn_w is not None:
        branch = ops.linear_residual(m, layer.w_down, layer.b_down, None)
        return ops.norm_residual(branch, layer.post_ffn_w, W.eps, h, W.norm)
    if W.tp is None:
        return ops.linear_residual(m, layer.w_down, layer.b_down, h, res_scale=W.residual_scale, then_norm=after)
    return reduce_residual(ops.linear_residual, m, layer.w_down, layer.b_down, h, W.tp, ops.symmetric)


def _add_linear(x, w, b, residual):
    return residual + F.linear(x, dense_weight(w), b)


def prefill(W: FusedWeights, k_caches, v_caches, pad, ids, pos, last):
    """The prompt (B, T), row b left-padded by pad[b], through every layer; K/V written at slots 0 .. T-1;
    -> float32 logits (B, V) of token `last` ((1,) long, a tensor so that one compiled prefill serves every
    prompt length of a bucket).

    Each row runs rolled left by its padding (its real tokens at 0 .. T-1-pad[b], its padding after them), so
    that a real query attends exactly its row's earlier real tokens under the causal mask alone: layers without
    window, sinks or soft-capping take SDPA's is_causal path (an explicit mask keeps it off the flash kernels),
    the others a (T, T) mask shared by every row. A padding query sees more than itself then, but its keys land
    in slots below pad[b], which no step reads. K/V are written back in the padded layout the decode step reads:
    slot s of row b holds rolled index (s - pad[b]) % T."""
    B, T = ids.shape
    i = torch.arange(T, device=ids.device)
    rolled = (i[None, :] + pad[:, None]) % T  # (B, T): rolled index -> slot
    ids, pos = ids.gather(1, rolled), pos.gather(1, rolled)
    back = ((i[None, :] - pad[:, None]) % T)[:, None, :, None]  # (B, 1, T, 1): slot -> rolled index
    h = embed_rows(W.embed, W.pos_embed, ids, pos, W.embed_scale)  # (B, T, H)
    # per layer: its sliding window, None where it masks nothing beyond causality (T keys or more)
    windows = [None if layer.window is None or layer.window >= T else layer.window for layer in W.layers]
    causal = i[None, :] <= i[:, None]  # (T query, T key), the same for every row once rolled
    masks = {w: causal if w is None else causal & (i[None, :] > i[:, None] - w) for w in set(windows)}
    D, Hq, Hkv = W.head_dim, W.n_heads, W.n_kv_heads
    tables = prefill_rope_tables(W, pos, h.dtype)
    for layer, window, kc, vc in zip(W.layers, windows, k_caches, v_caches):
        q, k, v = prefill_qkv(W, layer, h, tables[layer.rope])
        kc[:, :, :T] = k.gather(2, back.expand(B, Hkv, T, D))
        vc[:, :, :T] = v.gather(2, back.expand(B, Hkv, T, D))
        if layer.sinks is not None:
            a = _sink_attention(q, k, v, masks[window], layer.scale, layer.sinks)
        elif W.attn_softcap is not None:
            a = _softcap_attention(q, k, v, masks[window], layer.scale, W.attn_softcap)
        elif window is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scale, enable_gqa=Hq != Hkv)
        else:
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=masks[window], scale=layer.scale, enable_gqa=Hq != Hkv
            )
        h = prefill_after_attention(W, layer, h, a)
    final = (last - pad) % T  # (B,): the last prompt token's rolled index
    logits = norm_linear_ref(
        h.gather(1, final[:, None, None].expand(B, 1, h.shape[-1]))[:, 0],
        W.norm_w,
        W.norm_b,
        W.eps,
        W.lm_head,
        None,
        "none",
        torch.float32,
        **W.head_options(),
    )
    return logits if W.vocab is None else W.vocab.gather_logits(logits)  # under tp: this rank's vocabulary rows


def verify_step(W: FusedWeights, k_caches, v_caches, pad, ids, pos, ops):
    """T tokens per row against the cache, each at its own position: ids, pos (B, T) long -> float32 logits
    (B, T, V). decode_step over the B * T tokens as rows (cache_group T): token t of row b writes its K/V at slot
    pos[b, t] + pad[b] of cache row b and attends to slots pad[b] .. that slot (the row's earlier tokens, then
    itself; within a layer's window), so a row's positions must rise along T. Within a layer, norm_qkv writes every
    token's K/V before the attention reads any (the next operation on the stream): a token sees its row's earlier
    tokens of the same verify step. Two tokens of a row at one position write one slot: only a token no row keeps
    may (spec/state.py feed_positions). `ops` (model.StepOps): the decode step's, Triton kernels or their twins."""
    B, T = ids.shape
    flat = dict(ids=ids.reshape(B * T), pos=pos.reshape(B * T))
    logits = decode_step(W, k_caches, v_caches, pad.repeat_interleave(T), **flat, ops=ops, cache_group=T)
    return logits.view(B, T, logits.shape[-1])


def prefill_rope_tables(W: FusedWeights, pos, dtype) -> dict:
    """cos, sin per RoPE kind of the model's layers (None: no RoPE) at positions `pos` (B, T)."""
    return {
        kind: None if inv is None else rope_cos_sin(inv, scale, pos, dtype)
        for kind, (inv, scale) in step_ropes(W, pos).items()
    }


def prefill_qkv(W: FusedWeights, layer, h, cos_sin):
    """A layer's attention inputs from its input h (B, T, H): norm, QKV projection, Q/K norms, RoPE (`cos_sin`:
    prefill_rope_tables's for the layer's kind) -> q (B, Hq, T, D), k and v (B, Hkv, T, D)."""
    B, T, _ = h.shape
    D, Hq, Hkv = W.head_dim, W.n_heads, W.n_kv_heads
    style = W.norm if W.norm != "layer" else "rms"
    qkv = F.linear(norm_ref(h, layer.norm1_w, layer.norm1_b, W.eps, style), dense_weight(layer.w_qkv), layer.b_qkv)
    q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
    q, k = qk_norm_ref(q, k, layer.q_norm, layer.k_norm, W.eps, style)
    if cos_sin is not None:
        q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def prefill_after_attention(W: FusedWeights, layer, h, a):
    """The rest of a layer after attention: a (B, Hq, T, D) -> O projection and residual, then the MLP (or the
    routed experts) and its residual -> the layer's output (B, T, H)."""
    B, _, T, _ = a.shape
    a = a.transpose(1, 2).reshape(B, T, -1)
    if layer.post_attn_w is not None:
        h = norm_residual_ref(F.linear(a, dense_weight(layer.w_o), layer.b_o), layer.post_attn_w, W.eps, h, W.norm)
    elif W.residual_scale is not None:
        h = linear_residual_ref(a, layer.w_o, layer.b_o, h, W.residual_scale)
    else:
        h = reduce_residual(_add_linear, a, layer.w_o, layer.b_o, h, W.tp)
    if layer.router is not None:
        return h + _moe_prefill(W, layer, h)
    m = norm_linear_ref(h, layer.norm2_w, layer.norm2_b, W.eps, layer.w_up, layer.b_up, W.act, None, **W.norm_options())
    if layer.post_ffn_w is not None:
        branch = F.linear(m, dense_weight(layer.w_down), layer.b_down)
        return norm_residual_ref(branch, layer.post_ffn_w, W.eps, h, W.norm)
    if W.residual_scale is not None:
        return linear_residual_ref(m, layer.w_down, layer.b_down, h, W.residual_scale)
    return reduce_residual(_add_linear, m, layer.w_down, layer.b_down, h, W.tp)


def _moe_prefill(W: FusedWeights, layer, h):
    """The routed experts' sum of a (B, T, H) prompt (kernels/moe.py moe_dense_ref): every expert on every token."""
    x = norm_ref(h, layer.norm2_w, None, W.eps, W.norm).reshape(-1, h.shape[-1])
    logits = F.linear(x, layer.router, layer.router_b)
    dense = moe_dense_ref(x, logits, layer.w_up, layer.w_down, layer.top_k, layer.renorm, **layer.moe_options())
    return dense.view(h.shape)


def _softcap_attention(q, k, v, mask, scale: float, softcap: float):
    """Attention with Gemma 2's soft-capped scores (cap * tanh(scores / cap)), as its eager attention computes
    it: q (B, Hq, T, D), k and v (B, Hkv, S, D), mask (T, S) bool."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)


def _sink_attention(q, k, v, mask, scale: float, sinks):
    """Attention with gpt-oss's sinks (a logit per head in each softmax, with no value), as its eager attention
    computes it: q (B, Hq, T, D), k and v (B, Hkv, S, D), mask (T, S) bool, sinks (Hq,)."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    scores = (torch.matmul(q, k.transpose(2, 3)) * scale).masked_fill(~mask, float("-inf"))
    probs = with_sink_softmax(scores, sinks.view(1, -1, 1, 1).to(scores.dtype))
    return torch.matmul(probs.to(v.dtype), v)
