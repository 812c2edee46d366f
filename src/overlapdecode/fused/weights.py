"""The fused path's weights: one matrix per fused projection (Q, K and V rows together; gate then up rows),
row-major (out, in), and the model-wide tensors and settings the step reads (`FusedWeights`, `LayerWeights`).

Copying the weights would double the memory, so the fused tensors are made once and the Hugging Face parameters
are re-bound as VIEWS of them (`fuse_rows`): the Hugging Face model keeps working, reads the same bytes, and a
second re-layout of the same model finds the views and copies nothing. layout.py makes them from each family.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..quant.modules import QUANTIZED
from ..quant.packed import PackedWeight
from ..tp import RowReduce, VocabShard


@dataclass
class LayerWeights:
    """One decoder layer. Matrices are (out, in) row-major; a `*_b` is None where the model has no bias; a norm
    weight None where the layer has no such norm."""

    norm1_w: torch.Tensor | None  # None: no norm before attention (OLMo2)
    norm1_b: torch.Tensor | None
    w_qkv: torch.Tensor  # (Hq*D + 2*Hkv*D, H): Q rows, then K rows, then V rows
    b_qkv: torch.Tensor | None
    w_o: torch.Tensor  # (H, Hq*D)
    b_o: torch.Tensor | None
    norm2_w: torch.Tensor | None  # None: no norm before the MLP (OLMo2)
    norm2_b: torch.Tensor | None
    w_up: torch.Tensor  # Llama family: (2I, H), gate rows then up rows; GPT-2: (4H, H); experts: (E, 2I, H)
    b_up: torch.Tensor | None
    w_down: torch.Tensor  # (H, I); experts: (E, H, I)
    b_down: torch.Tensor | None
    scale: float  # attention score scale
    q_norm: torch.Tensor | None = None  # RMSNorm of Q before RoPE: (D,) per head (Qwen3, Gemma 3), (Hq*D,) OLMo2's
    k_norm: torch.Tensor | None = None  # of K: (D,) or (Hkv*D,)
    post_attn_w: torch.Tensor | None = None  # RMSNorm of the attention branch before its add (OLMo2, Gemma 2/3)
    post_ffn_w: torch.Tensor | None = None  # of the MLP branch
    rope: str | None = "global"  # the rotary table: "global" (FusedWeights.inv_freq), "local", None (no RoPE)
    window: int | None = None  # sliding window: keys at slots > the query's slot - window
    router: torch.Tensor | None = None  # (E, H): a layer of routed experts (w_up, w_down per expert); None: an MLP
    top_k: int = 0  # experts per token
    renorm: bool = False  # the top-k routing weights divided by their sum
    # gpt-oss: the router's bias (E,) (the experts' are b_up (E, 2I) and b_down (E, H))
    router_b: torch.Tensor | None = None
    topk_first: bool = False  # the top k of the router logits, then their softmax (gpt-oss)
    interleaved: bool = False  # the experts' gate and up rows alternate (gpt-oss)
    swiglu: tuple[float, float] | None = None  # (alpha, limit) of gpt-oss's clamped activation; None: SiLU(gate) * up
    sinks: torch.Tensor | None = None  # (Hq,) attention sink logits (gpt-oss)

    def moe_options(self) -> dict:
        """kernels/moe.py's keywords beyond Qwen3-MoE's and Mixtral's for this layer (none for those)."""
        out = dict(b_up=self.b_up, b_down=self.b_down, topk_first=self.topk_first, interleaved=self.interleaved)
        return {k: v for k, v in dict(out, swiglu=self.swiglu).items() if v is not None and v is not False}


