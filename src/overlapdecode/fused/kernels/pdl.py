"""Programmatic dependent launch (PDL, Hopper and later): the prologue every kernel of the fused step runs.

A kernel launched with `launch_pdl=True` may be scheduled while the kernel before it on the stream is still
running: its launch and block set-up overlap the previous kernel's tail instead of following it (inside a
CUDA graph the launch becomes a programmatic edge). `gdc_wait` then blocks until the previous kernel has
finished and its writes are visible, so it comes first, before any load: the kernel reads nothing early,
and since every kernel of the chain waits, kernel i + 2 also sees kernel i's writes (the ticket counters and
partial sums shared by consecutive split-K launches included). `gdc_launch_dependents` lets the next kernel
be scheduled as soon as every program of this one has started. Without PDL (`PDL=False`: CPU, the
interpreter, GPUs before sm_90) both are compiled out.
"""

import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(pdl: bool) -> dict:
    """The launch keyword for PDL, empty without it (so that a launch dynamo traces, which knows only
    warps/stages/ctas, never sees it)."""
    return {"launch_pdl": True} if pdl else {}
