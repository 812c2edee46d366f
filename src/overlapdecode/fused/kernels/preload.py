"""The preload form of the row-block GEMVs (at most 16 rows): each program's whole share of the weights is one
tile, loaded into registers BEFORE the program's `gdc_wait`, so that under PDL mode 4 (pdl.py, "ahead": the next
kernel is scheduled as soon as every program of this one has started) the weights of the next projection stream
in while the kernel ahead (attention, an epilogue, the split-K finish, the projection before) still runs.

Why: in the step each layer costs 17-26 us more than its weights take at full bandwidth, about 3-5 us at each
of its five kernel boundaries, where each GEMV ramps up its loads from nothing and drains on its own
(docs/KERNELS.md "Where the time goes"). Loading only the first weight tile before the wait under mode 3 (the
next kernel scheduled during this one's epilogue) was slower (CHANGELOG.md "Tried and dropped"); here the
next kernel's programs arrive while this one is still running, and each of them holds everything it will
multiply, so its work after the wait is one read of x from L2, one product and the epilogue. The register file
is the buffer (256 KB per SM, 33 MB over an H200's 132 SMs: more than one projection of a 1B model).

Tiles from the shape, not a table: 16 output columns per program (tl.dot's smallest side), and a K range as
long as BUDGET bytes of the program's weight rows allow (a power of two from 16 up to K rounded up: gate/up's
two weights and QKV's two halves of a rotary pair halve it), so K is split into cdiv(K, range) ranges that the
split-K tickets finish as in the K-loop form (linear_residual.py). Weights over MAX_BYTES keep the K loop: they
stream long enough to ramp up (the 1B shape's LM head, 525 MB, reaches 4.1 TB/s), and a 16-column tile would make
every program of a norm_linear launch read its rows' norm statistics once more.

Off by default (FusedModel(preload=True), best with pdl=4): its speed is not measured yet.
"""

from __future__ import annotations

import triton

BUDGET = 16 * 1024  # weight bytes per program: 32 registers per thread of 4 warps
MAX_BYTES = 128 * 2**20  # weights above this keep the K loop
COLS = 16  # output columns (or rotary pairs) per program
# weight bytes per warp (128 per thread) up to which a tile stays on 4 warps, else 8. For sm_90 (ptxas), 16 KB tiles
# on 4 warps spill nothing (tests/test_kernel_compile.py); 32 KB tiles (BUDGET 32768) of QKV, gate/up and GPT-2's fc
# spilled 228-252 bytes on 4 warps and QKV and gate/up still 152 on 8 (x's 16-row tile is in registers too)
WARP_BYTES = 4096


def preload_tiles(w_rows: int, total_rows: int, K: int, elt_bytes: int) -> dict | None:
    """For a program holding `w_rows` weight rows (16 columns: 16; gate/up's two weights: 32; a QKV tile's pairs:
    2 x its pairs) of a weight of `total_rows` x K elements of `elt_bytes` bytes: block_k (= the program's K
    range, a power of two), split (cdiv(K, block_k)), num_warps, num_stages; None where the weight is over MAX_BYTES
    (the K-loop form then)."""
    if total_rows * K * elt_bytes > MAX_BYTES:
        return None
    most = max(16, BUDGET // (w_rows * elt_bytes))
    block_k = max(16, min(1 << (most.bit_length() - 1), triton.next_power_of_2(K)))
    warps = 4 if w_rows * block_k * elt_bytes <= WARP_BYTES * 4 else 8  # at most WARP_BYTES of the tile per warp
    return dict(block_k=block_k, split=triton.cdiv(K, block_k), num_warps=warps, num_stages=1)
