"""A tile's per-row maximum and first column holding it: the first stage of the greedy choice, run by the greedy
kernel over the logits (greedy.py) or, from 17 rows, by the LM head's own programs over the logits they compute
(norm_linear.py, `choice`), whose tiles then never reach memory."""

import triton
import triton.language as tl

BIG_INDEX = tl.constexpr(2**31 - 1)  # above any column: "no candidate"


@triton.jit
def block_argmax(y, rows, cols, row_ok, col_ok, val_ptr, idx_ptr, pid_n, B):
    """Store the per-row maximum of the (BLOCK_M, BLOCK_N) tile `y` (float32) and the first column holding it
    (NaN counting as the maximum, the first NaN then) at (pid_n, row) of the (NBLK, B) partials."""
    live = row_ok[:, None] & col_ok[None, :]
    v = tl.where(live, y, float("-inf"))
    nan = v != v
    any_nan = tl.max(nan.to(tl.int32), 1) > 0
    key = tl.where(nan, float("inf"), v)
    m = tl.max(key, 1)
    cand = tl.where(any_nan[:, None], nan, key == m[:, None]) & live
    first = tl.min(tl.where(cand, cols[None, :], BIG_INDEX), 1)
    tl.store(val_ptr + pid_n * B + rows, tl.where(any_nan, float("nan"), m), mask=row_ok)
    tl.store(idx_ptr + pid_n * B + rows, first, mask=row_ok)
