"""On a real GPU: the Triton decode attention against its PyTorch reference at the shapes of the models we
decode (Llama-3.2-1B, Llama-3-8B, GPT-2) and caches up to 2048 slots; a cache poisoned outside
[start, length) gives bit-identical output; a CUDA graph captured once follows new positions on replay
(so nothing on the host depends on their values).

Tolerances: float32 within 1e-4 relative (the kernel's float32 dots are IEEE, not TF32); 16-bit within
bf16 tolerance, as the kernel rounds the softmax weights to the cache dtype for the second dot.
"""

from __future__ import annotations

import pytest
import torch

from overlapdecode.fused.kernels.decode_attention import (
    block_sizes,
    choose_num_splits,
    decode_attention,
    decode_attention_ref,
    make_workspace,
)

DEV = "cuda"
SHAPES = {"llama-3.2-1b": (32, 8, 64), "llama-3-8b": (32, 8, 128), "gpt2": (12, 12, 64)}  # (Hq, Hkv, D)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["float32", "bfloat16", "float16"]
# (B, S): many splits of one block each; odd S (BLOCK_N does not divide it); few splits looping over
# several blocks; enough rows that there is one split per (row, kv head) and no combine.
BATCHES = [(1, 2048), (3, 77), (8, 1000), (64, 2048)]


def positions(B, S, seed=0):
    """(start, length) per row, int32 on the GPU, with the extremes in the first rows: the whole cache,
    one live slot at the start, one live slot at the end; the rest random with start < length <= S."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, S, (B,), generator=g)
    length = start + 1 + (torch.rand(B, generator=g) * (S - start)).long()
    extremes = [(0, S), (0, 1), (S - 1, S)]
    for row, (lo, hi) in enumerate(extremes[:B]):
        start[row], length[row] = lo, hi
    assert bool(((start < length) & (length <= S)).all())
    return start.int().to(DEV), length.int().to(DEV)


def case(model, B, S, dtype, seed=0):
    Hq, Hkv, D = SHAPES[model]
    g = torch.Generator(device=DEV).manual_seed(seed)
    q = 3 * torch.randn(B, Hq, D, device=DEV, generator=g)  # peaked softmax: the running max matters
    k = torch.randn(B, Hkv, S, D, device=DEV, generator=g)
    v = torch.randn(B, Hkv, S, D, device=DEV, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype), *positions(B, S, seed), D**-0.5


def assert_matches(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype == torch.float32:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    else:
        torch.testing.assert_close(out.float(), ref.float(), rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("B,S", BATCHES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("model", list(SHAPES))
def test_matches_reference(model, dtype, B, S):
    q, k, v, start, length, scale = case(model, B, S, dtype)
    assert_matches(decode_attention(q, k, v, start, length, scale), decode_attention_ref(q, k, v, start, length, scale))


@pytest.mark.parametrize("B", [1, 64])  # split + combine, and one split writing out directly
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("model", list(SHAPES))
def test_reads_only_slots_in_start_to_length(model, dtype, B):
    S = 2048
    q, k, v, start, length, scale = case(model, B, S, dtype, seed=1)
    start, length = start.long(), length.long()  # int64 positions are accepted too
    Hkv, D = SHAPES[model][1:]
    assert (choose_num_splits(B, Hkv, S, block_sizes(D, dtype)[0]) == 1) == (B == 64)
    clean = decode_attention(q, k, v, start, length, scale)
    assert_matches(clean, decode_attention_ref(q, k, v, start, length, scale))
    slot = torch.arange(S, device=DEV)
    outside = ((slot < start[:, None]) | (slot >= length[:, None]))[:, None, :, None]  # (B, 1, S, 1)
    for value in (float("nan"), float("inf"), 6e4 if dtype == torch.float16 else 1e30):
        dirty = decode_attention(q, k.masked_fill(outside, value), v.masked_fill(outside, value), start, length, scale)
        assert torch.equal(dirty, clean), value


@pytest.mark.parametrize("buffers", ["caller's out and workspace", "allocated while capturing"])
def test_cuda_graph_replay_follows_new_positions(buffers):
    model, B, S, dtype = "llama-3.2-1b", 4, 2048, torch.bfloat16
    q, k, v, start, length, scale = case(model, B, S, dtype, seed=2)
    if buffers == "caller's out and workspace":
        kwargs = dict(out=torch.empty_like(q), workspace=make_workspace(q, k))
        assert kwargs["workspace"].numel() > 0  # several splits: the combine runs
    else:
        kwargs = {}
    side = torch.cuda.Stream()  # warm up (compile) outside the capture, on a side stream as torch asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        decode_attention(q, k, v, start, length, scale, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(q, k, v, start, length, scale, **kwargs)
    for seed in (3, 4, 5):
        new_start, new_length = positions(B, S, seed)
        if seed == 5:  # short rows: most splits are empty and their workspace holds the last replay's
            new_start, new_length = torch.zeros_like(new_start), torch.full_like(new_length, 70)
        start.copy_(new_start)
        length.copy_(new_length)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, decode_attention_ref(q, k, v, start, length, scale))


@pytest.mark.parametrize("rows,S", [(1, 8192), (8, 2048)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("model", list(SHAPES))
def test_verify_rows_read_their_cache_row_once_as_the_reference(model, dtype, rows, S):
    """The verify step's K + 1 = 5 tokens of each cache row (cache_group 5: the many-query form, asked for,
    decode_attention.many_queries_tile) against the reference and the program-per-token form, each token's length
    one past the one before, rows left-padded; then replayed from a CUDA graph with make_workspace's buffer."""
    T = 5
    Hq, Hkv, D = SHAPES[model]
    g = torch.Generator(device=DEV).manual_seed(7)
    q = (3 * torch.randn(rows * T, Hq, D, device=DEV, generator=g)).to(dtype)
    k, v = (torch.randn(rows, Hkv, S, D, device=DEV, generator=g).to(dtype) for _ in range(2))
    base = torch.randint(S // 2, S - T, (rows,), device=DEV, generator=g)
    length = (base[:, None] + torch.arange(1, T + 1, device=DEV)).flatten()
    start = torch.randint(0, 9, (rows,), device=DEV, generator=g).repeat_interleave(T)
    ref = decode_attention_ref(q, k, v, start, length, D**-0.5, cache_group=T)
    many = decode_attention(q, k, v, start, length, D**-0.5, cache_group=T, many_queries=True)
    assert_matches(many, ref)
    assert_matches(decode_attention(q, k, v, start, length, D**-0.5, cache_group=T, many_queries=False), ref)
    out, ws = torch.empty_like(q), make_workspace(q, k, cache_group=T, many_queries=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        decode_attention(q, k, v, start, length, D**-0.5, out=out, workspace=ws, cache_group=T, many_queries=True)
    length -= 3  # new positions, read by the replay
    graph.replay()
    assert_matches(out, decode_attention_ref(q, k, v, start, length, D**-0.5, cache_group=T))
