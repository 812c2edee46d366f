"""Which Hugging Face models the fused path supports, and their weights re-laid out for it, once per model.

The decode kernels want one weight matrix per fused projection (Q, K and V rows together; gate then up
rows), row-major (out, in). Copying the weights would double the memory, so the fused tensors are made once
and the Hugging Face parameters are re-bound as VIEWS of them: the Hugging Face model keeps working, reads
the same bytes, and a second `fuse_weights` of the same model finds the views and copies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..tp import RowReduce, VocabShard, row_reduce_of

LLAMA_FAMILY = ("llama", "qwen2", "mistral")
SUPPORTED = LLAMA_FAMILY + ("gpt2",)
# Rotary variants whose frequencies do not depend on the sequence length (HF precomputes `inv_freq`).
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass
class LayerWeights:
    """One decoder layer. Matrices are (out, in) row-major; a `*_b` is None where the model has no bias."""

    norm1_w: torch.Tensor
    norm1_b: torch.Tensor | None
    w_qkv: torch.Tensor  # (Hq*D + 2*Hkv*D, H): Q rows, then K rows, then V rows
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor  # (H, Hq*D)
    b_o: torch.Tensor | None
    norm2_w: torch.Tensor
    norm2_b: torch.Tensor | None
    w_up: torch.Tensor  # Llama family: (2I, H), gate rows then up rows; GPT-2: (4H, H)
    b_up: torch.Tensor | None
    w_down: torch.Tensor  # (H, I)
    b_down: torch.Tensor | None
    scale: float  # attention score scale


@dataclass
class FusedWeights:
    family: str  # "llama" (Llama, Qwen2, Mistral) or "gpt2"
    layers: list[LayerWeights]
    embed: torch.Tensor  # (V, H)
    pos_embed: torch.Tensor | None  # (max positions, H), GPT-2's learned positions
    norm_w: torch.Tensor
    norm_b: torch.Tensor | None
    lm_head: torch.Tensor  # (V, H); the embedding itself where tied; this rank's rows of it under tp (vocab)
    n_heads: int
    n_kv_heads: int
    head_dim: int
    eps: float
    norm: str  # "rms" or "layer"
    act: str  # "silu_mul" (gate/up) or "gelu_tanh"
    inv_freq: torch.Tensor | None  # (D/2,) float32, None without RoPE
    rope_scale: float  # HF's attention_scaling, multiplies cos and sin
    sliding_window: int | None
    tp: RowReduce | None = None  # a tensor-parallel shard (tp.py): w_o and w_down are row-parallel
    vocab: VocabShard | None = None  # under tp: lm_head holds this rank's rows; the step gathers the logits

    @property
    def hidden(self) -> int:
        return self.embed.shape[1]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the fused step reads (for static-address marking and memory accounting)."""
        out = [self.embed, self.pos_embed, self.norm_w, self.norm_b, self.lm_head, self.inv_freq]
        for layer in self.layers:
            out += [v for v in vars(layer).values() if isinstance(v, torch.Tensor)]
        return [t for t in out if t is not None]


def model_family(model) -> str:
    """ "llama" or "gpt2", or a ValueError naming the supported families."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in LLAMA_FAMILY:
        return "llama"
    if model_type == "gpt2":
        return "gpt2"
    raise ValueError(
        f"model: the fused path supports the Llama family (Llama, Qwen2, Mistral) and GPT-2, got model_type "
        f"{model_type!r} ({type(model).__name__}); use another strategy for it"
    )


def fuse_weights(model) -> FusedWeights:
    """The fused weights of `model`, its parameters re-bound as views of them (no copy if already so)."""
    family = model_family(model)
    # not inference tensors, even under inference_mode: they become the Hugging Face model's parameters
    with torch.inference_mode(False), torch.no_grad():
        return _fuse_llama(model) if family == "llama" else _fuse_gpt2(model)


def shard_vocab(W: FusedWeights) -> None:
    """Under tp, make W's LM head this rank's rows of it (a view; the Hugging Face model keeps the whole) and
    W.vocab the shard that gathers the logits; nothing where unsharded or where a rank would hold no rows (a toy
    vocabulary). The tensor-parallel group is the whole world (tp.prepare checks tp == the world size)."""
    if W.tp is None or W.vocab is not None:
        return
    shard = VocabShard(W.tp.group, W.tp.rank, dist.get_world_size(), W.lm_head.shape[0])
    if shard.chunk * (shard.tp - 1) < shard.vocab:
        lo, hi = shard.rows
        W.vocab, W.lm_head = shard, W.lm_head[lo:hi]


# --- fusing rows into one tensor, parameters re-bound as views -------------------------------------------


def _is_fused_run(parts: list[torch.Tensor]) -> bool:
    """True when `parts` are contiguous, back to back, in one storage: already views of one fused tensor."""
    storage = parts[0].untyped_storage().data_ptr()
    offset = parts[0].storage_offset()
    for p in parts:
        if not p.is_contiguous() or p.untyped_storage().data_ptr() != storage or p.storage_offset() != offset:
            return False
        offset += p.numel()
    return True


def _span(parts: list[torch.Tensor]) -> torch.Tensor:
    """The tensor spanning `parts` (known to be back to back): rows concatenated, no copy."""
    rows = sum(p.shape[0] for p in parts)
    whole = torch.empty(0, dtype=parts[0].dtype, device=parts[0].device)
    return whole.set_(parts[0].untyped_storage(), parts[0].storage_offset(), (rows, *parts[0].shape[1:]))


def _fuse_rows(owners: list[tuple[nn.Module, str]]) -> torch.Tensor | None:
    """Concatenate the row blocks `getattr(module, name)` into one tensor and re-bind each as a view of it."""
    params = [getattr(m, n) for m, n in owners]
    if any(p is None for p in params):
        if not all(p is None for p in params):
            raise ValueError("model: some of the projections fused together have a bias and others not")
        return None
    if _is_fused_run(params):
        return _span(params)
    fused = torch.cat([p.detach() for p in params], dim=0)
    start = 0
    for (module, name), p in zip(owners, params):
        setattr(module, name, nn.Parameter(fused[start : start + p.shape[0]], requires_grad=p.requires_grad))
        start += p.shape[0]
    return fused


def _conv1d_out_in(module: nn.Module) -> torch.Tensor:
    """GPT-2's Conv1D keeps its weight (in, out); re-bind it as the transposed view of an (out, in) tensor."""
    w = module.weight
    if w.t().is_contiguous():
        return w.detach().t()
    out_in = w.detach().t().contiguous()
    module.weight = nn.Parameter(out_in.t(), requires_grad=w.requires_grad)
    return out_in


