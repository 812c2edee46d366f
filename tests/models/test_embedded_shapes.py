"""The embedded real-size shapes of Phi-3, OLMo2, SmolLM3, Granite, Gemma 2, Mixtral and gpt-oss (models.py): their
configs' fields, their parameter counts against the published models' (on the meta device: a real-size model is
never drawn on CPU), the fused path's acceptance of each (fuse_weights on the meta device), and each family at a
tiny size through load_model under `kv`, `static` and `fused` against Hugging Face's greedy tokens."""

from __future__ import annotations

import logging

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused.layout import DECODERS, fuse_weights
from overlapdecode.models import loading, shapes
from support.helpers import hf_generate, make_batch

# name -> (config class, fields as the published config.json gives them, its rope_parameters' keys)
CONFIGS = {
    "phi3-mini-random": (
        "Phi3Config",
        dict(
            vocab_size=32064,
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=32,
            max_position_embeddings=131072,
            original_max_position_embeddings=4096,
            rms_norm_eps=1e-5,
            sliding_window=262144,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=32000,
        ),
        dict(rope_type="longrope", rope_theta=10000.0, original_max_position_embeddings=4096, factor=32.0),
    ),
    "olmo2-1b-random": (
        "Olmo2Config",
        dict(
            vocab_size=100352,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=100257,
            pad_token_id=100277,
        ),
        dict(rope_type="default", rope_theta=500000.0),
    ),
    "smollm3-3b-random": (
        "SmolLM3Config",
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=36,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            no_rope_layer_interval=4,
            use_sliding_window=False,
            bos_token_id=None,
            eos_token_id=128012,
        ),
        dict(rope_type="default", rope_theta=5000000.0),
    ),
    "granite-2b-random": (
        "GraniteConfig",
        dict(
            vocab_size=49155,
            hidden_size=2048,
            intermediate_size=8192,
            num_hidden_layers=40,
            num_attention_heads=32,
            num_key_value_heads=8,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            embedding_multiplier=12.0,
            attention_multiplier=0.015625,
            residual_multiplier=0.22,
            logits_scaling=8.0,
            bos_token_id=0,
            eos_token_id=0,
        ),
        dict(rope_type="default", rope_theta=5000000.0),
    ),
    "gemma2-2b-random": (
        "Gemma2Config",
        dict(
            vocab_size=256000,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=26,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            sliding_window=4096,
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            bos_token_id=2,
            eos_token_id=1,
        ),
        dict(rope_type="default", rope_theta=10000.0),
    ),
    "mixtral-random": (
        "MixtralConfig",
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=8,  # of Mixtral-8x7B's 32
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            sliding_window=None,
            bos_token_id=1,
            eos_token_id=2,
        ),
        dict(rope_type="default", rope_theta=1000000.0),
    ),
    "gpt-oss-random": (
        "GptOssConfig",
        dict(
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=12,  # of gpt-oss-20b's 24
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            num_local_experts=32,
            num_experts_per_tok=4,
            attention_bias=True,
            sliding_window=128,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=200002,
        ),
        dict(
            rope_type="yarn",
            rope_theta=150000.0,
            factor=32.0,
            beta_fast=32.0,
            beta_slow=1.0,
            truncate=False,
            original_max_position_embeddings=4096,
        ),
    ),
}

