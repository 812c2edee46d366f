"""What the benchmark must know of a model beyond generating with it, through one small interface:
`model_facts(model)` (its family, its decoder layers, its positions, whether `fused` serves it, its weight bytes)
and `step_weight_bytes(model, rows)` (the bytes one decode step reads at least: the floor of MBU and the toll).

The bench measures through the public API and asks here for the rest, so that it reaches into no adapter or
layout module: a model's facts are answered from the model (hf/architecture.py), from its config before it is
loaded (fused/layout.py), or from its name (models/).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from .fused.layout import act_order_layers, serves


@dataclass(frozen=True)
class ModelFacts:
    """`model_type`: its decoder config's; `layers`: its decoder layers; `positions`: the positions it has (None:
    no table); `fused`: whether strategy="fused" serves it, as far as its config tells (layout.serves) and
    Triton is installed; `weight_bytes`: its parameters' bytes, each storage once (None from a config alone)."""

    model_type: str | None
    layers: int | None
    positions: int | None
    fused: bool
    weight_bytes: int | None = None


def model_facts(model) -> ModelFacts:
    """The facts of `model`: a loaded causal LM, its config, or a model name (an embedded one, a directory or a hub
    name: only its config is read)."""
    weights, layers = None, None
    if isinstance(model, str):
        from .models.embedded import EMBEDDED
        from .models.loading import embedded_config, pretrained_config

        config = embedded_config(model) if model in EMBEDDED else pretrained_config(model)
    elif isinstance(model, torch.nn.Module):
        from .hf.architecture import describe

        config, weights, layers = model.config, weight_bytes(model), describe(model).num_layers
    else:
        config = model
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if layers is None:
        layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    positions = getattr(text, "n_positions", None) or getattr(text, "max_position_embeddings", None)
    positions = positions if isinstance(positions, int) and positions > 0 else None  # XLNet says -1: no table
    fused = serves(config) and importlib.util.find_spec("triton") is not None
    if fused and isinstance(model, torch.nn.Module) and act_order_layers(model):
        fused = False  # GPTQ act-order layers: the fused path refuses them (layout.fuse_weights)
    return ModelFacts(getattr(text, "model_type", None), layers, positions, fused, weights)


def _storage(t: torch.Tensor) -> tuple:
    """The storage a tensor lives in (views of one storage share it)."""
    return (t.untyped_storage().data_ptr(), t.device)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters, each storage counted once (tied embeddings are one tensor): what a
    decode step reads at least once."""
    seen, total = set(), 0
    for p in model.parameters():
        key = _storage(p)
        if key not in seen:
            seen.add(key)
            total += p.untyped_storage().nbytes()
    return total


# where a config names its routed experts and the experts each token is routed to (Qwen3-MoE, Mixtral, gpt-oss,
# OLMoE, DeepSeek-V3 and the like; attribute maps make several names answer for one field)
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
EXPERTS_PER_TOKEN_FIELDS = ("num_experts_per_tok", "top_k_experts", "moe_topk")


def _config_count(cfg, fields) -> int | None:
    for field in fields:
        value = getattr(cfg, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def stacked_experts(model, num_experts: int) -> list:
    """The routed experts' stacked tensors: the parameters of two or more dimensions, the first `num_experts`, of
    each module named like `experts` (`mlp.experts`: transformers 5.x's (E, 2I, H) gate_up_proj, (E, H, I)
    down_proj, gpt-oss's (E, 2I) biases), except shared experts (dense: every token runs them) and a router or gate
    inside such a module (JetMoE's: its (E, H) weight is read whole, as is its bias of H = E values). Each tensor
    once."""
    found, seen = [], set()
    for name, module in model.named_modules():
        last = name.rsplit(".", 1)[-1].lower()
        if not last.endswith("experts") or last.startswith("shared"):
            continue
        for pname, p in module.named_parameters():
            path = [part.lower() for part in pname.split(".")[:-1]]
            if any("router" in part or part.endswith("gate") for part in path):
                continue
            key = (p.untyped_storage().data_ptr(), p.device, p.storage_offset(), tuple(p.shape), p.stride())
            if p.dim() >= 2 and p.shape[0] == num_experts and key not in seen:
                seen.add(key)
                found.append(p)
    return found


def step_weight_bytes(model, rows: int) -> int:
    """The weight bytes one decode step of `rows` rows reads at least: `weight_bytes`, less what it cannot reach.
    Why: MBU and the toll measure a step against its floor, the bytes it must read at the copy bandwidth, and
    counting bytes no step reads would overstate the floor. Two kinds of tensors are read in part:
    - an embedding table (token or position) whose storage no other parameter shares: a step gathers its rows'
      entries, at most min(num_embeddings, rows) rows of it (Llama-3-8B's untied 128256 x 4096 table: 1 GB in
      bfloat16, of which one row is read at batch 1; a quantized model's unquantized table likewise). A table tied to
      the LM head is read whole by the head and counts whole.
    - a mixture of experts' routed experts: a step reads only the experts its rows were routed to, at most min(E,
      rows x k) of a layer's E (k experts per token), so each stacked expert tensor (`stacked_experts`) counts min(E,
      rows x k) / E of its bytes (Qwen3-30B-A3B at batch 1: 8 of 128 experts read).
    Routers, shared experts and everything else count whole."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    total = weight_bytes(model) - _unread_embedding_bytes(model, rows)
    cfg = model.config.get_text_config(decoder=True)
    num_experts = _config_count(cfg, EXPERT_COUNT_FIELDS)
    per_token = _config_count(cfg, EXPERTS_PER_TOKEN_FIELDS)
    if num_experts is None or per_token is None:
        return total
    unread = num_experts - min(num_experts, rows * per_token)
    for p in stacked_experts(model, num_experts):
        total -= p.numel() * p.element_size() * unread // num_experts
    return total


def _unread_embedding_bytes(model, rows: int) -> int:
    """The bytes of the embedding tables' rows a step of `rows` rows cannot gather: each nn.Embedding whose weight
    storage is no other parameter's (untied), all but min(num_embeddings, rows) of its rows."""
    owners: dict = {}
    for p in model.parameters():
        owners[_storage(p)] = owners.get(_storage(p), 0) + 1
    shared = {key for key, n in owners.items() if n > 1}
    for module in model.modules():  # a weight held by a module that is no embedding (a tied head) is shared
        if not isinstance(module, torch.nn.Embedding):
            shared.update(_storage(p) for p in module.parameters(recurse=False))
    unread, seen = 0, set()
    for module in model.modules():
        if not isinstance(module, torch.nn.Embedding):
            continue
        w = module.weight
        key = _storage(w)
        if key in shared or key in seen:
            continue
        seen.add(key)
        row_bytes = w[0].numel() * w.element_size()
        unread += (w.shape[0] - min(w.shape[0], rows)) * row_bytes
    return unread
