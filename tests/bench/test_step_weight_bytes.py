"""facts.py step_weight_bytes: the weight bytes a decode step of B rows reads, the floor of MBU and the toll.

A mixture of experts' step reads at most min(E, B x k) of a layer's E experts, and an embedding table no other
parameter shares (untied) at most B of its rows; everything else is read whole. The expected figures are computed
here from each config's sizes (the bytes of one expert times the experts a step cannot reach, per MoE layer; the
untied tables' widths), not with the function's own search for the experts or the tables.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import (
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    GptOssConfig,
    GptOssForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PretrainedConfig,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

import overlapdecode as od
from overlapdecode.facts import step_weight_bytes, weight_bytes

E, K = 8, 2  # experts per MoE layer, experts per token
H, HEADS, KV_HEADS, HEAD_DIM, VOCAB, LAYERS = 32, 4, 2, 8, 128, 3
ATTENTION = dict(
    hidden_size=H,
    num_attention_heads=HEADS,
    num_key_value_heads=KV_HEADS,
    head_dim=HEAD_DIM,
    vocab_size=VOCAB,
    num_hidden_layers=LAYERS,
    max_position_embeddings=64,
)
F32 = 4  # bytes: the models are built in float32


def _build(model_cls, config):
    torch.manual_seed(0)
    return model_cls(config).eval()


def _param_bytes(model) -> int:
    """Every parameter's bytes, a tied one once (parameters() yields a shared tensor once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _unread_tables(config, rows: int) -> int:
    """The bytes of the untied embedding tables' rows a step of `rows` rows cannot gather: the token table (VOCAB x
    H) unless tied to the head, Gemma 4's per-layer table (VOCAB x layers x its per-layer width)."""
    width = 0 if config.tie_word_embeddings else H
    width += LAYERS * (getattr(config, "hidden_size_per_layer_input", 0) or 0)
    return (VOCAB - min(VOCAB, rows)) * width * F32


def _expected(model, rows: int, moe_layers: int, expert_elements: int) -> int:
    """All parameters' bytes less, in each MoE layer, one expert's bytes for every expert a step of `rows` rows
    cannot reach, and less the untied tables' rows it cannot gather."""
    unreached = E - min(E, rows * K)
    unread = _unread_tables(model.config, rows)
    return _param_bytes(model) - moe_layers * unreached * expert_elements * F32 - unread


