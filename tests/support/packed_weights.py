"""Quantized weights for the kernel tests: a random weight quantized and packed as the fused kernels read it, and the
exact (float64) product of x with the stored numbers, against which two ways of computing it are compared."""

from __future__ import annotations

import torch

from overlapdecode.quant import Fp8Linear, Int4Linear, Int8Linear, PackedWeight
from overlapdecode.quant.schemes import unpack_int4


def packed_weight(
    N: int, K: int, scheme: str, group_size: int | None, seed: int = 0, device="cpu", dtype=torch.float32
) -> PackedWeight:
    """A random (N, K) weight of `dtype` quantized, with a whole group of equal weights (row 0's first), a group's
    first weights equal (the rest of it random) and an all-zero row (the last)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * K**-0.5
    w[0, : group_size or K] = 0.05
    w[N // 2, : min(K, 5)] = -0.02
    w[-1] = 0.0
    w = w.to(dtype)
    layer = (
        Int4Linear(w, None, group_size) if scheme == "int4" else {"int8": Int8Linear, "fp8": Fp8Linear}[scheme](w, None)
    )
    p = layer.packed()
    moved = {k: getattr(p, k).detach().to(device) for k in ("q", "scales", "zeros") if getattr(p, k) is not None}
    return p._replace(**moved)


def exact_product(x: torch.Tensor, w: PackedWeight) -> torch.Tensor:
    """x @ w'^T in float64 from the stored numbers of an int4 weight: sum_k x (q - z) s, no rounding but float64's."""
    N, K = w.shape
    G = w.scales.shape[1]
    q = unpack_int4(w.q, G * w.group_size).double().view(N, G, w.group_size)
    wd = ((q - w.zeros.double()[..., None]) * w.scales.double()[..., None]).view(N, -1)[:, :K]
    return x.double() @ wd.T