@dataclass
class FusedWeights:
    family: str  # "llama" (Llama, Qwen2, Mistral and the DECODERS) or "gpt2"
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
    norm: str  # "rms", "layer", "rms_offset" (Gemma: (1 + w)) or "rms_f32" (OLMo2: w times the float32 x)
    act: str  # "silu_mul" (gate/up), "gelu_tanh" or "gelu_tanh_mul" (Gemma's GeGLU)
    inv_freq: torch.Tensor | None  # (R/2,) float32 (R: the rotary dims, D or fewer), None without RoPE
    rope_scale: float  # HF's attention_scaling, multiplies cos and sin
    tp: RowReduce | None = None  # a tensor-parallel shard (tp.py): w_o and w_down are row-parallel
    vocab: VocabShard | None = None  # under tp: lm_head holds this rank's rows; the step gathers the logits
    model_type: str = ""
    local_inv_freq: torch.Tensor | None = None  # Gemma 3's local layers' table (their own base frequency)
    local_rope_scale: float = 1.0
    long_inv_freq: torch.Tensor | None = None  # LongRoPE's long table, used where a forward passes rope_switch
    rope_switch: int | None = None  # LongRoPE: original_max_position_embeddings
    embed_scale: float | None = None  # Granite's embedding_multiplier; Gemma's sqrt(hidden) in the model dtype
    residual_scale: float | None = None  # Granite's residual_multiplier, on each branch before its add
    logit_div: float | None = None  # Granite's logits_scaling, dividing the logits
    logit_softcap: float | None = None  # Gemma 2's final_logit_softcapping
    attn_softcap: float | None = None  # Gemma 2's attn_logit_softcapping

    @property
    def hidden(self) -> int:
        return self.embed.shape[1]

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor the fused step reads (for static-address marking and memory accounting)."""
        out = [self.embed, self.pos_embed, self.norm_w, self.norm_b, self.lm_head, self.inv_freq]
        out += [self.local_inv_freq, self.long_inv_freq]
        for layer in self.layers:
            out += [v for v in vars(layer).values() if isinstance(v, (torch.Tensor, PackedWeight))]
        return [p for t in out if t is not None for p in (t.tensors() if isinstance(t, PackedWeight) else [t])]

    def extras(self) -> list[str]:
        """What this model asks of the step beyond the Llama family's and GPT-2's layer (empty for those)."""
        found = [
            name
            for name in ("local_inv_freq", "long_inv_freq", "embed_scale", "residual_scale", "logit_div")
            + ("logit_softcap", "attn_softcap")
            if getattr(self, name) is not None
        ]
        if self.norm not in ("rms", "layer"):
            found.append(f"norm={self.norm}")
        if self.act not in ("silu_mul", "gelu_tanh"):
            found.append(f"act={self.act}")
        if self.inv_freq is not None and 2 * self.inv_freq.numel() != self.head_dim:
            found.append("partial rotary")
        per_layer = {
            "q/k norm": lambda layer: layer.q_norm is not None,
            "post-norms": lambda layer: layer.post_attn_w is not None,
            "no pre-norm": lambda layer: layer.norm1_w is None,
            "sliding-window layers": lambda layer: layer.window is not None,
            "per-layer RoPE": lambda layer: layer.rope != "global",
            "mixture of experts": lambda layer: layer.router is not None,
            "attention sinks": lambda layer: layer.sinks is not None,
        }
        found += [name for name, has in per_layer.items() if any(has(layer) for layer in self.layers)]
        return found

    def qkv_options(self, layer: LayerWeights) -> dict:
        """norm_qkv's keywords beyond the Llama family's for `layer` (none for those)."""
        out = dict(self.norm_options())
        if layer.q_norm is not None and layer.q_norm.numel() == self.head_dim:  # per head, in the kernel
            out.update(q_norm=layer.q_norm, k_norm=layer.k_norm)
        return out

    def norm_options(self) -> dict:
        """The norm kernels' keywords beyond the Llama family's: Gemma's and OLMo2's RMSNorm roundings."""
        return dict(norm_style=self.norm) if self.norm in ("rms_offset", "rms_f32") else {}

    def head_options(self) -> dict:
        """The LM head's keywords beyond the Llama family's: its norm, Granite's division, Gemma 2's soft-cap."""
        out = dict(self.norm_options())
        if self.logit_div is not None:
            out["logit_div"] = self.logit_div
        if self.logit_softcap is not None:
            out["softcap"] = self.logit_softcap
        return out


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


def fuse_rows(owners: list[tuple[nn.Module, str]]) -> torch.Tensor | None:
    """Concatenate the row blocks `getattr(module, name)` into one tensor and re-bind each as a view of it."""
    params = [getattr(m, n) for m, n in owners]
    if any(p is None for p in params):
        if not all(p is None for p in params):
            raise ValueError("strategy 'fused': some of the projections fused together have a bias and others not")
        return None
    if _is_fused_run(params):
        return _span(params)
    fused = torch.cat([p.detach() for p in params], dim=0)
    start = 0
    for (module, name), p in zip(owners, params):
        setattr(module, name, nn.Parameter(fused[start : start + p.shape[0]], requires_grad=p.requires_grad))
        start += p.shape[0]
    return fused


def conv1d_out_in(module: nn.Module) -> torch.Tensor | PackedWeight:
    """GPT-2's Conv1D keeps its weight (in, out); re-bind it as the transposed view of an (out, in) tensor. (A
    quantized layer in its place holds (out, in) rows already.)"""
    if isinstance(module, QUANTIZED):
        return layer_weight(module)
    w = module.weight
    if w.t().is_contiguous():
        return w.detach().t()
    out_in = w.detach().t().contiguous()
    module.weight = nn.Parameter(out_in.t(), requires_grad=w.requires_grad)
    return out_in


def layer_weight(module: nn.Module) -> torch.Tensor | PackedWeight:
    """A layer's (out, in) weight: its tensor, or a quantized layer's PackedWeight (quant/packed.py)."""
    if isinstance(module, QUANTIZED):
        return _detached(module.packed())
    return module.weight.detach()


def _detached(w: PackedWeight) -> PackedWeight:
    return w._replace(**{k: getattr(w, k).detach() for k in ("q", "scales", "zeros") if getattr(w, k) is not None})


def fused_weight(modules: list[nn.Module]) -> torch.Tensor | PackedWeight:
    """The rows of `modules`' weights as one (out, in) weight, each layer's re-bound as a view of it (fuse_rows):
    quantized layers' codes, scales and zeros each fused alike, into one PackedWeight of their scheme and groups."""
    first = modules[0]
    if not isinstance(first, QUANTIZED):
        if any(isinstance(m, QUANTIZED) for m in modules):
            raise ValueError("model: some of the projections fused together are quantized and others not")
        return fuse_rows([(m, "weight") for m in modules])
    kinds = {(type(m), m.in_features, m.group_size) for m in modules}
    if len(kinds) > 1:
        raise ValueError(f"model: the projections fused together are quantized differently ({sorted(map(str, kinds))})")
    numbers = {name: fuse_rows([(m, name) for m in modules]) for name in ("weight", "scales", "zeros")}
    return _detached(first.packed()._replace(q=numbers["weight"], scales=numbers["scales"], zeros=numbers["zeros"]))


def bias_of(module: nn.Module) -> torch.Tensor | None:
    b = getattr(module, "bias", None)
    return None if b is None else b.detach()


def refuse(cfg, what: str):
    """The ValueError for a part of a model the fused step does not implement, naming it and the way out."""
    raise ValueError(
        f"strategy 'fused': the fused path does not support {cfg.model_type}'s {what}; use another strategy for it"
    )
