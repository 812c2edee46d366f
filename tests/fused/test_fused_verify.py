"""The fused verify step (forward.verify_step: several tokens per row at the row's own positions against the cache):
Hugging Face's float32 logits at every verified position, for rows of different left padding that advance by
different counts, the slots of their rejected tokens written again by the next verify; plain layers, a sliding
window with soft-capping (Gemma 2), sinks with routed experts (gpt-oss). And the verify step of T tokens is T
one-token decode steps: their logits and cache, with the torch operations and with the Triton kernels (in Triton's
interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused import forward
from overlapdecode.fused.model import FusedModel
from overlapdecode.inputs import position_ids_for_prompt
from support.fused_families import WINDOW, family_model
from support.fused_steps import tiny_fused_model
from support.helpers import make_batch
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture: the attention's loops)

P = 9
PADS = [0, 4, P - 1]  # row 2: one real token
T = 4  # tokens verified per row and verify


def _hf_logits(model, tokens: list[int]) -> torch.Tensor:
    """Hugging Face's logits over one row's real tokens, no padding: (len, V)."""
    return model(input_ids=torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("name", ["qwen2", "gemma2", "gpt-oss"])
@torch.no_grad()
def test_verified_positions_give_hugging_faces_logits_as_rows_advance_by_different_counts(name):
    model = tiny_fused_model("qwen2") if name == "qwen2" else family_model(name)
    fm = FusedModel(model, compile_prefill=False)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 990, (len(PADS), P), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate(PADS):
        mask[row, :pad] = 0
    cache = fm.cache_for(len(PADS), 64)
    fm.prefill(cache, ids, mask, position_ids_for_prompt(mask))
    rows = [ids[b, pad:].tolist() for b, pad in enumerate(PADS)]  # each row's real tokens so far
    pos = torch.tensor([len(r) for r in rows])  # the position of each row's next token
    for kept in ([1, 3, 4], [2, 4, 1]):  # the tokens each row keeps of a verify: the others' slots are written again
        new = torch.randint(3, 990, (len(PADS), T), generator=g)
        at = pos[:, None] + torch.arange(T)[None, :]
        got = forward.verify_step(fm.weights, cache.k, cache.v, cache.pad, new, at, fm.ops)
        assert got.dtype == torch.float32 and got.shape == (len(PADS), T, model.config.vocab_size)
        for b, row in enumerate(rows):
            want = _hf_logits(model, row + new[b].tolist())[len(row) :]
            assert (got[b] - want).abs().max().item() <= 1e-4 * max(want.abs().max().item(), 1.0), (name, b)
            row.extend(new[b, : kept[b]].tolist())
        pos = pos + torch.tensor(kept)


@torch.no_grad()
def test_a_row_that_repeats_a_position_past_its_kept_tokens_leaves_them_alone():
    """Tokens fed past a row's drafts share one position (spec/state.py feed_positions): they write one slot past the
    row's kept ones, and the logits at the positions before them are those of the row's tokens alone."""
    model = tiny_fused_model("qwen2")
    fm = FusedModel(model, compile_prefill=False)
    ids = torch.randint(3, 990, (1, P), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    cache = fm.cache_for(1, 64)
    fm.prefill(cache, ids, mask, position_ids_for_prompt(mask))
    new = torch.tensor([[11, 12, 13, 14, 15]])
    at = torch.tensor([[P, P + 1, P + 2, P + 2, P + 2]])  # two kept, then three at one position past them
    got = forward.verify_step(fm.weights, cache.k, cache.v, cache.pad, new, at, fm.ops)
    want = _hf_logits(model, ids[0].tolist() + [11, 12])[P:]
    assert (got[0, :2] - want).abs().max().item() <= 1e-4 * max(want.abs().max().item(), 1.0)
    new2 = torch.tensor([[21, 22]])  # the next verify from the third slot: the repeated position's slot rewritten
    got2 = forward.verify_step(fm.weights, cache.k, cache.v, cache.pad, new2, torch.tensor([[P + 2, P + 3]]), fm.ops)
    want2 = _hf_logits(model, ids[0].tolist() + [11, 12, 21, 22])[P + 2 :]
    assert (got2[0] - want2).abs().max().item() <= 1e-4 * max(want2.abs().max().item(), 1.0)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
@pytest.mark.parametrize("name", ["tiny-llama", "mistral-sliding", "olmo2"])
@torch.no_grad()
def test_a_verify_of_t_tokens_is_t_one_token_steps(name, kernels):
    """forward.verify_step over (B, T) against T successive forward.decode_step calls from the same cache: the same
    float32 logits and K/V at every slot; a plain Llama, every layer in a window shorter than the positions
    (Mistral's), OLMo2's whole-projection Q/K norms (qk_norm_rope); one row left-padded. The Triton kernels run
    in Triton's interpreter on CPU."""
    model = od.load_model(name, device="cpu") if name == "tiny-llama" else family_model(name)
    fm = FusedModel(model, kernels=kernels, compile_prefill=False)
    pads = [0, 3]
    ids = torch.randint(3, 990, (len(pads), P), generator=torch.Generator().manual_seed(5))
    mask = torch.ones_like(ids)
    mask[1, : pads[1]] = 0
    caches = [fm.cache_for(len(pads), 32, tag) for tag in ("verify", "steps")]
    for cache in caches:
        fm.prefill(cache, ids, mask, position_ids_for_prompt(mask))
    pos = mask.sum(1)[:, None] + torch.arange(T)[None, :]  # (B, T): each row's next T positions
    new = torch.randint(3, 990, (len(pads), T), generator=torch.Generator().manual_seed(6))
    assert name != "mistral-sliding" or int(pos.max()) >= WINDOW  # the window cuts every row's keys
    W, c = fm.weights, caches[0]
    got = forward.verify_step(W, c.k, c.v, c.pad, new, pos, fm.ops)
    c = caches[1]
    want = torch.stack([forward.decode_step(W, c.k, c.v, c.pad, new[:, t], pos[:, t], fm.ops) for t in range(T)], dim=1)
    assert got.shape == want.shape == (len(pads), T, model.config.vocab_size)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_speculation_on_the_triton_kernels_gives_the_tokens_without_it(tiny_llama):
    """The captured rounds (loop/rounds.py, run eagerly on CPU) on `fused` with the Triton kernels in Triton's
    interpreter: greedy tokens of prompt lookup and of the model as its own draft (every draft accepted, so every
    verified token counts) are those without speculation, at batch 3 with left padding."""
    ids, mask = make_batch(3, seed=24)
    dec = od.Decoder(tiny_llama, fused_options=dict(kernels="triton", compile_prefill=False))
    kw = dict(attention_mask=mask, max_new_tokens=7, strategy="fused", eos_token_id=[], pad_token_id=0)
    ref = dec.generate(ids, **kw)
    for spec in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=tiny_llama, num_assistant_tokens=3)):
        assert torch.equal(dec.generate(ids, **kw, **spec), ref), list(spec)
    assert dec.last_speculation.accepted == dec.last_speculation.drafted