# name -> (published model, its published parameter count, its layers, the shape's own count, head size): the
# published counts are those of the model cards (Mixtral-8x7B: Mistral AI's 46.7B; gpt-oss-20b: OpenAI's 20.91B, all
# its weights counted, its MXFP4 experts included); the cut-down shapes are counted at the published depth
PUBLISHED = {
    "phi3-mini-random": ("Phi-3.5-mini-instruct", 3.82e9, 32, 3_821_079_552, 96),
    "olmo2-1b-random": ("OLMo-2-0425-1B", 1.48e9, 16, 1_484_916_736, 128),
    "smollm3-3b-random": ("SmolLM3-3B", 3.08e9, 36, 3_075_098_624, 128),
    "granite-2b-random": ("granite-3.1-2b-instruct", 2.53e9, 40, 2_533_531_648, 64),
    "gemma2-2b-random": ("gemma-2-2b", 2.61e9, 26, 2_614_341_888, 256),
    "mixtral-random": ("Mixtral-8x7B-v0.1", 46.7e9, 32, 11_872_309_248, 128),
    "gpt-oss-random": ("gpt-oss-20b", 20.91e9, 24, 11_036_513_472, 64),
}

PUBLISHED_CLASS = {
    "phi3-mini-random": "Phi3ForCausalLM",
    "olmo2-1b-random": "Olmo2ForCausalLM",
    "smollm3-3b-random": "SmolLM3ForCausalLM",
    "granite-2b-random": "GraniteForCausalLM",
    "gemma2-2b-random": "Gemma2ForCausalLM",
    "mixtral-random": "MixtralForCausalLM",
    "gpt-oss-random": "GptOssForCausalLM",
}

NAMES = list(CONFIGS)


def _meta_model(config):
    with torch.device("meta"):
        return loading.causal_lm_class(config.model_type)(config)


def _at_depth(name: str, layers: int):
    """The shape's config at `layers` layers, its layer-type pattern repeated to them."""
    cls, kwargs = shapes.FAMILY_SHAPES[name]
    kwargs = dict(kwargs, num_hidden_layers=layers)
    for key in ("layer_types", "no_rope_layers"):
        if key in kwargs:
            kwargs[key] = [kwargs[key][i % len(kwargs[key])] for i in range(layers)]
    return cls(**kwargs)


def test_the_new_shapes_are_embedded_names():
    assert set(NAMES) <= set(od.EMBEDDED) and len(set(od.EMBEDDED)) == len(od.EMBEDDED)


@pytest.mark.parametrize("name", NAMES)
def test_config_fields_are_the_published_ones(name):
    cls, fields, rope = CONFIGS[name]
    cfg = loading.embedded_config(name)
    assert type(cfg).__name__ == cls
    assert {key: getattr(cfg, key) for key in fields} == fields
    assert {key: cfg.rope_parameters.get(key) for key in rope} == rope
    assert loading.embedded_config(name) is not cfg  # each caller its own


def test_phi3_longrope_has_a_factor_per_rotary_pair():
    """Phi-3.5-mini's LongRoPE: short and long factors, one per pair of the 96-wide heads, as transformers validates
    them; the long ones past 4096 positions stretch the slow frequencies up to 64 times."""
    cfg = loading.embedded_config("phi3-mini-random")
    params = cfg.rope_parameters
    assert len(params["short_factor"]) == len(params["long_factor"]) == 48 == cfg.hidden_size // 32 // 2
    assert params["short_factor"][0] == 1.0 and params["long_factor"][-1] == 64.84
    assert params["short_factor"] == sorted(params["short_factor"]) and params["long_factor"] == sorted(
        params["long_factor"]
    )


def test_layer_patterns_are_the_shipped_ones():
    smol = loading.embedded_config("smollm3-3b-random")
    assert [i for i, rotates in enumerate(smol.no_rope_layers) if not rotates] == list(range(3, 36, 4))
    gemma2 = loading.embedded_config("gemma2-2b-random")
    assert gemma2.layer_types == ["sliding_attention", "full_attention"] * 13
    oss = loading.embedded_config("gpt-oss-random")
    assert oss.layer_types == ["sliding_attention", "full_attention"] * 6


