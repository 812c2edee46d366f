"""The three operations that address the KV cache by row (norm_qkv's K/V store, qk_norm_rope's K at the slot, decode
attention's K/V reads) with `cache_group` g > 1, as the verify step runs them: query row r uses cache row r // g.
Each kernel equals its reference, and the reference equals the same rows run with cache_group 1 against each query
row's own copy of its cache row; odd shapes (grouped-query heads, heads of 24 dims, a cache of 37 slots), the
attention split into several pieces with rows that start past slot 0; the bad arguments. On CPU the kernels run in
Triton's interpreter (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

from overlapdecode.fused import forward
from overlapdecode.fused.kernels.decode_attention import (
    MANY_QUERIES_BY_DEFAULT,
    decode_attention,
    decode_attention_ref,
)
from overlapdecode.fused.kernels.linear_residual import Tickets
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.kernels.qk_norm_rope import qk_norm_rope, qk_norm_rope_ref
from support.triton_interpreter import interpreter_patches  # noqa: F401 (autouse fixture: the attention's loops)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)
ROWS = 2  # cache rows
H, HQ, HKV, D, S = 40, 6, 2, 24, 37  # a group of 3 query heads per kv head, heads of 24 dims


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).contiguous()


def verify_slots(g: int, first=(5, 20)) -> torch.Tensor:
    """(ROWS * g,) slots of g tokens per cache row, rising along each row's tokens as a verify step's."""
    return torch.tensor([first[r // g] + r % g for r in range(ROWS * g)], device=DEV)


def spread(cache: torch.Tensor, g: int) -> torch.Tensor:
    """Each query row's own copy of its cache row: (ROWS * g, ...)."""
    return cache.repeat_interleave(g, dim=0).clone()


def gathered(before: torch.Tensor, own: torch.Tensor, slot: torch.Tensor, g: int) -> torch.Tensor:
    """The grouped cache the rows' own copies `own` say: `before` with query row r's slot taken from its copy."""
    out = before.clone()
    for r, s in enumerate(slot.tolist()):
        out[r // g, :, s] = own[r, :, s]
    return out


def _qkv(g: int, rope: bool = True):
    torch.manual_seed(g)
    B = ROWS * g
    x, nw = rnd(B, H) + 0.3, rnd(H, scale=0.3) + 1
    w, b = rnd((HQ + 2 * HKV) * D, H, scale=H**-0.5), rnd((HQ + 2 * HKV) * D, scale=0.1)
    inv = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D)) if rope else None
    slot = verify_slots(g)
    return (x, nw, None, 1e-5, w, b, inv, 0.9, slot - 3, slot), rnd(ROWS, HKV, S, D), rnd(ROWS, HKV, S, D)


@pytest.mark.parametrize("g", [2, 3])
@pytest.mark.parametrize(
    "tiles",
    [dict(programs=1, dense=False), dict(programs=1000, dense=False), dict(swap=True, dense=False), dict(dense=True)],
    ids=["row block", "split", "swapped", "dense"],
)
def test_norm_qkv_writes_each_rows_kv_to_its_cache_row(g, tiles):
    args, k0, v0 = _qkv(g)
    k_ref, v_ref, k, v = k0.clone(), v0.clone(), k0.clone(), v0.clone()
    q_ref = norm_qkv_ref(*args, k_ref, v_ref, HQ, HKV, D, cache_group=g)
    q = norm_qkv(*args, k, v, HQ, HKV, D, block_k=16, cache_group=g, **tiles)
    torch.testing.assert_close(q, q_ref, **TOL)
    torch.testing.assert_close(k, k_ref, **TOL)
    torch.testing.assert_close(v, v_ref, **TOL)
    # the reference: as each query row writing its own copy of its cache row
    k_own, v_own = spread(k0, g), spread(v0, g)
    q_own = norm_qkv_ref(*args, k_own, v_own, HQ, HKV, D)
    slot = args[-1]
    assert torch.equal(q_ref, q_own)
    assert torch.equal(k_ref, gathered(k0, k_own, slot, g)) and torch.equal(v_ref, gathered(v0, v_own, slot, g))
    assert not torch.equal(k_ref, k0) and not torch.equal(k_ref[1], k0[1])  # the second cache row written too


