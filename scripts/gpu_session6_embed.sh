#!/usr/bin/env bash
# For the next GPU call (session 6 had no device time left to run it): the embedding kernel on a GPU (its
# kernel cases), then the GPT-2 step in one graph with the kernel and with the torch ops, alternating.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
timeout 40 python3 -m pytest tests/fused_kernel_cases.py -q -p no:cacheprovider -k embed 2>&1 | tail -2
timeout 30 python3 - <<'PY'
import triton.testing
import overlapdecode as od
from kernel_sweep import captured_step
model = od.load_model("gpt2-random", dtype="bfloat16", device="cuda")
res = {"kernel": [], "torch ops": []}
for kernel in (True, False, True, False):
    g, keep = captured_step(model, 1, embed_kernel=kernel)
    res["kernel" if kernel else "torch ops"].append(round(triton.testing.do_bench(g.replay, rep=100, return_mode="median"), 4))
    del g, keep
print("gpt2 b1 step ms, embedding by", res)
PY
