"""The sampled-choice kernels equal their torch reference in Triton's interpreter (a fresh process: the
interpreter must be chosen before Triton is first imported)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent
ROOT = HERE.parents[1]  # the repository


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run tests/fused/sample_kernel_cases.py directly")
def test_sample_kernels_match_their_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "sample_kernel_cases.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
