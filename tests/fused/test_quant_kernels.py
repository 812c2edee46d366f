"""The projections' Triton kernels on quantized weights equal their torch twins, run on CPU by Triton's interpreter
(their sm_90 compile checks are test_kernel_compile.py's).

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
ROOT = HERE.parents[1]  # the repository


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run tests/fused/quant_kernel_cases.py directly")
def test_quantized_kernels_match_their_twins_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(HERE.parent), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "quant_kernel_cases.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
    # the only cases skipped are bfloat16's, which the interpreter cannot hold (a GPU runs them)
    skips = re.findall(r"^SKIPPED \[\d+\] .*$", proc.stdout, flags=re.M)
    assert all("the interpreter's bfloat16" in line for line in skips), skips
