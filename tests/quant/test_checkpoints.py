"""AWQ and GPTQ int4 checkpoints read by load_model (quant/checkpoints.py, models/prequantized.py), against the
formats' published packing and dequantization written independently in support/int4_checkpoints.py: the loaded
weights equal the published dequantization bit for bit; every preset gives Hugging Face generate()'s greedy tokens
on a float32 model holding those same weights; GPTQ act-order; every variant not read refused up front."""

from __future__ import annotations

import json
import os

import pytest
import torch

import overlapdecode as od
from overlapdecode.quant import Int4Linear, dequantize
from overlapdecode.quant.checkpoints import AWQ_ORDER, unpack_columns, unpack_rows
from overlapdecode.quant.model import MARKER
from support.helpers import make_batch
from support.int4_checkpoints import (
    pack_awq,
    pack_gptq_weight,
    pack_gptq_zeros,
    published_dequantize,
    quant_config,
    random_numbers,
    saved_tensors,
    write_checkpoint,
)

# (id, write_checkpoint keywords): both formats, both families, groups that divide K and 48, which does not (GPTQ:
# a short last group), symmetric and asymmetric, v1 and v2 zeros, a quantized head, shards, act-order
CASES = {
    "awq-llama-g32": dict(family="llama", method="awq", group_size=32),
    "awq-qwen2-g16-shards": dict(family="qwen2", method="awq", group_size=16, shards=2),
    "gptq-llama-g32-v1": dict(family="llama", method="gptq", group_size=32),
    "gptq-qwen2-g48-v1-sym": dict(family="qwen2", method="gptq", group_size=48, sym=True),
    "gptq-llama-g16-v2-head": dict(family="llama", method="gptq", group_size=16, v1=False, head=True),
    "gptq-qwen2-perrow-v2-head": dict(family="qwen2", method="gptq", group_size=-1, v1=False, head=True),
    "gptq-llama-g32-actorder": dict(family="llama", method="gptq", group_size=32, act_order=True),
    "gptq-qwen2-g48-actorder-v2": dict(family="qwen2", method="gptq", group_size=48, act_order=True, v1=False),
}
EAGER_PRESETS = ("baseline", "kv", "static", "fused")  # fused: its kernels' torch twins on CPU
COMPILED_PRESETS = ("compiled", "interleaved", "deferred", "nocheck")


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    reference, layers = write_checkpoint(path, **CASES[request.param])
    return request.param, str(path), reference, layers


# --- the packing, by hand -----------------------------------------------------------------------------------


def test_unpacking_follows_each_formats_published_order():
    """One word of nibbles 1..8 (nibble i = i + 1): AWQ's holds columns 0, 2, 4, 6, 1, 3, 5, 7 in its nibbles 0-7,
    so column c reads nibble AWQ's [0, 4, 1, 5, 2, 6, 3, 7][c]; GPTQ's holds rows (qweight) or columns (qzeros) in
    order. 0x87654321 as an int32 is negative: the top nibble survives the sign."""
    word = torch.tensor([[0x87654321 - 2**32]], dtype=torch.int32)
    assert unpack_columns(word, AWQ_ORDER).tolist() == [[1, 5, 2, 6, 3, 7, 4, 8]]
    assert unpack_columns(word, range(8)).tolist() == [[1, 2, 3, 4, 5, 6, 7, 8]]
    assert unpack_rows(word).flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert AWQ_ORDER == (0, 2, 4, 6, 1, 3, 5, 7)
    # the reference packers agree with the same words
    assert torch.equal(pack_awq(torch.tensor([[1, 5, 2, 6, 3, 7, 4, 8]])), word)
    assert torch.equal(pack_gptq_weight(torch.arange(1, 9)[:, None]), word)
    assert torch.equal(pack_gptq_zeros(torch.arange(2, 10)[None, :], v1=True), word)  # v1 stores z - 1


