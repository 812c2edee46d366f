"""Programmatic dependent launch (PDL, Hopper and later): the prologue every kernel of the fused step runs.

A kernel launched with `launch_pdl=True` may be scheduled before the kernel ahead of it on the stream has
finished: its launch and block set-up overlap that kernel's tail instead of following it (inside a CUDA
graph the launch becomes a programmatic edge). `gdc_wait` then blocks until the kernel ahead has finished
and its writes are visible, so it comes first, before any load: a kernel reads nothing early, and since every
kernel of the chain waits, kernel i + 2 also sees kernel i's writes (the ticket counters and partial sums
shared by consecutive split-K launches included).

When the next kernel may start is the `PDL` mode:
- 0: no PDL (CPU, the interpreter, GPUs before sm_90): both instructions compiled out.
- 1 (wait): the next kernel is scheduled as this kernel's programs exit.
- 2 (early): also `gdc_launch_dependents` at the start: the next kernel is scheduled as soon as every
  program of this one has started; its programs then wait on the SMs that happen to be free, which can
  leave a GEMV's programs unevenly spread (measured: Llama-1B step 0.965 -> 1.008 ms, GPT-2 0.374 ->
  0.338 ms, H200, commit cacedb8).
- 3 (late): `gdc_launch_dependents` once a program has finished its main loop (`pdl_release`), so the next
  kernel is scheduled during this one's epilogues (the split-K finish, RoPE, the stores), when every SM is
  about to free up. The default on sm_90+: the fastest at every measured shape (docs/KERNELS.md).
"""

import triton
import triton.language as tl


@triton.jit
def pdl_start(PDL: tl.constexpr):
    if PDL >= 1:
        tl.extra.cuda.gdc_wait()
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def pdl_release(PDL: tl.constexpr):
    if PDL == 3:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_launch(pdl: int) -> dict:
    """The launch keyword for PDL, empty without it (so that a launch dynamo traces, which knows only
    warps/stages/ctas, never sees it)."""
    return {"launch_pdl": True} if pdl else {}
