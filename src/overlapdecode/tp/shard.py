"""Tensor-parallel sharding of a Hugging Face model, in place: the plans, the checks, the process group, and the
row-parallel modules that replace the projections they cut.

The split (Megatron's, as in gpt-fast), done in place on a normal Hugging Face model:
- column-parallel: q/k/v and gate/up (GPT-2: `c_attn`, `c_fc`) keep 1/N of their output features, i.e. whole
  heads (GPT-2's `c_attn` holds q, k and v side by side: each of the three is split per head on its own), so
  attention runs on local heads with no communication;
- row-parallel: o_proj and down_proj (GPT-2: both `c_proj`) keep the matching 1/N of their input features;
  their partial sums are added by one all-reduce (tp/collectives.py), and their bias (replicated) is added
  once, after it;
- embeddings and the lm-head are replicated in the Hugging Face model: every rank then computes the same full
  logits, so choosing a token needs no gather. Their cost is one embedding lookup (B rows, no bandwidth) and
  one extra read of the lm-head per step (1 GB of Llama-3-70B's 72 GB per GPU at tp=2). The `fused` step
  reads only its rank's rows of the head (a view, `VocabShard`) and gathers the logits (one all-gather of
  B x vocab/tp floats per step), so every rank still holds the same full logits.
- the config's head counts become the local ones (and `head_dim` is written out where the config derived it
  from them), so Hugging Face's StaticCache/DynamicCache, which take their shapes from the keys they are
  given and the config, hold only the local KV heads.

Fused weights (the `fused` preset, fused/layout.py) are made from the sharded model, so they come out sharded
the same way: `w_qkv` = (local q rows, local k rows, local v rows), i.e. each of the three blocks cut per
head (Split(dim=0, blocks=3), like GPT-2's `c_attn`); `w_up` = (local gate rows, local up rows)
(Split(dim=0, blocks=2)); `w_o` and `w_down` row-parallel (their input dim).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from transformers.pytorch_utils import Conv1D

from .collectives import RowReduce, all_reduce_sum

# model_type -> plan family; the families name their projections differently
FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2"}

# (attention or mlp module, projection) -> "column" | "row"; blocks > 1: q, k, v packed side by side
_LLAMA_PLAN = {
    "self_attn.q_proj": ("column", 1),
    "self_attn.k_proj": ("column", 1),
    "self_attn.v_proj": ("column", 1),
    "self_attn.o_proj": ("row", 1),
    "mlp.gate_proj": ("column", 1),
    "mlp.up_proj": ("column", 1),
    "mlp.down_proj": ("row", 1),
}
_GPT2_PLAN = {
    "attn.c_attn": ("column", 3),
    "attn.c_proj": ("row", 1),
    "mlp.c_fc": ("column", 1),
    "mlp.c_proj": ("row", 1),
}
_PLANS = {"llama": _LLAMA_PLAN, "gpt2": _GPT2_PLAN}


@dataclass(frozen=True)
class Placement:
    """Where this process's shard lives: its rank among `tp` and its device; `group` names the
    torch.distributed group of the all-reduces (None when tp == 1)."""

    rank: int
    tp: int
    device: torch.device
    group: str | None = None


@dataclass(frozen=True)
class Split:
    """A parameter cut along `dim`: `blocks` equal blocks (GPT-2's q, k, v), each cut into tp equal parts;
    rank r keeps part r of every block, in block order."""

    dim: int
    blocks: int = 1


def check_tp(tp) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int):
        raise TypeError(f"tp must be an int (the number of processes sharing the model), got {type(tp).__name__}")
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    return tp


def family(config) -> str:
    """The plan family of a config, or a ValueError naming `tp` and the supported model types."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(
            f"tp > 1: no sharding plan for model type {model_type!r}; supported: "
            f"{', '.join(sorted(FAMILIES))} (the Llama family and GPT-2)"
        )
    return FAMILIES[model_type]


def _head_counts(config) -> dict[str, int]:
    """Sizes that tp must divide, by name for the error message."""
    if family(config) == "gpt2":
        inner = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        return {"attention heads": config.n_head, "MLP width": inner}
    return {
        "attention heads": config.num_attention_heads,
        "KV heads": config.num_key_value_heads,
        "MLP width": config.intermediate_size,
    }