@pytest.mark.parametrize("method", ["awq", "gptq"])
@pytest.mark.parametrize("v1", [True, False])
def test_the_reference_packers_and_dequantizations_agree_with_the_formula(method, v1):
    """support/'s packers then its published dequantizations give (q - z) * s computed from the codes directly (the
    reference is itself checked before the loader is checked against it)."""
    gen = torch.Generator().manual_seed(3)
    codes, zeros, scales, g_idx = random_numbers(64, 24, 16, sym=False, v1=v1, act_order=method == "gptq", gen=gen)
    tensors = dict(
        qweight=pack_awq(codes) if method == "awq" else pack_gptq_weight(codes),
        qzeros=pack_awq(zeros) if method == "awq" else pack_gptq_zeros(zeros, v1),
        scales=scales,
        g_idx=g_idx,
    )
    got = published_dequantize(method, tensors, 16, v1 and method == "gptq", torch.float32)
    g = g_idx.long()
    want = ((codes - zeros[g]) * scales.float()[g]).t()
    assert torch.equal(got, want)


def test_a_v1_zero_nibble_of_15_reads_as_16_as_autogptqs_dequantization_does():
    """The v1 packer cannot store z = 0 (it stores -1, which sets every higher bit of its word); GPTQ's torch
    dequantization then reads nibble + 1 = 16 in each such nibble, and so does the loader."""
    from overlapdecode.quant.checkpoints import CheckpointFormat, repack

    zeros = torch.tensor([[0] + [3] * 7])  # column 0's z = 0: its word's every nibble reads 15
    tensors = dict(qweight=pack_gptq_weight(torch.full((8, 8), 5)), qzeros=pack_gptq_zeros(zeros, v1=True))
    tensors.update(scales=torch.ones(1, 8, dtype=torch.float16), g_idx=torch.zeros(8, dtype=torch.int32))
    packed, order = repack(CheckpointFormat("gptq", 8, zeros_minus_one=True), tensors, "x", 8, 8, torch.float32)
    assert order is None and packed.zeros[:, 0].tolist() == [16.0] * 8
    ref = published_dequantize("gptq", tensors, 8, True, torch.float32)
    assert torch.equal(dequantize(packed), ref) and (ref == -11).all()


# --- the loaded weights -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_loaded_weights_are_the_published_dequantization_bit_for_bit(checkpoint, dtype):
    name, path, _, layers = checkpoint
    case = CASES[name]
    model = od.load_model(path, dtype=dtype, device="cpu")
    assert getattr(model.config, "quantization_config", None) is None
    found = {n for n, m in model.named_modules() if isinstance(m, Int4Linear)}
    assert found == set(layers)
    for layer_name, tensors in layers.items():
        layer = model.get_submodule(layer_name)
        K = layer.in_features
        group = K if case["group_size"] == -1 else case["group_size"]
        v1 = case["method"] == "gptq" and case.get("v1", True)
        ref = published_dequantize(case["method"], tensors, group, v1, dtype)
        got = layer.dequantized()
        assert got.dtype == dtype and torch.equal(got, ref), layer_name
        assert layer.group_size == group and layer.weight.dtype == torch.uint8 and layer.scales.dtype == dtype
        assert (layer.act_order is not None) == case.get("act_order", False), layer_name
        if layer.act_order is None:  # the project's own layout, read as any int4 layer's
            assert torch.equal(dequantize(layer.packed()), ref), layer_name
    saved = saved_tensors(path)
    for key, param in model.named_parameters():
        plain = key.rpartition(".")[0] not in layers or key.endswith(".bias")
        if key in saved and plain:  # embeddings, norms, biases, an unquantized head: the saved values in the dtype
            assert torch.equal(param, saved[key].to(dtype)), key
    assert not any(p.is_meta for p in model.parameters())
    tied = (
        model.lm_head.weight is model.model.embed_tokens.weight if not isinstance(model.lm_head, Int4Linear) else None
    )
    assert tied == (None if case.get("head") else case["family"] == "qwen2")