@pytest.mark.parametrize("g", [2, 3])
@pytest.mark.parametrize("rope", [True, False])
def test_qk_norm_rope_normalises_each_rows_k_in_its_cache_row(g, rope):
    """OLMo2's whole-projection Q/K norms then RoPE: each row's K at its slot of its cache row, nothing else."""
    torch.manual_seed(10 + g)
    B = ROWS * g
    q, k0 = rnd(B, HQ, D) * 2, rnd(ROWS, HKV, S, D)
    qn, kn = rnd(HQ * D, scale=0.3) + 1, rnd(HKV * D, scale=0.3) + 1
    inv = 1.0 / (500.0 ** (torch.arange(0, D, 2, device=DEV).float() / D)) if rope else None
    slot = verify_slots(g)
    pos = slot - 3
    k_ref, k = k0.clone(), k0.clone()
    ref = qk_norm_rope_ref(q.clone(), k_ref, slot, qn, kn, 1e-5, inv, 0.9, pos, "rms_f32", cache_group=g)
    got = qk_norm_rope(q.clone(), k, slot, qn, kn, 1e-5, inv, 0.9, pos, block=16, cache_group=g)
    torch.testing.assert_close(got, ref, **TOL)
    torch.testing.assert_close(k, k_ref, **TOL)
    k_own = spread(k0, g)
    own = qk_norm_rope_ref(q.clone(), k_own, slot, qn, kn, 1e-5, inv, 0.9, pos, "rms_f32")
    assert torch.equal(ref, own) and torch.equal(k_ref, gathered(k0, k_own, slot, g))
    assert not torch.equal(k_ref[1], k0[1])


