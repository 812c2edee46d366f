"""The quantized linear layers, one class per scheme (int4, int8, fp8), each replacing an nn.Linear (or GPT-2's
Conv1D) in place: its forward dequantizes the weight, then multiplies (plain PyTorch, so the eager and compiled
presets and Hugging Face's own generate() run the quantized model as it is).

Each holds its packed weight as parameters (requires_grad off), so that moving the model moves them, and counting
its parameters' bytes counts the quantized size: `weight` is the packed codes (N rows, as nn.Linear's weight:
`weight.shape[0]` is still the output size), `scales` and `zeros` the group numbers, `bias` the layer's own.
The layout is packed.py's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .packed import PackedWeight
from .schemes import dequantize_fp8, dequantize_int4, dequantize_int8, quantize_fp8, quantize_int4, quantize_int8


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class Int4Linear(nn.Module):
    """y = x @ w'.T + b with w' = (q - z) * s (schemes.py): int4 codes two per byte along K, a scale and a zero point
    per row and group of `group_size` input features.

    `act_order` (a buffer, None unless the layer was read from a GPTQ act-order checkpoint: quant/checkpoints.py):
    the packed rows hold the input features sorted by group, and input feature k is their column act_order[k]; the
    forward puts the dequantized columns back in input order. The fused kernels do not read such layers."""

    scheme = "int4"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group_size: int):
        """Quantize `weight` (out_features, in_features); `bias` is kept as it is."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group_size = group_size
        q, scales, zeros = quantize_int4(weight.detach(), group_size)
        self.weight, self.scales, self.zeros = _frozen(q), _frozen(scales), _frozen(zeros)
        self.bias = None if bias is None else _frozen(bias.detach())
        self.register_buffer("act_order", None)

    @classmethod
    def from_packed(
        cls, w: PackedWeight, bias: torch.Tensor | None = None, act_order: torch.Tensor | None = None
    ) -> Int4Linear:
        """A layer of numbers already quantized and packed (an AWQ or GPTQ checkpoint's, repacked)."""
        if w.scheme != "int4":
            raise ValueError(f"w: an int4 PackedWeight expected, got {w.scheme}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = w.shape
        layer.group_size = w.group_size
        layer.weight, layer.scales, layer.zeros = _frozen(w.q), _frozen(w.scales), _frozen(w.zeros)
        layer.bias = None if bias is None else _frozen(bias.detach())
        layer.register_buffer("act_order", act_order)
        return layer

    def packed(self) -> PackedWeight:
        """The packed numbers as stored (with act_order: the input features sorted by group)."""
        return PackedWeight("int4", self.weight, self.scales, self.zeros, self.in_features, self.group_size)

    def dequantized(self) -> torch.Tensor:
        """w' (out_features, in_features), its columns in input order."""
        w = dequantize_int4(self.weight, self.scales, self.zeros, self.in_features, self.group_size)
        return w if self.act_order is None else w.index_select(1, self.act_order)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized(), self.bias)

    def extra_repr(self) -> str:
        order = ", act_order=True" if self.act_order is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}{order}"


class RowScaledLinear(nn.Module):
    """y = x @ w'.T + b with w' = q * s (schemes.py): codes of the subclass's scheme, a scale per output row, no
    zero points. Int8Linear and Fp8Linear differ in their codes alone."""

    scheme = ""  # the subclass's
    quantize_rows = dequantize_rows = None  # schemes.py's pair for the scheme

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        """Quantize `weight` (out_features, in_features); `bias` is kept as it is."""
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scales = type(self).quantize_rows(weight.detach())
        self.weight, self.scales = _frozen(q), _frozen(scales)
        self.zeros = None  # symmetric: no zero points
        self.bias = None if bias is None else _frozen(bias.detach())

    @classmethod
    def from_packed(cls, w: PackedWeight, bias: torch.Tensor | None = None) -> RowScaledLinear:
        """A layer of numbers already quantized (a saved model's)."""
        if w.scheme != cls.scheme:
            raise ValueError(f"w: a {cls.scheme} PackedWeight expected, got {w.scheme}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.out_features, layer.in_features = w.shape
        layer.weight, layer.scales, layer.zeros = _frozen(w.q), _frozen(w.scales), None
        layer.bias = None if bias is None else _frozen(bias.detach())
        return layer

    @property
    def group_size(self) -> int:
        return self.in_features

    def packed(self) -> PackedWeight:
        return PackedWeight(self.scheme, self.weight, self.scales, None, self.in_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, type(self).dequantize_rows(self.weight, self.scales), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Int8Linear(RowScaledLinear):
    """int8 codes, a scale per output row."""

    scheme = "int8"
    quantize_rows, dequantize_rows = staticmethod(quantize_int8), staticmethod(dequantize_int8)


class Fp8Linear(RowScaledLinear):
    """float8_e4m3fn codes, a scale per output row."""

    scheme = "fp8"
    quantize_rows, dequantize_rows = staticmethod(quantize_fp8), staticmethod(dequantize_fp8)


QUANTIZED = (Int4Linear, Int8Linear, Fp8Linear)
