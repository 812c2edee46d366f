"""Decode attention on small odd shapes: the PyTorch reference against a naive softmax(q K^T) V written
here, the Triton kernel against the reference, and the argument checks.

Where the kernel runs: on a CUDA machine, compiled. Without CUDA, in Triton's interpreter, which needs
TRITON_INTERPRET=1 before triton is first imported (its own tl.* helpers are decorated then): tests/conftest.py
sets it. The kernel's refusal of CPU tensors without the interpreter is checked in a child process without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import overlapdecode
from overlapdecode.fused.kernels.decode_attention import (
    MAX_SPLITS,
    TARGET_PROGRAMS,
    choose_num_splits,
    decode_attention,
    decode_attention_ref,
    direct_tiles,
    pipeline_stages,
    workspace_numel,
)
from overlapdecode.fused.kernels.linear_residual import Tickets
from support.triton_interpreter import INTERPRETING, interpreter_patches  # noqa: F401 (autouse fixture)

ON_CUDA = torch.cuda.is_available()
KERNEL_DEVICE = "cuda" if ON_CUDA else "cpu"
kernel_runs_here = pytest.mark.skipif(
    not (ON_CUDA or INTERPRETING), reason="needs CUDA, or TRITON_INTERPRET=1 before triton is imported (conftest.py)"
)

# The odd case: GQA group of 3, head size not a power of two, BLOCK_N = 16 not dividing S = 37, and rows
# with start = 0 and length = S, with length = start + 1 (one live slot), and in the middle.
B, HQ, HKV, S = 3, 6, 2, 37
STARTS, LENGTHS = [0, 5, 20], [37, 6, 33]


def naive_attention(q, k_cache, v_cache, start, length, scale):
    """softmax(scale * q . k) @ v for each row and query head over the row's live slots, in float64."""
    Bq, Hq, D = q.shape
    group = Hq // k_cache.shape[1]
    out = torch.empty(Bq, Hq, D, dtype=torch.float64)
    for b in range(Bq):
        lo, hi = int(start[b]), int(length[b])
        for h in range(Hq):
            k = k_cache[b, h // group, lo:hi].double().cpu()
            v = v_cache[b, h // group, lo:hi].double().cpu()
            w = torch.softmax(k @ q[b, h].double().cpu() * scale, dim=0)
            out[b, h] = w @ v
    return out


def make_case(
    D, hq=HQ, hkv=HKV, starts=STARTS, lengths=LENGTHS, s=S, dtype=torch.float32, index=torch.int32, device="cpu", seed=0
):
    g = torch.Generator().manual_seed(seed)
    bsz = len(starts)
    q = 3 * torch.randn(bsz, hq, D, generator=g)  # peaked softmax: the running max matters
    k = torch.randn(bsz, hkv, s, D, generator=g)
    v = torch.randn(bsz, hkv, s, D, generator=g)
    start = torch.tensor(starts, dtype=index)
    length = torch.tensor(lengths, dtype=index)
    return [t.to(device, dtype) for t in (q, k, v)] + [start.to(device), length.to(device)]


def poison_outside(cache, start, length, value):
    """A copy of the cache with `value` in every slot before start and from length on."""
    out = cache.clone()
    for b in range(cache.shape[0]):
        out[b, :, : int(start[b])] = value
        out[b, :, int(length[b]) :] = value
    return out


# ---- reference (always on CPU) ----


@pytest.mark.parametrize("D", [16, 48])
@pytest.mark.parametrize("hq,hkv", [(6, 2), (4, 4), (4, 1)])
def test_reference_matches_naive_attention(D, hq, hkv):
    q, k, v, start, length = make_case(D, hq, hkv)
    out = decode_attention_ref(q, k, v, start, length, D**-0.5)
    assert out.dtype == torch.float32 and out.shape == q.shape
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, start, length, D**-0.5), rtol=1e-5, atol=1e-5)


