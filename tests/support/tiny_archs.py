"""Tiny random configs of every causal LM that transformers maps in AutoModelForCausalLM, built from each
config class's own fields: every size a config names (hidden size, layers, heads, experts, state sizes,
windows...) made small, and a per-layer kind list (layer_types and the like) reduced to one layer of each kind,
so that a hybrid or a global/local model stays one in two or three layers. A few configs need a value that the
generic rules cannot guess (a nested attention config, a head count tied to another size): OVERRIDES gives it.
What cannot be built tiny, or needs a package that is not installed, is skipped with the reason (`tiny_model`
returns it instead of a model)."""

from __future__ import annotations

import dataclasses
import warnings

import torch
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from overlapdecode.models import loading

VOCAB = 512
MAX_PARAMS = 3_000_000  # a tiny model has well under this; more means a size the rules did not reach
WINDOW = 6  # sliding windows, local attention and attention chunks: shorter than prompt + new tokens

SIZES = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "d_model": 64,
    "n_embd": 64,
    "embed_dim": 64,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_layers": 2,
    "n_layers": 2,
    "decoder_layers": 2,
    "encoder_layers": 2,
    "num_decoder_layers": 2,
    "num_encoder_layers": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "num_heads": 4,
    "n_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_attention_heads": 4,
    "num_decoder_attention_heads": 4,
    "num_encoder_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "kv_channels": 16,
    "dim_head": 16,
    "attention_head_dim": 16,
    "intermediate_size": 128,
    "ffn_dim": 128,
    "n_inner": 128,
    "d_ff": 128,
    "dff": 128,
    "dim_ff": 128,
    "ffn_hidden_size": 128,
    "decoder_ffn_dim": 128,
    "encoder_ffn_dim": 128,
    "shared_intermediate_size": 32,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "expert_intermediate_size": 32,
    "expert_ffn_hidden_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_topk": 2,
    "top_k_experts": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "zero_expert_num": 1,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "n_ctx": 256,
    "max_seq_len": 256,
    "sliding_window": WINDOW,
    "window_size": WINDOW,
    "attention_chunk_size": WINDOW,
    "sliding_window_size": WINDOW,
    "state_size": 8,
    "mamba_d_state": 8,
    "ssm_state_size": 8,
    "mamba_n_heads": 8,
    "mamba_d_head": 16,
    "n_mamba_heads": 8,
    "time_step_rank": 8,
    "mamba_dt_rank": 8,
    "mamba_d_ssm": 128,
    "mamba_chunk_size": 16,
    "chunk_size": 16,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_head_dim": 16,
    "linear_num_heads": 4,
    "rotary_dim": 8,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 16,
    "attn_layer_period": 2,
    "attn_layer_offset": 1,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16,
    "laurel_rank": 8,
    "num_kv_shared_layers": 0,
    "pronunciation_vocab_size": 32,
    "shape_vocab_size": 32,
    "pronunciation_embed_dim": 16,
    "shape_embed_dim": 16,
    "encoder_hash_byte_group_vocab": 64,
    "swa_num_attention_heads": 4,
    "swa_num_key_value_heads": 2,
    "swa_head_dim": 16,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "num_mtp_layers": 0,
    "altup_num_inputs": 2,
    "decoder_vocab_size": VOCAB,
    "is_decoder": True,  # BERT-like encoders used as causal LMs attend causally only as decoders
    # context must decide the tokens, or a cache that loses it would go unseen: with tied embeddings and the
    # default 0.02 init, a 2-layer model mostly repeats its last token
    "tie_word_embeddings": False,
    "initializer_range": 0.1,
    "init_std": 0.1,
}
# per-layer kind lists: reduced to one layer of each kind the full-size default has
KIND_LISTS = ("layer_types", "layers_block_type", "attention_layers", "mlp_layer_types", "indexer_types")

