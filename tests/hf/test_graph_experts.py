"""graph_experts.py: a compiled call on CUDA runs a MoE model's experts as "batched_mm" where the model's own
implementation would copy to the host inside the captured step, and puts the model's choice back after. On CPU:
which calls switch, the restore (on an exception too), and that "batched_mm" gives Hugging Face generate()'s
tokens under the compiled presets (tests/gpu/test_gpu_experts.py runs the switch itself under CUDA graphs)."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
import overlapdecode.decode as decode_mod
from overlapdecode.hf.graph_experts import GRAPH_SAFE, graph_safe_experts, needs_graph_safe
from support.helpers import hf_generate, make_batch
from support.tiny_archs import VOCAB, tiny_model

MOE = ["qwen3_moe", "mixtral", "gpt_oss"]


def _model(name: str, dtype=torch.float32):
    model, why = tiny_model(name)
    assert model is not None, why
    return model.to(dtype)


def _experts_seen(model) -> set:
    return {m.config._experts_implementation for m in model.modules() if hasattr(type(m), "_apply_gate")}


@pytest.mark.parametrize("name", MOE)
def test_which_calls_switch(name):
    model = _model(name)
    assert model.get_experts_implementation()[""] == "grouped_mm"
    assert needs_graph_safe(model, True, "cuda")  # grouped_mm in float32 under compile: offs.tolist()
    assert not needs_graph_safe(model, False, "cuda")  # eager steps may copy to the host
    assert not needs_graph_safe(model, True, "cpu")  # no CUDA graph
    model.set_experts_implementation("eager")  # nonzero() over the experts hit
    assert needs_graph_safe(model, True, "cuda")
    model.set_experts_implementation("grouped_mm")
    model.to(torch.bfloat16)  # torch's grouped_mm itself, capturable
    assert not needs_graph_safe(model, True, "cuda")


def test_a_dense_model_never_switches():
    model = _model("llama")
    assert not needs_graph_safe(model, True, "cuda")


def test_the_models_choice_comes_back_after_the_call_and_after_an_exception():
    model = _model("mixtral")
    with graph_safe_experts(model, True, "cuda"):
        assert model.get_experts_implementation()[""] == GRAPH_SAFE and _experts_seen(model) == {GRAPH_SAFE}
    assert model.get_experts_implementation()[""] == "grouped_mm" and _experts_seen(model) == {"grouped_mm"}
    with pytest.raises(RuntimeError, match="inside"):
        with graph_safe_experts(model, True, "cuda"):
            raise RuntimeError("inside")
    assert _experts_seen(model) == {"grouped_mm"}


@pytest.mark.parametrize("name", MOE)
def test_batched_mm_experts_give_hf_tokens_under_the_compiled_presets(name):
    model = _model(name)
    ids, mask = make_batch(3, seed=5, prompt_len=8, high=VOCAB)
    ref = hf_generate(model, ids, mask, 12, [], 0)  # Hugging Face with the model's own grouped_mm
    with graph_safe_experts(model, True, "cuda"):  # as a compiled CUDA call runs them
        for strategy in ("compiled", "interleaved"):
            out = od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=strategy, eos_token_id=[])
            assert torch.equal(out, ref), strategy


def test_generate_asks_for_the_switch_on_compiled_hf_steps_only(monkeypatch):
    seen = []
    real = decode_mod.graph_safe_experts

    def spy(model, compile_, device_type):
        seen.append((compile_, device_type))
        return real(model, compile_, device_type)

    monkeypatch.setattr(decode_mod, "graph_safe_experts", spy)
    model = _model("qwen3_moe")
    ids, mask = make_batch(2, seed=1, prompt_len=6, high=VOCAB)
    for strategy in ("kv", "static", "compiled"):
        od.generate(model, ids, attention_mask=mask, max_new_tokens=3, strategy=strategy, eos_token_id=[])
    assert seen == [(False, "cpu"), (False, "cpu"), (True, "cpu")]
