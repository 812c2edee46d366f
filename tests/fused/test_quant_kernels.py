"""The projections' Triton kernels on quantized weights equal their torch twins, run on CPU by Triton's interpreter.

The interpreter must be chosen before Triton is first imported (and this test process has imported it), so the
cases (quant_kernel_cases.py) run in a fresh process with TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run tests/quant_kernel_cases.py directly")
def test_quantized_kernels_match_their_twins_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), str(HERE), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "quant_kernel_cases.py")],
        env=env,
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
    # the only cases skipped are bfloat16's, which the interpreter cannot hold (a GPU runs them)
    skips = re.findall(r"^SKIPPED \[\d+\] .*$", proc.stdout, flags=re.M)
    assert all("the interpreter's bfloat16" in line for line in skips), skips


# --- the kernels on packed weights compile for an H100/H200 (sm_90) -------------------------------------------------

# (kernel, N per accumulator, K, accumulators, constexprs) at the Llama-1B shape
PROJECTIONS = {
    "qkv": ("norm_qkv", 1536, 2048, 2, dict(D=64)),
    "o": ("linear_residual", 2048, 2048, 1, {}),
    "gate/up": ("norm_linear", 8192, 2048, 2, dict(ACT=2)),
    "down": ("linear_residual", 2048, 8192, 1, {}),
    "head": ("norm_linear", 128256, 2048, 1, dict(ACT=0, ROUND_OUT=False)),
}


@pytest.mark.parametrize("scheme,group_size", [("int4", 128), ("int8", None), ("int4", 96)])
@pytest.mark.parametrize("name", sorted(PROJECTIONS))
@pytest.mark.parametrize("rows", [1, 64])
def test_quantized_projections_compile_for_sm90(scheme, group_size, name, rows):
    """Each projection's kernel with int4 or int8 weights (bfloat16 activations, PDL LATE) compiles for sm_90: the
    row-block tiles (1 row) and the swapped tiles (64 rows) that quantized launches take from 17 rows, those on
    tensor cores (warpgroup MMAs from 64 weight rows per program), reading nothing before the PDL wait, with few
    spills; the codes arrive in 16-byte copies, never byte by byte (packed.py's layout). A group of 96 (no power of
    two) takes the per-weight group numbers."""
    pytest.importorskip("triton")
    from test_kernel_compile import CASES, ptx, spill_bytes

    from overlapdecode.fused.kernels.norm_linear import NORM_NONE
    from overlapdecode.fused.kernels.norm_qkv import swapped_qkv_tiles
    from overlapdecode.fused.kernels.packed_weights import QUANT_CODES
    from overlapdecode.fused.kernels.swap_ab import swap_tiles

    fn, N, K, accs, extra = PROJECTIONS[name]
    kernel, types, constants = CASES[fn]
    types = dict(types, w_ptr="*u8" if scheme == "int4" else "*i8", s_ptr="*bf16")
    quant = dict(QUANT=QUANT_CODES[scheme], GROUP=group_size or K)
    if scheme == "int4":
        types["z_ptr"] = "*bf16"
    else:
        quant["z_ptr"] = None
    constants = {k: v for k, v in constants.items() if k not in ("s_ptr", "z_ptr", "QUANT", "GROUP")}
    constants = dict(constants, **extra, **quant, PDL=3, K=K)
    warps, stages = 4, 3
    if rows > 16:
        tiles = swapped_qkv_tiles(rows, N, K, 2, 132) if fn == "norm_qkv" else swap_tiles(rows, N, K, 2, accs, 132)
        constants.update(SWAP=True, BLOCK_M=tiles["block_m"], BLOCK_K=tiles["block_k"], K_CHUNK=K // 2, SPLIT=2)
        constants["HALF" if fn == "norm_qkv" else "BLOCK_N"] = tiles["block_n"]
        if fn != "linear_residual":  # rows normalised beforehand, as every swapped launch's (swap_ab.use_prenorm)
            constants.update(LAYER=NORM_NONE, NB_PAD=0)
        warps, stages = tiles["num_warps"], tiles["num_stages"]
    elif "K_CHUNK" in constants:
        constants.update(K_CHUNK=K, SPLIT=1)
    text = ptx(kernel, types, constants, aligned=True, num_warps=warps, num_stages=stages)
    lines = text.splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    assert not [line for line in lines[:wait] if "ld.global" in line]
    if rows > 16:
        assert "wgmma.mma_async" in text or "mma.sync.aligned" in text
    assert not re.search(r"ld\.global[.\w]*\.[bu]8\b", text)  # no byte loads: the codes in vectors
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", text)
    assert spill_bytes(text) <= 256
