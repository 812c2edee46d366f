"""test_kernel_compile.py's sm_90 compile checks, on a CPU machine: the suite runs Triton's interpreter there
(conftest.py chooses it before Triton is imported), under which no kernel compiles, so the checks run in a child
pytest with TRITON_INTERPRET=0, each its own test there; here one test asserts that every one of them passed."""

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


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the suite is not interpreted: the file runs itself")
def test_every_kernel_compiles_for_sm90_in_a_child_without_the_interpreter():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="0")
    for key in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT"):  # the child is one process of its own
        env.pop(key, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(HERE / "test_kernel_compile.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    report = proc.stdout[-6000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, report
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 100 and "skipped" not in proc.stdout, report