OVERRIDES = {
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},
    "mamba2": {"num_heads": 8, "head_dim": 16, "n_groups": 1},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "bamba": {"attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    "zaya": {"num_experts_per_tok": 1},
    "dbrx": {
        "attn_config": {"kv_n_heads": 2},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
    },
    "mpt": {"attn_config": {}},
    "reformer": {
        "is_decoder": True,
        "axial_pos_shape": [16, 16],
        "axial_pos_embds_dim": [32, 32],
        "attn_layers": ["local", "lsh"],
        "local_attn_chunk_length": 4,
        "lsh_attn_chunk_length": 4,
        "num_buckets": 4,
    },
}


def causal_lm_types() -> list[str]:
    """The model types AutoModelForCausalLM knows, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _fields(cls) -> dict:
    try:
        return {f.name: f for f in dataclasses.fields(cls)}
    except TypeError:  # not a dataclass config
        return {}


def _kinds(values) -> list:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def _small_kwargs(cls, model_type: str | None = None) -> dict:
    """The keyword arguments that make `cls` tiny (sub-configs made tiny in turn)."""
    fields = _fields(cls)
    amap = getattr(cls, "attribute_map", None) or {}
    kwargs = {}
    for name, value in SIZES.items():
        target = amap.get(name, name)
        if target in fields and target not in kwargs:
            kwargs[target] = value
    if "kv_lora_rank" in fields:  # multi-head latent attention: as many key/value heads as query heads
        kwargs[amap.get("num_key_value_heads", "num_key_value_heads")] = SIZES["num_attention_heads"]
    for name, sub in (getattr(cls, "sub_configs", None) or {}).items():
        if isinstance(sub, type) and name in fields:
            kwargs[name] = _small_kwargs(sub)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        default = cls()
    layers = getattr(default, "num_hidden_layers", None)
    for name in KIND_LISTS:
        values = getattr(default, name, None)
        if name in fields and isinstance(values, (list, tuple)) and values and all(isinstance(v, str) for v in values):
            kinds = _kinds(values)
            n = max(2, len(kinds))
            kwargs[name] = [kinds[i % len(kinds)] for i in range(n)]
            if layers is not None:
                kwargs[amap.get("num_hidden_layers", "num_hidden_layers")] = n
    return kwargs


def tiny_config(model_type: str):
    """The tiny config of `model_type` (the config class its causal LM class takes)."""
    model_cls = loading.causal_lm_class(model_type)
    cls = model_cls.config_class
    kwargs = _small_kwargs(cls)
    kwargs.update(OVERRIDES.get(model_type, {}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = cls(**kwargs)
        # special ids of the full vocabulary moved into the small one (an embedding's padding_idx must exist)
        for cfg in {id(c): c for c in (config, config.get_text_config(decoder=True))}.values():
            for name, small in (
                ("bos_token_id", 1),
                ("eos_token_id", 2),
                ("pad_token_id", 0),
                ("decoder_start_token_id", 1),
            ):
                value = getattr(cfg, name, None)
                if isinstance(value, int) and value >= VOCAB:
                    setattr(cfg, name, small)
                elif isinstance(value, list):
                    setattr(cfg, name, [v if v < VOCAB else small for v in value])
    return model_cls, config


def tiny_model(model_type: str):
    """(model in eval mode, None) or (None, the reason it cannot be built tiny here)."""
    try:
        model_cls, config = tiny_config(model_type)
    except ImportError as err:
        return None, f"needs a package that is not installed ({str(err).strip().splitlines()[0][:120]})"
    except Exception as err:  # noqa: BLE001 - a config the generic rules cannot make small
        return None, f"config cannot be made tiny: {type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                meta = model_cls(config)
        n = sum(p.numel() for p in meta.parameters())
        if n > MAX_PARAMS:
            return None, f"{n / 1e6:.0f}M parameters at the smallest sizes the generic rules set"
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model_cls(config)
    except ImportError as err:
        return None, f"needs a package that is not installed ({str(err).strip().splitlines()[0][:120]})"
    except Exception as err:  # noqa: BLE001 - a model whose code refuses the small sizes
        return None, f"model cannot be built tiny: {type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    return model.eval(), None
