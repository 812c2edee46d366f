"""Load a causal LM: a Hugging Face hub name, a local directory, or an embedded random config.

The embedded configs exist so that the benchmark and the tests run with no download: `gpt2-random` is the
GPT-2 124M architecture with random weights (the benchmark's reference model), `tiny-gpt2` and
`tiny-llama` are small enough for CPU tests. The `llama-*-random` shapes are Llama-3's; `smollm2-*-random` and
`qwen2.5-*-random` are smaller Llama-family shapes with other head counts and GQA ratios (SmolLM2-360M and -1.7B,
Qwen2.5-0.5B and -1.5B, the Qwen2 ones with their QKV biases), to measure the fused step on. Other families
at real size, with their own vocabularies: `qwen3-0.6b-random` (Qwen3-0.6B: RMSNorm on each head's queries and
keys), `gemma3-1b-random` (Gemma-3-1B: five 512-token sliding-window layers to one global layer, each kind with
its own RoPE base) and `qwen3-moe-random` (a mixture of experts cut down from Qwen3-30B-A3B: its layer, 12 of its
48 layers and 32 of its 128 experts, 8 experts per token; 2.7B parameters). `phi3-mini-random` is
Phi-3.5-mini-instruct (3.8B: Q/K/V and gate/up each one matrix as shipped, LongRoPE to 128K positions).
`olmo2-1b-random` is OLMo-2-0425-1B (1.5B: RMSNorm after each branch and none before, Q/K norms over the whole
projection). `smollm3-3b-random` is SmolLM3-3B (3.1B: every fourth layer without RoPE). `granite-2b-random` is
granite-3.1-2b-instruct (2.5B: its embedding, attention, residual and logit multipliers). `gemma2-2b-random` is
gemma-2-2b (2.6B: 4096-token sliding-window and global layers alternating, attention and final logits soft-capped,
built with eager attention since Hugging Face's SDPA attention skips the cap). `mixtral-random` is Mixtral-8x7B's
layer in 8 of its 32 layers (8 experts, 2 per token; 11.9B parameters). `gpt-oss-random` is gpt-oss-20b's layer in
12 of its 24 layers (32 experts with biases, 4 per token, attention sinks, 128-token sliding and full layers
alternating, YaRN; 11.0B parameters, eager attention: its class has no SDPA one). Random weights give the same time
per token as trained ones; only the text is meaningless, which the command line says.
Their tokenizer is the byte-level one of tokenizer.py (random text out, but text in and out with no download).

Every argument is checked before anything is built or downloaded: a device that does not exist, a seed a
generator cannot take, or a path that does not exist is a ValueError/TypeError naming the argument; a
directory or hub model whose config is no decoder-only causal LM (a saved BertForMaskedLM, which
AutoModelForCausalLM would load as a BertLMHeadModel attending both ways) is refused from its config alone.
"""

from __future__ import annotations

import contextlib
import copy
import os
import socket
import urllib.parse

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    SmolLM3Config,
    SmolLM3ForCausalLM,
)

from . import random_init
from . import tp as tensor_parallel
from .embedded import EMBEDDED, embedded_list
from .inputs import check_causal_config
from .quant import model as quant_model
from .sampling import check_seed
from .tokenizer import ByteTokenizer

