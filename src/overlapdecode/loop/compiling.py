"""What the package's torch.compile calls share: the recompile limits a benchmark sweep needs, and the count
of graphs dynamo has compiled.

Each (model, batch, cache length, sampling setting) is one specialisation of a compiled step, and each prompt
bucket one of the fused prefill: dynamo's default limit (8 per function) would make a sweep fall back to eager
silently. The limits are raised only around the calls that may compile (a call's first compiled step, a
prefill of a new shape) and restored when they return: the process's dynamo settings are left as they were
(a config patch, which recent torch keeps per thread).
"""

from __future__ import annotations

import torch

# at least these, while a call that may compile runs
RECOMPILE_LIMITS = {"recompile_limit": 64, "accumulated_recompile_limit": 512}


def recompile_limits():
    """A context in which dynamo's recompile limits are at least RECOMPILE_LIMITS (higher ones are kept), and
    after which they are what they were."""
    cfg = torch._dynamo.config
    return cfg.patch({name: max(getattr(cfg, name), limit) for name, limit in RECOMPILE_LIMITS.items()})


def compile_count() -> int:
    """How many graphs dynamo has compiled in this process (for the no-recompilation checks)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
