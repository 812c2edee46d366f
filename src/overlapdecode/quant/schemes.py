"""The weight-only schemes' math in plain PyTorch: quantize an (N, K) weight (N output rows, K input features),
dequantize it back, and pack int4 codes two per byte.

int4: asymmetric, per output row and group of `group_size` consecutive input features (the last group of a row is
short where K is not a multiple of it), an integer zero point:

    s  = (max - min) / 15          at least the dtype's smallest normal number (a group of equal weights)
    z  = clamp(round(-min / s), 0, 15)
    q  = clamp(round(w / s) + z, 0, 15)
    w' = (q - z) * s

int8: symmetric, per output row:

    s  = max|w| / 127
    q  = round(w / s)              0 where s is 0 (an all-zero row: no division by zero)
    w' = q * s

fp8 (float8_e4m3fn: 4 exponent bits, 3 mantissa bits, no infinities, largest finite 448), symmetric, per output row:

    s  = max|w| / 448
    q  = fp8(clamp(w / s, -448, 448))   the cast rounds to the nearest fp8 number, halves to even; 0 where s is 0
    w' = q * s

The arithmetic is float32 (a 16-bit weight is upcast first); s is rounded to the weight's dtype, which is what is
stored, and z and q are computed with that stored s, so that w' = (q - z) * s holds exactly for the stored numbers
(in float32 the rounding changes nothing). `round` is torch.round: halves to even. The zero points, integers 0-15,
are stored in the weight's dtype too (exactly). w' is one product in the dtype: q - z (or q) is an integer or an fp8
number (4 significant bits) the dtype holds exactly, and its product with s is exact in float32, so the dtype's
correctly rounded product and float32's product rounded once to the dtype are the same bits: these functions,
torch.compile's code and the Triton kernels (float32 in registers, one rounding) dequantize alike.

Note that the zero point's clamp to 0-15 makes a group whose weights all have one sign reconstruct poorly (its
range does not contain 0: a group of positive weights gets z = 0 and q saturates at 15); groups of real weights of
32-128 features straddle 0. The formulas are kept as stated so that checkpoints with 4-bit zero points fit later.
"""

from __future__ import annotations

import torch

INT4_MAX = 15
INT8_MAX = 127
FP8_MAX = 448.0  # float8_e4m3fn's largest finite number
CHUNK_ELEMENTS = 1 << 24  # weights quantized per pass: bounds the float32 temporaries (64 MB each)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """Codes (N, K) in 0-15 -> (N, ceil(K / 2)) uint8: byte j of a row holds code 2j in its low four bits and code
    2j + 1 in its high four (0 past K)."""
    if q.shape[1] % 2:
        q = torch.cat([q, q.new_zeros(q.shape[0], 1)], dim=1)
    q = q.to(torch.uint8)
    return q[:, 0::2] | (q[:, 1::2] << 4)


def unpack_int4(packed: torch.Tensor, width: int) -> torch.Tensor:
    """(N, B) uint8 -> the codes (N, width) uint8: the low then the high four bits of each byte, cut or padded
    with 0 to `width`."""
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).view(packed.shape[0], -1)
    if codes.shape[1] >= width:
        return codes[:, :width]
    return torch.cat([codes, codes.new_zeros(codes.shape[0], width - codes.shape[1])], dim=1)


def groups_of(in_features: int, group_size: int) -> int:
    """Groups per row: ceil(K / group_size)."""
    return -(-in_features // group_size)


def _row_chunks(w: torch.Tensor):
    step = max(1, CHUNK_ELEMENTS // max(1, w.shape[1]))
    return w.split(step, dim=0)


def quantize_int4(w: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (packed (N, ceil(K / 2)) uint8, scales (N, G) and zeros (N, G) in w's dtype), G =
    ceil(K / group_size)."""
    parts = [_quantize_int4_rows(rows, group_size) for rows in _row_chunks(w)]
    return tuple(torch.cat(p, dim=0) for p in zip(*parts))


def _quantize_int4_rows(w: torch.Tensor, group_size: int):
    N, K = w.shape
    G = groups_of(K, group_size)
    wf = w.float()
    if G * group_size > K:  # the short last group: padded with its own last weight (its min and max unchanged)
        wf = torch.cat([wf, wf[:, -1:].expand(N, G * group_size - K)], dim=1)
    groups = wf.view(N, G, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # (N, G)
    s = torch.clamp((hi - lo) / INT4_MAX, min=torch.finfo(w.dtype).tiny).to(w.dtype)
    sf = s.float()
    z = torch.clamp(torch.round(-lo / sf), 0, INT4_MAX) + 0.0  # + 0.0: a zero point of -0.0 stored as 0.0
    q = torch.clamp(torch.round(groups / sf[..., None]) + z[..., None], 0, INT4_MAX)
    return pack_int4(q.view(N, -1)[:, :K]), s, z.to(w.dtype)


def dequantize_int4(
    packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, in_features: int, group_size: int
) -> torch.Tensor:
    """w' = (q - z) * s, (N, K) in the scales' dtype (scales and zeros (N, ceil(K / group_size)))."""
    N, G = scales.shape
    q = unpack_int4(packed, G * group_size).view(N, G, group_size).to(scales.dtype)
    return ((q - zeros[..., None]) * scales[..., None]).view(N, -1)[:, :in_features]


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (q (N, K) int8, scales (N, 1) in w's dtype)."""
    return _row_scaled(w, INT8_MAX, torch.int8, rounded=True)


def _row_scaled(w: torch.Tensor, top: float, dtype: torch.dtype, rounded: bool):
    """q = clamp(w / s) (rounded to integers where `rounded`), s = max|w| / top per row, in row chunks."""
    parts = []
    for rows in _row_chunks(w):
        wf = rows.float()
        s = (wf.abs().amax(dim=1, keepdim=True) / top).to(rows.dtype)
        sf = s.float()
        q = wf / torch.where(sf == 0, 1.0, sf)
        parts.append((torch.clamp(torch.round(q) if rounded else q, -top, top).to(dtype), s))
    return tuple(torch.cat(p, dim=0) for p in zip(*parts))


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """w' = q * s, (N, K) in the scales' dtype."""
    return q.to(scales.dtype) * scales


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> (q (N, K) float8_e4m3fn, scales (N, 1) in w's dtype)."""
    return _row_scaled(w, FP8_MAX, torch.float8_e4m3fn, rounded=False)


def dequantize_fp8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """w' = q * s, (N, K) in the scales' dtype."""
    return q.to(scales.dtype) * scales
