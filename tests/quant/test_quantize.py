"""Weight-only quantization (overlapdecode.quant): the stored numbers against the formulas, computed here from
scratch group by group; the quantized layers; `od.quantize` and `load_model(quantize=...)` over whole models; every
preset's tokens equal to Hugging Face generate()'s on the same quantized model (CPU, float32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from overlapdecode.quant import Int4Linear, Int8Linear, dequantize
from overlapdecode.quant.schemes import pack_int4, quantize_int4, quantize_int8, unpack_int4

# --- the formulas, from scratch ---------------------------------------------------------------------------------


def reference_int4(w: torch.Tensor, group_size: int):
    """codes (N, K), scales and zeros (N, G) in w's dtype, w' (N, K): one group at a time, float32 scalars; s rounded
    to w's dtype before it is used, as stored."""
    N, K = w.shape
    codes = torch.empty(N, K)
    out = torch.empty(N, K, dtype=w.dtype)
    scales, zeros = [], []
    for n in range(N):
        row_s, row_z = [], []
        for start in range(0, K, group_size):
            g = w[n, start : start + group_size].float()
            s = (g.max() - g.min()) / 15
            s = torch.maximum(s, torch.tensor(torch.finfo(w.dtype).tiny)).to(w.dtype)
            sf = s.float()
            z = torch.clamp(torch.round(-g.min() / sf), 0, 15)
            q = torch.clamp(torch.round(g / sf) + z, 0, 15)
            codes[n, start : start + group_size] = q
            out[n, start : start + group_size] = ((q - z) * sf).to(w.dtype)
            row_s.append(s)
            row_z.append(z.to(w.dtype))
        scales.append(torch.stack(row_s))
        zeros.append(torch.stack(row_z))
    return codes, torch.stack(scales), torch.stack(zeros), out


def reference_int8(w: torch.Tensor):
    """codes (N, K), scales (N, 1) in w's dtype, w' (N, K): one row at a time."""
    codes, scales, out = [], [], []
    for row in w.float():
        s = (row.abs().max() / 127).to(w.dtype)
        q = torch.zeros_like(row) if s == 0 else torch.round(row / s.float())
        codes.append(q)
        scales.append(s)
        out.append((q * s.float()).to(w.dtype))
    return torch.stack(codes), torch.stack(scales)[:, None], torch.stack(out)