def test_reference_reads_only_the_live_slots():
    q, k, v, start, length = make_case(16, index=torch.int64)
    clean = decode_attention_ref(q, k, v, start, length, 0.25)
    for value in (float("nan"), 1e30):
        dirty = decode_attention_ref(
            q, poison_outside(k, start, length, value), poison_outside(v, start, length, value), start, length, 0.25
        )
        assert torch.equal(dirty, clean), value


def test_reference_16_bit_output_dtype():
    q, k, v, start, length = make_case(16, dtype=torch.bfloat16)
    out = decode_attention_ref(q, k, v, start, length, 0.25)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), naive_attention(q, k, v, start, length, 0.25), rtol=2e-2, atol=2e-2)


# ---- argument checks (raised before any kernel work, so they run everywhere) ----


def _bad_inputs():
    """{expected message: arguments}."""
    q, k, v, start, length = make_case(16)
    cases = {
        r"q must be \(B, Hq, D\)": (q[0], k, v, start, length),
        "q must be float32, bfloat16 or float16": (q.double(), k, v, start, length),
        r"k_cache must be \(B, Hkv, S, D\)": (q, k[0], v, start, length),
        # anchored: the v_cache check's message also names k_cache's shape
        r"^k_cache shape \(3, 2, 37, 8\) does not match q shape": (q, k[:, :, :, :8], v[:, :, :, :8], start, length),
        r"^k_cache shape \(2, 2, 37, 16\) does not match q shape": (q, k[:2], v[:2], start, length),  # batch
        r"^v_cache shape": (q, k, v[:, :, :5], start, length),
        "v_cache dtype": (q, k, v.half(), start, length),
        r"q heads \(5\) must be a multiple of k_cache heads \(2\)": (q[:, :5], k, v, start, length),
        r"start must have shape \(3,\)": (q, k, v, start[:2], length),
        "length must be int32 or int64": (q, k, v, start, length.float()),
        "length is on meta": (q, k, v, start, length.to("meta")),
    }
    return {message: case + (0.25,) for message, case in cases.items()}


@pytest.mark.parametrize("fn", [decode_attention, decode_attention_ref])
@pytest.mark.parametrize("message", list(_bad_inputs()))
def test_rejects_bad_tensors_naming_the_argument(fn, message):
    with pytest.raises(ValueError, match=message):
        fn(*_bad_inputs()[message])


@pytest.mark.parametrize("scale", [torch.tensor(0.25), float("nan"), True])
def test_rejects_a_scale_that_is_not_a_finite_number(scale):
    q, k, v, start, length = make_case(16)
    with pytest.raises(TypeError, match="scale"):
        decode_attention(q, k, v, start, length, scale)


