"""Programmatic dependent launch (PDL, Hopper and later): the prologue every kernel of the fused step runs.

A kernel launched with `launch_pdl=True` may be scheduled before the kernel ahead of it on the stream has
finished: its launch and block set-up overlap that kernel's tail instead of following it (inside a CUDA
graph the launch becomes a programmatic edge). `gdc_wait` then blocks until the kernel ahead has finished
and its writes are visible, so it comes first, before any load: a kernel reads nothing early, and since every
kernel of the chain waits, kernel i + 2 also sees kernel i's writes (the ticket counters and partial sums
shared by consecutive split-K launches included).

When the next kernel may start is the `PDL` mode:
- 0: no PDL (CPU, the interpreter, GPUs before sm_90): both instructions compiled out.
- 1 (`WAIT`): the next kernel is scheduled as this kernel's programs exit.
- 2 (`EARLY`): also `gdc_launch_dependents` at the start: the next kernel is scheduled as soon as every
  program of this one has started; its programs then wait on the SMs that happen to be free, which can
  leave a GEMV's programs unevenly spread (measured: Llama-1B step 0.965 -> 1.008 ms, GPT-2 0.374 ->
  0.338 ms, H200, commit cacedb8).
- 3 (`LATE`): `gdc_launch_dependents` once a program has finished its main loop (`pdl_release`), so the next
  kernel is scheduled during this one's epilogues (the split-K finish, RoPE, the stores), when every SM is
  about to free up (the default: docs/KERNELS.md has the figures).

A kernel may still do one thing before its `gdc_wait`: ask L2 for its own weights (`prefetch_rows`), which no
kernel of the step writes. Those bytes then stream from memory while the kernel ahead finishes, instead of
after it; the main loop's loads find them in L2 or merge with the requests in flight.
"""

import triton
import triton.language as tl

OFF, WAIT, EARLY, LATE = 0, 1, 2, 3


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


@triton.jit
def prefetch_rows(row_ptrs, nbytes, PREFETCH: tl.constexpr):
    """Ask L2 for the first min(nbytes, PREFETCH) bytes at each of `row_ptrs` (a block of pointers, one per
    weight row of this program; 16-byte aligned, sizes multiples of 16: the caller checks) with one
    `cp.async.bulk.prefetch.L2` each (sm_90+). A hint only: nothing is loaded into registers, no value changes,
    and a row repeated across threads is simply asked for twice. PREFETCH 0 compiles it out (the interpreter,
    CPUs, GPUs before sm_90)."""
    if PREFETCH > 0:
        n = tl.minimum(nbytes, PREFETCH).to(tl.int32)
        if n > 0:
            tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;", "=r,l,r",
                                      [row_ptrs, tl.zeros(row_ptrs.shape, tl.int32) + n], dtype=tl.int32,
                                      is_pure=False, pack=1)


def prefetch_bytes(prefetch: int, *tensors, row_bytes: int) -> int:
    """The PREFETCH constexpr of a launch: `prefetch` (bytes per weight row, a multiple of 16; 0 off) where
    every weight tensor is 16-byte aligned and a row (`row_bytes`) a multiple of 16 bytes, else 0."""
    if prefetch < 0 or prefetch % 16:
        raise ValueError(f"prefetch must be a non-negative multiple of 16 bytes, got {prefetch}")
    if not prefetch or row_bytes % 16 or any(t.data_ptr() % 16 for t in tensors):
        return 0
    return prefetch


def pdl_launch(pdl: int) -> dict:
    """The launch keyword for PDL, empty without it (so that a launch dynamo traces, which knows only
    warps/stages/ctas, never sees it)."""
    return {"launch_pdl": True} if pdl else {}