def _attention(g: int, starts=(0, 4)):
    """q of ROWS * g query rows; each row's tokens attend from its start (4: left padding) up to their slots."""
    torch.manual_seed(20 + g)
    q, k, v = 3 * rnd(ROWS * g, HQ, D), rnd(ROWS, HKV, S, D), rnd(ROWS, HKV, S, D)
    length = verify_slots(g, first=(30, 12)) + 1
    start = torch.tensor([starts[r // g] for r in range(ROWS * g)], device=DEV)
    return q, k, v, start, length


def _attend(q, k, v, start, length, g: int, **options):
    """decode_attention with cache_group g, scale 0.3 and fresh ticket counters, which the launch leaves at zero."""
    tickets = Tickets(DEV)
    out = decode_attention(q, k, v, start, length, 0.3, tickets=tickets, cache_group=g, **options)
    assert not tickets.counters.any()
    return out


@pytest.mark.parametrize("g", [2, 3])
@pytest.mark.parametrize("block_n,num_splits", [(None, None), (16, 1), (16, 3)])
@pytest.mark.parametrize("many", [True, False])
def test_attention_reads_each_rows_cache_row(g, block_n, num_splits, many):
    """The kernel (one piece per query row and kv head, or three, a row's live range starting past slot 0; a program
    per cache row taking its g query rows together, or one per query row) against the reference, which equals the
    rows against their own copies of their cache rows, and the torch twin; the split's ticket counters back to
    zero."""
    q, k, v, start, length = _attention(g)
    ref = decode_attention_ref(q, k, v, start, length, 0.3, cache_group=g)
    got = _attend(q, k, v, start, length, g, block_n=block_n, num_splits=num_splits, many_queries=many)
    torch.testing.assert_close(got, ref, **TOL)
    assert torch.equal(ref, decode_attention_ref(q, spread(k, g), spread(v, g), start, length, 0.3))
    torch.testing.assert_close(forward.decode_attention_torch(q, k, v, start, length, 0.3, cache_group=g), ref)
    # cache row 1 differs from cache row 0: a row that read another's would differ
    assert not torch.allclose(
        ref, decode_attention_ref(q, spread(k.flip(0), g), spread(v.flip(0), g), start, length, 0.3)
    )


@pytest.mark.parametrize("g", [2, 3])
@pytest.mark.parametrize("many", [True, False])
def test_attention_with_sinks_and_soft_capping_reads_each_rows_cache_row(g, many):
    """gpt-oss's sinks and Gemma 2's soft-capping in the split's combine, with cache_group."""
    q, k, v, start, length = _attention(g)
    sinks = rnd(HQ)
    for extra in (dict(sinks=sinks), dict(softcap=2.0)):
        ref = decode_attention_ref(q, k, v, start, length, 0.3, cache_group=g, **extra)
        got = decode_attention(
            q, k, v, start, length, 0.3, block_n=16, num_splits=2, cache_group=g, many_queries=many, **extra
        )
        torch.testing.assert_close(got, ref, **TOL)
        assert torch.equal(ref, decode_attention_ref(q, spread(k, g), spread(v, g), start, length, 0.3, **extra))


@pytest.mark.parametrize("block_n,num_splits", [(16, 1), (16, 4), (None, None)])
def test_many_queries_read_a_cache_row_once_each_query_within_its_own_window(block_n, num_splits, monkeypatch):
    """A sliding window of 16: each token of a row starts where its own window does (the later of its padding and
    length - 16), so the tokens' ranges differ and a piece of 16 keys (the second of row 0) may hold no slot of a
    query (its first token's): that query's max stays -inf there. One program per (cache row, kv head) with every
    query row of it (the grid counted), against the reference and the form with a program per query row; sinks
    with a window too."""
    from overlapdecode.fused.kernels import decode_attention as module

    g = 4
    q, k, v, pad, length = _attention(g)
    start = torch.maximum(pad, length - 16)
    grids = []
    kernel = module._split_kernel
    monkeypatch.setattr(module, "_split_kernel", GridSpy(kernel, grids))
    ref = decode_attention_ref(q, k, v, start, length, 0.3, cache_group=g)
    for many in (True, False, None):  # None: MANY_QUERIES_BY_DEFAULT's form
        got = _attend(q, k, v, start, length, g, block_n=block_n, num_splits=num_splits, many_queries=many)
        torch.testing.assert_close(got, ref, **TOL)
    default = ROWS * HKV if MANY_QUERIES_BY_DEFAULT else ROWS * g * HKV
    assert [grid[0] for grid in grids] == [ROWS * HKV, ROWS * g * HKV, default]
    sinks = rnd(HQ)
    ref = decode_attention_ref(q, k, v, start, length, 0.3, cache_group=g, sinks=sinks)
    got = decode_attention(
        q, k, v, start, length, 0.3, block_n=16, num_splits=3, cache_group=g, sinks=sinks, many_queries=True
    )
    torch.testing.assert_close(got, ref, **TOL)


def test_many_queries_read_no_value_of_a_slot_that_none_of_them_sees():
    """Two tokens of a row whose ranges leave a gap (slots 10-39): NaN keys and values there reach no output, as in
    the reference and the program-per-token form; and a workspace made for the call (make_workspace with its
    cache_group, whose split follows the cache rows) serves it."""
    from overlapdecode.fused.kernels.decode_attention import make_workspace

    torch.manual_seed(3)
    q, k, v = rnd(2, 2, 16), rnd(1, 1, 64, 16), rnd(1, 1, 64, 16)
    k[:, :, 10:40] = v[:, :, 10:40] = float("nan")
    start, length = torch.tensor([0, 40], device=DEV), torch.tensor([10, 50], device=DEV)
    ref = decode_attention_ref(q, k, v, start, length, 0.3, cache_group=2)
    assert ref.isfinite().all()
    for many in (True, False):
        got = decode_attention(q, k, v, start, length, 0.3, block_n=16, num_splits=1, cache_group=2, many_queries=many)
        torch.testing.assert_close(got, ref, **TOL)
    q, k, v = rnd(40, 1, 16), rnd(8, 1, 2048, 16), rnd(8, 1, 2048, 16)
    start, length = torch.zeros(40, dtype=torch.long, device=DEV), torch.arange(40, device=DEV) % 5 + 20
    ws = make_workspace(q, k, cache_group=5, many_queries=True)
    assert ws.numel() > make_workspace(q, k).numel()  # 8 cache rows split further than 40 query rows
    got = decode_attention(q, k, v, start, length, 0.3, workspace=ws, cache_group=5, many_queries=True)
    torch.testing.assert_close(got, decode_attention_ref(q, k, v, start, length, 0.3, cache_group=5), **TOL)


class GridSpy:
    """A kernel whose launches' grids are recorded before it runs."""

    def __init__(self, kernel, grids: list):
        self.kernel, self.grids = kernel, grids

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_many_queries_asked_for_where_they_cannot_serve_name_the_option():
    """The form serves where a cache row's queries x the head's tile fit MANY_QUERY_VALUES (heads of 24 dims: a
    tile of 32), and asked for elsewhere is a ValueError naming it."""
    q, k, v, start, length = _attention(2)
    with pytest.raises(ValueError, match="^many_queries: needs cache_group > 1"):
        decode_attention(q[:ROWS], k, v, start[:ROWS], length[:ROWS], 0.3, many_queries=True)
    for bad in (0, "no"):
        with pytest.raises(ValueError, match="^many_queries must be None, True or False"):
            decode_attention(q, k, v, start, length, 0.3, cache_group=2, many_queries=bad)
    ref = decode_attention_ref(q.repeat(1, 16, 1), k, v, start, length, 0.3, cache_group=2)
    got = decode_attention(q.repeat(1, 16, 1), k, v, start, length, 0.3, cache_group=2, many_queries=True)
    torch.testing.assert_close(got, ref, **TOL)  # 96 query heads, 48 a kv head: 2 x 48 queries in 128 x 32
    q3, k3, v3, start3, length3 = _attention(3)
    with pytest.raises(ValueError, match=r"^many_queries: needs .* got 3 x 48 queries of 32"):
        decode_attention(q3.repeat(1, 16, 1), k3, v3, start3, length3, 0.3, cache_group=3, many_queries=True)


# --- the bad arguments: one ValueError naming cache_group, before any kernel work -------------------------------


def _calls(g, k_rows: int = ROWS):
    """{name: a call of each operation with cache_group g on a cache of k_rows rows (query rows ROWS * 2)}."""
    args, k, v = _qkv(2)
    k, v = k[:1].expand(k_rows, -1, -1, -1).contiguous(), v[:1].expand(k_rows, -1, -1, -1).contiguous()
    q = rnd(ROWS * 2, HQ, D)
    slot = args[-1]
    qn, kn = rnd(HQ * D) + 1, rnd(HKV * D) + 1
    inv = args[6]
    start, length = torch.zeros_like(slot), slot + 1
    return {
        "norm_qkv_ref": lambda: norm_qkv_ref(*args, k, v, HQ, HKV, D, cache_group=g),
        "norm_qkv": lambda: norm_qkv(*args, k, v, HQ, HKV, D, cache_group=g),
        "qk_norm_rope_ref": lambda: qk_norm_rope_ref(q, k, slot, qn, kn, 1e-5, inv, 1.0, slot, cache_group=g),
        "qk_norm_rope": lambda: qk_norm_rope(q, k, slot, qn, kn, 1e-5, inv, 1.0, slot, cache_group=g),
        "decode_attention_ref": lambda: decode_attention_ref(q, k, v, start, length, 0.3, cache_group=g),
        "decode_attention": lambda: decode_attention(q, k, v, start, length, 0.3, cache_group=g),
        "decode_attention_torch": lambda: forward.decode_attention_torch(q, k, v, start, length, 0.3, cache_group=g),
    }


NAMES = list(_calls(2))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("g", [0, -2, True, 2.0, "2"])
def test_a_cache_group_that_is_not_a_positive_int_is_refused(name, g):
    with pytest.raises(ValueError, match="cache_group must be an int >= 1"):
        _calls(g)[name]()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("g,k_rows", [(3, ROWS), (2, 1), (2, 3)])
def test_cache_rows_times_cache_group_must_be_the_query_rows(name, g, k_rows):
    with pytest.raises(ValueError, match=r"cache_group: 4 query rows need k_cache rows x cache_group"):
        _calls(g, k_rows)[name]()
    _calls(2)[name]()  # the right shapes run