# Real-size Llama shapes: (hidden, layers, heads, kv heads, intermediate, tied embeddings, rope theta, rope
# scaling). Llama-3.2-1B, Llama-3-8B, Llama-3-70B; vocabulary 128256. Random weights, made on the device.
_LLAMA_SHAPES = {
    "llama-1b-random": (
        2048,
        16,
        32,
        8,
        8192,
        True,
        500000.0,
        dict(
            rope_type="llama3",
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    ),
    "llama-8b-random": (4096, 32, 32, 8, 14336, False, 500000.0, None),
    "llama-70b-random": (8192, 80, 64, 8, 28672, False, 500000.0, None),
}
# Smaller Llama-family shapes, 0.36B to 1.7B parameters, 24 to 32 layers, GQA ratios 1 to 7: (config class,
# hidden, layers, heads, kv heads, intermediate, vocabulary, rope theta, RMSNorm eps, BOS = EOS id, positions).
# All tie the embeddings; the Qwen2 ones have Q/K/V biases (zeros in a random draw, as Hugging Face initialises
# them). Random weights, drawn on the device as the Llama-3 shapes are.
_SMALL_SHAPES = {
    "smollm2-360m-random": (LlamaConfig, 960, 32, 15, 5, 2560, 49152, 100000.0, 1e-5, 0, 8192),  # ratio 3
    "qwen2.5-0.5b-random": (Qwen2Config, 896, 24, 14, 2, 4864, 151936, 1000000.0, 1e-6, 151643, 32768),  # 7
    "qwen2.5-1.5b-random": (Qwen2Config, 1536, 28, 12, 2, 8960, 151936, 1000000.0, 1e-6, 151643, 32768),  # 6
    "smollm2-1.7b-random": (LlamaConfig, 2048, 24, 32, 32, 8192, 49152, 130000.0, 1e-5, 0, 8192),  # ratio 1
}
# Real-size shapes of other families: (config class, its arguments), as the published configs give them. Random
# weights as Hugging Face initialises each family (Gemma's norms scale by 1 + weight: zeros), made on the device.
_GEMMA3_1B_LAYERS = 26
# Phi-3.5-mini-instruct's LongRoPE factors, one per rotary pair (head size 96: 48 pairs), rounded to two decimals:
# the short table up to 4096 positions, the long one past them
_PHI35_SHORT_FACTOR = [1.0, 1.02, 1.03, 1.03, 1.05, 1.05, 1.05, 1.05, 1.05, 1.07, 1.1, 1.11, 1.16, 1.16, 1.17, 1.29]
_PHI35_SHORT_FACTOR += [1.34, 1.68, 1.79, 1.82, 1.85, 1.88, 1.91, 1.94, 1.99, 2.02, 2.02, 2.02, 2.02, 2.02, 2.02, 2.03]
_PHI35_SHORT_FACTOR += [2.03, 2.03, 2.03, 2.03, 2.03, 2.03, 2.03, 2.03, 2.08, 2.09, 2.19, 2.22, 2.59, 2.73, 2.75, 2.84]
_PHI35_LONG_FACTOR = [1.08, 1.11, 1.14, 1.34, 1.59, 1.6, 1.62, 2.62, 3.23, 3.23, 4.79, 7.4, 7.7, 9.09, 12.2, 17.67]
_PHI35_LONG_FACTOR += [24.46, 28.57, 30.42, 30.84, 32.59, 32.93, 42.32, 44.96, 50.34, 50.45, 57.55, 57.93, 58.21, 60.14]
_PHI35_LONG_FACTOR += [62.61, 62.62, 62.71, 63.14, 63.14, 63.77, 63.93, 63.96, 63.97, 64.03, 64.07, 64.08, 64.12, 64.41]
_PHI35_LONG_FACTOR += [64.48, 64.51, 64.53, 64.84]
_SMOLLM3_3B_LAYERS = 36
_GEMMA2_2B_LAYERS = 26
# gpt-oss-20b has 24 layers: half of them, alternating as it does, keep 11.0B parameters (22 GB in bfloat16, 44 GB
# in the bench's default float32: one 80 GB GPU with room for the caches); a decode step's time is per layer
_GPT_OSS_LAYERS = 12
_FAMILY_SHAPES = {
    # Qwen3-0.6B: 596M parameters (tied embeddings), 16 query heads of 128 over a hidden size of 1024
    "qwen3-0.6b-random": (
        Qwen3Config,
        dict(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            bos_token_id=151643,
            eos_token_id=151645,
        ),
    ),
    # Gemma-3-1B: 1.0B parameters (tied), one KV head of 256; every sixth layer global (RoPE base 1M), the others
    # attend to the last 512 tokens (RoPE base 10K)
    "gemma3-1b-random": (
        Gemma3TextConfig,
        dict(
            vocab_size=262144,
            hidden_size=1152,
            intermediate_size=6912,
            num_hidden_layers=_GEMMA3_1B_LAYERS,
            num_attention_heads=4,
            num_key_value_heads=1,
            head_dim=256,
            query_pre_attn_scalar=256,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            sliding_window=512,
            layer_types=[
                "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(_GEMMA3_1B_LAYERS)
            ],
            rope_parameters=dict(
                full_attention=dict(rope_type="default", rope_theta=1000000.0),
                sliding_attention=dict(rope_type="default", rope_theta=10000.0),
            ),
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        ),
    ),
    # Qwen3-30B-A3B's layer (32 query and 4 KV heads of 128, experts 768 wide, 8 of them per token, their weights
    # renormalised) in 12 of its 48 layers with 32 of its 128 experts: 2.66B parameters, 1.0B of them read per
    # token at batch 1 (the attention, 8 experts per layer and the untied LM head)
    "qwen3-moe-random": (
        Qwen3MoeConfig,
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=6144,
            num_hidden_layers=12,
            num_attention_heads=32,
            num_key_value_heads=4,
            head_dim=128,
            moe_intermediate_size=768,
            num_experts=32,
            num_experts_per_tok=8,
            norm_topk_prob=True,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            bos_token_id=151643,
            eos_token_id=151645,
        ),
    ),
    # Phi-3.5-mini-instruct (the 128K-context Phi-3-mini): 3.82B parameters (untied), 32 heads of 96 and as many KV
    # heads, Q/K/V and gate/up each one matrix as shipped (qkv_proj, gate_up_proj); LongRoPE to 131072 positions
    # (factor 32 = 131072 / 4096, which transformers derives when the config leaves it out, and warns), every layer
    # given the config's 262144-token window
    "phi3-mini-random": (
        Phi3Config,
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
            tie_word_embeddings=False,
            sliding_window=262144,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                factor=32.0,
                original_max_position_embeddings=4096,
                short_factor=_PHI35_SHORT_FACTOR,
                long_factor=_PHI35_LONG_FACTOR,
            ),
            bos_token_id=1,
            eos_token_id=32000,
            pad_token_id=32000,
        ),
    ),
    # OLMo-2-0425-1B: 1.48B parameters (untied), 16 heads of 128 and as many KV heads; RMSNorm after each branch and
    # none before it, Q and K normalised over the whole projection; no BOS id in its config
    "olmo2-1b-random": (
        Olmo2Config,
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
            rope_parameters=dict(rope_type="default", rope_theta=500000.0),
            bos_token_id=None,
            eos_token_id=100257,
            pad_token_id=100277,
        ),
    ),
    # SmolLM3-3B: 3.08B parameters (tied), 16 query and 4 KV heads of 128; every fourth layer without RoPE
    # (no_rope_layers: 1 rotates, 0 does not), no sliding window; no BOS id in its config
    "smollm3-3b-random": (
        SmolLM3Config,
        dict(
            vocab_size=128256,
            hidden_size=2048,
            intermediate_size=11008,
            num_hidden_layers=_SMOLLM3_3B_LAYERS,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=65536,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=5000000.0),
            no_rope_layer_interval=4,
            no_rope_layers=[int((i + 1) % 4 != 0) for i in range(_SMOLLM3_3B_LAYERS)],
            use_sliding_window=False,
            sliding_window=None,
            bos_token_id=None,
            eos_token_id=128012,
            pad_token_id=128004,
        ),
    ),
    # granite-3.1-2b-instruct: 2.53B parameters (tied), 32 query and 8 KV heads of 64 in 40 layers; its multipliers
    # (embeddings x 12, attention scores x 1/64, each branch x 0.22 before its add, logits / 8)
    "granite-2b-random": (
        GraniteConfig,
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
            rope_parameters=dict(rope_type="default", rope_theta=5000000.0),
            embedding_multiplier=12.0,
            attention_multiplier=0.015625,
            residual_multiplier=0.22,
            logits_scaling=8.0,
            attention_dropout=0.1,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
        ),
    ),
    # gemma-2-2b: 2.61B parameters (tied), 8 query and 4 KV heads of 256; sliding-window (4096) and global layers
    # alternating, attention logits soft-capped at 50 and final logits at 30, four norms a layer
    "gemma2-2b-random": (
        Gemma2Config,
        dict(
            vocab_size=256000,
            hidden_size=2304,
            intermediate_size=9216,
            num_hidden_layers=_GEMMA2_2B_LAYERS,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=256,
            query_pre_attn_scalar=256,
            hidden_activation="gelu_pytorch_tanh",
            max_position_embeddings=8192,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            sliding_window=4096,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(_GEMMA2_2B_LAYERS)],
            attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=1,
        ),
    ),
    # Mixtral-8x7B's layer (32 query and 8 KV heads of 128, 8 experts 14336 wide, 2 of them per token) in 8 of its
    # 32 layers, a quarter as qwen3-moe-random keeps of Qwen3-30B-A3B's: 11.9B parameters (Mixtral-8x7B: 46.7B),
    # 24 GB in bfloat16 and 47 GB in the bench's default float32, so it fits one 80 GB GPU with room for the caches;
    # 3.3B of them read per token at batch 1
    "mixtral-random": (
        MixtralConfig,
        dict(
            vocab_size=32000,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=8,
            num_attention_heads=32,
            num_key_value_heads=8,
            num_local_experts=8,
            num_experts_per_tok=2,
            router_aux_loss_coef=0.02,
            max_position_embeddings=32768,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            sliding_window=None,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
    # gpt-oss-20b's layer (64 query and 8 KV heads of 64 with biases and a sink logit per head, 32 experts 2880 wide
    # with biases, 4 of them per token, the clamped SwiGLU) in 12 of its 24 layers, sliding (128 tokens) and full
    # alternating; YaRN from 4096 to 131072 positions: 11.0B parameters (gpt-oss-20b: 20.9B, its experts in MXFP4;
    # here every weight in the asked dtype); no BOS id in its config
    "gpt-oss-random": (
        GptOssConfig,
        dict(
            vocab_size=201088,
            hidden_size=2880,
            intermediate_size=2880,
            num_hidden_layers=_GPT_OSS_LAYERS,
            num_attention_heads=64,
            num_key_value_heads=8,
            head_dim=64,
            num_local_experts=32,
            num_experts_per_tok=4,
            router_aux_loss_coef=0.9,
            attention_bias=True,
            sliding_window=128,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(_GPT_OSS_LAYERS)],
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            tie_word_embeddings=False,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=150000.0,
                factor=32.0,
                beta_fast=32.0,
                beta_slow=1.0,
                truncate=False,
                original_max_position_embeddings=4096,
            ),
            bos_token_id=None,
            eos_token_id=200002,
            pad_token_id=199999,
        ),
    ),
}
_CAUSAL_LM = {
    "gpt2": GPT2LMHeadModel,
    "llama": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
    "qwen3_moe": Qwen3MoeForCausalLM,
    "phi3": Phi3ForCausalLM,
    "olmo2": Olmo2ForCausalLM,
    "smollm3": SmolLM3ForCausalLM,
    "granite": GraniteForCausalLM,
    "gemma2": Gemma2ForCausalLM,
    "mixtral": MixtralForCausalLM,
    "gpt_oss": GptOssForCausalLM,
}

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """`"bfloat16"` or `torch.bfloat16` -> `torch.bfloat16`; anything else is a ValueError naming `dtype`."""
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, got {dtype}")
        return dtype
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be one of {sorted(set(_DTYPES))}, got {dtype!r}")


