"""The fused prefill's rows rolled left by their padding (reference.prefill): the same float32 logits and the
same K/V in every slot a step reads ([pad[b], T)) as the prefill that masked the padded layout, and Hugging
Face's own forward logits, for rows of different left padding (none, and all but one token) in a prompt shorter
than its bucket; plain layers attend with SDPA's is_causal and no mask, windowed ones with a mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fused_families import family_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from overlapdecode.caches import position_ids_for_prompt
from overlapdecode.fused import reference
from overlapdecode.fused.kernels.embed import embed_rows
from overlapdecode.fused.kernels.linear_residual import linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear_ref, norm_ref
from overlapdecode.fused.kernels.norm_qkv import apply_rope, qk_norm_ref, rope_cos_sin
from overlapdecode.fused.kernels.norm_residual import norm_residual_ref
from overlapdecode.fused.model import PREFILL_BUCKET, FusedModel
from overlapdecode.tp import reduce_residual

P = 13  # not a multiple of the bucket: the prefill runs T = 64 tokens, 51 of them the bucket's right padding
PADS = [0, 5, P - 1, 3]  # row 2: one real token


def _masked_prefill(W, k_caches, v_caches, pad, ids, pos, last):
    """The prefill as it was before the rows were rolled: the padded layout throughout, a (B, 1, T, T) mask
    (causal, row b's keys from slot pad[b], a padding query seeing itself), K/V written as computed."""
    B, T = ids.shape
    h = embed_rows(W.embed, W.pos_embed, ids, pos, W.embed_scale)
    i = torch.arange(T, device=ids.device)
    causal = i[None, :] <= i[:, None]
    allowed = causal[None] & ((i[None, None, :] >= pad[:, None, None]) | (i[None, :, None] == i[None, None, :]))
    masks = {None: allowed[:, None]}
    for window in {layer.window for layer in W.layers} - {None}:
        masks[window] = (allowed & (i[None, None, :] > i[None, :, None] - window))[:, None]
    D, Hq, Hkv = W.head_dim, W.n_heads, W.n_kv_heads
    tables = {
        kind: None if inv is None else rope_cos_sin(inv, scale, pos, h.dtype)
        for kind, (inv, scale) in reference.step_ropes(W, pos).items()
    }
    style = W.norm if W.norm != "layer" else "rms"
    for layer, kc, vc in zip(W.layers, k_caches, v_caches):
        qkv = F.linear(norm_ref(h, layer.norm1_w, layer.norm1_b, W.eps, style), layer.w_qkv, layer.b_qkv)
        q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(B, T, Hq, D), k.view(B, T, Hkv, D), v.view(B, T, Hkv, D)
        q, k = qk_norm_ref(q, k, layer.q_norm, layer.k_norm, W.eps, style)
        cos_sin = tables[layer.rope]
        if cos_sin is not None:
            q, k = apply_rope(q, *cos_sin), apply_rope(k, *cos_sin)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        kc[:, :, :T] = k
        vc[:, :, :T] = v
        q = q.transpose(1, 2)
        mask = masks[layer.window]
        if layer.sinks is not None:
            a = reference._sink_attention(q, k, v, mask, layer.scale, layer.sinks)
        elif W.attn_softcap is None:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scale, enable_gqa=Hq != Hkv)
        else:
            a = reference._softcap_attention(q, k, v, mask, layer.scale, W.attn_softcap)
        a = a.transpose(1, 2).reshape(B, T, Hq * D)
        if layer.post_attn_w is not None:
            h = norm_residual_ref(F.linear(a, layer.w_o, layer.b_o), layer.post_attn_w, W.eps, h, W.norm)
        elif W.residual_scale is not None:
            h = linear_residual_ref(a, layer.w_o, layer.b_o, h, W.residual_scale)
        else:
            h = reduce_residual(reference._add_linear, a, layer.w_o, layer.b_o, h, W.tp)
        if layer.router is not None:
            h = h + reference._moe_prefill(W, layer, h)
            continue
        m = norm_linear_ref(
            h, layer.norm2_w, layer.norm2_b, W.eps, layer.w_up, layer.b_up, W.act, None, **W.norm_options()
        )
        if layer.post_ffn_w is not None:
            h = norm_residual_ref(F.linear(m, layer.w_down, layer.b_down), layer.post_ffn_w, W.eps, h, W.norm)
        elif W.residual_scale is not None:
            h = linear_residual_ref(m, layer.w_down, layer.b_down, h, W.residual_scale)
        else:
            h = reduce_residual(reference._add_linear, m, layer.w_down, layer.b_down, h, W.tp)
    x = h.index_select(1, last)[:, 0]
    return norm_linear_ref(x, W.norm_w, W.norm_b, W.eps, W.lm_head, None, "none", torch.float32, **W.head_options())