def test_rejects_bad_out_workspace_and_tuning():
    q, k, v, start, length = make_case(16)
    with pytest.raises(ValueError, match="out"):
        decode_attention(q, k, v, start, length, 0.25, out=torch.empty(3, 6, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="workspace"):
        decode_attention(q, k, v, start, length, 0.25, workspace=torch.empty(1), num_splits=2)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention(q, k, v, start, length, 0.25, num_splits=MAX_SPLITS + 1)
    with pytest.raises(ValueError, match="block_n"):
        decode_attention(q, k, v, start, length, 0.25, block_n=24)
    with pytest.raises(ValueError, match="contiguous"):
        decode_attention(q.transpose(0, 1).contiguous().transpose(0, 1), k, v, start, length, 0.25)
    q300, k300, v300, _, _ = make_case(300)
    with pytest.raises(ValueError, match="D=300"):
        decode_attention(q300, k300, v300, start, length, 0.25)
    qm, km = torch.empty(3, 2, 128, device="meta"), torch.empty(3, 2, 1 << 24, 128, device="meta")
    with pytest.raises(ValueError, match="2\\*\\*31"):  # shapes alone: meta tensors hold no data
        decode_attention(qm, km, km, start.to("meta"), length.to("meta"), 0.25)


@pytest.mark.skipif(ON_CUDA, reason="CPU tensors: the refusal of a machine without CUDA")
def test_rejects_cpu_tensors_without_the_interpreter():
    """In a child process without TRITON_INTERPRET: the kernel refuses CPU tensors with one error naming CUDA."""
    code = (
        "import torch\n"
        "from overlapdecode.fused.kernels.decode_attention import decode_attention\n"
        "q, k = torch.zeros(1, 2, 16), torch.zeros(1, 1, 8, 16)\n"
        "n = torch.tensor([8])\n"
        "try:\n"
        "    decode_attention(q, k, k, n - 8, n, 0.25)\n"
        "except ValueError as err:\n"
        "    print('refused:', err)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = str(Path(overlapdecode.__file__).resolve().parents[1])  # the package this process imported
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "refused:" in run.stdout and "CUDA" in run.stdout, run.stdout + run.stderr[-2000:]


def test_num_splits_follow_shapes_alone():
    assert choose_num_splits(1, 8, 2048, 64) == 32  # one split per block of keys
    assert choose_num_splits(4, 8, 2048, 64) == 8  # TARGET_PROGRAMS // 32 = 8.25, down to a power of two
    assert choose_num_splits(1, 8, 1000, 64) == 16  # no more splits than blocks of keys (16)
    assert choose_num_splits(64, 8, 2048, 64) == 1  # enough programs already: no split, no combine
    assert choose_num_splits(1, 1, 1 << 20, 64) == MAX_SPLITS
    # the grid target is the GPU's (2 x its SMs): a smaller GPU splits less, more rows split less
    assert choose_num_splits(1, 8, 4096, 64, programs=2 * 132) == 32
    assert choose_num_splits(1, 8, 4096, 64, programs=2 * 78) == 16
    assert choose_num_splits(8, 8, 4096, 64, programs=2 * 132) == 4
    for B in range(1, 200, 7):  # always a power of two, within the grid target unless one split is already past it
        n = choose_num_splits(B, 8, 1 << 16, 64)
        assert n & (n - 1) == 0 and (n == 1 or B * 8 * n <= TARGET_PROGRAMS)


def test_pipeline_depth_follows_the_blocks_a_piece_spans():
    assert pipeline_stages(16384 + 64, 64, 32) == 3  # 9 blocks of keys per piece
    assert pipeline_stages(4096 + 64, 64, 32) == 2  # 3 blocks: the prologue of a deeper pipeline would not pay
    assert pipeline_stages(96, 64, 1) == 2
    assert pipeline_stages(256, 64, 1) == 3
    assert workspace_numel(2, 4, 64, 1) == 0 and workspace_numel(2, 4, 64, 3) == 2 * 4 * 3 * 66


def test_many_rows_read_blocks_of_32_keys_on_2_warps():
    """direct_tiles: one piece per (row, kv head) because the rows x kv heads are past half the grid target, heads
    up to 64 wide: 32 keys on 2 warps; else (a short cache at a few rows, wider heads) the defaults."""
    assert direct_tiles(64, 1, 512, 264) == direct_tiles(16, 1, 136, 264) == (32, 2)
    assert direct_tiles(64, 2, 512, 264) is None and direct_tiles(128, 1, 512, 264) is None
    assert direct_tiles(64, 1, 8, 264) is None  # one row, a cache of one block: not the many-row case


def triton_cdiv(a, b):
    return -(-a // b)


# ---- the Triton kernel (CUDA, or the interpreter) ----

# (block_n, num_splits): default plan; several splits of one block; one split looping over 3 blocks (and
# writing `out` directly); two splits, the first looping over two blocks.
PLANS = [(None, None), (16, None), (16, 1), (16, 2)]


@kernel_runs_here
@pytest.mark.parametrize("block_n,num_splits", PLANS)
@pytest.mark.parametrize("D", [16, 48])
def test_triton_matches_reference(D, block_n, num_splits):
    q, k, v, start, length = make_case(D, device=KERNEL_DEVICE)
    out = decode_attention(q, k, v, start, length, D**-0.5, block_n=block_n, num_splits=num_splits)
    ref = decode_attention_ref(q, k, v, start, length, D**-0.5)
    assert out.dtype == q.dtype and out.shape == q.shape
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@kernel_runs_here
@pytest.mark.parametrize("D", [16, 48])
def test_triton_many_rows_with_the_direct_tiles(D, monkeypatch):
    """With more rows x kv heads than the grid target (one piece each), the default launch takes direct_tiles's
    32-key blocks on 2 warps and equals the reference (live ranges of 1 to 3 blocks of 32 keys)."""
    import overlapdecode.fused.kernels.decode_attention as attention

    monkeypatch.setattr(attention, "default_programs", lambda device: 4)  # B x Hkv = 8 programs: past it
    q, k, v, start, length = make_case(D, starts=[0, 3, 0, 9], lengths=[70, 40, 1, 95], s=96, device=KERNEL_DEVICE)
    assert choose_num_splits(4, k.shape[1], 96, 64, attention.default_programs(q.device)) == 1
    out = decode_attention(q, k, v, start, length, D**-0.5)
    torch.testing.assert_close(out, decode_attention_ref(q, k, v, start, length, D**-0.5), rtol=1e-5, atol=1e-5)


@kernel_runs_here
@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 1), (6, 3)])
def test_triton_group_layouts_and_int64_positions(hq, hkv):
    q, k, v, start, length = make_case(16, hq, hkv, index=torch.int64, device=KERNEL_DEVICE)
    out = decode_attention(q, k, v, start, length, 0.25, block_n=16)
    torch.testing.assert_close(out, decode_attention_ref(q, k, v, start, length, 0.25), rtol=1e-5, atol=1e-5)


