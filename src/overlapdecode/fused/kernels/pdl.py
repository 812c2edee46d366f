"""Programmatic dependent launch (PDL, Hopper and later): the prologue and the release every kernel of the fused
step runs.

A kernel launched with `launch_pdl=True` may be scheduled before the kernel ahead of it on the stream has
finished: its launch and block set-up overlap that kernel's tail instead of following it (inside a CUDA
graph the launch becomes a programmatic edge). `gdc_wait` then blocks until the kernel ahead has finished
and its writes are visible, so it comes first, before any load: a kernel reads nothing early, and since every
kernel of the chain waits, kernel i + 2 also sees kernel i's writes (the ticket counters and partial sums
shared by consecutive split-K launches included).

`PDL` (a constexpr) is on or off:
- off (CPU, the interpreter, GPUs before sm_90): both instructions compiled out.
- on: `gdc_wait` at the start (`pdl_start`), and `gdc_launch_dependents` once a program has finished its main
  loop (`pdl_release`), so the next kernel is scheduled during this one's epilogues (the split-K finish, RoPE,
  the stores), when every SM is about to free up. The fastest of the modes measured (docs/KERNELS.md,
  "Programmatic dependent launch").
"""

import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(pdl: bool) -> dict:
    """The launch keyword for PDL, empty without it (so that a launch dynamo traces, which knows only
    warps/stages/ctas, never sees it)."""
    return {"launch_pdl": True} if pdl else {}