@pytest.mark.parametrize("name", NAMES)
def test_configs_build_and_validate_without_warnings(name):
    """transformers warns, and goes on, where a rope_parameters structure is not the one it expects (a factor list
    of another length than the rotary pairs, a key it does not know): no warning here."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("transformers")  # transformers' loggers do not propagate to the root
    logger.addHandler(handler)
    try:
        loading.embedded_config(name).validate_rope()
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == []


@pytest.mark.parametrize("name", NAMES)
def test_parameter_counts_are_the_published_models(name):
    """Built on the meta device (no memory): the shape's exact count and head size, and at the published model's
    depth within 1% of its published count (the cards round to three figures)."""
    model_name, published, depth, count, head_dim = PUBLISHED[name]
    model = _meta_model(loading.embedded_config(name))
    assert sum(p.numel() for p in model.parameters()) == count, model_name
    assert model.model.layers[0].self_attn.head_dim == head_dim
    full = _meta_model(_at_depth(name, depth))
    assert abs(sum(p.numel() for p in full.parameters()) / published - 1) < 0.01, model_name
    tied = CONFIGS[name][1]["tie_word_embeddings"]
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied


# name -> what the fused step does beyond the Llama family's layer for it (FusedWeights.extras)
EXTRAS = {
    "phi3-mini-random": {"long_inv_freq", "sliding-window layers"},
    "olmo2-1b-random": {"norm=rms_f32", "q/k norm", "post-norms", "no pre-norm"},
    "smollm3-3b-random": {"per-layer RoPE"},
    "granite-2b-random": {"embed_scale", "residual_scale", "logit_div"},
    "gemma2-2b-random": {
        "embed_scale",
        "logit_softcap",
        "attn_softcap",
        "norm=rms_offset",
        "act=gelu_tanh_mul",
        "post-norms",
        "sliding-window layers",
    },
    "mixtral-random": {"mixture of experts"},
    "gpt-oss-random": {"norm=rms_f32", "sliding-window layers", "mixture of experts", "attention sinks"},
}


@pytest.mark.parametrize("name", NAMES)
def test_the_fused_path_takes_each_shape(name):
    """A decoder of layout.DECODERS, fused at real size on the meta device with the attention load_model builds it
    with (fuse_weights refuses what the step does not run), with its family's changes."""
    config = loading.embedded_config(name)
    cls = loading.causal_lm_class(config.model_type)
    config._attn_implementation = loading._embedded_attention(cls, config, "sdpa")
    assert config.model_type in DECODERS
    W = fuse_weights(_meta_model(config))
    assert set(W.extras()) == EXTRAS[name]
    assert len(W.layers) == config.num_hidden_layers and W.hidden == config.hidden_size


def test_the_fused_weights_of_each_family_are_its_own():
    def fused(name):
        config = loading.embedded_config(name)
        cls = loading.causal_lm_class(config.model_type)
        config._attn_implementation = loading._embedded_attention(cls, config, "sdpa")
        return fuse_weights(_meta_model(config))

    W = fused("phi3-mini-random")  # as shipped: one QKV and one gate/up matrix a layer
    assert W.layers[0].w_qkv.shape == (3 * 3072, 3072) and W.layers[0].w_up.shape == (2 * 8192, 3072)
    assert W.rope_switch == 4096 and W.inv_freq.numel() == W.long_inv_freq.numel() == 48
    assert W.layers[0].window == 262144
    W = fused("smollm3-3b-random")
    assert [i for i, layer in enumerate(W.layers) if layer.rope is None] == list(range(3, 36, 4))
    W = fused("granite-2b-random")
    assert (W.embed_scale, W.residual_scale, W.logit_div, W.layers[0].scale) == (12.0, 0.22, 8.0, 0.015625)
    W = fused("gemma2-2b-random")
    assert (W.attn_softcap, W.logit_softcap) == (50.0, 30.0)
    assert [layer.window for layer in W.layers] == [4096, None] * 13
    W = fused("mixtral-random")
    assert [(layer.router.shape, layer.top_k, layer.renorm) for layer in W.layers] == [((8, 4096), 2, True)] * 8
    assert W.layers[0].w_up.shape == (8, 2 * 14336, 4096)
    W = fused("gpt-oss-random")
    assert [(layer.router.shape, layer.top_k, layer.window) for layer in W.layers] == [
        ((32, 2880), 4, 128),
        ((32, 2880), 4, None),
    ] * 6
    assert W.layers[0].sinks.shape == (64,) and W.layers[0].w_up.shape == (32, 2 * 2880, 2880)
    assert W.rope_scale == pytest.approx(0.1 * torch.log(torch.tensor(32.0)).item() + 1)  # YaRN's attention factor


