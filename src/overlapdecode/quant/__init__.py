"""Weight-only quantization: int4 (per row and group, asymmetric), int8 and fp8 e4m3 (per row, symmetric); AWQ and
GPTQ int4 checkpoints read into the int4 layout (checkpoints.py).

    model = od.quantize(od.load_model("llama-1b-random"), "int4", group_size=128)
    model = od.load_model("llama-1b-random", quantize="int4")     # the same at load

schemes.py: the formulas and the int4 packing; packed.py: PackedWeight, the layout the kernels read; modules.py:
Int4Linear, Int8Linear and Fp8Linear, which replace nn.Linear in place; model.py: `quantize`, over a whole model.
The fused path reads PackedWeight in its kernels (fused/kernels/packed_weights.py). docs/QUANTIZATION.md is the
user's guide.
"""

from .model import quantize
from .modules import Fp8Linear, Int4Linear, Int8Linear
from .packed import SCHEMES, PackedWeight, dense_weight, dequantize

__all__ = ["SCHEMES", "Fp8Linear", "Int4Linear", "Int8Linear", "PackedWeight", "dense_weight", "dequantize", "quantize"]