def test_act_order_layers_hold_the_groups_consecutively_and_their_order_back(tmp_path):
    """The packed rows hold the input features sorted by group (each group's `group_size` features side by side, as
    packed.py's layout needs), and act_order puts the dequantized columns back in input order."""
    _, layers = write_checkpoint(tmp_path, method="gptq", group_size=32, act_order=True)
    model = od.load_model(str(tmp_path), device="cpu")
    layer = model.model.layers[0].mlp.down_proj  # K = 128: four groups
    g_idx = layers["model.layers.0.mlp.down_proj"]["g_idx"].long()
    assert not torch.equal(g_idx, torch.arange(128) // 32)
    order = torch.argsort(g_idx, stable=True)
    assert torch.equal(layer.act_order, torch.argsort(order))
    sorted_weight = dequantize(layer.packed())
    ref = published_dequantize("gptq", layers["model.layers.0.mlp.down_proj"], 32, True, torch.float32)
    assert torch.equal(sorted_weight, ref[:, order])
    assert torch.equal(layer.dequantized(), ref)
    x = torch.randn(3, 128)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, ref.contiguous()))  # the same layout: the same sums


# --- every preset gives Hugging Face's tokens on the same weights -------------------------------------------


def _hf_tokens(reference, ids, mask, n=12):
    return reference.generate(
        ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=[], pad_token_id=0
    )


def test_every_eager_preset_gives_hugging_faces_tokens(checkpoint):
    name, path, reference, _ = checkpoint
    model = od.load_model(path, device="cpu")
    ids, mask = make_batch(3, seed=5)
    ref = _hf_tokens(reference, ids, mask)
    assert len(set(ref[:, ids.shape[1] :].flatten().tolist())) > 6  # tokens that tell weights apart
    for preset in EAGER_PRESETS:
        if preset == "fused" and CASES[name].get("act_order"):
            with pytest.raises(ValueError, match="strategy 'fused': .* GPTQ act-order .* use strategy 'static'"):
                od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=preset, eos_token_id=[])
            continue
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=preset, eos_token_id=[])
        assert torch.equal(out, ref), (name, preset)


@pytest.mark.parametrize("case", ["awq-qwen2-g16-shards", "gptq-llama-g32-actorder"])
def test_the_compiled_presets_give_hugging_faces_tokens(case, tmp_path):
    """The dequantization (and act-order's column gather) compiled with the step."""
    reference, _ = write_checkpoint(tmp_path, **CASES[case])
    model = od.load_model(str(tmp_path), device="cpu")
    ids, mask = make_batch(3, seed=5)
    ref = _hf_tokens(reference, ids, mask)
    for preset in COMPILED_PRESETS:
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=preset, eos_token_id=[])
        assert torch.equal(out, ref), (case, preset)


def test_the_gpu_greedy_check_accepts_a_float16_divergence_only_within_the_logits_own_error(tmp_path, monkeypatch):
    """tests/gpu's greedy check in a 16-bit model, here on CPU: the compiled preset on a float16 GPTQ act-order model
    parts from Hugging Face at a gap (2.4e-4) inside float16's own error against float32, and passes with no other
    near-tie rule; a token changed where Hugging Face's choice is clearest fails it."""
    from support import greedy_checks

    write_checkpoint(tmp_path, method="gptq", group_size=32, act_order=True)
    model = od.load_model(str(tmp_path), dtype="float16", device="cpu")
    ids, mask = make_batch(4, 0, 16, low=0, high=model.config.vocab_size - 1, device="cpu")
    monkeypatch.setattr(greedy_checks, "near_ties", lambda scores: [])  # only the float32 reference's rule

    def compiled(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="compiled", eos_token_id=[])

    hf = greedy_checks.assert_hf_greedy_tokens(model, ids, mask, compiled, "compiled float16", n=64)
    P = ids.shape[1]
    assert not torch.equal(compiled(64), hf.sequences)  # it does part: the rule was needed
    top2 = torch.stack(hf.logits, 1).float().topk(2, dim=-1).values
    clear = int((top2[..., 0] - top2[..., 1]).amin(0).argmax())  # the step whose choice is clearest in every row
    wrong = hf.sequences.clone()
    wrong[0, P + clear] = (wrong[0, P + clear] + 1) % model.config.vocab_size
    monkeypatch.setattr(greedy_checks, "hf_greedy", lambda *a: hf)
    with pytest.raises(AssertionError, match=f"diverged at step {clear} with no near tie before"):
        greedy_checks.assert_hf_greedy_tokens(model, ids, mask, lambda n: wrong, "a wrong token", n=64)