@torch.no_grad()
def test_a_drafts_last_token_of_a_round_is_fed_without_the_lm_head(tiny_llama, monkeypatch):
    """A fused draft model feeds its K-th draft (its cache then holds the round's K + 1 slots, as the model's) with
    the decode step's K/V writes alone: no LM head read, the same cache as a whole step writes, and the same tokens
    as without speculation."""
    fm = FusedModel(tiny_llama, compile_prefill=False)
    ids, mask = make_batch(3, seed=5)
    caches = [fm.cache_for(3, 32, tag) for tag in ("whole", "fed")]
    for cache in caches:
        fm.prefill(cache, ids, mask, position_ids_for_prompt(mask))
    tok, pos = torch.tensor([7, 8, 9]), mask.sum(1)
    W, (a, b) = fm.weights, caches
    assert forward.decode_step(W, a.k, a.v, a.pad, tok, pos, fm.ops).shape == (3, tiny_llama.config.vocab_size)
    assert forward.decode_step(W, b.k, b.v, b.pad, tok, pos, fm.ops, head=False) is None
    for x, y in zip(a.k + a.v, b.k + b.v):
        assert torch.equal(x, y)
    heads = []  # per decode step of a call (the verify step is one too, its tokens as rows): whether it read the head
    step = forward.decode_step
    monkeypatch.setattr(
        forward, "decode_step", lambda *a, head=True, **k: heads.append(head) or step(*a, head=head, **k)
    )
    dec = od.Decoder(tiny_llama)
    kw = dict(attention_mask=mask, max_new_tokens=9, strategy="fused", eos_token_id=[], pad_token_id=0)
    ref = dec.generate(ids, **kw)
    heads.clear()
    assert torch.equal(dec.generate(ids, **kw, assistant_model=tiny_llama, num_assistant_tokens=3), ref)
    rounds = dec.last_speculation.rounds
    assert rounds >= 2 and heads.count(False) == rounds and heads.count(True) == 4 * rounds  # 3 drafts, the verify


@torch.no_grad()
def test_a_greedy_fused_draft_chooses_its_tokens_in_its_step(tiny_llama, monkeypatch):
    """A fused draft model's greedy drafts (no repetition penalty) come from its step's own greedy choice
    (FusedRows.choose: ops.greedy after the head, not a chunked argmax over returned logits): the logits' argmax,
    the same K/V as the step that returns logits, each draft's token apart from the next draft's; a call gives the
    tokens it gives without speculation, and a repetition penalty keeps the logits path."""
    from overlapdecode.fused.speculation import FusedRows

    fm = FusedModel(tiny_llama, compile_prefill=False)
    ids, mask = make_batch(3, seed=6)
    rows = [FusedRows(fm, 3, 32, tag) for tag in ("logits", "chosen")]
    for r in rows:
        r.prefill(ids, mask, position_ids_for_prompt(mask))
    tok, pos = torch.tensor([[7], [8], [9]]), mask.sum(1)[:, None]
    logits = rows[0].forward(tok, pos, 1)[:, 0]
    first = rows[1].choose(tok, pos, 0)
    assert torch.equal(first, logits.argmax(-1))
    for x, y in zip(rows[0].cache.k + rows[0].cache.v, rows[1].cache.k + rows[1].cache.v):
        assert torch.equal(x, y)
    kept = first.clone()
    second = rows[1].choose(first[:, None], pos + 1, 1)
    assert torch.equal(second, rows[0].forward(first[:, None], pos + 1, 1)[:, 0].argmax(-1))
    assert torch.equal(first, kept)  # the second draft wrote its own state

    chosen = []  # per draft forward of a call: whether the step chose the token (a greedy-finish argument)
    step = forward.decode_step
    monkeypatch.setattr(
        forward, "decode_step", lambda *a, **k: chosen.append(len(a) > 7 and a[7] is not None) or step(*a, **k)
    )
    dec = od.Decoder(tiny_llama)
    kw = dict(attention_mask=mask, max_new_tokens=9, strategy="fused", eos_token_id=[], pad_token_id=0)
    for extra in ({}, dict(repetition_penalty=1.3)):
        ref = dec.generate(ids, **kw, **extra)
        chosen.clear()
        assert torch.equal(dec.generate(ids, **kw, **extra, assistant_model=tiny_llama, num_assistant_tokens=3), ref)
        rounds = dec.last_speculation.rounds
        assert chosen.count(True) == (0 if extra else 3 * rounds), extra
