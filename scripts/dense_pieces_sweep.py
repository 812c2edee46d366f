"""The dense form's product (kernels/dense.py) alone on a GPU: cuBLAS's float32-out product of 64 and 128 rows by
the QKV, O and down weights of the Llama-1B and Llama-3-8B shapes, over the whole of K (`torch.mm`) against K in 2,
4 and 8 pieces (`torch.bmm`, what dense.pieces_for chooses between), bfloat16, us per call as CUDA-graph replays
over weight copies 4x the L2 (kernel_sweep.rotated); TB/s of the weight bytes.

    python3 scripts/dense_pieces_sweep.py OUT.json

made the figures of docs/KERNELS.md, "Dense form", for the products alone (results/h200/llama-dense-pieces).
"""

import json
import sys

import torch
from kernel_sweep import rotated, time_rotated

WEIGHTS = (  # name, N, K
    ("qkv", 3072, 2048),
    ("o", 2048, 2048),
    ("down", 2048, 8192),
    ("8b-qkv", 6144, 4096),
    ("8b-o", 4096, 4096),
    ("8b-down", 4096, 14336),
)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: dense_pieces_sweep.py OUT.json")
    if not torch.cuda.is_available():
        raise SystemExit("dense_pieces_sweep.py: needs a CUDA GPU")
    out = []
    for B in (64, 128):
        for name, N, K in WEIGHTS:
            x = torch.randn(B, K, device="cuda", dtype=torch.bfloat16)
            sets = rotated(lambda N=N, K=K: (torch.randn(N, K, device="cuda", dtype=torch.bfloat16),), N * K * 2)
            for s in (1, 2, 4, 8):
                k = K // s
                if s == 1:
                    fn = lambda w: torch.mm(x, w.t(), out_dtype=torch.float32)  # noqa: E731
                else:
                    xs = x.view(B, s, k).permute(1, 0, 2)
                    fn = lambda w, xs=xs, s=s, k=k, N=N: torch.bmm(  # noqa: E731
                        xs, w.view(N, s, k).permute(1, 2, 0), out_dtype=torch.float32
                    )
                us = time_rotated(fn, sets)
                row = dict(B=B, w=name, s=s, us=round(us, 2), tbs=round(N * K * 2 / us / 1e6, 2))
                print(row, flush=True)
                out.append(row)
            del sets
            torch.cuda.empty_cache()
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