def _qwen2():
    """Qwen2 (QKV biases), every bias and norm weight random."""
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name:
                p.normal_(1.0, 0.1)
    return model


# qwen2: plain layers; gemma3 and qwen3-sliding: a window of 6 (shorter than the prompt) in layer 0; gemma2:
# soft-capping and a window; gpt-oss: sinks, a window and routed experts
MODELS = ["qwen2", "gemma3", "qwen3-sliding", "gemma2", "gpt-oss"]


def _model(name):
    return _qwen2() if name == "qwen2" else family_model(name)


def _prompt():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, 990, (len(PADS), P), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(PADS):
        mask[row, :pad] = 0
    return ids, mask


def _prefill(fm, prefill, ids, mask):
    """`prefill` run by FusedModel.prefill (the bucket's right padding, pad and `last` as it makes them) on a
    fresh cache of one bucket -> (logits, the cache)."""
    fm._prefill = prefill
    cache = fm.cache_for(ids.shape[0], PREFILL_BUCKET)
    for t in (*cache.k, *cache.v):
        t.fill_(float("nan"))  # a slot the prefill should have written and did not shows
    fm._caches.clear()  # the next call gets a cache of its own
    return fm.prefill(cache, ids, mask, position_ids_for_prompt(mask)), cache


@pytest.mark.parametrize("name", MODELS)
@torch.no_grad()
def test_rolled_prefill_equals_the_masked_one_and_hugging_face(name):
    model = _model(name)
    fm = FusedModel(model, compile_prefill=False)
    ids, mask = _prompt()
    got, cache = _prefill(fm, reference.prefill, ids, mask)
    want, old = _prefill(fm, _masked_prefill, ids, mask)
    assert got.dtype == torch.float32 and got.shape == (len(PADS), model.config.vocab_size)
    assert (got - want).abs().max().item() <= 1e-5
    assert torch.equal(cache.pad, torch.tensor(PADS))
    for row, pad in enumerate(PADS):
        for new, before in zip((*cache.k, *cache.v), (*old.k, *old.v)):
            assert (new[row, :, pad:] - before[row, :, pad:]).abs().max().item() <= 1e-5, (row, pad)
    hf = model(input_ids=ids, attention_mask=mask).logits[:, -1].float()
    assert (got - hf).abs().max().item() <= 1e-4


def _attention_calls(monkeypatch, model, ids, mask):
    """The keywords of each SDPA call of one prefill of `model`."""
    calls = []
    sdpa = F.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(kw)
        return sdpa(*args, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    fm = FusedModel(model, compile_prefill=False)
    fm.prefill(fm.cache_for(ids.shape[0], PREFILL_BUCKET), ids, mask, position_ids_for_prompt(mask))
    return calls


def _causal(call) -> bool:
    return bool(call.get("is_causal")) and call.get("attn_mask") is None


def test_plain_layers_attend_without_a_mask(monkeypatch):
    """Qwen2's layers: is_causal, no mask; Qwen3's window of 6 in layer 0 keeps a (T, T) mask, its full layer 1
    none; a window as long as the bucket masks nothing beyond causality: no mask."""
    ids, mask = _prompt()
    assert all(_causal(call) for call in _attention_calls(monkeypatch, _qwen2(), ids, mask))
    first, second = _attention_calls(monkeypatch, family_model("qwen3-sliding"), ids, mask)
    assert first["attn_mask"].shape == (PREFILL_BUCKET, PREFILL_BUCKET) and not first.get("is_causal")
    assert _causal(second)
    wide = family_model("qwen3-sliding", sliding_window=PREFILL_BUCKET)
    assert all(_causal(call) for call in _attention_calls(monkeypatch, wide, ids, mask))


@pytest.mark.parametrize("name", ["qwen2", "gpt-oss"])
@torch.no_grad()
def test_a_full_bucket_and_a_row_of_padding_only(name):
    """A prompt as long as its bucket (T == P, no right padding) with a row that is all padding and one of a single
    real token: the real rows' logits and cache slots [pad, T) as the masked prefill's, every logit finite."""
    model = _model(name)
    fm = FusedModel(model, compile_prefill=False)
    pads = [0, 7, PREFILL_BUCKET, PREFILL_BUCKET - 1]
    ids = torch.randint(3, 990, (len(pads), PREFILL_BUCKET), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    got, cache = _prefill(fm, reference.prefill, ids, mask)
    want, old = _prefill(fm, _masked_prefill, ids, mask)
    assert torch.isfinite(got).all()
    real = [row for row, pad in enumerate(pads) if pad < PREFILL_BUCKET]
    assert (got[real] - want[real]).abs().max().item() <= 1e-5
    for row in real:
        for new, before in zip((*cache.k, *cache.v), (*old.k, *old.v)):
            assert (new[row, :, pads[row] :] - before[row, :, pads[row] :]).abs().max().item() <= 1e-5, row