def _bias(module: nn.Module) -> torch.Tensor | None:
    b = getattr(module, "bias", None)
    return None if b is None else b.detach()


# --- the two families -------------------------------------------------------------------------------------


def _fuse_llama(model) -> FusedWeights:
    cfg = model.config
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise ValueError(f"model: the fused path supports the SiLU MLP, got hidden_act={cfg.hidden_act!r}")
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        raise ValueError("model: the fused path does not support sliding-window layers")
    rotary = model.model.rotary_emb
    rope_type = getattr(rotary, "rope_type", "default")
    if rope_type not in _STATIC_ROPE:
        raise ValueError(f"model: the fused path supports RoPE types {_STATIC_ROPE}, got {rope_type!r}")
    first = model.model.layers[0].self_attn
    head_dim = first.head_dim
    layers = []
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        projs = [attn.q_proj, attn.k_proj, attn.v_proj]
        layers.append(
            LayerWeights(
                norm1_w=block.input_layernorm.weight.detach(),
                norm1_b=None,
                w_qkv=_fuse_rows([(p, "weight") for p in projs]),
                b_qkv=_fuse_rows([(p, "bias") for p in projs]),
                w_o=attn.o_proj.weight.detach(),
                b_o=_bias(attn.o_proj),
                norm2_w=block.post_attention_layernorm.weight.detach(),
                norm2_b=None,
                w_up=_fuse_rows([(mlp.gate_proj, "weight"), (mlp.up_proj, "weight")]),
                b_up=_fuse_rows([(mlp.gate_proj, "bias"), (mlp.up_proj, "bias")]),
                w_down=mlp.down_proj.weight.detach(),
                b_down=_bias(mlp.down_proj),
                scale=float(attn.scaling),
            )
        )
    window = getattr(cfg, "sliding_window", None) if cfg.model_type == "mistral" else None
    return FusedWeights(
        family="llama",
        layers=layers,
        embed=model.model.embed_tokens.weight.detach(),
        pos_embed=None,
        norm_w=model.model.norm.weight.detach(),
        norm_b=None,
        lm_head=model.lm_head.weight.detach(),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        eps=float(cfg.rms_norm_eps),
        norm="rms",
        act="silu_mul",
        inv_freq=rotary.inv_freq.detach().float(),
        rope_scale=float(rotary.attention_scaling),
        sliding_window=window,
        tp=row_reduce_of(first.o_proj),
    )


def _fuse_gpt2(model) -> FusedWeights:
    cfg = model.config
    if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(
            f"model: the fused path supports GPT-2's tanh GELU, got activation_function={cfg.activation_function!r}"
        )
    if getattr(cfg, "reorder_and_upcast_attn", False):
        raise ValueError("model: the fused path does not support reorder_and_upcast_attn")
    tr = model.transformer
    layers = []
    for block in tr.h:
        attn, mlp = block.attn, block.mlp
        layers.append(
            LayerWeights(
                norm1_w=block.ln_1.weight.detach(),
                norm1_b=block.ln_1.bias.detach(),
                w_qkv=_conv1d_out_in(attn.c_attn),
                b_qkv=_bias(attn.c_attn),
                w_o=_conv1d_out_in(attn.c_proj),
                b_o=_bias(attn.c_proj),
                norm2_w=block.ln_2.weight.detach(),
                norm2_b=block.ln_2.bias.detach(),
                w_up=_conv1d_out_in(mlp.c_fc),
                b_up=_bias(mlp.c_fc),
                w_down=_conv1d_out_in(mlp.c_proj),
                b_down=_bias(mlp.c_proj),
                scale=float(attn.scaling),
            )
        )
    return FusedWeights(
        family="gpt2",
        layers=layers,
        embed=tr.wte.weight.detach(),
        pos_embed=tr.wpe.weight.detach(),
        norm_w=tr.ln_f.weight.detach(),
        norm_b=tr.ln_f.bias.detach(),
        lm_head=model.lm_head.weight.detach(),
        n_heads=cfg.n_head,
        n_kv_heads=cfg.n_head,
        head_dim=tr.h[0].attn.head_dim,  # n_head is local under tp
        eps=float(cfg.layer_norm_epsilon),
        norm="layer",
        act="gelu_tanh",
        inv_freq=None,
        rope_scale=1.0,
        sliding_window=None,
        tp=row_reduce_of(tr.h[0].attn.c_proj),
    )
