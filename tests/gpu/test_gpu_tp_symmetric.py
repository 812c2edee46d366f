"""On a real GPU: tp.SymmetricAllReduce, the fused step's one-shot all-reduce over symmetric memory, in a
one-rank NCCL group (the two-rank proof is scripts/tp_probe.py on two GPUs): its buffers alternate, the sum
of one rank is its own partial, and the sum is recorded in a CUDA graph whose replays follow new contents.
Run in a child process: a process group in the pytest process would outlive the test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import overlapdecode

CHILD = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    from overlapdecode.tp import SymmetricAllReduce
    r = SymmetricAllReduce(dist.group.WORLD.group_name, torch.device("cuda"))
    shape, dt = (3, 4096), torch.bfloat16
    a, b, c = (r.buffer(shape, dt) for _ in range(3))
    assert a.data_ptr() != b.data_ptr() and c.data_ptr() == a.data_ptr(), "the two buffers must alternate"
    x = torch.randn(shape, device="cuda").to(dt)
    a.copy_(x)
    assert torch.equal(r.sum(a), x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        r.sum(b)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = r.sum(b)
    for seed in range(3):
        y = torch.randn(shape, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)).to(dt)
        b.copy_(y)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y), seed
    print("symmetric all-reduce ok", flush=True)
    os._exit(0)  # no NCCL teardown (it has hung at exit on the GPU machine)
""")


def test_symmetric_all_reduce_one_rank_and_under_a_cuda_graph():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = str(Path(overlapdecode.__file__).resolve().parents[1])
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PYTHONPATH=src,
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NCCL_NVLS_ENABLE="0",
    )
    run = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0 and "symmetric all-reduce ok" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]