def check_config(config, tp: int) -> None:
    """ValueError naming `tp` when this model cannot be cut into tp shards. Depends on the config only, so
    every rank raises the same error at the same point, before any collective: none is left waiting."""
    if tp == 1:
        return
    for what, n in _head_counts(config).items():
        if n % tp:
            raise ValueError(f"tp={tp} does not divide the model's {n} {what}; choose a tp that divides it")


def max_tp(config) -> int:
    """The largest tp this config admits on its heads (every valid tp divides it)."""
    return math.gcd(*_head_counts(config).values())


def prepare(tp: int, device: torch.device, config) -> Placement:
    """Check tp against the model and the process group, start torch.distributed if the caller has not
    (NCCL on CUDA, gloo on CPU), and return this process's placement. tp == 1: nothing changes.

    A CUDA device without an index becomes cuda:LOCAL_RANK (one GPU per process, as torchrun numbers them).
    Every check reads only the config and the environment, the same on every rank: all ranks raise together.
    """
    tp = check_tp(tp)
    if tp == 1:
        return Placement(0, 1, device)
    check_config(config, tp)
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
    elif "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        world = int(os.environ["WORLD_SIZE"])
    else:
        raise ValueError(f"tp={tp} needs one process per shard: start the program with torchrun --nproc-per-node {tp}")
    if world != tp:
        raise ValueError(
            f"tp={tp} must equal the number of processes, but torch.distributed has {world}: "
            f"start the program with torchrun --nproc-per-node {tp}"
        )
    if device.type == "cuda":
        if device.index is None:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            if local >= torch.cuda.device_count():
                raise ValueError(
                    f"tp={tp}: process LOCAL_RANK={local} has no GPU of its own (it sees "
                    f"{torch.cuda.device_count()}); pass device='cuda:K' to choose one"
                )
            device = torch.device("cuda", local)
        torch.cuda.set_device(device)  # NCCL and the default CUDA stream follow the current device
    if not dist.is_initialized():
        if device.type == "cuda":
            dist.init_process_group(backend="nccl", device_id=device)
        else:
            dist.init_process_group(backend="gloo")
    return Placement(dist.get_rank(), tp, device, dist.group.WORLD.group_name)


def check_same_on_every_rank(place: Placement, **arguments) -> None:
    """ValueError, on every rank alike, when the ranks were given different `arguments` (load_model's).
    Why: ranks whose replicated weights differ (another seed, dtype or model) compute different logits, so
    they return different "full" outputs and may stop at different steps, one rank then waiting in a
    collective another has left. One all-gather of a few strings, at load time only."""
    if place.tp == 1:
        return
    seen = [None] * place.tp
    dist.all_gather_object(seen, arguments)  # collective: every rank, after the group is up
    differ = [k for k in arguments if any(s[k] != seen[0][k] for s in seen)]
    if differ:
        detail = "; ".join(f"{k}: " + ", ".join(f"rank {r} {s[k]!r}" for r, s in enumerate(seen)) for k in differ)
        raise ValueError(f"tp={place.tp}: every rank must call load_model with the same arguments ({detail})")


def local_ranges(size: int, split: Split, rank: int, tp: int) -> list[tuple[int, int]]:
    """[start, stop) index ranges along split.dim that rank keeps of a dim of `size`, in order."""
    block = size // split.blocks
    part = block // tp
    return [(b * block + rank * part, b * block + (rank + 1) * part) for b in range(split.blocks)]


def _layer_modules(model):
    """(projection name, module, style, blocks) for every projection the plan cuts; a ValueError when the
    model's modules do not follow its family's names."""
    plan = _PLANS[family(model.config)]
    found = []
    for name, module in model.named_modules():
        key = ".".join(name.split(".")[-2:])
        if key in plan:
            found.append((name, module, *plan[key]))
    layers = model.config.num_hidden_layers
    if len(found) != layers * len(plan):
        raise ValueError(
            f"tp > 1: found {len(found)} of the {layers * len(plan)} projections that the "
            f"{family(model.config)} sharding plan expects ({', '.join(plan)} per layer)"
        )
    return found


