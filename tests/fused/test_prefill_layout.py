"""The fused prefill's rows rolled left by their padding (forward.prefill): the same float32 logits and the
same K/V in every slot a step reads ([pad[b], T)) as the prefill that masked the padded layout, and Hugging
Face's own forward logits, for rows of different left padding (none, and all but one token) in a prompt shorter
than its bucket; plain layers attend with SDPA's is_causal and no mask, windowed ones with a mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from overlapdecode.fused import forward
from overlapdecode.fused.kernels.embed import embed_rows
from overlapdecode.fused.kernels.norm_linear import norm_linear_ref
from overlapdecode.fused.model import PREFILL_BUCKET, FusedModel
from overlapdecode.inputs import position_ids_for_prompt
from support.fused_families import family_model
from support.fused_steps import tiny_fused_model

P = 13  # not a multiple of the bucket: the prefill runs T = 64 tokens, 51 of them the bucket's right padding
PADS = [0, 5, P - 1, 3]  # row 2: one real token


def _masked_prefill(W, k_caches, v_caches, pad, ids, pos, last):
    """The prefill in the padded layout throughout, with a (B, 1, T, T) mask (causal, row b's keys from slot pad[b],
    a padding query seeing itself) and K/V written as computed: the oracle of the rolled layout. The projections
    and the rest of each layer are forward.prefill's own pieces; only the layout and the attention differ."""
    B, T = ids.shape
    h = embed_rows(W.embed, W.pos_embed, ids, pos, W.embed_scale)
    i = torch.arange(T, device=ids.device)
    causal = i[None, :] <= i[:, None]
    allowed = causal[None] & ((i[None, None, :] >= pad[:, None, None]) | (i[None, :, None] == i[None, None, :]))
    masks = {None: allowed[:, None]}
    for window in {layer.window for layer in W.layers} - {None}:
        masks[window] = (allowed & (i[None, None, :] > i[None, :, None] - window))[:, None]
    tables = forward.prefill_rope_tables(W, pos, h.dtype)
    for layer, kc, vc in zip(W.layers, k_caches, v_caches):
        q, k, v = forward.prefill_qkv(W, layer, h, tables[layer.rope])
        kc[:, :, :T] = k
        vc[:, :, :T] = v
        mask = masks[layer.window]
        if layer.sinks is not None:
            a = forward._sink_attention(q, k, v, mask, layer.scale, layer.sinks)
        elif W.attn_softcap is None:
            a = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=layer.scale, enable_gqa=W.n_heads != W.n_kv_heads
            )
        else:
            a = forward._softcap_attention(q, k, v, mask, layer.scale, W.attn_softcap)
        h = forward.prefill_after_attention(W, layer, h, a)
    x = h.index_select(1, last)[:, 0]
    return norm_linear_ref(x, W.norm_w, W.norm_b, W.eps, W.lm_head, None, "none", torch.float32, **W.head_options())


# qwen2: plain layers; gemma3 and qwen3-sliding: a window of 6 (shorter than the prompt) in layer 0; gemma2:
# soft-capping and a window; gpt-oss: sinks, a window and routed experts
MODELS = ["qwen2", "gemma3", "qwen3-sliding", "gemma2", "gpt-oss"]


def _model(name):
    return (
        tiny_fused_model("qwen2") if name == "qwen2" else family_model(name)
    )  # Qwen2: QKV biases, random biases and norms


def _prompt(pads=PADS, length=P, seed=7):
    """Random ids (len(pads), length) and the mask that left-pads row b by pads[b]."""
    ids = torch.randint(3, 990, (len(pads), length), generator=torch.Generator().manual_seed(seed))
    mask = torch.ones_like(ids)
    for row, pad in enumerate(pads):
        mask[row, :pad] = 0
    return ids, mask


def _assert_same_slots(cache, old, pads, rows):
    """Every layer's K and V of `rows` equal in the slots a step reads, [pad, T)."""
    for row in rows:
        for new, before in zip((*cache.k, *cache.v), (*old.k, *old.v)):
            assert (new[row, :, pads[row] :] - before[row, :, pads[row] :]).abs().max().item() <= 1e-5, row


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
    got, cache = _prefill(fm, forward.prefill, ids, mask)
    want, old = _prefill(fm, _masked_prefill, ids, mask)
    assert got.dtype == torch.float32 and got.shape == (len(PADS), model.config.vocab_size)
    assert (got - want).abs().max().item() <= 1e-5
    assert torch.equal(cache.pad, torch.tensor(PADS))
    _assert_same_slots(cache, old, PADS, range(len(PADS)))
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
    assert all(_causal(call) for call in _attention_calls(monkeypatch, _model("qwen2"), ids, mask))
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
    ids, mask = _prompt(pads, PREFILL_BUCKET, seed=3)
    got, cache = _prefill(fm, forward.prefill, ids, mask)
    want, old = _prefill(fm, _masked_prefill, ids, mask)
    assert torch.isfinite(got).all()
    real = [row for row, pad in enumerate(pads) if pad < PREFILL_BUCKET]
    assert (got[real] - want[real]).abs().max().item() <= 1e-5
    _assert_same_slots(cache, old, pads, real)
