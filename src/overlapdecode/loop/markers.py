"""Named phases (prefill, decode_step, stop_check) for Nsight (NVTX) and the PyTorch profiler.

NVTX ranges cost about a microsecond and are pushed on CUDA only; `record_function` is entered only while
the PyTorch profiler is running, so an unprofiled step pays nothing for it.
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd import profiler as _autograd_profiler

PREFILL = "prefill"
DECODE_STEP = "decode_step"
STOP_CHECK = "stop_check"


@contextlib.contextmanager
def phase(name: str, cuda: bool):
    if cuda:
        torch.cuda.nvtx.range_push(name)
    try:
        if _autograd_profiler._is_profiler_enabled:
            with torch.profiler.record_function(name):
                yield
        else:
            yield
    finally:
        if cuda:
            torch.cuda.nvtx.range_pop()
