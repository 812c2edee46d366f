"""The weight prefetch of the fused GEMVs (kernels/pdl.py, prefetch_rows): compiled for an H100/H200 (sm_90)
on this CPU machine by Triton's own compiler and ptxas, each kernel asks L2 for its weight rows with
`cp.async.bulk.prefetch.L2` before its `griddepcontrol.wait`, and without PREFETCH the instruction is gone.
What it prefetches cannot change a value (it is a hint): the GPU tests check the step's logits are equal with
and without it; here, that it is really emitted, in the right place, and that bad settings are refused."""

from __future__ import annotations

import pytest
import torch

triton = pytest.importorskip("triton")
if not hasattr(triton, "compile"):  # pragma: no cover
    pytest.skip("no Triton compiler", allow_module_level=True)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from overlapdecode.fused.kernels.linear_residual import _linear_split_kernel  # noqa: E402
from overlapdecode.fused.kernels.norm_linear import _norm_linear_kernel  # noqa: E402
from overlapdecode.fused.kernels.norm_qkv import _norm_qkv_kernel  # noqa: E402
from overlapdecode.fused.kernels.pdl import prefetch_bytes  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)


def ptx(kernel, types: dict, constants: dict) -> str:
    """The PTX of `kernel` for sm_90: `types` the Triton type of each run-time argument, `constants` the
    value of each constexpr."""
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    missing = [n for n, t in signature.items() if t == "constexpr" and n not in constants]
    assert not missing, missing
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants), target=SM90).asm["ptx"]


def cases(prefetch: int):
    common = dict(PDL=3, PREFETCH=prefetch, BLOCK_M=16)
    lin = ({**{n: "*bf16" for n in ("x_ptr", "w_ptr", "b_ptr", "res_ptr", "out_ptr")}, "part_ptr": "*fp32",
            "ticket_ptr": "*i32", "B": "i32", "N": "i32"},
           dict(common, K=3072, K_CHUNK=768, SPLIT=4, HAS_BIAS=True, BLOCK_N=32, BLOCK_K=128))
    nl = ({**{n: "*bf16" for n in ("x_ptr", "nw_ptr", "nb_ptr", "w_ptr", "b_ptr", "out_ptr")}, "B": "i32",
           "N": "i32", "eps": "fp32"},
          dict(common, K=2048, LAYER=False, HAS_BIAS=False, ACT=2, ROUND_OUT=True, BLOCK_N=32, BLOCK_K=256))
    qkv = ({**{n: "*bf16" for n in ("x_ptr", "nw_ptr", "nb_ptr", "w_ptr", "b_ptr", "q_ptr", "k_ptr", "v_ptr")},
            "inv_freq_ptr": "*fp32", "pos_ptr": "*i64", "slot_ptr": "*i64", "part_ptr": "*fp32", "ticket_ptr": "*i32",
            **{n: "i32" for n in ("B", "S", "n_heads", "n_kv")}, "eps": "fp32", "rope_scale": "fp32"},
           dict(common, K=2048, K_CHUNK=512, SPLIT=4, LAYER=False, HAS_BIAS=False, ROPE=True, D=64, HALF=32,
                BLOCK_K=256))
    return {"linear_residual": (_linear_split_kernel, *lin), "norm_linear": (_norm_linear_kernel, *nl),
            "norm_qkv": (_norm_qkv_kernel, *qkv)}


@pytest.mark.parametrize("name", ["linear_residual", "norm_linear", "norm_qkv"])
def test_prefetch_is_emitted_before_the_wait_and_only_when_asked(name):
    kernel, types, constants = cases(2048)[name]
    lines = ptx(kernel, types, constants).splitlines()
    prefetches = [i for i, line in enumerate(lines) if "cp.async.bulk.prefetch.L2.global" in line]
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    assert prefetches and len(waits) == 1
    assert max(prefetches) < waits[0]  # all before the wait: they overlap the kernel ahead
    kernel, types, constants = cases(0)[name]
    assert "cp.async.bulk.prefetch" not in ptx(kernel, types, constants)


def test_prefetch_bytes_refuses_bad_settings_and_falls_back_when_unaligned():
    w = torch.zeros(64, 40, dtype=torch.bfloat16)
    assert prefetch_bytes(2048, w, row_bytes=80) == 2048
    assert prefetch_bytes(2048, w, row_bytes=66) == 0  # a row of 33 bf16: not a multiple of 16 bytes
    assert prefetch_bytes(2048, w.view(-1)[1:], row_bytes=80) == 0  # 2 bytes past an aligned start
    assert prefetch_bytes(0, w, row_bytes=80) == 0
    for bad in (-16, 24):
        with pytest.raises(ValueError, match="prefetch"):
            prefetch_bytes(bad, w, row_bytes=80)
