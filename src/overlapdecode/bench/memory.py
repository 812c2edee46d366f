"""Caching-allocator figures for one generation: peak allocated, peak reserved, fragmentation, calls.

Fragmentation here is `(peak reserved - peak allocated) / peak reserved`: the share of the memory that the
caching allocator held from the driver at its peak that no live tensor used (blocks split, cached for
reuse on a stream, or stranded between growing activations). `alloc_requests` counts tensor allocations
served by the allocator (`allocation.all.allocated` in `torch.cuda.memory_stats`), `device_mallocs` the
`cudaMalloc` calls behind them (`num_device_alloc`): the expensive ones.
"""

from __future__ import annotations

import os

import torch


def allocator_setting() -> str:
    """The allocator configuration of this process, as set before CUDA started."""
    conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    return "expandable" if "expandable_segments:True" in conf.replace(" ", "") else "default"


def start(device: torch.device) -> dict | None:
    """Empty the cache and reset the peaks; returns the counters to subtract at `stop`."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    stats = torch.cuda.memory_stats(device)
    return {k: stats.get(k, 0) for k in ("allocation.all.allocated", "num_device_alloc")}


def stop(device: torch.device, before: dict | None) -> dict:
    """Figures since `start`; all None without CUDA (the CPU has no caching allocator to report on)."""
    if before is None:
        return dict(
            peak_allocated_mb=None, peak_reserved_mb=None, fragmentation=None, alloc_requests=None, device_mallocs=None
        )
    torch.cuda.synchronize(device)
    stats = torch.cuda.memory_stats(device)
    alloc = stats["allocated_bytes.all.peak"]
    reserved = stats["reserved_bytes.all.peak"]
    return dict(
        peak_allocated_mb=alloc / 2**20,
        peak_reserved_mb=reserved / 2**20,
        fragmentation=(reserved - alloc) / reserved if reserved else 0.0,
        alloc_requests=stats.get("allocation.all.allocated", 0) - before["allocation.all.allocated"],
        device_mallocs=stats.get("num_device_alloc", 0) - before["num_device_alloc"],
    )
