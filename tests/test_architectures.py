"""Beyond GPT-2 and Llama: other Hugging Face causal LMs, loaded from a local directory, give HF's tokens."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import overlapdecode as od
from helpers import hf_generate, make_batch

SMALL = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, eos_token_id=2)
ARCHS = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "gpt-neox": (GPTNeoXConfig, GPTNeoXForCausalLM, {}),
    "phi3": (Phi3Config, Phi3ForCausalLM, dict(pad_token_id=0)),
    "mistral-sliding": (MistralConfig, MistralForCausalLM, dict(sliding_window=16)),  # window < sequence
}
EAGER = ["baseline", "kv", "static", od.Strategy(cache="static", stop_check="pingpong", lag=2)]


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_model(request, tmp_path_factory):
    cfg_cls, model_cls, extra = ARCHS[request.param]
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    model_cls(cfg_cls(**SMALL, **extra)).save_pretrained(path)
    return request.param, od.load_model(str(path), device="cpu")


def test_eager_strategies_match_hf(arch_model):
    name, model = arch_model
    ids, mask = make_batch(4, seed=40)
    ref = hf_generate(model, ids, mask, 30, [], 0)
    for s in EAGER:
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy=s, eos_token_id=[])
        assert torch.equal(out, ref), (name, s)


def test_compiled_refuses_sliding_window_clearly():
    model = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=16)).eval()
    ids, _ = make_batch(1, seed=41)
    with pytest.raises(ValueError, match="sliding-window layers"):
        od.generate(model, ids, max_new_tokens=4, strategy="compiled")