# --- a quantized model saved, then loaded -----------------------------------------------------------------


def _same_model(a, b) -> None:
    """The same layers, the same numbers (and dtypes) in each, the same config marker."""
    assert [type(m).__name__ for m in a.modules()] == [type(m).__name__ for m in b.modules()]
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sa[k].dtype == sb[k].dtype and torch.equal(sa[k], sb[k]), k
    assert getattr(a.config, MARKER) == getattr(b.config, MARKER)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2"])
@pytest.mark.parametrize("scheme,group_size", [("int4", 24), ("int8", 128), ("fp8", 128)])
def test_a_quantized_model_saved_loads_back_as_it_was(name, scheme, group_size, tmp_path):
    """save_pretrained of an od.quantize'd model writes its packed numbers and config.json's marker; load_model
    reads them back quantized (Hugging Face's from_pretrained would not: the shapes are the packed ones), the same
    numbers, so the same tokens; loaded in another dtype, the scales and zeros take it."""
    model = od.quantize(od.load_model(name, device="cpu"), scheme, group_size)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[MARKER]["scheme"] == scheme
    back = od.load_model(str(tmp_path), device="cpu")
    _same_model(model, back)
    ids, mask = make_batch(2, seed=3)
    run = lambda m: od.generate(m, ids, attention_mask=mask, max_new_tokens=8, strategy="static", eos_token_id=[])  # noqa: E731
    assert torch.equal(run(back), run(model))
    half = od.load_model(str(tmp_path), device="cpu", dtype="bfloat16")
    assert half.lm_head.scales.dtype == torch.bfloat16 and half.lm_head.weight.dtype == model.lm_head.weight.dtype


def test_an_awq_or_gptq_model_loaded_then_saved_loads_back_as_it_was(checkpoint, tmp_path):
    """An AWQ/GPTQ checkpoint, once loaded, saves as overlapdecode's own format (act-order's column order with it)."""
    _, path, _, _ = checkpoint
    model = od.load_model(path, device="cpu")
    model.save_pretrained(tmp_path)
    _same_model(model, od.load_model(str(tmp_path), device="cpu"))


def test_a_saved_quantized_model_refuses_what_does_not_fit_it(tmp_path):
    model = od.quantize(od.load_model("tiny-llama", device="cpu"), "int4", 16)
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"quantize: .* is quantized already \(overlapdecode int4\)"):
        od.load_model(str(tmp_path), device="cpu", quantize="int8")
    config = json.loads((tmp_path / "config.json").read_text())
    config[MARKER]["group_size"] = 32  # the files hold groups of 16: twice the scales this config says
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"\.scales: shape \(\d+, 4\) in the files, \(\d+, 2\) for int4"):
        od.load_model(str(tmp_path), device="cpu")
    for marker in ({"scheme": "int3"}, "int4"):
        config[MARKER] = marker
        (tmp_path / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match=f"config.json's {MARKER} is not one load_model reads"):
            od.load_model(str(tmp_path), device="cpu")


def test_model_facts_say_fused_does_not_serve_act_order(tmp_path):
    write_checkpoint(tmp_path / "ordered", method="gptq", act_order=True)
    write_checkpoint(tmp_path / "plain", method="gptq")
    assert od.model_facts(str(tmp_path / "plain")).fused == od.model_facts("tiny-llama").fused
    if od.model_facts("tiny-llama").fused:  # Triton installed
        assert not od.model_facts(str(tmp_path / "ordered")).fused  # from the config: desc_act
        assert not od.model_facts(od.load_model(str(tmp_path / "ordered"), device="cpu")).fused  # from its layers
        assert od.model_facts(od.load_model(str(tmp_path / "plain"), device="cpu")).fused


