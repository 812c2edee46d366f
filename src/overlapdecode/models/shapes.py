"""The embedded random-weight models' shapes, as data: each is the published config of the model it is named
after (loading.embedded_config builds the config; random weights are drawn on the device, random_init.py).

Four tables: the real-size Llama-3 shapes and the smaller Llama-family ones as tuples (both drawn as
tensor-parallel shards where asked), the other families' configs as (config class, its arguments), and as those
GPT-2 124M itself with the CPU tests' tiny shapes.
"""

from __future__ import annotations

from transformers import (
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    GptOssConfig,
    GraniteConfig,
    LlamaConfig,
    MixtralConfig,
    Olmo2Config,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
    SmolLM3Config,
)

# Llama-3.2's RoPE: the llama3 scaling of a base trained at 8192 positions, to 131072
_LLAMA32_ROPE = dict(
    rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)
# Real-size Llama shapes: (hidden, layers, heads, kv heads, intermediate, tied embeddings, rope theta, rope
# scaling). Llama-3.2-1B, Llama-3.2-3B, Llama-3-8B, Llama-3-70B; vocabulary 128256. Random weights, made on the
# device.
LLAMA_SHAPES = {
    "llama-1b-random": (2048, 16, 32, 8, 8192, True, 500000.0, _LLAMA32_ROPE),
    "llama-3b-random": (3072, 28, 24, 8, 8192, True, 500000.0, _LLAMA32_ROPE),
    "llama-8b-random": (4096, 32, 32, 8, 14336, False, 500000.0, None),
    "llama-70b-random": (8192, 80, 64, 8, 28672, False, 500000.0, None),
}
# Smaller Llama-family shapes, 0.36B to 1.7B parameters, 24 to 32 layers, GQA ratios 1 to 7: (config class,
# hidden, layers, heads, kv heads, intermediate, vocabulary, rope theta, RMSNorm eps, BOS = EOS id, positions).
# All tie the embeddings; the Qwen2 ones have Q/K/V biases (zeros in a random draw, as Hugging Face initialises
# them). Random weights, drawn on the device as the Llama-3 shapes are.
SMALL_SHAPES = {
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
# Qwen3-0.6B's config; Qwen3-1.7B's differs in its widths alone (loading.embedded_config copies each config's
# arguments, so the two share nothing a caller can change)
_QWEN3_0_6B = dict(
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
)
FAMILY_SHAPES = {
    # Qwen3-0.6B: 596M parameters (tied embeddings), 16 query heads of 128 over a hidden size of 1024
    "qwen3-0.6b-random": (Qwen3Config, _QWEN3_0_6B),
    # Qwen3-1.7B: 1.7B parameters (tied), Qwen3-0.6B's structure 2048 wide over 28 layers
    "qwen3-1.7b-random": (Qwen3Config, dict(_QWEN3_0_6B, hidden_size=2048, intermediate_size=6144)),
    # Qwen2.5-7B: 7.6B parameters (untied), 28 query heads of 128 and 4 KV heads, Q/K/V biases
    "qwen2.5-7b-random": (
        Qwen2Config,
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=131072,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
            bos_token_id=151643,
            eos_token_id=151643,
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
# GPT-2 124M (the bench's reference model) and the CPU tests' tiny models: (config class, its arguments)
TINY_SHAPES = {
    "gpt2-random": (GPT2Config, {}),  # 124M: 12 layers, 768 wide, 12 heads, 1024 positions, 50257 tokens
    "tiny-gpt2": (
        GPT2Config,
        dict(
            vocab_size=1000,
            n_positions=256,
            n_embd=64,
            n_layer=2,
            n_head=4,
            bos_token_id=999,
            eos_token_id=999,
            initializer_range=0.2,  # wider than 0.02, so random output varies (a better test of EOS)
        ),
    ),
    "tiny-llama": (
        LlamaConfig,
        dict(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            bos_token_id=1,
            eos_token_id=2,
        ),
    ),
}
