"""Quantize a Hugging Face causal LM in place: every linear layer of the decoder and the LM head becomes an
Int4Linear, Int8Linear or Fp8Linear (modules.py); embeddings, norms and biases stay as they are. The config
records the scheme (`MARKER`), so that a saved quantized model loads back as one (load_model).

A tied LM head (GPT-2's, Llama-3.2-1B's) is quantized as the head while the embedding table keeps its
full-precision weight: the two are untied (config.tie_word_embeddings off), so that Hugging Face never ties them
back. GPT-2's Conv1D layers (weights stored (in, out)) are quantized from their (out, in) transpose. Mixtures of
experts (their experts are stacked tensors, not linear layers) and tensor-parallel shards are refused.
"""

from __future__ import annotations

import torch
from torch import nn

from .modules import QUANTIZED, Fp8Linear, Int4Linear, Int8Linear
from .packed import SCHEMES

# config fields naming routed experts (as bench/worker.py reads them)
_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
# the config field that says a model's layers are quantized: save_pretrained writes it into config.json and
# load_model reads the directory back as such (models/prequantized.py `load_saved`)
MARKER = "overlapdecode_quantization"


def mark(model, scheme: str, group_size: int | None) -> None:
    """Record in `model.config` that its quantized layers are `scheme` (int4: `group_size` input features a group,
    None for a whole row). Hugging Face's own from_pretrained does not read such a directory (its shapes differ)."""
    setattr(model.config, MARKER, {"scheme": scheme, "group_size": group_size if scheme == "int4" else None})


def check_scheme(scheme, group_size, name: str = "scheme") -> None:
    """A scheme of SCHEMES and, for int4, a positive int group size; else a ValueError naming the argument
    (`name`: the scheme's argument, `quantize` for load_model)."""
    if not isinstance(scheme, str) or scheme not in SCHEMES:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, SCHEMES))}, got {scheme!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(
            f"group_size must be a positive int (the input features sharing an int4 scale and zero point), got "
            f"{group_size!r}"
        )


def check_config(config, name: str = "model") -> None:
    """Refuse, from the config alone, what quantize does not take: a mixture of experts."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if any(getattr(text, f, None) for f in _EXPERT_FIELDS):
        raise ValueError(
            f"{name}: quantize does not support mixtures of experts yet ({getattr(text, 'model_type', '?')}: its "
            f"experts are stacked tensors, not linear layers); load it without quantize"
        )


def _conv1d_class():
    from transformers.pytorch_utils import Conv1D

    return Conv1D


def linear_layers(model, meta: bool = False) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute, layer) for every nn.Linear and Conv1D of `model`, checked to be a causal LM quantize
    takes (ValueError naming `model` otherwise). `meta`: the model may still be on the meta device (its weights
    drawn and quantized one layer at a time, models/random_init.py)."""
    if not isinstance(model, nn.Module) or not hasattr(getattr(model, "config", None), "get_text_config"):
        raise ValueError(
            f"model must be a Hugging Face causal LM (e.g. from overlapdecode.load_model), got {type(model).__name__}"
        )
    check_config(model.config)
    if any(name.rsplit(".", 1)[-1].endswith("experts") for name, _ in model.named_modules()):
        raise ValueError("model: quantize does not support mixtures of experts yet; use the model unquantized")
    from ..tp.shard import is_sharded

    if is_sharded(model):
        raise ValueError("model: quantize does not support tensor-parallel shards; quantize with tp=1")
    done = {m.scheme for m in model.modules() if isinstance(m, QUANTIZED)}
    if done:
        raise ValueError(f"model is already quantized ({', '.join(sorted(done))}); load it again to quantize it anew")
    if not meta and any(p.is_meta for p in model.parameters()):
        raise ValueError("model has weights on the meta device (never loaded); load it first")
    kinds = (nn.Linear, _conv1d_class())
    found = [
        (parent, attr, child)
        for parent in model.modules()
        for attr, child in parent.named_children()
        if isinstance(child, kinds)
    ]
    if not found:
        raise ValueError(f"model {type(model).__name__} has no linear layer to quantize")
    return found


def quantize(model, scheme: str = "int4", group_size: int = 128):
    """Quantize `model`'s decoder linear layers and LM head in place (`scheme` "int4", "int8" or "fp8";
    `group_size`: int4's input features per scale and zero point; int8 and fp8 have one scale per output row and
    ignore it); returns the model. Its weights then take their packed size on the device (no full-precision copy
    is kept); every strategy runs it, and Hugging Face's generate() too. docs/QUANTIZATION.md has the formulas and
    the layout."""
    check_scheme(scheme, group_size)
    return quantize_layers(model, linear_layers(model), scheme, group_size)


@torch.no_grad()
def quantize_layers(model, layers, scheme: str, group_size: int, device: torch.device | None = None):
    """Replace each (parent, attribute, layer) of `layers` by its quantized layer. `device`: move each weight there
    before quantizing it, then the rest of the model (load_model: a model read on the host reaches the device
    packed, one full-precision matrix at a time)."""
    made: dict[int, nn.Module] = {}  # a layer shared by two parents is quantized once
    for parent, attr, layer in layers:
        if id(layer) not in made:
            made[id(layer)] = quantized_layer(layer, scheme, group_size, device)
        setattr(parent, attr, made[id(layer)])
    untie(model)
    mark(model, scheme, group_size)
    return model if device is None else model.to(device)


@torch.no_grad()
def quantized_layer(layer: nn.Module, scheme: str, group_size: int, device: torch.device | None = None) -> nn.Module:
    """The quantized layer of one nn.Linear or Conv1D (its weight moved to `device` first, if given)."""
    weight = layer.weight.t() if isinstance(layer, _conv1d_class()) else layer.weight  # Conv1D: (in, out)
    bias = layer.bias
    if device is not None:
        weight, bias = weight.to(device), None if bias is None else bias.to(device)
    if scheme == "int4":
        return Int4Linear(weight, bias, group_size)
    return (Int8Linear if scheme == "int8" else Fp8Linear)(weight, bias)


def untie(model) -> None:
    """The LM head, quantized, is no longer the embedding's weight: Hugging Face must not tie them again."""
    for config in {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values():
        if getattr(config, "tie_word_embeddings", False):
            config.tie_word_embeddings = False
    tied = getattr(model, "all_tied_weights_keys", None)
    if tied:
        quantized = {name for name, m in model.named_modules() if isinstance(m, QUANTIZED)}
        model.all_tied_weights_keys = {k: v for k, v in tied.items() if k.rsplit(".", 1)[0] not in quantized}