# --- what is refused, and when ----------------------------------------------------------------------------


def _config_only(path, method="gptq", **changes):
    """A checkpoint directory whose quantization_config is changed by `changes` and whose weights are gone: a refusal
    from the config names what it found; a config accepted by mistake would fail later, on the missing files."""
    write_checkpoint(path, method=method)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"].update(changes)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    os.remove(os.path.join(path, "model.safetensors"))
    return str(path)


@pytest.mark.parametrize(
    "method,changes,words",
    [
        ("gptq", dict(bits=8), "only 4-bit checkpoints are read"),
        ("awq", dict(bits=3), "bits=3"),
        ("awq", dict(version="gemv"), "AWQ version 'gemv'; only AWQ's GEMM layout"),
        ("awq", dict(version="GEMV_FAST"), "AWQ version 'gemv_fast'"),
        ("awq", dict(version=None, format="marlin"), "AWQ version 'marlin'"),
        ("awq", dict(backend="llm-awq"), "backend 'llm-awq'"),
        ("awq", dict(zero_point=False), "zero_point=False"),
        ("gptq", dict(checkpoint_format="marlin"), "checkpoint_format 'marlin'"),
        ("gptq", dict(checkpoint_format=None, format="bitblas"), "checkpoint_format 'bitblas'"),
        ("gptq", dict(is_marlin_format=True), "Marlin's layout"),
        ("gptq", dict(pack_dtype="int16"), "pack_dtype 'int16'"),
        ("gptq", dict(dynamic={"-:.*down": {}}), "'dynamic' per-module overrides"),
        ("gptq", dict(group_size=0), "group_size must be a positive int or -1, got 0"),
        ("gptq", dict(quant_method="bitsandbytes"), "quant_method 'bitsandbytes' is not read"),
        ("gptq", dict(quant_method="fp8"), "quant_method 'fp8' is not read"),
    ],
)
def test_variants_not_read_are_refused_from_the_config_naming_what_was_found(tmp_path, method, changes, words):
    path = _config_only(tmp_path, method, **changes)
    with pytest.raises(ValueError, match="quantization_config: .*" + _escaped(words)):
        od.load_model(path, device="cpu")


def _escaped(words: str) -> str:
    import re

    return re.escape(words)


