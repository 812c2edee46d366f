"""Tensor parallelism: each process of a `torchrun --nproc-per-node N` group holds 1/N of every layer.

Why: a model that one GPU cannot hold (Llama-3-70B in bfloat16) or a batch-1 step that one GPU's memory
bandwidth bounds. A decode step reads every weight once, so N GPUs each reading 1/N of the layers cut the
step's time, paid for by two all-reduces per layer.

The split (Megatron's, as in gpt-fast), done in place on a normal Hugging Face model:
- column-parallel: q/k/v and gate/up (GPT-2: `c_attn`, `c_fc`) keep 1/N of their output features, i.e. whole
  heads (GPT-2's `c_attn` holds q, k and v side by side: each of the three is split per head on its own), so
  attention runs on local heads with no communication;
- row-parallel: o_proj and down_proj (GPT-2: both `c_proj`) keep the matching 1/N of their input features;
  their partial sums are added by one all-reduce, and their bias (replicated) is added once, after it;
- embeddings and the lm-head are replicated in the Hugging Face model: every rank then computes the same full
  logits, so choosing a token needs no gather. Their cost is one embedding lookup (B rows, no bandwidth) and
  one extra read of the lm-head per step (1 GB of Llama-3-70B's 72 GB per GPU at tp=2). The `fused` step
  reads only its rank's rows of the head (a view, `VocabShard`) and gathers the logits (one all-gather of
  B x vocab/tp floats per step), so every rank still holds the same full logits.
- the config's head counts become the local ones (and `head_dim` is written out where the config derived it
  from them), so Hugging Face's StaticCache/DynamicCache, which take their shapes from the keys they are
  given and the config, hold only the local KV heads.

The all-reduce is a functional collective (`torch.ops._c10d_functional`): dynamo traces it into the compiled
step, so the compiled presets keep one graph per step and, on CUDA, it is recorded in the step's CUDA graph;
eagerly it runs on gloo (CPU) as on NCCL. The decode loop does not know the model is sharded (gpt-fast's
separation): `od.generate` is called on every rank with the same arguments and returns the full output.

Why every rank stops at the same step, by construction: after each all-reduce every rank holds the same
hidden states (NCCL and gloo hand every rank the same reduced bits), the layers between all-reduces are
the same computation on the same inputs, and the norm, lm-head and sampling are replicated; so every rank
computes the same logits, the same tokens and the same finished mask, and its stop check (whatever its lag)
reads the same flag at the same step. No rank waits in a collective that another has stopped issuing.
Sampling draws its noise from a generator seeded with `seed`: the same seed gives every rank the same noise.
With `seed=None` the seed comes from the global CPU RNG, which agrees across ranks only if every rank seeded
and used it alike: pass a seed under tp.

Fused weights (the `fused` preset, fused/layout.py) are made from the sharded model, so they come out sharded
the same way: `w_qkv` = (local q rows, local k rows, local v rows), i.e. each of the three blocks cut per
head (Split(dim=0, blocks=3), like GPT-2's `c_attn`); `w_up` = (local gate rows, local up rows)
(Split(dim=0, blocks=2)); `w_o` and `w_down` row-parallel (their input dim). Its kernels fuse the residual
add into the epilogue of `w_o` and `w_down`: `reduce_residual` keeps that, adding the residual (and bias) on
rank 0 only (the other ranks add zeros) before the one all-reduce, so the sum holds them once.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from transformers.pytorch_utils import Conv1D

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


def all_reduce_sum(x: torch.Tensor, group: str) -> torch.Tensor:
    """Sum over the tensor-parallel group. A functional collective: traced by dynamo into the compiled step
    (and its CUDA graph); eagerly it blocks the stream, not the host, until the sum is ready."""
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", group))


@dataclass(frozen=True)
class VocabShard:
    """A vocabulary-parallel LM head (the fused step's, fused/layout.py): this rank holds rows [lo, hi) of the
    (vocab, hidden) LM head, `chunk` = ceil(vocab / tp) rows per rank (the last may hold fewer, even none), and
    `gather_logits` puts every rank's logits back together. Why: the replicated head is read whole by every
    rank at every step (1.05 GB of Llama-3-8B's 9.08 GB per GPU at tp=2); sharded, each reads 1/tp of it, for
    one all-gather of B x vocab/tp float32 logits."""

    group: str
    rank: int
    tp: int
    vocab: int

    @property
    def chunk(self) -> int:
        return -(-self.vocab // self.tp)

    @property
    def rows(self) -> tuple[int, int]:
        lo = min(self.rank * self.chunk, self.vocab)
        return lo, min(lo + self.chunk, self.vocab)

    def gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """(B, hi - lo) logits of this rank's rows -> (B, vocab), the same on every rank. A functional
        all-gather, as all_reduce_sum (inside a compiled step and its CUDA graph); a rank holding fewer than
        `chunk` rows pads with -inf, which the trim drops."""
        B, n = local.shape
        if n < self.chunk:
            local = torch.nn.functional.pad(local, (0, self.chunk - n), value=float("-inf"))
        full = torch.ops._c10d_functional.wait_tensor(
            torch.ops._c10d_functional.all_gather_into_tensor(local.contiguous(), self.tp, self.group))
        return full.view(self.tp, B, self.chunk).transpose(0, 1).reshape(B, self.tp * self.chunk)[:, : self.vocab]


@dataclass(frozen=True)
class RowReduce:
    """How a row-parallel projection's partial sums are combined: the group, and this process's rank in it."""

    group: str
    rank: int


def row_reduce_of(module) -> RowReduce | None:
    """The RowReduce of a row-parallel projection, None for an unsharded one (for fused/layout.py)."""
    return module.reduce if isinstance(module, (RowParallelLinear, RowParallelConv1D)) else None


def is_sharded(model) -> bool:
    """Whether `model` is a tensor-parallel shard (holds a row-parallel projection)."""
    return any(row_reduce_of(m) is not None for m in model.modules())


class SymmetricAllReduce:
    """One-shot all-reduce over symmetric memory, for the fused decode step on CUDA (its StepGraph captures it).

    Why: a decode step's all-reduces are tiny (B x hidden: 8 KB at Llama-3-8B, batch 1) and there are two per
    layer; NCCL's fixed cost per call, even inside a CUDA graph, ate most of what tp=2 saves (H200, Llama-3-8B,
    commit 5d51a65: 4.42 -> 3.71 ms/token, 0.84x). Here each rank's kernel writes its partial sum straight
    into its own buffer of a pair that every rank mapped at rendezvous, and one kernel
    (`torch.ops.symm_mem.one_shot_all_reduce`) waits at a barrier for the peers, reads their buffers over
    NVLink and sums: no NCCL launch, no ring. The two buffers of a shape alternate: a rank can be at most one
    all-reduce ahead of another (each one starts with a barrier), so the buffer it writes next is never one
    a peer is still reading. Buffers are made (a collective rendezvous) on first use of a shape, during the
    step's first, eager run, which every rank runs in the same order.
    """

    def __init__(self, group: str, device: torch.device):
        import torch.distributed._symmetric_memory as symm_mem  # CUDA builds only

        self._symm_mem = symm_mem
        self.group = group
        self.device = device
        self._pairs: dict = {}
        self._turn: dict = {}
        if not symm_mem.is_symm_mem_enabled_for_group(group):
            symm_mem.enable_symm_mem_for_group(group)

    def buffer(self, shape, dtype) -> torch.Tensor:
        """The next buffer of this shape for a partial sum (the caller writes it, then calls `sum`)."""
        key = (tuple(shape), dtype)
        pair = self._pairs.get(key)
        if pair is None:
            pair = [self._symm_mem.empty(*shape, dtype=dtype, device=self.device) for _ in range(2)]
            for t in pair:
                self._symm_mem.rendezvous(t, self.group)  # collective: every rank, in the same order
            self._pairs[key] = pair
            self._turn[key] = 0
        turn = self._turn[key]
        self._turn[key] = 1 - turn
        return pair[turn]

    def sum(self, buf: torch.Tensor) -> torch.Tensor:
        """The sum over the group of every rank's `buf` (a new tensor; ordered on the current stream)."""
        return torch.ops.symm_mem.one_shot_all_reduce(buf, "sum", self.group)


def reduce_residual(linear_residual, x, w, b, residual, reduce: RowReduce | None,
                    symmetric: SymmetricAllReduce | None = None):
    """`linear_residual(x, w, b, residual)` = residual + x @ w.T + b, for a w holding 1/tp of its input features
    (None: unsharded, called as is). Residual and bias join on rank 0 only, then one all-reduce sums the
    partial products: a kernel that fuses the residual add into its epilogue keeps doing so. With `symmetric`
    (the fused step on CUDA) the kernel writes its partial sum into a symmetric buffer (`out=`) and the
    one-shot all-reduce sums it; otherwise the functional collective does."""
    if reduce is None:
        return linear_residual(x, w, b, residual)
    if reduce.rank != 0:
        residual, b = torch.zeros_like(residual), None
    if symmetric is None:
        return all_reduce_sum(linear_residual(x, w, b, residual), reduce.group)
    buf = symmetric.buffer(residual.shape, residual.dtype)
    return symmetric.sum(linear_residual(x, w, b, residual, out=buf))


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
        for name, module, style, _ in _layer_modules(model):
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
