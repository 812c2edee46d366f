"""The fused model driven step by step as the decode loop drives it, for the per-step logit tests (CPU and GPU)."""

from __future__ import annotations

import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import overlapdecode as od
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


SMALL = dict(
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=2,
)


def tiny_fused_model(name: str):
    """A tiny model whose biases and norm weights are random too (Hugging Face initialises them to 0 and 1,
    which would let a dropped bias or norm weight go unnoticed)."""
    torch.manual_seed(0)
    if name == "qwen2":  # QKV bias
        model = Qwen2ForCausalLM(Qwen2Config(**SMALL)).eval()
    elif name == "mistral":
        model = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=None)).eval()
    elif name == "llama3-tied":  # Llama-3 RoPE scaling and tied embeddings, one KV head
        rope = dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=32,
            rope_theta=10000.0,
        )
        model = LlamaForCausalLM(
            LlamaConfig(**dict(SMALL, num_key_value_heads=1), tie_word_embeddings=True, rope_parameters=rope)
        ).eval()
    else:
        model = od.load_model(name, device="cpu")
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in pname or ".ln_" in pname:
                p.normal_(1.0, 0.1)
    return model