def embedded_config(name: str):
    """The config of an embedded model name; EOS is the last vocabulary id, as in GPT-2."""
    if name == "gpt2-random":
        return GPT2Config()  # 124M: 12 layers, 768 wide, 12 heads, 1024 positions, 50257 tokens
    if name in _LLAMA_SHAPES:
        hidden, layers, heads, kv_heads, inter, tied, theta, scaling = _LLAMA_SHAPES[name]
        rope = dict(rope_type="default", rope_theta=theta) if scaling is None else dict(scaling, rope_theta=theta)
        return LlamaConfig(
            vocab_size=128256,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=inter,
            tie_word_embeddings=tied,
            max_position_embeddings=131072 if scaling else 8192,
            rms_norm_eps=1e-5,
            rope_parameters=rope,
            bos_token_id=128000,
            eos_token_id=128001,
        )
    if name in _SMALL_SHAPES:
        cls, hidden, layers, heads, kv_heads, inter, vocab, theta, eps, eos, positions = _SMALL_SHAPES[name]
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            intermediate_size=inter,
            tie_word_embeddings=True,
            max_position_embeddings=positions,
            rms_norm_eps=eps,
            rope_parameters=dict(rope_type="default", rope_theta=theta),
            bos_token_id=eos,
            eos_token_id=eos,
        )
    if name in _FAMILY_SHAPES:
        cls, kwargs = _FAMILY_SHAPES[name]
        return cls(**copy.deepcopy(kwargs))  # a config of its own: a caller may change it
    if name == "tiny-gpt2":
        return GPT2Config(
            vocab_size=1000,
            n_positions=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=999,
            eos_token_id=999,
            initializer_range=0.2,  # wider than 0.02, so random output varies (a better test of EOS)
        )
    if name == "tiny-llama":
        return LlamaConfig(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=2,
        )
    raise ValueError(f"unknown embedded model {name!r}; embedded models are {embedded_list()}")


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def check_device(device) -> torch.device:
    """`device` as a torch.device that exists on this machine (None: CUDA if available, else CPU)."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(
            f"device must be a str such as 'cpu' or 'cuda:0', a torch.device or None, got {type(device).__name__}"
        )
    if isinstance(device, int):
        raise TypeError(f"device must be a str such as 'cpu' or 'cuda:{device}', not the int {device}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"device {device!r} is not a device: use 'cpu', 'cuda' or 'cuda:N'") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ValueError(f"device {device!r}: only 'cpu' and 'cuda' devices are supported")
    if not torch.cuda.is_available():
        raise ValueError(f"device={dev} was asked for but CUDA is not available on this machine")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device={dev}: this machine has {count} CUDA device(s), indices 0-{count - 1}")
    return dev


def looks_like_path(name: str) -> bool:
    """A model name meant as a local path rather than a hub name: it starts with /, . or ~, or has more than
    one '/' (a hub id is 'name' or 'org/name', so one '/' alone does not make a path), or a backslash
    separator on Windows."""
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return True
    return os.sep != "/" and os.sep in name


def check_model_path(name_or_path) -> None:
    """Refuse, naming it as a path, a name that is meant as a local path (has a separator, or starts with
    . or ~) but is not a directory; an embedded name or a would-be hub name passes."""
    if not isinstance(name_or_path, str) or not name_or_path:
        raise TypeError(f"name_or_path must be a non-empty string, got {name_or_path!r}")
    if name_or_path in EMBEDDED:
        return
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise ValueError(f"path {name_or_path} is a file, not a model directory (saved with save_pretrained)")
    if looks_like_path(name_or_path):
        raise ValueError(
            f"path {name_or_path} does not exist (give a model directory, a hub name or one of {embedded_list()})"
        )


def _hub_unreachable(timeout: float = 5.0) -> str | None:
    """Why the Hugging Face hub cannot be reached from here, or None (reachable, or behind a proxy, which only
    the hub client knows how to use)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    if any(
        os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
    ):
        return None
    url = urllib.parse.urlsplit(constants.ENDPOINT)
    try:
        socket.create_connection(
            (url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout=timeout
        ).close()
    except OSError as err:
        return f"{url.hostname}: {err.strerror or err}"
    return None


def pretrained_config(name_or_path: str, what: str | None = None):
    """The config of a directory or hub name, checked to be a decoder-only causal LM (inputs.check_causal_config)
    before any weight is read; from_pretrained's own errors otherwise.

    A hub name is looked up in the local Hugging Face cache first; one that is not there while the hub cannot
    be reached is an OSError at once (the hub client retries for about 30 s before it says so). `what` starts
    the message of a config that is no causal LM (default: "name_or_path NAME")."""
    check_model_path(name_or_path)
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        config = AutoConfig.from_pretrained(path)
    else:
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True)
        except OSError:
            why = _hub_unreachable()
            if why is not None:
                raise OSError(
                    f"{name_or_path} is neither a directory nor in the local Hugging Face cache, and the "
                    f"hub cannot be reached to look it up ({why})"
                ) from None
            config = AutoConfig.from_pretrained(path)
    check_causal_config(config, what or f"name_or_path {name_or_path}")
    return config


