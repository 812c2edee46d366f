"""load_model's reader of quantized checkpoints: AWQ and GPTQ int4 ones (quant/checkpoints.py has the formats),
without AutoAWQ or GPTQModel, and the quantized models save_pretrained writes (`load_saved`). The model is built
from its config with its parameters on the meta device (its buffers, such as RoPE's frequencies, computed as usual),
so no full-precision weight is ever made for a quantized layer; the safetensors files are read one tensor at a
time; each quantized linear layer (a `NAME.qweight` in an AWQ/GPTQ checkpoint, a `NAME.scales` in a saved model)
becomes an Int4Linear (Int8Linear, Fp8Linear) of its numbers, on the device; the other tensors (embeddings, norms,
an unquantized LM head) are loaded as they are, in the model's dtype.

A tensor the model has no place for, a parameter the files lack, a quantized layer that is no linear layer or whose
tensors do not fit it: each a ValueError naming it. The loaded model's config has no quantization_config any more
(its weights are overlapdecode's Int4Linear layers now, no longer in the checkpoint's layout); it records them as
overlapdecode's instead (quant/model.py `MARKER`), so that the model, saved, loads back.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re

import torch
from torch import nn

from ..quant import checkpoints
from ..quant import model as quant_model
from ..quant.modules import QUANTIZED, Fp8Linear, Int4Linear, Int8Linear
from ..quant.packed import SCHEMES, PackedWeight

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
# tensors older checkpoints hold that the model computes itself (Hugging Face skips them too)
_COMPUTED = (r"rotary_emb\.inv_freq$",)


@contextlib.contextmanager
def parameters_on_meta():
    """Modules built inside make their parameters on the meta device (no storage; their initialisation costs
    nothing) and their buffers as usual: the buffers nobody saves (RoPE's inv_freq) keep their computed values."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def tensor_files(path: str) -> dict[str, str]:
    """Tensor name -> the safetensors file holding it (one file, or the shards of an index)."""
    from safetensors import safe_open

    index = os.path.join(path, _INDEX)
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(path, _SINGLE)
    if not os.path.exists(single):
        raise ValueError(
            f"path {path}: a quantized checkpoint is read from safetensors files ({_SINGLE} or {_INDEX}); none here"
        )
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


class _Reader:
    """Reads tensors by name, each file opened once."""

    def __init__(self, files: dict[str, str]):
        self.files, self.open = files, {}

    def __call__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        file = self.files[name]
        if file not in self.open:
            self.open[file] = safe_open(file, framework="pt")
        return self.open[file].get_tensor(name)


def _conv1d_class():
    from transformers.pytorch_utils import Conv1D

    return Conv1D


def _features(module: nn.Module, name: str) -> tuple[int, int]:
    """(in_features, out_features) of a linear layer (GPT-2's Conv1D too), read from its (meta) weight's shape."""
    if isinstance(module, _conv1d_class()):
        return module.weight.shape[0], module.weight.shape[1]
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    raise ValueError(
        f"{name}: the checkpoint quantizes it, but the model's {name} is a {type(module).__name__}, not a linear layer"
    )


def load_checkpoint(path: str, config, fmt, dtype: torch.dtype, device: torch.device, attn_implementation: str):
    """The causal LM of the directory `path` (its config `config`, read as the CheckpointFormat `fmt`), its
    quantized layers Int4Linear, in `dtype` on `device`, in eval mode."""

    def layer(name: str, K: int, N: int, read, files) -> tuple[nn.Module, list[str]]:
        wanted = [t for t in checkpoints.TENSORS[fmt.method] if t != "g_idx" or f"{name}.g_idx" in files]
        _check_present(name, wanted, files)
        packed, act_order = checkpoints.repack(fmt, {t: read(f"{name}.{t}") for t in wanted}, name, K, N, dtype)
        packed = packed._replace(**{k: getattr(packed, k).to(device) for k in ("q", "scales", "zeros")})
        act_order = None if act_order is None else act_order.to(device)
        return Int4Linear.from_packed(packed, None, act_order), wanted

    model = _load(path, config, "quantization_config", ".qweight", layer, dtype, device, attn_implementation)
    quant_model.mark(model, "int4", None if fmt.group_size == -1 else fmt.group_size)  # it saves as overlapdecode's
    return model


def saved_format(config, path: str) -> tuple[str, int | None] | None:
    """(scheme, group size) of a quantized model that save_pretrained wrote, from its config's `quant_model.MARKER`
    (group size None: int8, fp8, or int4 groups of a whole row); None for a config without it; a ValueError naming
    the field for one that load_model does not read."""
    marker = getattr(config, quant_model.MARKER, None)
    if marker is None:
        return None
    scheme, group = (marker.get("scheme"), marker.get("group_size")) if isinstance(marker, dict) else (None, None)
    if scheme not in SCHEMES or not (group is None or (type(group) is int and group >= 1)):
        raise ValueError(f"path {path}: config.json's {quant_model.MARKER} is not one load_model reads: {marker!r}")
    return scheme, group


def load_saved(
    path: str,
    config,
    scheme: str,
    group: int | None,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str,
):
    """A quantized model that save_pretrained wrote (od.quantize's, load_model's, or an AWQ/GPTQ checkpoint's once
    loaded), of `scheme` and `group` (`saved_format`): each quantized layer NAME holds NAME.weight (the codes),
    NAME.scales, int4's NAME.zeros (and NAME.act_order where a GPTQ act-order checkpoint made it) in the packed
    layout (quant/packed.py); scales and zeros in `dtype`, as they are kept."""

    def layer(name: str, K: int, N: int, read, files) -> tuple[nn.Module, list[str]]:
        wanted = ["weight", "scales"] + (["zeros"] if scheme == "int4" else [])
        wanted += ["act_order"] if f"{name}.act_order" in files else []
        _check_present(name, wanted, files)
        t = {k: read(f"{name}.{k}") for k in wanted}
        G = 1 if scheme != "int4" else -(-K // (group or K))
        shapes = dict(weight=(N, -(-K // 2) if scheme == "int4" else K), scales=(N, G), zeros=(N, G), act_order=(K,))
        for k, v in t.items():
            if tuple(v.shape) != shapes[k]:
                raise ValueError(
                    f"{name}.{k}: shape {tuple(v.shape)} in the files, {shapes[k]} for {scheme} of {N}x{K}"
                )
        numbers = {k: v.to(device=device, dtype=dtype if k in ("scales", "zeros") else v.dtype) for k, v in t.items()}
        packed = PackedWeight(scheme, numbers["weight"], numbers["scales"], numbers.get("zeros"), K, group or K)
        if scheme == "int4":
            return Int4Linear.from_packed(packed, None, numbers.get("act_order")), wanted
        return (Int8Linear if scheme == "int8" else Fp8Linear).from_packed(packed), wanted

    model = _load(path, config, quant_model.MARKER, ".scales", layer, dtype, device, attn_implementation)
    quant_model.mark(model, scheme, group)
    return model


def _check_present(name: str, wanted: list[str], files) -> None:
    missing = [f"{name}.{t}" for t in wanted if f"{name}.{t}" not in files]
    if missing:
        raise ValueError(f"{name}: the checkpoint lacks {', '.join(missing)}")


def _load(path, config, field: str, suffix: str, make_layer, dtype, device, attn_implementation: str):
    """The model of `config` less its `field`, built on the meta device; each layer NAME with a NAME`suffix` tensor
    in the files is `make_layer(NAME, K, N, read, files)`'s (-> the layer, the tensor names it took, less NAME.),
    its bias read after; every other tensor loaded as it is; in `dtype` on `device`, in eval mode."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    files = tensor_files(path)
    quantized = sorted(k[: -len(suffix)] for k in files if k.endswith(suffix))
    if not quantized:
        raise ValueError(
            f"path {path}: its config has {field}, but its files hold no quantized layer (no NAME{suffix})"
        )
    config = copy.deepcopy(config)
    delattr(config, field)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    read = _Reader(files)
    taken = set()
    for name in quantized:
        parent_name, _, attr = name.rpartition(".")
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{name}{suffix}: the model ({type(model).__name__}) has no layer {name}") from None
        K, N = _features(module, name)
        quantized_layer, took = make_layer(name, K, N, read, files)
        if f"{name}.bias" in files:
            if module.bias is None:
                raise ValueError(f"{name}.bias: the model's {name} has no bias")
            quantized_layer.bias = nn.Parameter(
                read(f"{name}.bias").to(device=device, dtype=dtype), requires_grad=False
            )
            taken.add(f"{name}.bias")
        elif module.bias is not None:
            raise ValueError(f"{name}: the checkpoint lacks {name}.bias")
        model.get_submodule(parent_name).set_submodule(attr, quantized_layer)
        taken.update(f"{name}.{t}" for t in took)
    _load_plain(model, read, [k for k in files if k not in taken], dtype, device)
    if isinstance(model.get_output_embeddings(), QUANTIZED):
        quant_model.untie(model)  # a quantized head is no longer the embedding's table
    model.tie_weights()
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise ValueError(f"path {path}: the checkpoint lacks {', '.join(left[:6])}{' ...' if len(left) > 6 else ''}")
    if os.path.exists(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.to(device).eval()


def _load_plain(model, read, names: list[str], dtype: torch.dtype, device: torch.device) -> None:
    """The unquantized tensors, each in place of its meta parameter (floating point ones in `dtype`); those the
    model computes itself or declares it ignores (GPT-2's attention masks) are skipped."""
    owners = {}
    for mname, module in model.named_modules():
        kept = [b for b in module._buffers if b not in module._non_persistent_buffers_set]
        for pname in list(module._parameters) + kept:
            owners[f"{mname}.{pname}" if mname else pname] = (module, pname)
    skip = list(_COMPUTED) + list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    names = [n for n in names if not any(re.search(p, n) for p in skip)]
    unknown = [n for n in names if n not in owners]
    if unknown:
        raise ValueError(
            f"the checkpoint holds tensors the model ({type(model).__name__}) has no place for: "
            f"{', '.join(sorted(unknown)[:6])}{' ...' if len(unknown) > 6 else ''}"
        )
    for name in names:
        module, pname = owners[name]
        t = read(name)
        t = t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
        old = module._parameters.get(pname)
        if pname in module._parameters:
            if old is not None and tuple(old.shape) != tuple(t.shape):
                raise ValueError(f"{name}: shape {tuple(t.shape)} in the checkpoint, {tuple(old.shape)} in the model")
            module._parameters[pname] = nn.Parameter(t, requires_grad=old.requires_grad if old is not None else False)
        else:
            module._buffers[pname] = t