def test_load_model_builds_gpt_oss_and_gemma2_with_eager_attention():
    """gpt-oss has no SDPA attention (transformers refuses to build it so); Gemma 2's SDPA attention skips the
    attention soft-cap. The others keep what was asked."""
    for name in NAMES:
        config = loading.embedded_config(name)
        cls = loading.causal_lm_class(config.model_type)
        want = "eager" if name in ("gpt-oss-random", "gemma2-2b-random") else "sdpa"
        assert loading._embedded_attention(cls, config, "sdpa") == want, name
        assert loading._embedded_attention(cls, config, "eager") == "eager"


# A tiny size of each shape, its family's structure kept (LongRoPE switching inside the prompt, the NoPE layer, the
# multipliers, the sliding and full layers with a window shorter than the call, the soft-caps, the experts and their
# routing, the sinks), loaded by load_model under the shape's own name
_TINY = dict(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_attention_heads=4, bos_token_id=999, pad_token_id=0
)
_TINY_OVERRIDES = {
    "phi3-mini-random": dict(
        num_hidden_layers=2,
        num_key_value_heads=2,
        sliding_window=6,
        original_max_position_embeddings=6,
        rope_parameters=dict(
            rope_type="longrope",
            rope_theta=10000.0,
            factor=32.0,
            original_max_position_embeddings=6,
            short_factor=[1.0 + 0.1 * i for i in range(8)],
            long_factor=[2.0 + 0.5 * i for i in range(8)],
        ),
    ),
    "olmo2-1b-random": dict(num_hidden_layers=2, num_key_value_heads=2),
    "smollm3-3b-random": dict(num_hidden_layers=4, num_key_value_heads=2, no_rope_layers=[1, 1, 1, 0]),
    "granite-2b-random": dict(num_hidden_layers=2, num_key_value_heads=2),
    "gemma2-2b-random": dict(
        num_hidden_layers=2,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "mixtral-random": dict(num_hidden_layers=2, num_key_value_heads=2, num_local_experts=4, intermediate_size=32),
    "gpt-oss-random": dict(
        num_hidden_layers=2,
        num_key_value_heads=2,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        intermediate_size=32,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    ),
}


@pytest.mark.parametrize("name", NAMES)
def test_each_family_loads_and_generates_its_hf_tokens_at_a_tiny_size(name, monkeypatch):
    cls, kwargs = shapes.FAMILY_SHAPES[name]
    kwargs = {**kwargs, **_TINY, **_TINY_OVERRIDES[name], "eos_token_id": 998}
    monkeypatch.setattr(loading, "embedded_config", lambda n: cls(**kwargs) if n == name else None)
    model = od.load_model(name, device="cpu")
    assert type(model).__name__ == PUBLISHED_CLASS[name] and not model.training
    assert model.generation_config.eos_token_id == 998 and model.generation_config.bos_token_id == 999
    want_attention = "eager" if name in ("gpt-oss-random", "gemma2-2b-random") else "sdpa"
    assert model.config._attn_implementation == want_attention
    ids, mask = make_batch(2, seed=4, prompt_len=12)
    want = hf_generate(model, ids, mask, 10, [], 0)
    for strategy in ("kv", "static", "fused"):
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=10, strategy=strategy, eos_token_id=[])
        assert torch.equal(out, want), strategy
