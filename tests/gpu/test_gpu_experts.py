"""On a real GPU: mixture-of-experts models under the compiled presets' CUDA graphs (graph_experts.py). In
float32, transformers' grouped_mm experts copy their offsets to the host under compile, which no graph can
hold; the call runs them as batched_mm and gives Hugging Face generate()'s tokens, and the model keeps its own
implementation after the call. In bfloat16 torch's grouped_mm itself runs, and is captured."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from support.helpers import hf_generate, make_batch
from support.tiny_archs import VOCAB, tiny_model

DEV = "cuda"


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_moe_models_match_hf_under_cuda_graphs_in_float32(name):
    model, why = tiny_model(name)
    assert model is not None, why
    model = model.to(DEV)
    # 3 rows: a shape of its own (test_gpu_sliding's gpt-oss case, 4 rows, counts its one compile in this process)
    ids, mask = make_batch(3, seed=11, prompt_len=10, high=VOCAB, device=DEV)
    ref = hf_generate(model, ids, mask, 30, [], 0)
    dec = od.Decoder(model)
    before = od.compile_count()
    for strategy in ("compiled", "interleaved", "compiled"):
        out = dec.generate(ids, attention_mask=mask, max_new_tokens=30, strategy=strategy, eos_token_id=[])
        assert torch.equal(out, ref), strategy
    assert od.compile_count() - before == 1
    assert model.get_experts_implementation()[""] == "grouped_mm"


@pytest.mark.parametrize("name", ["qwen3_moe", "gpt_oss"])
def test_moe_models_run_captured_in_bfloat16(name):
    model, why = tiny_model(name)
    assert model is not None, why
    model = model.to(DEV, torch.bfloat16)
    ids, mask = make_batch(2, seed=3, prompt_len=10, high=VOCAB, device=DEV)
    out = od.generate(model, ids, attention_mask=mask, max_new_tokens=20, strategy="interleaved", eos_token_id=[])
    assert out.shape == (2, 30)
    assert model.get_experts_implementation()[""] == "grouped_mm"