def test_a_config_accepted_reaches_the_files(tmp_path):
    """The other side of the refusals above: a config that is read goes on to the (missing) weights."""
    with pytest.raises(ValueError, match="read from safetensors files"):
        od.load_model(_config_only(tmp_path), device="cpu")


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(quantize="int4"), "quantize: .* is quantized already \\(GPTQ v1 int4, group_size 32\\); load it without"),
        (dict(tp=2), "tp: .* tensor-parallel shards of it are not made yet"),
    ],
)
def test_quantize_and_tp_are_refused_for_a_quantized_checkpoint(tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        od.load_model(_config_only(tmp_path), device="cpu", **kwargs)


def test_a_hub_name_is_refused_naming_the_download():
    """A hub name's config may sit in the local cache; its quantized weights are read from a directory only."""
    from types import SimpleNamespace

    from overlapdecode.models.loading import _check_prequantized
    from overlapdecode.quant.checkpoints import CheckpointFormat

    config = SimpleNamespace(model_type="llama")
    with pytest.raises(ValueError, match="read from a local directory; download it first .*org/model-AWQ --local-dir"):
        _check_prequantized("org/model-AWQ", CheckpointFormat("awq", 128), config, None, 1)


def test_a_mixture_of_experts_checkpoint_is_refused(tmp_path):
    path = _config_only(tmp_path)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config.update(model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=4)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    with pytest.raises(ValueError, match="GPTQ v1 int4.* mixture of experts; quantized experts are not read"):
        od.load_model(path, device="cpu")


def _rewrite(path, change) -> None:
    """Apply `change` to the saved tensors of `path` (one file)."""
    from safetensors.torch import save_file

    tensors = saved_tensors(path)
    change(tensors)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def _ragged_g_idx(t):
    g = t["model.layers.1.mlp.up_proj.g_idx"]
    g[0] = 1  # group 0 loses a feature, group 1 gains one
    t["model.layers.1.mlp.up_proj.g_idx"] = g


@pytest.mark.parametrize(
    "change,words",
    [
        (_ragged_g_idx, "model.layers.1.mlp.up_proj.g_idx: its groups must hold 32 input features each"),
        (
            lambda t: t.update({"model.layers.0.self_attn.o_proj.qweight": torch.zeros(4, 64, dtype=torch.int32)}),
            r"model.layers.0.self_attn.o_proj.qweight: shape \(4, 64\) does not fit the layer \(expected \(8, 64\)\)",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.gate_proj.scales": torch.ones(2, 128, dtype=torch.int32)}),
            "gate_proj.scales: dtype torch.int32; floating-point scales expected",
        ),
        (lambda t: t.pop("model.layers.0.self_attn.q_proj.qzeros"), "lacks model.layers.0.self_attn.q_proj.qzeros"),
        (lambda t: t.pop("model.norm.weight"), "the checkpoint lacks model.norm.weight"),
        (lambda t: t.update({"model.extra.scales": torch.ones(2)}), "has no place for: model.extra.scales"),
        (
            lambda t: t.update({"model.layers.0.input_layernorm.qweight": torch.zeros(8, 8, dtype=torch.int32)}),
            "model.layers.0.input_layernorm is a LlamaRMSNorm, not a linear layer",
        ),
        (lambda t: t.update({"model.layers.0.mlp.up_proj.bias": torch.ones(128)}), "up_proj.bias: the model's"),
        (lambda t: t.update({"model.embed_tokens.weight": torch.ones(10, 64)}), r"shape \(10, 64\) in the checkpoint"),
    ],
)
def test_tensors_that_do_not_fit_are_named(tmp_path, change, words):
    write_checkpoint(tmp_path, method="gptq", group_size=32, act_order=True)
    _rewrite(str(tmp_path), change)
    with pytest.raises(ValueError, match=words):
        od.load_model(str(tmp_path), device="cpu")


def test_tensors_the_model_computes_itself_are_skipped(tmp_path):
    """Older checkpoints hold each layer's RoPE frequencies; the model's own stay (as Hugging Face's loading does)."""
    reference, _ = write_checkpoint(tmp_path, method="awq")
    stale = {"model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8), "model.rotary_emb.inv_freq": torch.ones(8)}
    _rewrite(str(tmp_path), lambda t: t.update(stale))
    model = od.load_model(str(tmp_path), device="cpu")
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_a_checkpoint_without_quantized_layers_is_refused(tmp_path):
    write_checkpoint(tmp_path, method="awq")
    _rewrite(str(tmp_path), lambda t: [t.pop(k) for k in list(t) if k.endswith((".qweight", ".qzeros", ".scales"))])
    with pytest.raises(ValueError, match="its files hold no quantized layer"):
        od.load_model(str(tmp_path), device="cpu")


def test_quant_config_helper_is_what_the_loader_reads():
    """The support's configs are the formats' own keys (AutoAWQ's and GPTQ's), read as such."""
    from types import SimpleNamespace

    from overlapdecode.quant.checkpoints import read_format

    assert (
        str(read_format(SimpleNamespace(quantization_config=quant_config("awq", 64)))) == "AWQ GEMM int4, group_size 64"
    )
    v2 = quant_config("gptq", 128, v1=False)
    assert str(read_format(SimpleNamespace(quantization_config=v2))) == "GPTQ v2 int4, group_size 128"
    assert read_format(SimpleNamespace()) is None


def test_the_command_line_refuses_quantize_for_a_quantized_checkpoint_in_one_line(tmp_path, capsys):
    from overlapdecode.cli import main

    path = _config_only(tmp_path)
    assert main(["generate", "--model", path, "--quantize", "int4", "--prompt-ids", "1,2", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--quantize" in err and "quantized already" in err, err
