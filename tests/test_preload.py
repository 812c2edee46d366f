"""kernels/preload.py's rule: the preload form's K range per program from the weight's shape (no table)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from overlapdecode.fused.kernels import preload  # noqa: E402


@pytest.mark.parametrize("w_rows", [16, 32, 64, 128])
@pytest.mark.parametrize("K", [40, 100, 768, 2048, 5120, 8192, 14336])
@pytest.mark.parametrize("elt", [2, 4])
def test_a_programs_k_range_fits_the_budget_and_the_split_covers_k(w_rows, K, elt):
    plan = preload.preload_tiles(w_rows, 256, K, elt)
    bk, split = plan["block_k"], plan["split"]
    assert bk >= 16 and bk & (bk - 1) == 0  # a power of two, tl.dot's smallest K at least
    assert w_rows * bk * elt <= max(preload.BUDGET, w_rows * 16 * elt)  # the budget, or one 16-wide K tile
    assert (split - 1) * bk < K <= split * bk  # every K range holds some of K, together all of it
    assert bk < 2 * K  # never wider than K rounded up to a power of two
    assert plan["num_warps"] == (4 if w_rows * bk * elt <= 4 * preload.WARP_BYTES else 8)
    if w_rows * 16 * elt <= preload.BUDGET and split > 1:  # a range as long as the budget allows
        assert 2 * w_rows * bk * elt > preload.BUDGET


def test_weights_past_the_bound_keep_the_k_loop():
    """Llama-3.2-1B's LM head (128256 x 2048, 16-bit: 525 MB) streams long enough to ramp up: no plan; its gate/up
    (2 x 8192 x 2048) and Llama-3-8B's QKV (6144 x 4096) get one."""
    assert preload.preload_tiles(16, 128256, 2048, 2) is None
    assert preload.preload_tiles(32, 16384, 2048, 2) == dict(block_k=256, split=8, num_warps=4, num_stages=1)
    assert preload.preload_tiles(32, 6144, 4096, 2)["split"] == 16
    big = preload.MAX_BYTES // (2 * 2048)
    assert preload.preload_tiles(16, big, 2048, 2) is not None
    assert preload.preload_tiles(16, big + 1, 2048, 2) is None
