"""A quantized weight as one value, `PackedWeight`: what the quantized modules hold and what the fused path's
kernels read (fused/layout.py fuses the packed rows of Q, K and V, or of gate and up, as it fuses 16-bit rows).

The layout, chosen for the decode GEMV, where each program streams whole rows of K:

- int4: `q` (N, ceil(K / 2)) uint8, row-major, two codes per byte along K (code 2j in the low four bits of byte j,
  2j + 1 in the high four). A thread's 16-byte load is 32 consecutive weights of one row, and a warp's loads of a
  row tile are contiguous: coalesced 16-byte loads, as a 16-bit row tile's, at a quarter of its bytes. Unpacking
  is a mask and a shift per byte (`& 0xF`, `>> 4`), then the two halves interleaved back in K order; nothing
  depends on the kernel's tile size, so one layout serves every tile, split of K and orientation (the swapped
  tiles read the same rows).
- int8: `q` (N, K) int8, row-major: the 16-bit layout at half the bytes.
- fp8: `q` (N, K) float8_e4m3fn, row-major: int8's layout, the kernels converting each code to float32 in place of
  an integer one.
- `scales` (N, G) (int8, fp8: G = 1) and `zeros` (N, G) (int4; None for int8 and fp8), row-major, in the model's
  dtype, G = ceil(K / group_size): a program's rows read their few group numbers per K tile next to the codes (2 x
  2 bytes per 128 weights at group 128: 6% of the int4 bytes). Rows concatenate: Q, K, V (or gate, up) stacked along N
  are one PackedWeight of the same group size.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .schemes import dequantize_fp8, dequantize_int4, dequantize_int8

SCHEMES = ("int4", "int8", "fp8")


class PackedWeight(NamedTuple):
    """An (N, K) weight in the layout of the module docstring. `in_features` is K (the packed int4 rows are
    ceil(K / 2) bytes wide); `group_size` is K for int8 and fp8 (one scale per row)."""

    scheme: str
    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    in_features: int
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): the weight's logical shape."""
        return (self.q.shape[0], self.in_features)

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype, in which the weight is dequantized."""
        return self.scales.dtype

    @property
    def device(self) -> torch.device:
        return self.q.device

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.q, self.scales, self.zeros) if t is not None]


def dequantize(w: PackedWeight) -> torch.Tensor:
    """The (N, K) weight w' in the model's dtype (schemes.py's formulas)."""
    if w.scheme == "int4":
        return dequantize_int4(w.q, w.scales, w.zeros, w.in_features, w.group_size)
    if w.scheme == "fp8":
        return dequantize_fp8(w.q, w.scales)
    return dequantize_int8(w.q, w.scales)


def dense_weight(w):
    """A plain weight as it is, a PackedWeight dequantized: what a torch twin multiplies by."""
    return dequantize(w) if isinstance(w, PackedWeight) else w
