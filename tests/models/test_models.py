"""load_model: embedded configs, a local directory saved with save_pretrained (no download), dtype/device."""

from __future__ import annotations

import copy

import pytest
import torch

import overlapdecode as od
from overlapdecode import tp as tensor_parallel
from overlapdecode.models import loading, random_init, shapes
from support.helpers import hf_generate, make_batch
from support.saved_models import save_tiny_with_tokenizer

# name -> (vocab, hidden, layers, positions, eos, bos): the shapes the docs and the CPU tests rely on
SHAPES = {
    "tiny-gpt2": (1000, 64, 2, 256, 999, 999),
    "tiny-llama": (1000, 64, 2, 256, 2, 1),
    "gpt2-random": (50257, 768, 12, 1024, 50256, 50256),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_embedded_configs(name):
    vocab, hidden, layers, positions, eos, bos = SHAPES[name]
    cfg = loading.embedded_config(name)
    got = (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_hidden_layers,
        getattr(cfg, "n_positions", None) or cfg.max_position_embeddings,
        cfg.eos_token_id,
        cfg.bos_token_id,
    )
    assert got == SHAPES[name]
    if name == "gpt2-random":  # the 124M model: its config only (CPU memory and time in CI)
        return
    model = od.load_model(name, device="cpu")
    assert not model.training and next(model.parameters()).dtype == torch.float32
    assert model.get_output_embeddings().weight.shape == (vocab, hidden)
    assert model.generation_config.eos_token_id == eos and model.generation_config.bos_token_id == bos


def test_seed_makes_weights_reproducible():
    a = od.load_model("tiny-gpt2", device="cpu", seed=1)
    b = od.load_model("tiny-gpt2", device="cpu", seed=1)
    c = od.load_model("tiny-gpt2", device="cpu", seed=2)
    wa, wb, wc = (m.transformer.h[0].attn.c_attn.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_local_directory_round_trip(tmp_path):
    original = save_tiny_with_tokenizer(tmp_path)
    loaded = od.load_model(str(tmp_path), device="cpu")
    ids, mask = make_batch(2, seed=9)
    out = od.generate(loaded, ids, attention_mask=mask, max_new_tokens=10, strategy="static", eos_token_id=[])
    assert torch.equal(out, hf_generate(original, ids, mask, 10, [], 0))
    tok = od.load_tokenizer(str(tmp_path))
    assert tok("w5 w17").input_ids == [5, 17]


def test_dtype():
    assert next(od.load_model("tiny-llama", dtype="bfloat16", device="cpu").parameters()).dtype == torch.bfloat16
    assert next(od.load_model("tiny-llama", dtype=torch.float16, device="cpu").parameters()).dtype == torch.float16


@pytest.mark.parametrize(
    "kw, exc, words",
    [
        (dict(seed=1.5), TypeError, "seed must be an int"),
        (dict(seed="a"), TypeError, "seed must be an int"),
        (dict(seed=None), TypeError, "seed must be an int"),
        (dict(seed=2**64), ValueError, "seed must be in [0, 2**64)"),
        (dict(seed=-1), ValueError, "seed must be in [0, 2**64)"),
        (dict(device="banana"), ValueError, "device 'banana' is not a device"),
        (dict(device=5), TypeError, "device must be a str"),
        (dict(device=True), TypeError, "device must be a str"),
        (dict(device="meta"), ValueError, "only 'cpu' and 'cuda' devices"),
        (dict(dtype="float8"), ValueError, "dtype must be one of"),
        (dict(dtype=torch.int8), ValueError, "dtype must be one of"),
    ],
)
def test_load_model_bad_arguments_are_named(kw, exc, words):
    with pytest.raises(exc) as err:
        od.load_model("tiny-gpt2", **kw)
    assert words in str(err.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer of a machine without CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:7", torch.device("cuda", 0)])
def test_load_model_cuda_without_cuda(device):
    with pytest.raises(ValueError, match="CUDA is not available"):
        od.load_model("tiny-gpt2", device=device)


@pytest.mark.parametrize("name", ["/nonexistent/dir", "./no-such-model", "~/no-such-model-here", "a/b/c/d"])
def test_paths_that_do_not_exist_are_named_as_paths(name):
    with pytest.raises(ValueError, match=f"path {name} does not exist"):
        od.load_model(name)
    with pytest.raises(ValueError, match=f"path {name} does not exist"):
        od.load_tokenizer(name)


def test_a_file_is_not_a_model_directory(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file, not a model directory"):
        od.load_model(str(f))


def test_a_name_is_a_non_empty_string():
    for bad in ("", None, 3):
        with pytest.raises(TypeError, match="name_or_path must be a non-empty string"):
            od.load_model(bad)


def _tiny_bert_config(**kw):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, **kw
    )


def test_a_saved_masked_lm_is_refused_not_loaded_as_a_causal_lm(tmp_path, capsys):
    """AutoModelForCausalLM loads a saved BertForMaskedLM as BertLMHeadModel (is_decoder=False: it attends both
    ways) and generate ran it; the docs say masked-LM models are refused."""
    from transformers import BertForMaskedLM, BertForSequenceClassification, BertLMHeadModel

    from overlapdecode.cli import main

    BertForMaskedLM(_tiny_bert_config()).save_pretrained(tmp_path / "mlm")
    with pytest.raises(ValueError, match=r"name_or_path .*mlm was saved as BertForMaskedLM, which is not a causal"):
        od.load_model(str(tmp_path / "mlm"), device="cpu")
    BertForSequenceClassification(_tiny_bert_config()).save_pretrained(tmp_path / "cls")
    with pytest.raises(ValueError, match="saved as BertForSequenceClassification, which is not a causal LM"):
        od.load_model(str(tmp_path / "cls"), device="cpu")
    # saved as a causal LM head but without is_decoder: an encoder all the same
    BertLMHeadModel(_tiny_bert_config()).save_pretrained(tmp_path / "enc")
    with pytest.raises(ValueError, match=r"is an encoder \(bert with is_decoder=False"):
        od.load_model(str(tmp_path / "enc"), device="cpu")
    # the same class as a decoder loads and generates Hugging Face's tokens
    decoder = BertLMHeadModel(_tiny_bert_config(is_decoder=True)).eval()
    decoder.save_pretrained(tmp_path / "dec")
    loaded = od.load_model(str(tmp_path / "dec"), device="cpu")
    ids, mask = make_batch(2, seed=3, high=100)
    out = od.generate(loaded, ids, attention_mask=mask, max_new_tokens=5, strategy="kv", eos_token_id=[])
    assert torch.equal(out, hf_generate(decoder, ids, mask, 5, [], 0))
    capsys.readouterr()
    for argv in (["generate", "--prompt-ids", "1,2"], ["bench", "--out", str(tmp_path / "out"), "--device", "cpu"]):
        assert main(argv + ["--model", str(tmp_path / "mlm")]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"overlapdecode {argv[0]}: error: --model {tmp_path / 'mlm'} was saved as BertForMaskedLM, "
            f"which is not a causal LM (masked-LM and classification heads are refused); generate needs "
            f"a decoder-only causal LM"
        )
    assert not (tmp_path / "out").exists()  # refused before any worker or directory


def test_an_encoder_model_object_is_refused_by_generate():
    from transformers import BertLMHeadModel

    model = BertLMHeadModel(_tiny_bert_config()).eval()
    with pytest.raises(ValueError, match=r"model BertLMHeadModel is an encoder \(bert with is_decoder=False"):
        od.generate(model, torch.tensor([[5, 6]]), max_new_tokens=2, strategy="kv")


# name -> (parameters, heads, kv heads, head size, Q/K/V bias, largest tp): the published models' counts
SMALL_SHAPES = {
    "smollm2-360m-random": (361_821_120, 15, 5, 64, False, 5),
    "qwen2.5-0.5b-random": (494_032_768, 14, 2, 64, True, 2),
    "qwen2.5-1.5b-random": (1_543_714_304, 12, 2, 128, True, 2),
    "smollm2-1.7b-random": (1_711_376_384, 32, 32, 64, False, 32),
}


def _meta_model(name: str, **overrides):
    config = loading.embedded_config(name)
    for key, value in overrides.items():
        setattr(config, key, value)
    with torch.device("meta"):
        return loading.causal_lm_class(config.model_type)(config)


@pytest.mark.parametrize("name", list(SMALL_SHAPES))
def test_small_llama_family_shapes_are_the_published_ones(name):
    """Built on the meta device (no memory): the parameter count of the model each shape follows, its heads,
    head size, biases and tied embeddings, and that every shard boundary of each tp it admits falls between
    random_init's tiles (so load_model can draw it, also as shards)."""
    params, heads, kv, head_dim, bias, tp = SMALL_SHAPES[name]
    model = _meta_model(name)
    cfg = model.config
    assert sum(p.numel() for p in model.parameters()) == params
    attn = model.model.layers[0].self_attn
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, attn.head_dim) == (heads, kv, head_dim)
    assert (attn.q_proj.bias is not None) == bias and model.lm_head.weight is model.model.embed_tokens.weight
    assert 12 <= cfg.num_hidden_layers <= 32 and name in od.EMBEDDED
    assert tensor_parallel.max_tp(cfg) == tp
    splits = tensor_parallel.param_splits(model)
    for pname, split in splits.items():
        size = model.get_parameter(pname).shape[split.dim]
        t = random_init.tile_size(size, split, tp)
        for ranks in {1, tp}:
            for rank in range(ranks):
                assert all(a % t == 0 and b % t == 0 for a, b in tensor_parallel.local_ranges(size, split, rank, ranks))


@pytest.mark.parametrize("name", list(SMALL_SHAPES))
def test_small_shapes_run_fused_at_one_layer(name):
    """Each shape's layer (full width, one layer, a small vocabulary) drawn by random_init as load_model draws it,
    then `fused` (the torch twins of the kernels, float32) against Hugging Face's greedy tokens."""
    config = loading.embedded_config(name)
    config.num_hidden_layers, config.vocab_size = 1, 1000
    config.bos_token_id = config.eos_token_id = 999
    model = random_init.random_model(
        loading.causal_lm_class(config.model_type),
        config,
        tensor_parallel.Placement(0, 1, torch.device("cpu")),
        torch.float32,
        seed=0,
    ).eval()
    assert model.model.layers[0].mlp.down_proj.weight.shape == (config.hidden_size, config.intermediate_size)
    ids, mask = make_batch(2, seed=4)
    ref = hf_generate(model, ids, mask, 4, [], 0)
    out = od.generate(model, ids, attention_mask=mask, max_new_tokens=4, strategy="fused", eos_token_id=[])
    assert torch.equal(out, ref)


@pytest.mark.parametrize("tied", [False, True])
def test_a_quantized_random_model_is_drawn_one_matrix_at_a_time(tied, monkeypatch):
    """random_model(quantize=...): each linear layer quantized as soon as its matrix is drawn, so that at no draw
    is an earlier layer's full-precision matrix alive (a 70B shape in int4 never exists whole); the packed weights
    and the rest equal those of the whole draw quantized after (a tied LM head quantized, its table kept)."""
    import weakref

    from overlapdecode.quant import model as quant_model

    config = loading.embedded_config("smollm2-360m-random")
    config.num_hidden_layers, config.vocab_size, config.hidden_size = 2, 96, 64
    config.intermediate_size, config.num_attention_heads, config.num_key_value_heads = 128, 4, 2
    config.head_dim, config.tie_word_embeddings = 16, tied
    config.bos_token_id = config.eos_token_id = 95
    place = tensor_parallel.Placement(0, 1, torch.device("cpu"))
    cls = loading.causal_lm_class(config.model_type)
    whole = random_init.random_model(cls, copy.deepcopy(config), place, torch.float32, seed=1)  # quantize unties it
    quant_model.quantize_layers(whole, quant_model.linear_layers(whole), "int4", 16)
    drawn, packed, alive_at_draws = [], [], []  # the matrices drawn; weak references to the layers packed
    draw, pack = random_init.draw_matrix, quant_model.quantized_layer

    def spy_draw(name, *args, **kwargs):  # the full-precision layers packed before and still alive
        alive_at_draws.append([layer for layer in packed if layer() is not None])
        drawn.append(name)
        return draw(name, *args, **kwargs)

    def spy_pack(layer, *args, **kwargs):
        packed.append(weakref.ref(layer))
        return pack(layer, *args, **kwargs)

    monkeypatch.setattr(random_init, "draw_matrix", spy_draw)
    monkeypatch.setattr(quant_model, "quantized_layer", spy_pack)
    parts = random_init.random_model(
        cls, copy.deepcopy(config), place, torch.float32, seed=1, quantize="int4", group_size=16
    )
    alive_at_draws.append([layer for layer in packed if layer() is not None])  # and once it is made
    assert len(drawn) == 2 * 7 + 1 + (not tied)  # q, k, v, o, gate, up, down a layer; the table; an untied head
    assert all(not alive for alive in alive_at_draws), [a for a in alive_at_draws if a]
    want, got = whole.state_dict(), parts.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    assert isinstance(parts.lm_head, quant_model.Int4Linear) and not parts.config.tie_word_embeddings
    ids, mask = make_batch(2, seed=4)
    ids = ids % 95
    torch.testing.assert_close(parts(ids, attention_mask=mask).logits, whole(ids, attention_mask=mask).logits)


def test_load_model_quantizes_a_drawn_shape_as_it_draws_it(monkeypatch):
    """load_model(NAME, quantize=...) of a drawn shape (here llama-70b-random's name over a small config) takes the
    drawing path with its quantization (no quantization after it), and gives od.quantize's weights of the model."""
    small = loading.embedded_config("llama-1b-random")
    small.num_hidden_layers, small.vocab_size, small.hidden_size, small.intermediate_size = 1, 96, 64, 128
    small.num_attention_heads, small.num_key_value_heads, small.head_dim = 4, 2, 16
    small.bos_token_id = small.eos_token_id = 95
    monkeypatch.setattr(loading, "embedded_config", lambda name: copy.deepcopy(small))
    calls = []
    draw = random_init.random_model
    monkeypatch.setattr(random_init, "random_model", lambda *a, **k: calls.append(a[5:]) or draw(*a, **k))
    got = od.load_model("llama-70b-random", device="cpu", quantize="int4", group_size=32)
    want = od.quantize(od.load_model("llama-70b-random", device="cpu"), "int4", 32)
    assert calls == [("int4", 32), (None, 128)]
    assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values()))
    assert got.state_dict().keys() == want.state_dict().keys()


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_the_cache_goes_under_the_forwards_own_keyword(name):
    """transformers 5.24 renamed the forward's `past_key_values` to `cache` and warns (FutureWarning) at every
    call that still passes the old name; 5.17 has no `cache` parameter (its **kwargs would swallow one and run
    without a cache). Either way the keyword must be a named parameter of the forward, and no call warns."""
    import inspect
    import warnings

    from overlapdecode.hf.caches import cache_keyword

    model = od.load_model(name, device="cpu")
    assert cache_keyword(model) in inspect.signature(type(model).forward).parameters
    ids, mask = make_batch(2, seed=4)
    want = hf_generate(model, ids, mask, 6, [], 0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for strategy in ("kv", "static"):
            out = od.generate(model, ids, attention_mask=mask, max_new_tokens=6, strategy=strategy, eos_token_id=[])
            assert torch.equal(out, want), strategy
    assert [str(w.message) for w in seen if "past_key_values" in str(w.message)] == []


# name -> (class, parameters, layers, heads, kv heads, head size, tied embeddings, vocabulary, eos, bos): the
# published models' figures (qwen3-moe-random: Qwen3-30B-A3B's layer at 12 layers and 32 experts)
FAMILY_SHAPES = {
    "qwen3-0.6b-random": ("Qwen3ForCausalLM", 596_049_920, 28, 16, 8, 128, True, 151936, 151645, 151643),
    "qwen3-1.7b-random": ("Qwen3ForCausalLM", 1_720_574_976, 28, 16, 8, 128, True, 151936, 151645, 151643),
    "qwen2.5-7b-random": ("Qwen2ForCausalLM", 7_615_616_512, 28, 28, 4, 128, False, 152064, 151643, 151643),
    "gemma3-1b-random": ("Gemma3ForCausalLM", 999_885_952, 26, 4, 1, 256, True, 262144, 1, 2),
    "qwen3-moe-random": ("Qwen3MoeForCausalLM", 2_661_602_304, 12, 32, 4, 128, False, 151936, 151645, 151643),
}


@pytest.mark.parametrize("name", list(FAMILY_SHAPES))
def test_other_family_shapes_are_the_published_ones(name):
    """Built on the meta device (a real-size model takes over ten seconds to draw on CPU): the class, parameter
    count, heads, head size, tied embeddings, vocabulary and token ids of the model each shape follows."""
    cls, params, layers, heads, kv, head_dim, tied, vocab, eos, bos = FAMILY_SHAPES[name]
    model = _meta_model(name)
    cfg = model.config
    assert type(model).__name__ == cls and name in od.EMBEDDED
    assert sum(p.numel() for p in model.parameters()) == params
    attn = model.model.layers[0].self_attn
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (layers, heads, kv)
    assert attn.q_proj.weight.shape == (heads * head_dim, cfg.hidden_size)
    if cls == "Qwen2ForCausalLM":  # Q/K/V biases, no per-head norms
        assert attn.q_proj.bias.shape == (heads * head_dim,) and not hasattr(attn, "q_norm")
    else:  # Qwen3 and Gemma 3 normalise each head's queries and keys
        assert attn.q_norm.weight.shape == (head_dim,)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert (cfg.vocab_size, cfg.eos_token_id, cfg.bos_token_id) == (vocab, eos, bos)
    assert loading.embedded_config(name) is not loading.embedded_config(name)  # each caller its own


def test_gemma3_shape_has_the_sliding_window_pattern_and_a_rope_base_per_layer_kind():
    cfg = loading.embedded_config("gemma3-1b-random")
    full = [i for i, kind in enumerate(cfg.layer_types) if kind == "full_attention"]
    assert full == [5, 11, 17, 23] and cfg.layer_types.count("sliding_attention") == 22
    assert cfg.sliding_window == 512 and cfg.query_pre_attn_scalar == 256
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1_000_000.0
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
    assert cfg.hidden_activation == "gelu_pytorch_tanh" and cfg.max_position_embeddings == 32768


def test_the_mixture_of_experts_shape_routes_8_of_32_experts_of_qwen3_30b_a3b():
    model = _meta_model("qwen3-moe-random")
    cfg = model.config
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (
        32,
        8,
        768,
        True,
    )
    assert cfg.mlp_only_layers == [] and cfg.decoder_sparse_step == 1  # every layer a mixture of experts
    experts = [m for m in model.modules() if type(m).__name__ == "Qwen3MoeExperts"]
    assert len(experts) == 12 and experts[0].down_proj.shape == (32, 2048, 768)


# A tiny size of each shape (its family's structure kept: the per-head norms, the sliding-window pattern and the
# RoPE base per layer kind, the routing), loaded by load_model under the shape's own name
_TINY = dict(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4, head_dim=16, bos_token_id=999
)
_TINY_OVERRIDES = {
    "qwen3-0.6b-random": dict(num_hidden_layers=2, num_key_value_heads=2),
    # 6 of its layers (5 sliding, 1 global) with a window of 6 tokens: the window cuts the 12-token prompt
    "gemma3-1b-random": dict(num_hidden_layers=6, query_pre_attn_scalar=16, sliding_window=6),
    # 2 of 8 experts per token: the rows of the batch take different experts
    "qwen3-moe-random": dict(
        num_hidden_layers=2, num_key_value_heads=2, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2
    ),
}


@pytest.mark.parametrize("name", list(_TINY_OVERRIDES))
def test_other_families_load_and_generate_their_hf_tokens_at_a_tiny_size(name, monkeypatch):
    cls, kwargs = shapes.FAMILY_SHAPES[name]
    kwargs = dict(kwargs, **_TINY, **_TINY_OVERRIDES[name], eos_token_id=998)
    if "layer_types" in kwargs:
        kwargs["layer_types"] = kwargs["layer_types"][: kwargs["num_hidden_layers"]]
    monkeypatch.setattr(loading, "embedded_config", lambda n: cls(**kwargs) if n == name else None)
    model = od.load_model(name, device="cpu")
    assert type(model).__name__ == FAMILY_SHAPES[name][0] and not model.training
    assert model.generation_config.eos_token_id == 998 and model.generation_config.bos_token_id == 999
    if name == "gemma3-1b-random":
        assert model.config.layer_types.count("full_attention") == 1
    ids, mask = make_batch(2, seed=4, prompt_len=12)
    want = hf_generate(model, ids, mask, 10, [], 0)
    for strategy in ("kv", "static", "fused"):  # fused: the mixture of experts' routed kernels' twins too
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=10, strategy=strategy, eos_token_id=[])
        assert torch.equal(out, want), strategy


def test_other_families_refuse_tensor_parallelism_by_name_before_building():
    with pytest.raises(ValueError, match="no sharding plan for model type 'qwen3_moe'"):
        od.load_model("qwen3-moe-random", device="cpu", tp=2)
