"""Random weights made directly as this rank's shard, equal to the unsharded ones whatever the tp.

Why: a 70B shape must never exist whole (141 GB in bfloat16), yet `tp=2` must give the tokens of `tp=1` on
the same random model, so the draw cannot depend on the sharding. The model is built on the meta device
(no memory), then each parameter's local part is drawn in tiles: a tile is a block of whole rows (or
columns, along the dim tensor parallelism cuts) drawn from its own generator, seeded by (seed, parameter
name, tile index). The tile size depends only on the full shape and the largest tp the config admits,
so every shard boundary of every valid tp falls between tiles, and concatenating the shards of any tp
gives exactly the tp=1 tensor. Replicated tensors are drawn in tiles too (identical on every rank).

Values: as Hugging Face initialises the Llama family: normal(0, initializer_range) for matrices (drawn
in float32, then cast, so a bfloat16 model is the rounded float32 one), zeros for biases, ones for norm
weights. Generators live on the target device (fast for a 70B shape), so a seed fixes the weights for a
given kind of device: CPU and CUDA generators differ, and CUDA's draw depends on the GPU model.
"""

from __future__ import annotations

import hashlib
import math

import torch
from torch import nn

from .. import tp as tensor_parallel
from ..quant import model as quant_model

TILE = 256  # rows (or columns) per generator: few generators for a 70B shape, small float32 temporaries


def tile_size(size: int, split: tensor_parallel.Split | None, max_tp: int) -> int:
    """Tile length along the cut dim of a `size`-long dim: divides every shard boundary of any tp that
    divides max_tp (the boundaries are multiples of size / (blocks * m)), and does not depend on tp."""
    blocks = split.blocks if split is not None else 1
    m = math.gcd(max_tp, size // blocks) if split is not None else 1
    return math.gcd(size // (blocks * m), TILE)


def tile_seed(seed: int, name: str, index: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def draw_matrix(
    name: str,
    full_shape,
    split,
    rank: int,
    tp: int,
    max_tp: int,
    std: float,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """This rank's part of a normal(0, std) matrix of `full_shape`, drawn tile by tile."""
    dim = split.dim if split is not None else 0
    size = full_shape[dim]
    t = tile_size(size, split, max_tp)
    ranges = tensor_parallel.local_ranges(size, split, rank, tp) if split is not None else [(0, size)]
    assert all(a % t == 0 and b % t == 0 for a, b in ranges), "a shard boundary inside a tile"
    local_shape = list(full_shape)
    local_shape[dim] = sum(b - a for a, b in ranges)
    out = torch.empty(local_shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device)
    tile_shape = list(full_shape)
    tile_shape[dim] = t
    at = 0
    for a, b in ranges:
        for index in range(a // t, b // t):
            gen.manual_seed(tile_seed(seed, name, index))
            tile = torch.empty(tile_shape, dtype=torch.float32, device=device).normal_(0.0, std, generator=gen)
            out.narrow(dim, at, t).copy_(tile)
            at += t
    return out


def materialize_(
    model, place: tensor_parallel.Placement, dtype: torch.dtype, seed: int, std: float, only: set | None = None
) -> None:
    """Replace every meta parameter of a full-shaped model by this rank's part of its random value, and
    rebuild the rotary embeddings (their buffers are computed, not drawn) on the device. `only`: the ids of the
    parameters to draw now (the others stay meta); parameters drawn already are kept. A parameter's value depends
    on its name and the seed alone, so drawing in parts gives the weights of one draw."""
    splits = tensor_parallel.param_splits(model)  # also at tp=1: the tiles follow the plan, not the tp
    limit = tensor_parallel.max_tp(model.config)
    owners: dict[int, list[tuple[nn.Module, str]]] = {}
    first_name: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):  # tied weights: one draw, every owner
        owner_name, _, pname = name.rpartition(".")
        owners.setdefault(id(param), []).append((model.get_submodule(owner_name), pname))
        first_name.setdefault(id(param), name)
    for key, name in first_name.items():
        module, pname = owners[key][0]
        meta = getattr(module, pname)
        if not meta.is_meta or (only is not None and key not in only):
            continue
        if meta.dim() >= 2:
            value = draw_matrix(
                name, meta.shape, splits.get(name), place.rank, place.tp, limit, std, seed, place.device, dtype
            )
        elif pname == "bias":
            split = splits.get(name)
            n = meta.shape[0] // place.tp if split is not None else meta.shape[0]
            value = torch.zeros(n, dtype=dtype, device=place.device)
        elif pname == "weight":  # norm scales
            value = torch.ones(meta.shape, dtype=dtype, device=place.device)
        else:
            raise ValueError(f"random init: no rule for parameter {name} of shape {tuple(meta.shape)}")
        param = nn.Parameter(value, requires_grad=False)
        for owner, attr in owners[key]:
            setattr(owner, attr, param)

    if only is not None:  # a part: the rotary buffers wait for the whole
        return
    for name, module in list(model.named_modules()):
        if any(b.is_meta for b in module.buffers(recurse=False)):
            if not name.endswith("rotary_emb"):
                raise ValueError(f"random init: no rule for the buffers of {name} ({type(module).__name__})")
            parent, _, child = name.rpartition(".")
            with torch.device(place.device):  # inv_freq in float32, as from_pretrained leaves it
                setattr(model.get_submodule(parent), child, type(module)(config=model.config))


def random_model(
    cls,
    config,
    place: tensor_parallel.Placement,
    dtype: torch.dtype,
    seed: int,
    quantize: str | None = None,
    group_size: int = 128,
):
    """`cls(config)` with random weights, made directly as this rank's shard on `place.device`. `quantize` (tp=1):
    each linear layer's weights drawn and quantized at once (quant.model.quantized_layer), one layer after the
    other, so that no more than one full-precision matrix exists beside the token table: a 70B shape in int4 is
    made in its packed size (the weights equal those quantized after a whole draw)."""
    with torch.device("meta"):
        model = cls(config)
    if quantize is not None:
        _quantize_as_drawn(model, place, dtype, seed, config.initializer_range, quantize, group_size)
    materialize_(model, place, dtype, seed, std=config.initializer_range)
    if place.tp > 1:
        tensor_parallel.localise_(model, place)
    return model


def _quantize_as_drawn(model, place, dtype, seed: int, std: float, scheme: str, group_size: int) -> None:
    """Each linear layer of a meta model drawn and replaced by its quantized layer before the next is drawn (a
    function of its own: no local keeps the last full-precision layer alive after it)."""
    made: dict[int, nn.Module] = {}  # a layer shared by two parents is quantized once
    layers = quant_model.linear_layers(model, meta=True)
    while layers:  # popped, so that a full-precision layer is freed once its last parent holds its packed one
        parent, attr, layer = layers.pop(0)
        if id(layer) not in made:
            materialize_(model, place, dtype, seed, std, {id(p) for p in layer.parameters()})
            made[id(layer)] = quant_model.quantized_layer(layer, scheme, group_size)
        setattr(parent, attr, made[id(layer)])
    quant_model.untie(model)
    quant_model.mark(model, scheme, group_size)
