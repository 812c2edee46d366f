"""Tensor parallelism: each process of a `torchrun --nproc-per-node N` group holds 1/N of every layer.

Why: a model that one GPU cannot hold (Llama-3-70B in bfloat16) or a batch-1 step that one GPU's memory
bandwidth bounds. A decode step reads every weight once, so N GPUs each reading 1/N of the layers cut the
step's time, paid for by two all-reduces per layer.

shard.py cuts a Hugging Face model in place (the plans, the checks, the process group, the row-parallel
modules); collectives.py holds what the steps communicate with (the traced all-reduce, the logits gather, the
fused step's symmetric-memory all-reduce). The decode loop does not know the model is sharded (gpt-fast's
separation): `od.generate` is called on every rank with the same arguments and returns the full output.

Why every rank stops at the same step, by construction: after each all-reduce every rank holds the same
hidden states (NCCL and gloo hand every rank the same reduced bits), the layers between all-reduces are
the same computation on the same inputs, and the norm, lm-head and sampling are replicated; so every rank
computes the same logits, the same tokens and the same finished mask, and its stop check (whatever its lag)
reads the same flag at the same step. No rank waits in a collective that another has stopped issuing.
Sampling draws its noise from a generator seeded with `seed`: the same seed gives every rank the same noise.
With `seed=None` the seed comes from the global CPU RNG, which agrees across ranks only if every rank seeded
and used it alike: pass a seed under tp.
"""

from .collectives import RowReduce, SymmetricAllReduce, VocabShard, all_reduce_sum, reduce_residual
from .shard import (
    FAMILIES,
    Placement,
    RowParallelConv1D,
    RowParallelLinear,
    Split,
    check_config,
    check_same_on_every_rank,
    check_tp,
    family,
    is_sharded,
    local_ranges,
    localise_,
    max_tp,
    narrow,
    param_splits,
    prepare,
    row_reduce_of,
    shard_,
)

__all__ = [
    "FAMILIES",
    "Placement",
    "RowParallelConv1D",
    "RowParallelLinear",
    "RowReduce",
    "Split",
    "SymmetricAllReduce",
    "VocabShard",
    "all_reduce_sum",
    "check_config",
    "check_same_on_every_rank",
    "check_tp",
    "family",
    "is_sharded",
    "local_ranges",
    "localise_",
    "max_tp",
    "narrow",
    "param_splits",
    "prepare",
    "reduce_residual",
    "row_reduce_of",
    "shard_",
]
