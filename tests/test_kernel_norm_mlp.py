"""kernels/norm_mlp.py: its cases (norm_mlp_cases.py) in Triton's interpreter, in a fresh process with
TRITON_INTERPRET=1 (the interpreter must be chosen before Triton is first imported); and the one-launch
kernel with its grid barrier compiled for an H100/H200 (sm_90) on this CPU machine by Triton's own compiler
and ptxas, which is all of the barrier that CI can check: the barrier's atomics in order, the prefetch of the
down-projection's first tile between arriving and waiting, the PDL instructions where pdl.py and the
module docstring put them, and no barrier at all in the kernels of the two-launch form."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from overlapdecode.fused.kernels.norm_mlp import _norm_mlp_kernel  # noqa: E402

HERE = Path(__file__).parent


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run tests/norm_mlp_cases.py directly")
def test_norm_mlp_cases_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "not on_the_gpu",
         str(HERE / "norm_mlp_cases.py")],
        env=env, cwd=HERE.parent, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


TYPES = {**{n: "*bf16" for n in ("x_ptr", "nw_ptr", "nb_ptr", "wu_ptr", "bu_ptr", "wd_ptr", "bd_ptr", "m_ptr",
                                  "out_ptr")},
         "part_ptr": "*fp32", "ticket_ptr": "*i32", "bar_ptr": "*i32", "B": "i32", "eps": "fp32"}
COMMON = dict(G=132, ROW_BLOCKS=1, BLOCK_M=16, BLOCK_N_UP=32, BLOCK_K_UP=256)
# GPT-2: LayerNorm, biases, tanh GELU, the step's down-projection tiles (model.TILES); Llama-1B: RMSNorm,
# no biases, SiLU(gate) * up, the kernels' default tiles
SHAPES = {"gpt2": dict(H=768, I=3072, K_CHUNK=1536, SPLIT=2, LAYER=True, HAS_BIAS_UP=True, HAS_BIAS_DOWN=True,
                       ACT=1, BLOCK_N_DOWN=16, BLOCK_K_DOWN=64),
          "llama": dict(H=2048, I=8192, K_CHUNK=4096, SPLIT=2, LAYER=False, HAS_BIAS_UP=False, HAS_BIAS_DOWN=False,
                        ACT=2, BLOCK_N_DOWN=32, BLOCK_K_DOWN=128)}


def ptx_lines(shape: str, **constants) -> list[str]:
    """The kernel's sm_90 PTX, without debug lines."""
    c = {**COMMON, **SHAPES[shape], **constants}
    signature = {name: TYPES.get(name, "constexpr") for name in _norm_mlp_kernel.arg_names}
    src = ASTSource(fn=_norm_mlp_kernel, signature=signature, constexprs=c)
    text = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=3)).asm["ptx"]
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith(".loc")]


def first(lines, pattern, start=0) -> int:
    """Index of the first line from `start` that matches `pattern` (a regular expression), or -1."""
    return next((i for i in range(start, len(lines)) if re.search(pattern, lines[i])), -1)


ARRIVE = r"atom\.global\.gpu\.release\.add"
SPIN = ACQUIRE = r"ld\.global\.gpu\.acquire"  # the spin: one thread's acquire loads
DEPART = r"atom\.global\.gpu\.acq_rel\.add"
WEIGHT_LOAD = r"ld\.global\.(b16|v)"  # a plain (cached, non-volatile) global load: the prefetched tile


@pytest.mark.parametrize("pdl", [0, 3])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_barrier_compiles_for_sm90_in_order(shape, pdl):
    lines = ptx_lines(shape, PHASES=3, PRE_K=SHAPES[shape]["BLOCK_K_DOWN"], PDL=pdl)
    wait = first(lines, r"griddepcontrol\.wait")
    assert (wait >= 0) == (pdl >= 1)
    if pdl:  # pdl.py: nothing is read before the kernel ahead has finished
        assert first(lines, r"ld\.global") > wait
    arrive = first(lines, ARRIVE)
    spin = acquire = first(lines, SPIN, arrive)
    assert 0 < arrive < spin, (arrive, spin)
    # the spin is a loop: a backward branch right after the acquire load's broadcast
    loop = next(i for i in range(spin, len(lines)) if re.match(r"@%p\d+ bra", lines[i]))
    label = lines[loop].split()[-1].rstrip(";")
    assert first(lines, "^" + re.escape(label) + ":") < spin < loop < spin + 12
    assert len([line for line in lines if re.search(ARRIVE, line)]) == 1
    # every thread's stores of the activations come before the arrive: a CTA barrier right before it
    assert [line for line in lines[arrive - 8:arrive] if line.startswith("bar.sync")]
    # the prefetch: the first down-projection tile is loaded after arriving, before waiting
    assert [line for line in lines[arrive:spin] if re.search(WEIGHT_LOAD, line)]
    # the whole CTA waits for the acquire before phase B (a CTA barrier after it, before any load of m)
    after = first(lines, r"bar\.sync", acquire)
    assert 0 < after < first(lines, r"ld\.global\.cg", acquire)
    release = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    if pdl == 3:  # dependents released only once every program has arrived (all of them are resident)
        assert len(release) == 1 and release[0] > acquire
    else:
        assert not release
    # depart, last: the final acq_rel atomic, then both counters stored back to 0
    depart = max(i for i, line in enumerate(lines) if re.search(DEPART, line))
    assert depart > acquire
    assert len([line for line in lines[depart:] if re.search(r"st\.global\.b32", line)]) == 2


@pytest.mark.parametrize("shape", list(SHAPES))
def test_no_prefetch_loads_nothing_at_the_barrier(shape):
    """PRE_K 0: no weight load between arriving and waiting (the control for the prefetch's A/B)."""
    lines = ptx_lines(shape, PHASES=3, PRE_K=0, PDL=3)
    arrive = first(lines, ARRIVE)
    spin = first(lines, SPIN, arrive)
    assert 0 < arrive < spin
    assert not [line for line in lines[arrive:spin] if re.search(r"ld\.global", line)]


@pytest.mark.parametrize("phases", [1, 2])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_two_launch_kernels_have_no_barrier(shape, phases):
    """The kernels of the two-launch form (the interpreter's) carry no barrier: no spin, no counter atomics
    (the split's tickets, acq_rel, only in phase B), and phase A alone no down-projection."""
    text = "\n".join(ptx_lines(shape, PHASES=phases, PRE_K=SHAPES[shape]["BLOCK_K_DOWN"], PDL=3))
    assert not re.search(ARRIVE, text) and not re.search(SPIN, text)
    assert bool(re.search(DEPART, text)) == (phases == 2)
    assert bool(re.search(r"ld\.global\.cg", text)) == (phases == 2)  # m and the partials, read past L1
    assert "griddepcontrol.launch_dependents" in text
