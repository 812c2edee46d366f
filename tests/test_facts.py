"""facts.py: what the bench asks of a model beyond generating with it, from a loaded model, its config or its name."""

from __future__ import annotations

import dataclasses
import importlib.util

import transformers

import overlapdecode as od
from overlapdecode.facts import weight_bytes


def test_a_loaded_model_its_config_and_its_name_give_the_same_facts():
    model = od.load_model("tiny-llama", device="cpu")
    loaded = od.model_facts(model)
    assert loaded == od.ModelFacts("llama", 2, 256, loaded.fused, weight_bytes(model))
    from_config = od.model_facts(model.config)
    assert from_config.weight_bytes is None  # a config has no weights
    assert dataclasses.replace(loaded, weight_bytes=None) == from_config == od.model_facts("tiny-llama")


def test_fused_is_told_from_the_family_and_the_llama_familys_sliding_layers():
    triton = importlib.util.find_spec("triton") is not None  # the fused path needs it
    assert od.model_facts("gpt2-random").fused == triton and od.model_facts("gemma3-1b-random").fused == triton
    cfg = transformers.BertConfig(is_decoder=True)
    assert not od.model_facts(cfg).fused  # no fused family
    sliding = transformers.LlamaConfig(layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2)
    assert not od.model_facts(sliding).fused
    windowed = [
        transformers.MistralConfig(sliding_window=8),
        transformers.Qwen2Config(use_sliding_window=True, max_window_layers=0),
    ]
    assert [od.model_facts(cfg).fused for cfg in windowed] == [triton, triton]  # windows the step takes
    assert od.model_facts(transformers.LlamaConfig(num_hidden_layers=2)).fused == od.model_facts("gpt2-random").fused


def test_positions_and_layers_of_gpt2_and_a_model_without_a_position_table():
    gpt2 = od.model_facts("gpt2-random")
    assert (gpt2.model_type, gpt2.layers, gpt2.positions) == ("gpt2", 12, 1024)
    assert od.model_facts(transformers.XLNetConfig()).positions is None  # XLNet says -1
