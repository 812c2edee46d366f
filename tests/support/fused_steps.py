"""The fused model driven step by step as the decode loop drives it, for the per-step logit tests (CPU and GPU)."""

from __future__ import annotations

import torch

from overlapdecode.inputs import position_ids_for_prompt
from overlapdecode.plan import static_cache_len


def fused_logits(fm, ids, mask, tokens):
    """Per-step float32 logits (B, n, V) of the FusedModel `fm` fed `tokens` (B, n) after the prompt."""
    B, P = ids.shape
    cache = fm.cache_for(B, static_cache_len(P, tokens.shape[1]))
    pos = position_ids_for_prompt(mask)
    out = [fm(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache).logits[:, -1]]
    last = pos[:, -1:]
    for j in range(tokens.shape[1] - 1):
        last = last + 1
        out.append(fm(input_ids=tokens[:, j : j + 1], position_ids=last, past_key_values=cache).logits[:, -1])
    return torch.stack(out, 1).float()


def hf_greedy(model, ids, mask, n: int):
    """Hugging Face generate()'s greedy output for n new tokens, EOS off, pad 0, with each step's logits
    (`.sequences`, `.logits`): what the fused path's tokens and logits are checked against."""
    return model.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=[],
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
