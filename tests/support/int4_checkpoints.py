"""AWQ (GEMM) and GPTQ int4 checkpoints written here from the formats' published packing, the reference the loader
(overlapdecode.quant.checkpoints, models/prequantized.py) is tested against, with nothing taken from the package:

- the packers: AutoAWQ's WQLinear_GEMM (nibble i of a word holds output column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i],
  zeros packed the same way), GPTQ's (qweight: nibble i of word r holds input feature 8r + i; qzeros: nibble i of
  word c holds column 8c + i, v1 storing z - 1 as an unsigned 32-bit number OR-ed in, v2 storing z);
- the published dequantizations: AWQ's (unpack, reverse the order, (q - z) * s per group) and GPTQ's
  (s[g_idx] * (q - z[g_idx]), z read as nibble + 1 in v1);
- `write_checkpoint`: a tiny Llama or Qwen2 whose linear layers hold random-but-valid codes, zero points and
  float16 scales, saved as a Hugging Face directory (safetensors, config.json with its quantization_config), and
  the reference: the same model in float32 holding the published dequantization of what was saved.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_UNDO_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
SIZES = dict(
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


def _int32(words: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit values held in int64 -> the int32 of the same bits."""
    words = words & 0xFFFFFFFF
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack_awq(values: torch.Tensor) -> torch.Tensor:
    """(R, C) values 0-15 -> (R, C / 8) int32: word c holds column 8c + AWQ_PACK_ORDER[i] at bits 4i."""
    R, C = values.shape
    words = torch.zeros(R, C // 8, dtype=torch.int64)
    for c in range(C // 8):
        for i in range(8):
            words[:, c] |= values[:, 8 * c + AWQ_PACK_ORDER[i]].long() << (4 * i)
    return _int32(words)


def pack_gptq_weight(codes: torch.Tensor) -> torch.Tensor:
    """(K, N) codes -> (K / 8, N) int32: word r holds input feature 8r + i at bits 4i."""
    K, N = codes.shape
    words = torch.zeros(K // 8, N, dtype=torch.int64)
    for r in range(K // 8):
        for i in range(8):
            words[r] |= codes[8 * r + i].long() << (4 * i)
    return _int32(words)


def pack_gptq_zeros(zeros: torch.Tensor, v1: bool) -> torch.Tensor:
    """(G, N) zero points -> (G, N / 8) int32, column 8c + i at bits 4i of word c; v1 stores z - 1 as the v1 packer
    does (an unsigned 32-bit number shifted and OR-ed in: z = 0 sets every higher bit of the word)."""
    G, N = zeros.shape
    stored = (zeros.long() - 1) & 0xFFFFFFFF if v1 else zeros.long()
    words = torch.zeros(G, N // 8, dtype=torch.int64)
    for c in range(N // 8):
        for i in range(8):
            words[:, c] |= (stored[:, 8 * c + i] << (4 * i)) & 0xFFFFFFFF
    return _int32(words)


def _nibbles(words: torch.Tensor) -> torch.Tensor:
    """(R, C) int32 -> (R, C, 8): nibble i of each word at [..., i]."""
    return torch.stack([(words >> (4 * i)) & 0xF for i in range(8)], dim=-1)


def awq_dequantize(qweight, qzeros, scales, group_size: int, dtype) -> torch.Tensor:
    """AutoAWQ's dequantize_gemm: (out, in) w' in `dtype` (the scales cast to it first)."""
    undo = torch.arange(qweight.shape[1] * 8).view(-1, 8)[:, AWQ_UNDO_ORDER].reshape(-1)
    q = _nibbles(qweight).reshape(qweight.shape[0], -1)[:, undo]
    z = _nibbles(qzeros).reshape(qzeros.shape[0], -1)[:, undo]
    s = scales.to(dtype)
    w = (q - z.repeat_interleave(group_size, 0)) * s.repeat_interleave(group_size, 0)  # (in, out)
    return w.t()


def gptq_dequantize(qweight, qzeros, scales, g_idx, v1: bool, dtype) -> torch.Tensor:
    """GPTQ's torch dequantization: w' = s[g_idx] * (q - z[g_idx]), z = nibble + 1 in v1; (out, in) in `dtype`."""
    K = qweight.shape[0] * 8
    q = _nibbles(qweight).permute(0, 2, 1).reshape(K, -1)  # (in, out): row 8r + i from nibble i of row r
    z = _nibbles(qzeros).reshape(qzeros.shape[0], -1) + (1 if v1 else 0)
    g = g_idx.long()
    return (scales.to(dtype)[g] * (q - z[g])).t()


def quant_config(method: str, group_size: int, act_order=False, v1=True, sym=False, head=False) -> dict:
    if method == "awq":
        return dict(quant_method="awq", bits=4, group_size=group_size, zero_point=True, version="gemm")
    return dict(
        quant_method="gptq",
        bits=4,
        group_size=group_size,
        desc_act=act_order,
        sym=sym,
        checkpoint_format="gptq" if v1 else "gptq_v2",
        lm_head=head,
        true_sequential=True,
        static_groups=False,
        damp_percent=0.01,
    )


def tiny_model(family: str, seed: int):
    torch.manual_seed(seed)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**SIZES)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**SIZES, tie_word_embeddings=True)).eval()  # QKV biases, a tied head


def random_numbers(K: int, N: int, group_size: int, sym: bool, v1: bool, act_order: bool, gen):
    """codes (K, N), zeros and float16 scales (G, N), g_idx (K,): valid for the format (v1 cannot store z = 0)."""
    group = K if group_size == -1 else group_size
    G = -(-K // group)
    codes = torch.randint(0, 16, (K, N), generator=gen)
    zeros = torch.full((G, N), 8) if sym else torch.randint(1 if v1 else 0, 16, (G, N), generator=gen)
    scales = (torch.rand(G, N, generator=gen) * 0.02 + 0.004).half()
    g_idx = torch.arange(K) // group
    if act_order:  # quantized in a random order: input feature perm[j] went into group j // group
        perm = torch.randperm(K, generator=gen)
        g_idx = torch.argsort(perm) // group
    return codes, zeros, scales, g_idx.to(torch.int32)


def layer_tensors(method: str, codes, zeros, scales, g_idx, v1: bool) -> dict:
    if method == "awq":
        return dict(qweight=pack_awq(codes), qzeros=pack_awq(zeros), scales=scales)
    return dict(qweight=pack_gptq_weight(codes), qzeros=pack_gptq_zeros(zeros, v1), scales=scales, g_idx=g_idx)


def published_dequantize(method: str, tensors: dict, group_size: int, v1: bool, dtype) -> torch.Tensor:
    """The format's own dequantization of one layer's saved tensors: (out, in) in `dtype`."""
    if method == "awq":
        return awq_dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"], group_size, dtype)
    g_idx = tensors["g_idx"]
    return gptq_dequantize(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx, v1, dtype)


def write_checkpoint(
    path,
    family="llama",
    method="awq",
    group_size=32,
    act_order=False,
    v1=True,
    sym=False,
    head=False,
    shards=1,
    seed=0,
    config_changes: dict | None = None,
):
    """Save a quantized tiny model at `path` (module docstring); -> (the float32 reference model holding the
    published dequantization of every quantized layer and the saved float16 values of the rest, {layer name:
    its saved tensors})."""
    os.makedirs(path, exist_ok=True)
    model = tiny_model(family, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.half().float())  # what a float16 checkpoint holds
    tensors, layers = {}, {}
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and (head or n != "lm_head")]
    for name in names:
        module = model.get_submodule(name)
        K, N = module.in_features, module.out_features
        numbers = random_numbers(K, N, group_size, sym, v1, act_order and method == "gptq", gen)
        layers[name] = layer_tensors(method, *numbers, v1)
        tensors.update({f"{name}.{k}": v for k, v in layers[name].items()})
        if module.bias is not None:
            tensors[f"{name}.bias"] = module.bias.detach().half()
        w = published_dequantize(method, layers[name], K if group_size == -1 else group_size, v1, torch.float32)
        if name == "lm_head":  # quantized head: no longer the embedding's table
            model.config.tie_word_embeddings = False
        module.weight = torch.nn.Parameter(w.contiguous(), requires_grad=False)
    skip = {f"{n}.weight" for n in names} | {f"{n}.bias" for n in names}
    if model.config.tie_word_embeddings:
        skip.add("lm_head.weight")
    tensors.update({k: v.half().contiguous() for k, v in model.state_dict().items() if k not in skip})
    _save(path, tensors, shards)
    config = model.config.to_dict()
    config["quantization_config"] = quant_config(method, group_size, act_order, v1, sym, head)
    config.update(config_changes or {})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return model, layers


def _save(path, tensors: dict, shards: int) -> None:
    if shards == 1:
        save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
        return
    keys = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k] for k in keys[i::shards]}
        save_file(part, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)


def saved_tensors(path) -> dict:
    """Every tensor of a checkpoint directory, by name."""
    files = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    return {k: v for f in files for k, v in load_file(os.path.join(path, f)).items()}