def awkward_weight(N: int, K: int, group_size: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Random rows, and rows whose first group is all equal, negative only, positive only, all zero."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * 0.1
    w[1, :group_size] = 0.37
    w[2, :group_size] = -w[2, :group_size].abs() - 0.01
    w[3, :group_size] = w[3, :group_size].abs() + 0.01
    w[4, :group_size] = 0.0
    w[5] = -0.25  # a whole row of one value
    return w.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("K,group_size", [(64, 16), (50, 16), (64, 48), (40, 128), (33, 32)])
def test_int4_numbers_are_the_formulas(K, group_size, dtype):
    w = awkward_weight(7, K, group_size, dtype)
    packed, scales, zeros = quantize_int4(w, group_size)
    codes, ref_s, ref_z, ref_w = reference_int4(w, group_size)
    G = -(-K // group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (7, (K + 1) // 2)
    assert scales.dtype == zeros.dtype == dtype and scales.shape == zeros.shape == (7, G)
    assert torch.equal(unpack_int4(packed, K).float(), codes)
    assert torch.equal(scales, ref_s) and torch.equal(zeros, ref_z)
    got = dequantize_int4_of(packed, scales, zeros, K, group_size)
    assert got.dtype == dtype and torch.isfinite(got).all()
    assert torch.equal(got, ref_w)
    assert (zeros >= 0).all() and (zeros <= 15).all() and (scales > 0).all()


def dequantize_int4_of(packed, scales, zeros, K, group_size):
    from overlapdecode.quant import PackedWeight

    return dequantize(PackedWeight("int4", packed, scales, zeros, K, group_size))


def test_int4_edge_groups_reconstruct_as_the_formulas_say():
    """The awkward groups, by value: an all-zero group is exact, a group of equal weights takes the floor scale
    (no division by zero, no NaN), a group straddling zero is within half a step of its weights."""
    w = awkward_weight(7, 64, 16)
    got = dequantize_int4_of(*quantize_int4(w, 16), 64, 16)
    assert torch.equal(got[4, :16], torch.zeros(16))
    assert torch.isfinite(got).all()
    s = (w[0, :16].max() - w[0, :16].min()) / 15
    assert (got[0, :16] - w[0, :16]).abs().max() <= s / 2 + 1e-7


def test_int4_packs_two_codes_per_byte_along_k():
    """The documented layout: byte j of a row holds code 2j in its low four bits and 2j + 1 in its high four."""
    codes = torch.tensor([[1, 2, 3, 4, 5], [15, 0, 0, 15, 7]])
    packed = pack_int4(codes)
    assert packed.tolist() == [[1 | 2 << 4, 3 | 4 << 4, 5], [15, 15 << 4, 7]]
    assert torch.equal(unpack_int4(packed, 5), codes.to(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_numbers_are_the_formulas(dtype):
    w = awkward_weight(7, 50, 16, dtype)
    w[4] = 0.0  # an all-zero row
    q, scales = quantize_int8(w)
    codes, ref_s, ref_w = reference_int8(w)
    assert q.dtype == torch.int8 and q.shape == w.shape and scales.shape == (7, 1) and scales.dtype == dtype
    assert torch.equal(q.float(), codes) and torch.equal(scales, ref_s)
    assert scales[4].item() == 0 and (q[4] == 0).all()
    from overlapdecode.quant import PackedWeight

    got = dequantize(PackedWeight("int8", q, scales, None, 50, 50))
    assert got.dtype == dtype and torch.equal(got, ref_w)


@pytest.mark.parametrize("scheme", ["int4", "int8"])
@pytest.mark.parametrize("bias", [True, False])
def test_quantized_layers_multiply_by_the_dequantized_weight(scheme, bias):
    torch.manual_seed(1)
    lin = torch.nn.Linear(50, 24, bias=bias)
    layer = Int4Linear(lin.weight, lin.bias, 16) if scheme == "int4" else Int8Linear(lin.weight, lin.bias)
    ref_w = reference_int4(lin.weight.detach(), 16)[3] if scheme == "int4" else reference_int8(lin.weight.detach())[2]
    x = torch.randn(3, 5, 50)
    assert torch.equal(layer(x), F.linear(x, ref_w, lin.bias))
    assert (layer.bias is None) == (not bias)
    if bias:
        assert torch.equal(layer.bias, lin.bias)
    assert layer.weight.shape[0] == 24  # the output size, as nn.Linear's weight has it
    assert all(not p.requires_grad for p in layer.parameters())
    packed = layer.packed()
    assert packed.shape == (24, 50) and torch.equal(dequantize(packed), ref_w)
    # the packed size: half a byte (int4) or a byte (int8) per weight, plus the group numbers and the bias
    nbytes = sum(p.numel() * p.element_size() for p in layer.parameters())
    numbers = 24 * 4 * 4 * 2 if scheme == "int4" else 24 * 4
    assert nbytes == (24 * 25 if scheme == "int4" else 24 * 50) + numbers + (24 * 4 if bias else 0)


# --- od.quantize and load_model(quantize=...) -------------------------------------------------------------------


def linear_weights(model) -> dict:
    """name -> (out, in) weight of every nn.Linear and Conv1D (transposed) of a full-precision model."""
    from transformers.pytorch_utils import Conv1D

    out = {}
    for name, m in model.named_modules():
        if isinstance(m, Conv1D):
            out[name] = (m.weight.detach().t().clone(), m.bias)
        elif isinstance(m, torch.nn.Linear):
            out[name] = (m.weight.detach().clone(), m.bias)
    return out


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
@pytest.mark.parametrize("scheme,group_size", [("int4", 16), ("int4", 48), ("int8", 128)])
def test_quantize_replaces_every_linear_layer_and_the_head(name, scheme, group_size):
    import weakref

    import overlapdecode as od

    model = od.load_model(name, device="cpu")
    embed = model.get_input_embeddings().weight
    embed_before = embed.detach().clone()
    weights = linear_weights(model)
    assert "lm_head" in weights and len(weights) == (9 if name == "tiny-gpt2" else 15)
    tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.Embedding)]  # tokens (GPT-2: positions)
    gone = [weakref.ref(m.weight) for m in model.modules() if hasattr(m, "weight") and m.weight.dim() == 2]
    assert od.quantize(model, scheme, group_size=group_size) is model
    layers = dict(model.named_modules())
    for layer_name, (w, b) in weights.items():
        layer = layers[layer_name]
        assert type(layer) is (Int4Linear if scheme == "int4" else Int8Linear), layer_name
        ref = reference_int4(w, group_size)[3] if scheme == "int4" else reference_int8(w)[2]
        assert torch.equal(dequantize(layer.packed()), ref), layer_name  # GPT-2's Conv1D: from its (out, in) view
        assert (b is None and layer.bias is None) or torch.equal(layer.bias, b)
    # the embedding keeps its full-precision table (GPT-2's head was tied to it: now untied, for good)
    assert model.get_input_embeddings().weight is embed and torch.equal(embed, embed_before)
    assert not model.config.tie_word_embeddings
    model.tie_weights()
    assert isinstance(model.lm_head, (Int4Linear, Int8Linear)) and model.get_input_embeddings().weight is embed
    # no full-precision copy of a quantized matrix is left: each old weight is freed (the embedding's is kept)
    import gc

    gc.collect()
    assert {id(r()) for r in gone if r() is not None} == {id(t) for t in tables}
    numbers = (".scales", ".zeros")  # the group numbers, (N, groups)
    floats = {
        id(p) for n, p in model.named_parameters() if p.is_floating_point() and p.dim() == 2 and not n.endswith(numbers)
    }
    assert floats == {id(t) for t in tables}


def test_quantized_model_is_smaller_by_the_packed_bytes():
    import overlapdecode as od

    def nbytes(model):
        return sum(p.numel() * p.element_size() for p in model.parameters())

    full = od.load_model("tiny-llama", device="cpu")
    weights = linear_weights(full)
    codes = sum(w.numel() for w, _ in weights.values())
    groups = sum(w.shape[0] * -(-w.shape[1] // 16) for w, _ in weights.values())
    int4 = od.quantize(od.load_model("tiny-llama", device="cpu"), "int4", group_size=16)
    int8 = od.quantize(od.load_model("tiny-llama", device="cpu"), "int8")
    rows = sum(w.shape[0] for w, _ in weights.values())
    assert nbytes(full) - nbytes(int4) == 4 * codes - codes // 2 - 2 * 4 * groups  # float32 -> codes, s and z
    assert nbytes(full) - nbytes(int8) == 4 * codes - codes - 4 * rows


@pytest.mark.parametrize(
    "args,kwargs,words",
    [
        (("int3",), {}, "scheme must be one of 'int4', 'int8', 'fp8', got 'int3'"),
        ((None,), {}, "scheme must be one of"),
        (("int4",), dict(group_size=0), "group_size must be a positive int"),
        (("int4",), dict(group_size=16.0), "group_size must be a positive int"),
        (("int4",), dict(group_size=True), "group_size must be a positive int"),
    ],
)
def test_bad_scheme_or_group_size_is_a_value_error_naming_it(tiny_llama, args, kwargs, words):
    import overlapdecode as od

    with pytest.raises(ValueError, match=words):
        od.quantize(tiny_llama, *args, **kwargs)
    assert isinstance(tiny_llama.lm_head, torch.nn.Linear)  # refused before any layer was touched


def test_bad_models_are_refused_naming_model():
    import overlapdecode as od
    from support.tiny_archs import tiny_model

    with pytest.raises(ValueError, match="model must be a Hugging Face causal LM"):
        od.quantize(torch.nn.Linear(4, 4), "int4")
    with pytest.raises(ValueError, match="model must be a Hugging Face causal LM"):
        od.quantize("tiny-llama", "int4")
    model = od.quantize(od.load_model("tiny-llama", device="cpu"), "int8")
    with pytest.raises(ValueError, match=r"model is already quantized \(int8\)"):
        od.quantize(model, "int4")
    moe, why = tiny_model("qwen3_moe")
    assert moe is not None, why
    with pytest.raises(ValueError, match="model: quantize does not support mixtures of experts"):
        od.quantize(moe, "int4")


def test_load_model_quantizes_as_quantize_does(tmp_path):
    import overlapdecode as od

    for scheme, group_size in (("int4", 16), ("int8", 128)):
        ref = od.quantize(od.load_model("tiny-gpt2", device="cpu"), scheme, group_size=group_size)
        got = od.load_model("tiny-gpt2", device="cpu", quantize=scheme, group_size=group_size)
        assert_same_parameters(got, ref)
    od.load_model("tiny-llama", device="cpu").save_pretrained(tmp_path)  # a directory: read on the host first
    ref = od.quantize(od.load_model(str(tmp_path), device="cpu"), "int4", group_size=32)
    got = od.load_model(str(tmp_path), device="cpu", quantize="int4", group_size=32)
    assert_same_parameters(got, ref)
    assert isinstance(got.model.layers[1].mlp.down_proj, Int4Linear) and not got.training


def assert_same_parameters(a, b) -> None:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    assert pa.keys() == pb.keys()
    for name in pa:
        assert pa[name].dtype == pb[name].dtype and torch.equal(pa[name], pb[name]), name


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(quantize="int2"), "quantize must be one of 'int4', 'int8', 'fp8'"),
        (dict(quantize="int4", group_size=-4), "group_size must be a positive int"),
        (dict(quantize="int4", tp=2), "quantize: tensor-parallel shards are not quantized yet"),
    ],
)
def test_load_model_refuses_bad_quantize_arguments_before_building(kwargs, words):
    import overlapdecode as od

    with pytest.raises(ValueError, match=words):
        od.load_model("tiny-llama", device="cpu", **kwargs)


def test_load_model_refuses_a_mixture_of_experts_from_its_config():
    import overlapdecode as od

    with pytest.raises(ValueError, match="quantize: quantize does not support mixtures of experts"):
        od.load_model("qwen3-moe-random", device="cpu", quantize="int8")  # 2.7B parameters: refused before any


def test_cli_names_equal_the_librarys():
    from overlapdecode.cli.args import QUANT_NAMES
    from overlapdecode.quant import SCHEMES

    assert QUANT_NAMES == SCHEMES


def test_generate_cli_quantizes(capsys):
    import overlapdecode as od
    from overlapdecode.cli import main

    argv = ["generate", "--model", "tiny-gpt2", "--prompt-ids", "5,6,7", "--max-new-tokens", "6", "--eos", "none"]
    assert main(argv + ["--strategy", "static", "--quantize", "int4", "--group-size", "16", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    model = od.load_model("tiny-gpt2", device="cpu", quantize="int4", group_size=16)
    ref = od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=6, strategy="static", eos_token_id=[])
    assert "ids: " + " ".join(str(t) for t in ref[0, 3:].tolist()) in out
    plain = od.generate(
        od.load_model("tiny-gpt2", device="cpu"), torch.tensor([[5, 6, 7]]), max_new_tokens=6, eos_token_id=[]
    )
    assert not torch.equal(plain, ref)  # quantized: other tokens


@pytest.mark.parametrize(
    "argv,words",
    [
        (["generate", "--prompt-ids", "1,2", "--model", "tiny-llama", "--group-size", "16"], "--group-size applies"),
        (["generate", "--prompt-ids", "1,2", "--model", "tiny-llama", "--quantize", "int8", "--group-size", "16"], "--group-size applies"),
        (["generate", "--prompt-ids", "1,2", "--model", "tiny-llama", "--quantize", "int4", "--group-size", "0"], "--group-size must be a positive int"),
        (["generate", "--prompt-ids", "1,2", "--model", "tiny-llama", "--quantize", "int5"], "argument --quantize: invalid choice"),
        (["generate", "--prompt-ids", "1,2", "--model", "qwen3-moe-random", "--quantize", "int4"], "--quantize: quantize does not support mixtures"),
        (["bench", "--model", "tiny-llama", "--group-size", "32"], "--group-size applies"),
        (["bench", "--model", "tiny-llama", "--quantize", "int4", "--group-size", "-1"], "--group-size must be"),
        (["bench", "--model", "qwen3-moe-random", "--quantize", "int8"], "--quantize: quantize does not support mixtures"),
    ],
)  # fmt: skip
def test_cli_quantize_mistakes_are_one_line_naming_the_flag(argv, words, capsys, tmp_path):
    from overlapdecode.cli import main

    out = ["--out", str(tmp_path / "out"), "--device", "cpu"] if argv[0] == "bench" else ["--device", "cpu"]
    try:
        code = main(argv + out)
    except SystemExit as stop:  # argparse's own refusal (a --quantize not among the choices)
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err
    assert err.split(": error: ", 1)[1].startswith(("--", "argument --")), err
    assert not (tmp_path / "out" / "results.json").exists()


def test_bench_records_the_quantization(tmp_path):
    """The config, every row and --append: a run of other weights is refused rather than mixed into the report."""
    import json

    from overlapdecode.cli import main

    out = str(tmp_path / "b")
    argv = ["bench", "--model", "tiny-llama", "--strategies", "static", "--peers", "none", "--lengths", "3"]
    argv += ["--repeats", "1", "--warmup", "0", "--no-profile", "--device", "cpu", "--out", out]
    assert main(argv + ["--quantize", "int4", "--group-size", "32"]) == 0
    results = json.load(open(f"{out}/results.json"))
    assert (results["config"]["quantize"], results["config"]["group_size"]) == ("int4", 32)
    assert all((r["quantize"], r["group_size"]) == ("int4", 32) for r in results["rows"])
    assert main(argv + ["--append"]) == 2
    assert main(argv + ["--append", "--quantize", "int4"]) == 2  # group 128: other weights


# --- every preset gives Hugging Face generate()'s tokens on the quantized model (CPU, float32) --------------------

N = 24
# (model, scheme, group size): groups that divide every K, and 48, which divides none (K 64, 128, 256: short groups)
QUANTIZED_MODELS = [
    (name, scheme, g)
    for name in ("tiny-gpt2", "tiny-llama")
    for scheme, g in (("int4", 16), ("int4", 48), ("int8", 128))
]
EAGER_PRESETS = ("baseline", "kv", "static", "fused")  # fused: its kernels' torch twins on CPU
COMPILED_PRESETS = ("compiled", "interleaved", "deferred", "nocheck")


@pytest.fixture(scope="module", params=QUANTIZED_MODELS, ids=lambda p: "-".join(map(str, p)))
def quantized(request):
    import overlapdecode as od

    name, scheme, group_size = request.param
    model = od.load_model(name, device="cpu", quantize=scheme, group_size=group_size)
    full = od.load_model(name, device="cpu")
    ids = torch.randint(3, 900, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, full(ids).logits)  # the weights really are other weights
    return request.param, model


def assert_presets_match_hf(model, presets, batch: int = 4, seed: int = 4, generate=None) -> None:
    import overlapdecode as od
    from support.helpers import eos_hit_midway, hf_generate, make_batch, naive_generate

    ids, mask = make_batch(batch, seed=seed)
    rows = [0, 2]  # rows 0 and 2 stop mid-way, 1 and 3 never do
    eos = eos_hit_midway(model, ids, mask, N, rows)
    assert eos is not None, "no usable EOS for this batch; change the seed"
    pad = 5
    ref = hf_generate(model, ids, mask, N, eos, pad)
    assert torch.equal(ref, naive_generate(model, ids, mask, N, eos, pad))
    assert (ref[rows, -1] == pad).all()
    for preset in presets:
        args = (ids,) if generate is not None else (model, ids)
        out = (generate or od.generate)(
            *args, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=eos, pad_token_id=pad
        )
        assert torch.equal(out, ref), preset


def test_eager_presets_give_hugging_faces_tokens_on_the_quantized_model(quantized):
    _, model = quantized
    assert_presets_match_hf(model, EAGER_PRESETS)


def test_compiled_presets_give_hugging_faces_tokens_on_the_quantized_model():
    """One model and scheme (compiling on CPU is slow): the dequantization compiled with the step, and the fused
    path's prefill compiled as on a GPU."""
    import overlapdecode as od

    model = od.load_model("tiny-gpt2", device="cpu", quantize="int4", group_size=48)
    assert_presets_match_hf(model, COMPILED_PRESETS)
    decoder = od.Decoder(model, fused_options=dict(compile_prefill=True))
    assert_presets_match_hf(model, ["fused"], generate=decoder.generate)


def test_one_seed_gives_the_same_sampled_tokens_under_every_preset(quantized):
    import overlapdecode as od
    from support.helpers import make_batch

    _, model = quantized
    ids, mask = make_batch(4, seed=43)
    kw = dict(do_sample=True, seed=9, top_k=30, temperature=0.8, max_new_tokens=12, attention_mask=mask)
    free = od.generate(model, ids, strategy="static", eos_token_id=[], **kw)[:, ids.shape[1] :]
    eos = sorted({int(free[r, 2 * r + 2]) for r in range(ids.shape[0])})  # rows stop at different steps
    outs = {p: od.generate(model, ids, strategy=p, eos_token_id=eos, **kw) for p in EAGER_PRESETS}
    ref = outs["baseline"]
    assert ref.shape[1] < ids.shape[1] + 12, "the batch should stop before max_new_tokens"
    for preset, out in outs.items():
        assert torch.equal(out, ref), preset


def test_the_fused_layout_keeps_the_packed_weights_and_their_size():
    """The fused path re-lays out the packed rows (Q, K, V together; gate then up) as it does 16-bit ones: the
    model's quantized layers become views of the fused tensors, and the bytes on the device do not grow."""
    import overlapdecode as od
    from overlapdecode.fused.model import FusedModel
    from overlapdecode.quant import PackedWeight

    model = od.load_model("tiny-llama", device="cpu", quantize="int4", group_size=48)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    nbytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    W = FusedModel(model).weights
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    qkv, up = W.layers[0].w_qkv, W.layers[0].w_up
    assert isinstance(qkv, PackedWeight) and qkv.shape == (128, 64) and qkv.group_size == 48
    assert torch.equal(
        dequantize(qkv), torch.cat([dequantize(m.packed()) for m in (attn.q_proj, attn.k_proj, attn.v_proj)])
    )
    assert torch.equal(
        dequantize(up), torch.cat([dequantize(mlp.gate_proj.packed()), dequantize(mlp.up_proj.packed())])
    )
    assert attn.k_proj.weight.untyped_storage().data_ptr() == qkv.q.untyped_storage().data_ptr()  # a view
    assert attn.k_proj.scales.untyped_storage().data_ptr() == qkv.scales.untyped_storage().data_ptr()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    seen = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    assert sum(seen.values()) == nbytes  # the same bytes, in fewer storages
    assert isinstance(W.lm_head, PackedWeight) and W.lm_head.q is not None


DENSE_FAMILIES = ("qwen3", "qwen3-sliding", "phi3", "phi3-longrope", "granite", "smollm3", "olmo2", "gemma")
DENSE_FAMILIES += ("gemma2", "gemma3")


@pytest.mark.parametrize("name", DENSE_FAMILIES)
def test_each_decoder_family_quantized_gives_hugging_faces_tokens_under_fused(name):
    """The fused path's families (Q/K norms, Phi-3's QKV and gate/up as shipped, post-norms, soft-caps, sliding
    layers...) on int4 weights: the fused preset (its kernels' torch twins here) and static give Hugging Face
    generate()'s greedy tokens on the same quantized model."""
    import overlapdecode as od
    from support.fused_families import family_model
    from support.helpers import make_batch

    model = od.quantize(family_model(name), "int4", group_size=16)
    ids, mask = make_batch(3, seed=2, high=min(990, model.config.vocab_size))
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False, eos_token_id=[], pad_token_id=0)
    for preset in ("fused", "static"):
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=12, strategy=preset, eos_token_id=[])
        assert torch.equal(out, ref), preset


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral", "gpt-oss"])
def test_mixtures_of_experts_are_refused(name):
    import overlapdecode as od
    from support.fused_families import family_model

    with pytest.raises(ValueError, match="quantize does not support mixtures of experts"):
        od.quantize(family_model(name), "int8")
