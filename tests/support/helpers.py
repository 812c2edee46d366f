"""The two oracles (independent of the package: Hugging Face `generate()` and a naive no-cache loop written
here from scratch), Hugging Face's sampling processors as a reference, the test batches, and the checks several
test modules share."""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import overlapdecode as od

P = 8  # prompt length of the shared batches; P + new tokens stays <= 64 so compiled tests share one graph


def make_batch(batch: int, seed: int = 0, prompt_len: int = P, low: int = 3, high: int = 990, device=None):
    """Random ids in [low, high) with left padding on every other row (pad positions hold a real id, as
    tokenizers do); the one builder of padded prompts for the CPU and the GPU tests.

    Row r (odd) has its first 1 + r % (prompt_len - 1) positions padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (batch, prompt_len), generator=g)
    mask = torch.ones_like(ids)
    for row in range(1, batch, 2):
        mask[row, : 1 + row % (prompt_len - 1)] = 0
    return (ids, mask) if device is None else (ids.to(device), mask.to(device))


def hf_generate(model, ids, mask, max_new_tokens, eos, pad):
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=pad,
    )


def hf_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a (left-padded) mask as Hugging Face's generate() gives them to a whole-sequence forward."""
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)


@torch.no_grad()
def naive_generate(model, ids, mask, max_new_tokens, eos, pad):
    """The no-cache oracle: re-run the whole sequence each step, positions as Hugging Face makes them."""
    eos_t = torch.tensor(eos, dtype=torch.long)
    seq, m = ids.clone(), mask.clone()
    finished = torch.zeros(ids.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        pos = hf_positions(m)
        logits = model(input_ids=seq, attention_mask=m, position_ids=pos).logits[:, -1]
        tok = logits.argmax(-1)
        tok = torch.where(finished, pad, tok)
        finished |= torch.isin(tok, eos_t)
        seq = torch.cat([seq, tok[:, None]], 1)
        m = torch.cat([m, torch.ones_like(tok[:, None])], 1)
        if finished.all():
            break
    return seq


def eos_hit_midway(model, ids, mask, max_new_tokens, rows_that_stop):
    """EOS ids chosen from a free run so that exactly the rows in `rows_that_stop` emit one mid-way.

    Returns the list of EOS ids, or None when no such choice exists for this batch.
    """
    free = naive_generate(model, ids, mask, max_new_tokens, [], 0)[:, ids.shape[1] :]
    others = {int(t) for r in range(free.shape[0]) if r not in rows_that_stop for t in free[r]}
    eos = []
    for r in rows_that_stop:
        row = [int(t) for t in free[r]]
        cands = [t for t in row[1 : max_new_tokens - 2] if t not in others]
        if not cands:
            return None
        eos.append(cands[0])
    return eos


def hf_processors(setting: dict) -> LogitsProcessorList:
    """Hugging Face generate()'s processors for `setting`, in its order (utils._get_logits_processor)."""
    procs = LogitsProcessorList()
    if setting.get("repetition_penalty") is not None:
        procs.append(RepetitionPenaltyLogitsProcessor(setting["repetition_penalty"]))
    if setting.get("temperature", 1.0) != 1.0:
        procs.append(TemperatureLogitsWarper(setting["temperature"]))
    if setting.get("top_k"):
        procs.append(TopKLogitsWarper(setting["top_k"]))
    if setting.get("top_p") is not None and setting["top_p"] < 1:
        procs.append(TopPLogitsWarper(setting["top_p"]))
    if setting.get("min_p") is not None:
        procs.append(MinPLogitsWarper(setting["min_p"]))
    return procs


@torch.no_grad()
def assert_inside_hf_kept_sets(model, out, mask, prompt_len, setting, model_device="cpu"):
    """Teacher-forced: at each step, the token lies in the set Hugging Face's processors keep for that prefix
    (`out`, `mask` on the CPU; the model's forward on `model_device`, the processors on the CPU)."""
    procs = hf_processors(setting)
    full_mask = torch.cat([mask, torch.ones(out.shape[0], out.shape[1] - prompt_len, dtype=mask.dtype)], 1)
    for t in range(prompt_len, out.shape[1]):
        m = full_mask[:, :t]
        pos = hf_positions(m)
        logits = (
            model(
                input_ids=out[:, :t].to(model_device),
                attention_mask=m.to(model_device),
                position_ids=pos.to(model_device),
            )
            .logits[:, -1]
            .float()
            .cpu()
        )
        kept = procs(out[:, :t], logits) > float("-inf")
        assert kept.gather(1, out[:, t : t + 1]).all(), (setting, t)


def assert_compiled_once(dec, ids, mask, n, runs):
    """For each (EOS ids, tokens) of `runs`, `compiled`, `interleaved`, then `compiled` again on one Decoder give
    those tokens, all from one graph for the shape: none per step, none per call, none per count of EOS ids (the
    EOS tensor has one width for up to 4: sampling.eos_tensor)."""
    before = od.compile_count()
    for eos_ids, ref in runs:
        for strategy in ("compiled", "interleaved", "compiled"):
            out = dec.generate(
                ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=eos_ids, pad_token_id=0
            )
            assert torch.equal(out, ref), (strategy, eos_ids)
    assert od.compile_count() - before == 1
