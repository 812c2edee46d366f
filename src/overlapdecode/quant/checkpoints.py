"""AWQ and GPTQ int4 checkpoints in packed.py's layout: what a Hugging Face config's `quantization_config` says
(`read_format`, which refuses up front every variant not read here), and each quantized layer's tensors unpacked
in its format's published order and packed again as the project's int4 rows (`repack`), the same w' bit for bit.

Both formats store w' = (q - z) * s per output column and group of input features, as packed.py does per output
row, so repacking moves codes and numbers and computes nothing: the codes are unpacked from their int32 words,
transposed to (out, in) rows and packed two per byte along K; scales and zeros are transposed and cast to the
model's dtype (exact for float16, the checkpoints' own, and float32; bfloat16 rounds the float16 scales).

- AWQ, GEMM version (AutoAWQ's WQLinear_GEMM): `qweight` int32 (K, N / 8), `qzeros` int32 (K / group, N / 8),
  `scales` (K / group, N). A word holds 8 output columns, nibble i (bits 4i .. 4i + 3) the column 8c + AWQ_ORDER[i]
  (interleaved for its GEMM kernel's unpacking); zeros are packed the same way and stored as they are.
- GPTQ (AutoGPTQ, GPTQModel): `qweight` int32 (K / 8, N), nibble i of word r the input feature 8r + i; `qzeros`
  int32 (G, N / 8), nibble i of word c the column 8c + i; `scales` (G, N); `g_idx` int32 (K,), the group of each
  input feature. The classic format ("gptq", v1) stores z - 1 in the nibble: AutoGPTQ's dequantization reads
  z = nibble + 1 (so a nibble of 15 reads as 16, the 16 in which the v1 packer's overflow of z = 0 ends up);
  "gptq_v2" stores z. With act-order (desc_act), g_idx is no longer arange(K) // group: the input features are
  quantized in another order, each group still `group` of them. They are sorted by group here, so that the
  groups are consecutive as packed.py needs, and the layer keeps the order back (Int4Linear.act_order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .packed import PackedWeight
from .schemes import groups_of, pack_int4

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]
GPTQ_ORDER = tuple(range(8))
METHODS = ("awq", "gptq")
TENSORS = {"awq": ("qweight", "qzeros", "scales"), "gptq": ("qweight", "qzeros", "scales", "g_idx")}


@dataclass(frozen=True)
class CheckpointFormat:
    """What a checkpoint's quantization_config says, checked: `method` "awq" or "gptq", `group_size` (-1: one group
    per row), `zeros_minus_one` (GPTQ v1: the nibbles hold z - 1)."""

    method: str
    group_size: int
    zeros_minus_one: bool = False

    def __str__(self) -> str:
        version = " v1" if self.zeros_minus_one else (" v2" if self.method == "gptq" else " GEMM")
        return f"{self.method.upper()}{version} int4, group_size {self.group_size}"


def _config_dict(config) -> dict | None:
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    if not isinstance(qc, dict):
        qc = qc.to_dict() if hasattr(qc, "to_dict") else vars(qc)
    return {str(k).lower(): v for k, v in qc.items()}


def _lower(value) -> str:
    return str(getattr(value, "value", value)).lower()


def read_format(config, what: str = "quantization_config") -> CheckpointFormat | None:
    """The CheckpointFormat of a config, None when it has no quantization_config; a ValueError naming `what` and
    what was found for anything not read here (another method, bits other than 4, AWQ other than GEMM with zero
    points, GPTQ in another kernel's layout, per-module overrides)."""
    qc = _config_dict(config)
    if qc is None:
        return None
    method = _lower(qc.get("quant_method"))
    if method not in METHODS:
        raise ValueError(
            f"{what}: quant_method {qc.get('quant_method')!r} is not read by overlapdecode (it reads AWQ and GPTQ int4 "
            f"checkpoints: quant_method 'awq' or 'gptq'); load a full-precision checkpoint and pass quantize= instead"
        )
    bits = qc.get("bits", qc.get("w_bit"))
    if bits != 4:
        raise ValueError(f"{what}: {method} checkpoint of bits={bits!r}; only 4-bit checkpoints are read")
    group = qc.get("group_size", qc.get("q_group_size"))
    if isinstance(group, bool) or not isinstance(group, int) or not (group == -1 or group >= 1):
        raise ValueError(f"{what}: group_size must be a positive int or -1, got {group!r}")
    if method == "awq":
        return _awq_format(qc, group, what)
    return _gptq_format(qc, group, what)


def _awq_format(qc: dict, group: int, what: str) -> CheckpointFormat:
    version = _lower(qc.get("format") or qc.get("version") or "gemm")
    if version != "gemm":
        raise ValueError(
            f"{what}: AWQ version {version!r}; only AWQ's GEMM layout (version 'gemm') is read, not GEMV, GEMV-fast, "
            f"llm-awq, Marlin or ExLlama layouts"
        )
    backend = _lower(qc.get("backend") or "auto")
    if backend == "llm-awq":
        raise ValueError(
            f"{what}: AWQ backend 'llm-awq' packs its weights otherwise; only AutoAWQ's GEMM layout is read"
        )
    if qc.get("zero_point", True) is not True:
        raise ValueError(
            f"{what}: AWQ with zero_point={qc.get('zero_point')!r}; only AWQ with zero points (zero_point true) is read"
        )
    return CheckpointFormat("awq", group)


def _gptq_format(qc: dict, group: int, what: str) -> CheckpointFormat:
    if qc.get("is_marlin_format"):
        raise ValueError(
            f"{what}: GPTQ in Marlin's layout (is_marlin_format); only the 'gptq' and 'gptq_v2' formats are read"
        )
    fmt = _lower(qc.get("checkpoint_format") or qc.get("format") or "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(
            f"{what}: GPTQ checkpoint_format {fmt!r}; only 'gptq' (v1) and 'gptq_v2' are read, not Marlin, BitBLAS, "
            f"IPEX or other kernels' layouts"
        )
    pack = _lower(qc.get("pack_dtype") or "int32").removeprefix("torch.")
    if pack != "int32":
        raise ValueError(f"{what}: GPTQ pack_dtype {pack!r}; only int32 words are read")
    if qc.get("dynamic"):
        raise ValueError(f"{what}: GPTQ 'dynamic' per-module overrides are not read (found {qc['dynamic']!r})")
    return CheckpointFormat("gptq", group, zeros_minus_one=fmt == "gptq")


# --- unpacking -----------------------------------------------------------------------------------------------


def unpack_columns(words: torch.Tensor, order) -> torch.Tensor:
    """int32 (R, C) -> codes (R, 8C) uint8: nibble i of word c is column 8c + order[i]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    nibbles = (words.to(torch.int32)[..., None] >> shifts) & 0xF  # (R, C, 8): nibble i at [..., i]
    columns = torch.empty_like(nibbles)
    columns[..., list(order)] = nibbles  # column order[i] of each block of 8 takes nibble i
    return columns.reshape(words.shape[0], -1).to(torch.uint8)


def unpack_rows(words: torch.Tensor) -> torch.Tensor:
    """int32 (R, C) -> codes (8R, C) uint8: nibble i of word r is row 8r + i (GPTQ's qweight)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=words.device)
    nibbles = (words.to(torch.int32)[:, None, :] >> shifts[None, :, None]) & 0xF  # (R, 8, C)
    return nibbles.reshape(-1, words.shape[1]).to(torch.uint8)


def _shape_error(layer: str, name: str, got, want) -> ValueError:
    return ValueError(f"{layer}.{name}: shape {tuple(got)} does not fit the layer (expected {tuple(want)})")


def repack(
    fmt: CheckpointFormat, tensors: dict, layer: str, in_features: int, out_features: int, dtype: torch.dtype
) -> tuple[PackedWeight, torch.Tensor | None]:
    """The layer `layer`'s checkpoint tensors (TENSORS[fmt.method], g_idx optional) repacked (module docstring), for
    a layer of `in_features` K and `out_features` N: (its PackedWeight, scales and zeros in `dtype`; `act_order`,
    (K,) long or None: input feature k is column act_order[k] of the packed rows). A ValueError naming the tensor
    whose shape or content does not fit."""
    K, N = in_features, out_features
    group = K if fmt.group_size == -1 else fmt.group_size
    if N % 8 or (fmt.method == "gptq" and K % 8):
        raise ValueError(f"{layer}: {K} input and {N} output features are not whole int32 words of 8 codes")
    if fmt.method == "awq" and K % group:
        raise ValueError(f"{layer}: AWQ needs input features ({K}) a multiple of group_size ({group})")
    G = groups_of(K, group)
    qweight, qzeros, scales = (tensors[n] for n in ("qweight", "qzeros", "scales"))
    want = (K, N // 8) if fmt.method == "awq" else (K // 8, N)
    for name, t, shape in (("qweight", qweight, want), ("qzeros", qzeros, (G, N // 8)), ("scales", scales, (G, N))):
        if tuple(t.shape) != shape:
            raise _shape_error(layer, name, t.shape, shape)
    for name, t in (("qweight", qweight), ("qzeros", qzeros)):
        if t.dtype != torch.int32:
            raise ValueError(f"{layer}.{name}: dtype {t.dtype}; int32 words expected")
    if not scales.is_floating_point():
        raise ValueError(f"{layer}.scales: dtype {scales.dtype}; floating-point scales expected")
    if fmt.method == "awq":
        codes, zeros = unpack_columns(qweight, AWQ_ORDER), unpack_columns(qzeros, AWQ_ORDER)  # (K, N), (G, N)
    else:
        codes, zeros = unpack_rows(qweight), unpack_columns(qzeros, GPTQ_ORDER)
    zeros = zeros.to(torch.int16) + (1 if fmt.zeros_minus_one else 0)
    act_order = None
    if fmt.method == "gptq" and tensors.get("g_idx") is not None:
        order = _group_order(tensors["g_idx"], K, G, group, layer)
        if order is not None:
            codes, act_order = codes[order], torch.argsort(order)
    packed = PackedWeight(
        "int4",
        pack_int4(codes.t().contiguous()),
        scales.t().to(dtype).contiguous(),
        zeros.t().to(dtype).contiguous(),
        K,
        group,
    )
    return packed, act_order


def _group_order(g_idx: torch.Tensor, K: int, G: int, group: int, layer: str) -> torch.Tensor | None:
    """None where g_idx is arange(K) // group (the groups are consecutive); else the input features sorted by group
    (a stable sort), checked to give `group` features to each group as the consecutive layout does."""
    if tuple(g_idx.shape) != (K,) or g_idx.is_floating_point():
        raise _shape_error(layer, "g_idx", g_idx.shape, (K,))
    g_idx = g_idx.long()
    consecutive = torch.arange(K) // group
    if torch.equal(g_idx, consecutive):
        return None
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= G or not torch.equal(torch.sort(g_idx).values, consecutive):
        counts = torch.bincount(g_idx.clamp(0, G), minlength=G + 1)[:G].tolist()
        raise ValueError(
            f"{layer}.g_idx: its groups must hold {group} input features each (the last one the rest), as act-order "
            f"GPTQ writes them; found groups of {counts[:8]}{' ...' if G > 8 else ''} features or groups outside "
            f"0-{G - 1}"
        )
    return torch.argsort(g_idx, stable=True)