def _embedded_attention(cls, config, asked: str) -> str:
    """The attention implementation an embedded model is built with: `asked`, but eager in place of SDPA for a class
    that has no SDPA attention (gpt-oss) and for a config that soft-caps the attention logits (Gemma 2: Hugging Face's
    SDPA attention skips the cap, and later transformers versions refuse the pair)."""
    if asked == "sdpa" and (not cls._supports_sdpa or getattr(config, "attn_logit_softcapping", None) is not None):
        return "eager"
    return asked


def load_model(
    name_or_path: str,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    seed: int = 0,
    attn_implementation: str = "sdpa",
    tp: int = 1,
    quantize: str | None = None,
    group_size: int = 128,
):
    """Return a causal LM in eval mode on `device` (default: CUDA if available, else CPU).

    `name_or_path` is an embedded name (see EMBEDDED; random weights drawn with `seed`), a local directory
    or a hub name (both through `from_pretrained`; hub names need network access). `attn_implementation` is Hugging
    Face's; an embedded gpt-oss (no SDPA attention) or Gemma 2 (attention soft-capping) takes eager in place of SDPA.

    `tp=N` > 1, in each process of `torchrun --nproc-per-node N`: this rank's tensor-parallel shard (tp.py),
    on cuda:LOCAL_RANK when `device` is CUDA without an index; torch.distributed is started if the caller
    has not. Every rank must load with the same arguments (a ValueError on every rank otherwise) and call
    `generate` with the same arguments. Hub models and directories are read whole on the host by every rank,
    then cut; the real-size llama-*-random shapes are drawn directly as shards (random_init.py), equal to
    their tp=1 weights on the same kind of device.

    `quantize` ("int4" or "int8"; None: full precision): the decoder's linear layers and the LM head quantized as
    `od.quantize(model, quantize, group_size)` does (quant/), never two full-precision copies on the device: an
    embedded model is made on the device, then quantized matrix by matrix in place; a directory or hub model is read
    on the host and each matrix quantized as it moves to the device. Not with tp > 1 nor for mixtures of experts.
    """
    check_model_path(name_or_path)
    torch_dtype = parse_dtype(dtype)
    device = check_device(device)
    check_seed(seed, allow_none=False)
    tp = tensor_parallel.check_tp(tp)
    if quantize is not None:
        quant_model.check_scheme(quantize, group_size, name="quantize")
        if tp > 1:
            raise ValueError("quantize: tensor-parallel shards are not quantized yet; load with tp=1")

    if name_or_path in EMBEDDED:
        config = embedded_config(name_or_path)
        if quantize is not None:
            quant_model.check_config(config, "quantize")
        cls = _CAUSAL_LM[config.model_type]
        config._attn_implementation = _embedded_attention(cls, config, attn_implementation)
        place = tensor_parallel.prepare(tp, device, config)  # validates tp on every rank; starts the group
        tensor_parallel.check_same_on_every_rank(
            place, name_or_path=name_or_path, dtype=str(torch_dtype), seed=seed, attn_implementation=attn_implementation
        )
        device = place.device
        if name_or_path in _LLAMA_SHAPES or name_or_path in _SMALL_SHAPES:  # drawn as shards: a 70B never exists whole
            model = random_init.random_model(cls, config, place, torch_dtype, seed)
        else:
            # Made directly on the device in the asked dtype, then cut (small shapes; the other families' shapes,
            # which tensor parallelism has no plan for: prepare() refuses tp > 1 for them). The seed fixes the
            # weights for a given device (CPU and CUDA generators differ).
            fork = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=fork, device_type=device.type), _default_dtype(torch_dtype), device:
                torch.manual_seed(seed)
                model = cls(config)
            model = tensor_parallel.shard_(model.to(device=device, dtype=torch_dtype), place)
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.bos_token_id = config.bos_token_id
        if quantize is not None:  # in place, on the device: each matrix's full-precision storage freed as it goes
            quant_model.quantize_layers(model, quant_model.linear_layers(model), quantize, group_size)
        return model.eval()

    path = os.path.expanduser(name_or_path)
    config = pretrained_config(name_or_path)
    if quantize is not None:
        quant_model.check_config(config, "quantize")
    place = tensor_parallel.prepare(tp, device, config if tp > 1 else None)
    tensor_parallel.check_same_on_every_rank(
        place, name_or_path=name_or_path, dtype=str(torch_dtype), attn_implementation=attn_implementation
    )
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=torch_dtype, attn_implementation=attn_implementation
    )
    if quantize is not None:  # read on the host; each matrix quantized as it moves to the device
        layers = quant_model.linear_layers(model)
        return quant_model.quantize_layers(model, layers, quantize, group_size, device=place.device).eval()
    return tensor_parallel.shard_(model, place).to(place.device).eval()