def _check_moe(model, moe_layers: int, expert_elements: int) -> None:
    total = _param_bytes(model)
    assert weight_bytes(model) == total
    all_experts = moe_layers * E * expert_elements * F32
    # one row reads exactly k of the E experts and one row of each untied table, every other parameter whole
    # (routers and dense layers included)
    assert step_weight_bytes(model, 1) == total - all_experts + all_experts * K // E - _unread_tables(model.config, 1)
    for rows in (1, 2, 3):  # 2, 4, 6 of 8 experts
        assert step_weight_bytes(model, rows) == _expected(model, rows, moe_layers, expert_elements)
    for rows in (E // K, 64):  # every expert reachable: the whole model but the tables' rows not gathered
        assert step_weight_bytes(model, rows) == total - _unread_tables(model.config, rows)
    assert step_weight_bytes(model, VOCAB) == total  # every row of every table reachable


def test_a_dense_model_reads_its_weights_but_the_untied_tables_rows_it_does_not_gather():
    """Llama untied: the token table (VOCAB x H) is gathered a row per step row; the head and every layer whole."""
    model = _build(LlamaForCausalLM, LlamaConfig(intermediate_size=64, **ATTENTION))
    assert not model.config.tie_word_embeddings
    assert weight_bytes(model) == _param_bytes(model)
    for rows in (1, 8, 127, 128, 500):
        assert step_weight_bytes(model, rows) == _param_bytes(model) - (VOCAB - min(VOCAB, rows)) * H * F32


def test_tied_embeddings_are_one_tensor():
    dense = _build(LlamaForCausalLM, LlamaConfig(intermediate_size=64, tie_word_embeddings=True, **ATTENTION))
    assert dense.get_output_embeddings().weight is dense.get_input_embeddings().weight
    assert step_weight_bytes(dense, 1) == _param_bytes(dense)
    untied = _build(LlamaForCausalLM, LlamaConfig(intermediate_size=64, **ATTENTION))
    assert _param_bytes(untied) - _param_bytes(dense) == VOCAB * H * F32  # the head counted once, not twice
    assert step_weight_bytes(untied, 1) - step_weight_bytes(dense, 1) == H * F32  # and one row of its own table
    moe = _build(
        Qwen3MoeForCausalLM,
        Qwen3MoeConfig(
            intermediate_size=64,
            moe_intermediate_size=16,
            num_experts=E,
            num_experts_per_tok=K,
            tie_word_embeddings=True,
            **ATTENTION,
        ),
    )
    assert step_weight_bytes(moe, 1) == _expected(moe, 1, LAYERS, 3 * H * 16)


def test_qwen3_moe_counts_the_experts_a_step_can_reach():
    """Layer 1 is a dense MLP (mlp_only_layers): read whole, as are the routers (E, H), which have the experts'
    leading dimension but are not experts. The fused re-layout changes nothing."""
    config = Qwen3MoeConfig(
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=E,
        num_experts_per_tok=K,
        mlp_only_layers=[1],
        **ATTENTION,
    )
    model = _build(Qwen3MoeForCausalLM, config)
    expert = 3 * H * config.moe_intermediate_size  # gate, up (2I, H) and down (H, I) of one expert
    _check_moe(model, LAYERS - 1, expert)
    before = [step_weight_bytes(model, rows) for rows in (1, 2, 4)]
    od.Decoder(model).fused_model()  # the dense weights become views of fused tensors
    assert [step_weight_bytes(model, rows) for rows in (1, 2, 4)] == before


def test_mixtral_counts_the_experts_a_step_can_reach():
    config = MixtralConfig(intermediate_size=24, num_local_experts=E, num_experts_per_tok=K, **ATTENTION)
    model = _build(MixtralForCausalLM, config)
    _check_moe(model, LAYERS, 3 * H * config.intermediate_size)


def test_gpt_oss_counts_its_experts_biases_with_them():
    """gpt-oss's experts have (E, 2I) and (E, H) biases, read with their experts; its router (E, H) and its
    bias (E,) are read whole."""
    config = GptOssConfig(
        intermediate_size=24,
        num_local_experts=E,
        num_experts_per_tok=K,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=8,
        **ATTENTION,
    )
    model = _build(GptOssForCausalLM, config)
    inter = config.intermediate_size
    _check_moe(model, LAYERS, H * 2 * inter + 2 * inter + inter * H + H)


def test_gemma4_names_its_experts_per_token_top_k_experts():
    """Gemma 4's MoE block runs beside a dense MLP in every layer, its router's scales ((E,) and (H,)) read whole;
    its config names k `top_k_experts`."""
    config = Gemma4TextConfig(
        intermediate_size=64,
        enable_moe_block=True,
        num_experts=E,
        top_k_experts=K,
        moe_intermediate_size=16,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=VOCAB,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        sliding_window=8,
        **ATTENTION,
    )
    assert getattr(config, "num_experts_per_tok", None) is None
    model = _build(Gemma4ForCausalLM, config)
    _check_moe(model, LAYERS, 3 * H * config.moe_intermediate_size)


def test_shared_experts_are_read_whole():
    """GLM-4-MoE's shared experts (an MLP every token runs, named `shared_experts`) are sized here so that their
    weights' leading dimension equals E: still read whole. Layer 0 is dense (first_k_dense_replace)."""
    config = Glm4MoeConfig(
        intermediate_size=64,
        moe_intermediate_size=E,  # the shared experts' gate and up (n_shared x I, H): leading dimension E
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_shared_experts=1,
        first_k_dense_replace=1,
        n_group=1,
        topk_group=1,
        **ATTENTION,
    )
    model = _build(Glm4MoeForCausalLM, config)
    assert model.model.layers[1].mlp.shared_experts.gate_proj.weight.shape[0] == E
    _check_moe(model, LAYERS - 1, 3 * H * config.moe_intermediate_size)


class _Experts(torch.nn.Module):
    """Stacked experts with, inside the same module, a router (E, H) and a bias of H = E (JetMoE keeps both
    there): only the stacked weight is an expert tensor."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(E, 5, E))
        self.bias = torch.nn.Parameter(torch.zeros(E))
        self.router = torch.nn.Module()
        self.router.layer = torch.nn.Linear(E, E, bias=False)


class _Toy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.config = PretrainedConfig(num_local_experts=E, num_experts_per_tok=K)
        self.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.layers[0].experts = _Experts()
        self.head = torch.nn.Linear(E, E, bias=False)  # leading dimension E, outside the experts: whole


def test_a_router_or_a_vector_inside_the_experts_module_is_read_whole():
    toy = _Toy()
    assert step_weight_bytes(toy, 1) == _param_bytes(toy) - (E - K) * 5 * E * F32
    assert step_weight_bytes(toy, 4) == _param_bytes(toy)
    with pytest.raises(ValueError, match="rows"):
        step_weight_bytes(toy, 0)


def test_a_bench_row_records_the_bytes_of_a_step_at_its_batch(tmp_path, monkeypatch):
    from overlapdecode.bench import worker
    from overlapdecode.bench.config import BenchConfig

    monkeypatch.setattr(worker, "step_weight_bytes", lambda model, rows: 1000 * rows)
    cfg = BenchConfig(
        strategies=("kv",), peers=(), lengths=(3,), batches=(1, 3), prompt_len=4, warmup=0, repeats=1, device="cpu"
    )
    out = tmp_path / "rows.jsonl"
    worker.run_worker(cfg, str(out))
    rows = [r for r in map(json.loads, out.read_text().splitlines()) if "strategy" in r]
    assert sorted(r["batch"] for r in rows if "seq_s" in r) == [1, 3]
    assert all(r["weight_bytes"] == 1000 * r["batch"] for r in rows)


def test_a_scale_sweep_point_records_the_bytes_of_a_step_at_its_rows(tmp_path, monkeypatch):
    from overlapdecode import facts

    monkeypatch.setattr(facts, "step_weight_bytes", lambda model, rows: 1000 * rows)
    path = Path(__file__).parents[2] / "scripts" / "scale_sweep.py"
    spec = importlib.util.spec_from_file_location("scale_sweep", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # imports the patched function
    out = tmp_path / "sweep"
    args = ["--out", str(out), "--model", "tiny-llama", "--dtype", "float32", "--rows", "1,3", "--prompts", "4"]
    args += ["--long-rows", "2", "--long-prompts", "8", "--strategies", "kv", "--new-tokens", "2"]
    args += ["--long-new-tokens", "2", "--repeats", "1", "--no-kernels"]
    assert script.main(args) == 0
    result = json.loads((out / "scale.json").read_text())
    assert [(r["rows"], r["weight_bytes"]) for r in result["rows"]] == [(1, 1000), (3, 3000), (2, 2000)]
    model = od.load_model("tiny-llama", dtype="float32")
    assert result["weight_bytes"] == weight_bytes(model)  # the whole model's, in the table's heading


def test_a_quantized_model_reads_its_codes_and_one_row_of_its_table():
    """od.quantize unties a tied head (the head quantized, the table kept): the table is then gathered a row per
    step row, the packed codes and group numbers read whole."""
    model = _build(LlamaForCausalLM, LlamaConfig(intermediate_size=64, tie_word_embeddings=True, **ATTENTION))
    od.quantize(model, "int4", group_size=16)
    table = model.get_input_embeddings().weight
    assert model.get_output_embeddings().weight.data_ptr() != table.data_ptr()
    assert step_weight_bytes(model, 1) == weight_bytes(model) - (VOCAB - 1) * H * F32
    assert step_weight_bytes(model, VOCAB) == weight_bytes(model)