@kernel_runs_here
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_triton_16_bit(dtype):
    if dtype == torch.bfloat16 and INTERPRETING:
        pytest.skip("Triton 3.6's interpreter computes tl.dot on bfloat16 wrongly (checked on CUDA)")
    q, k, v, start, length = make_case(48, dtype=dtype, device=KERNEL_DEVICE)
    out = decode_attention(q, k, v, start, length, 48**-0.5, block_n=16, num_splits=2)
    assert out.dtype == dtype
    torch.testing.assert_close(
        out.float(), decode_attention_ref(q, k, v, start, length, 48**-0.5).float(), rtol=2e-2, atol=2e-2
    )


@kernel_runs_here
@pytest.mark.parametrize("block_n,num_splits", [(16, 1), (16, 3)])
def test_triton_reads_only_the_live_slots(block_n, num_splits):
    q, k, v, start, length = make_case(48, device=KERNEL_DEVICE)
    clean = decode_attention(q, k, v, start, length, 0.2, block_n=block_n, num_splits=num_splits)
    for value in (float("nan"), 1e30):
        dirty = decode_attention(
            q,
            poison_outside(k, start, length, value),
            poison_outside(v, start, length, value),
            start,
            length,
            0.2,
            block_n=block_n,
            num_splits=num_splits,
        )
        assert torch.equal(dirty, clean), value


@kernel_runs_here
def test_triton_reuses_out_and_a_stale_workspace_as_lengths_change():
    """As a CUDA graph would: the same out, workspace (full of NaN from "earlier") and ticket counters, new
    positions in place. Short rows leave most splits empty; the program that combines must be the last of
    the live ones, must not read the empty ones' stale partials, and must put its counter back to 0."""
    q, k, v, start, length = make_case(16, device=KERNEL_DEVICE)
    splits = 3
    out = torch.full_like(q, float("nan"))
    ws = torch.full((workspace_numel(B, HQ, 16, splits),), float("nan"), device=KERNEL_DEVICE)
    tickets = Tickets(KERNEL_DEVICE)
    for starts, lengths in ([0, 5, 20], [37, 6, 33]), ([0, 2, 30], [1, 19, 37]), ([3, 0, 0], [4, 37, 17]):
        start.copy_(torch.tensor(starts))
        length.copy_(torch.tensor(lengths))
        got = decode_attention(
            q, k, v, start, length, 0.25, out=out, workspace=ws, block_n=16, num_splits=splits, tickets=tickets
        )
        assert got is out
        torch.testing.assert_close(out, decode_attention_ref(q, k, v, start, length, 0.25), rtol=1e-5, atol=1e-5)
        assert not tickets.counters.any()  # every counter back to zero for the next launch