# the files a saved tokenizer is made of (one at least): without any, a directory has no tokenizer
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)


def load_tokenizer(name_or_path: str):
    """The tokenizer of a model, set for generation: the byte-level one (tokenizer.py) for an embedded name,
    else the one saved with the model (hub name or directory). A directory saved without one (or with one that
    does not load) is a ValueError naming the path.

    A Hugging Face tokenizer is returned with `padding_side="left"` (generate refuses right padding, which is
    what most tokenizers are saved with) and, when it has no pad token, EOS as its pad token (GPT-2's has
    none, so `tokenizer(texts, padding=True)` would fail); padded positions are masked, so their id does not
    change the tokens.
    """
    check_model_path(name_or_path)
    if name_or_path in EMBEDDED:
        cfg = embedded_config(name_or_path)
        return ByteTokenizer(cfg.vocab_size, eos_token_id=cfg.eos_token_id, bos_token_id=cfg.bos_token_id)
    from transformers import AutoTokenizer  # optional and slow to import: only for hub models and directories

    path = os.path.expanduser(name_or_path)
    none_here = (
        f"{name_or_path}: no tokenizer in this directory (save one beside the model with tokenizer.save_pretrained)"
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        if not os.path.isdir(path):
            raise
        if not any(os.path.exists(os.path.join(path, n)) for n in _TOKENIZER_FILES):
            raise ValueError(none_here) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{name_or_path}: its tokenizer does not load ({type(err).__name__}: {first})") from None
    # transformers 5 builds an empty tokenizer (no vocabulary) for a directory saved without one
    if getattr(tokenizer, "vocab_size", 1) == 0:
        raise ValueError(none_here)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
