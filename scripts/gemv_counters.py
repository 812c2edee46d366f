"""One launch each of the batch-1 GEMV kernels at the Llama-8B and Llama-1B shapes (the down projection,
linear_residual, and gate/up, norm_linear with SiLU), with int4 weights (group 128) and bfloat16 ones, each twice,
so that Nsight Compute can read the hardware counters of the fused step's projections alone:

    ncu --clock-control none --kernel-name 'regex:_linear_split_kernel|_norm_linear_kernel' \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \\
        --section LaunchStats --section MemoryWorkloadAnalysis python3 scripts/gemv_counters.py [KEY=VALUE ...]

KEY=VALUE: tile keywords passed to both kernels (block_n, block_k, num_warps, num_stages; programs to
linear_residual only), as integers. The order of the launches: per shape, int4 then bfloat16, down then gate/up. Needs
a CUDA GPU; ncu clears the caches before each profiled launch, so every launch reads its weights from memory.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_sweep import packed  # noqa: E402

SHAPES = {"llama-8b": (4096, 14336), "llama-1b": (2048, 8192)}  # hidden, MLP width
KEYS = ("block_n", "block_k", "num_warps", "num_stages", "programs")
POWERS_OF_TWO = ("block_n", "block_k", "num_warps")  # Triton's tiles and warps


def parse(argv: list[str]) -> dict:
    tiles = {}
    for arg in argv:
        key, _, value = arg.partition("=")
        if key not in KEYS or not value.isdigit() or int(value) < 1:
            raise SystemExit(f"gemv_counters.py: {arg!r}: expected KEY=INTEGER >= 1 with KEY one of {', '.join(KEYS)}")
        if key in POWERS_OF_TWO and int(value) & (int(value) - 1):
            raise SystemExit(f"gemv_counters.py: {arg!r}: {key} must be a power of two")
        tiles[key] = int(value)
    return tiles


def main(argv=None) -> None:
    tiles = parse(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemv_counters.py: needs a CUDA GPU (the kernels are compiled for it)")
    from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual
    from overlapdecode.fused.kernels.norm_linear import norm_linear

    dt, dev = torch.bfloat16, "cuda"
    tickets = Tickets(dev)
    rand = lambda *s: torch.randn(*s, device=dev, dtype=dt) * 0.02  # noqa: E731
    gate_up_tiles = {k: v for k, v in tiles.items() if k != "programs"}
    for shape, (H, I) in SHAPES.items():
        x, norm_w, m = rand(1, H), rand(H) + 1, rand(1, I)
        for scheme in ("int4", None):
            down, gate_up = packed(rand(H, I), scheme, 128), packed(rand(2 * I, H), scheme, 128)
            for _ in range(2):
                linear_residual(m, down, None, x, tickets=tickets, dense=False, **tiles)
                norm_linear(x, norm_w, None, 1e-5, gate_up, None, "silu_mul", None, **gate_up_tiles)
            torch.cuda.synchronize()
            print(shape, scheme or "bfloat16", "launched", flush=True)


if __name__ == "__main__":
    main()