def param_splits(model) -> dict[str, Split]:
    """Every parameter that tensor parallelism cuts, by its name in `model.named_parameters()`.
    Parameters not listed are replicated (embeddings, norms, lm-head, row-parallel biases)."""
    splits = {}
    for name, module, style, blocks in _layer_modules(model):
        conv = isinstance(module, Conv1D)  # Conv1D stores its weight as (in, out), Linear as (out, in)
        if style == "column":
            splits[f"{name}.weight"] = Split(1 if conv else 0, blocks)
            if module.bias is not None:
                splits[f"{name}.bias"] = Split(0, blocks)
        else:
            splits[f"{name}.weight"] = Split(0 if conv else 1, blocks)
    return splits


def narrow(tensor: torch.Tensor, split: Split, rank: int, tp: int) -> torch.Tensor:
    """This rank's part of a full tensor, as a new contiguous tensor (the full one can be freed)."""
    parts = [tensor.narrow(split.dim, a, b - a) for a, b in local_ranges(tensor.shape[split.dim], split, rank, tp)]
    return torch.cat(parts, dim=split.dim) if len(parts) > 1 else parts[0].clone()


def row_reduce_of(module) -> RowReduce | None:
    """The RowReduce of a row-parallel projection, None for an unsharded one (for fused/layout.py)."""
    return module.reduce if isinstance(module, (RowParallelLinear, RowParallelConv1D)) else None


def is_sharded(model) -> bool:
    """Whether `model` is a tensor-parallel shard (holds a row-parallel projection)."""
    return any(row_reduce_of(m) is not None for m in model.modules())


class RowParallelLinear(nn.Linear):
    """A Linear holding 1/tp of the input features: partial product, all-reduce, then the bias once."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None, reduce: RowReduce):
        with torch.device("meta"):  # the parameters come from the sharded module; allocate nothing here
            super().__init__(weight.shape[1], weight.shape[0], bias=False)
        self.weight = weight
        self.bias = bias
        self.reduce = reduce

    def forward(self, x):
        y = all_reduce_sum(nn.functional.linear(x, self.weight), self.reduce.group)
        return y if self.bias is None else y + self.bias


class RowParallelConv1D(Conv1D):
    """GPT-2's Conv1D (weight (in, out)) holding 1/tp of the input features; bias added once after the sum."""

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter, reduce: RowReduce):
        with torch.device("meta"):
            super().__init__(weight.shape[1], weight.shape[0])
        self.weight = weight
        self.bias = bias
        self.reduce = reduce

    def forward(self, x):
        y = torch.mm(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], self.nf)
        return all_reduce_sum(y, self.reduce.group) + self.bias


def localise_(model, place: Placement) -> None:
    """After every cut parameter holds its local part: swap row-parallel projections for their all-reduce
    versions, set local feature counts, and make the attention modules and config count local heads."""
    tp = place.tp
    config = model.config
    for name, module, style, _ in _layer_modules(model):
        conv = isinstance(module, Conv1D)
        if style == "column":
            if conv:
                module.nf = module.weight.shape[1]
            else:
                module.out_features = module.weight.shape[0]
            continue
        cls = RowParallelConv1D if conv else RowParallelLinear
        parent_name, _, child = name.rpartition(".")
        row = cls(module.weight, module.bias, RowReduce(place.group, place.rank))
        setattr(model.get_submodule(parent_name), child, row)

    if family(config) == "gpt2":
        for name, _module, _style, _ in _layer_modules(model):
            if name.endswith("attn.c_attn"):
                attn = model.get_submodule(name.rpartition(".")[0])
                attn.num_heads //= tp
                attn.split_size //= tp  # c_attn's output is (q, k, v) of split_size features each
        head_dim = config.n_embd // config.n_head
        config.n_head //= tp
    else:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        config.num_attention_heads //= tp
        config.num_key_value_heads //= tp
    # written out: code that derives it as hidden_size // num_attention_heads would now get it wrong
    config.head_dim = head_dim


def shard_(model, place: Placement):
    """Cut a full model in place to this rank's shard (tp == 1: unchanged). Returns the model."""
    if place.tp == 1:
        return model
    splits = param_splits(model)
    for name, split in splits.items():
        owner_name, _, pname = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        full = getattr(owner, pname)
        setattr(owner, pname, nn.Parameter(narrow(full.detach(), split, place.rank, place.tp), full.requires_grad))
    localise_(model, place)
    return model
