#!/usr/bin/env bash
# What session 6 wrote after its device time ran out, to run first on one H200 (results to $OUT/verify-s6):
# 1. the kernel cases on the GPU (strided positions, the embedding kernel, refused strided operands);
# 2. the GPU tests that never ran: Llama-1B float32 batch 4 tokens = Hugging Face's (the RoPE-position fix,
#    ff1a5ac), the fused late stop checks = their sync twins, the bfloat16 logit error (after the 16-bit
#    rounding change, e3f2feb), then the eager late stop checks under TORCH_CUDA_SANITIZER=1;
# 3. the GPT-2 and Llama-1B steps in one graph with the embedding kernel and with the torch ops, alternating.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
W=$OUT/verify-s6; mkdir -p $W
timeout 100 python3 -m pytest tests/fused_kernel_cases.py -q -p no:cacheprovider > $W/kernel-cases.log 2>&1
echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
timeout 200 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
  -k "200_steps and llama-1b-random-4 or late_stop_checks or bfloat16" > $W/gpu-tests.log 2>&1
echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=|divergence" $W/gpu-tests.log | tail -8
TORCH_CUDA_SANITIZER=1 timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py tests/gpu/test_gpu_interleaved.py \
  -p no:cacheprovider -rA -q -k "late_stop_checks and eager or sanitizer" > $W/sanitizer.log 2>&1
echo "sanitizer rc=$?" >> $W/sanitizer.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $W/sanitizer.log | tail -6
timeout 90 python3 - > $W/embed.log 2>&1 <<'PY'
import json, os
import triton.testing
import overlapdecode as od
from kernel_sweep import captured_step
res = {}
for name in ("gpt2-random", "llama-1b-random"):
    model = od.load_model(name, dtype="bfloat16", device="cuda")
    r = res[name] = {"kernel": [], "torch ops": []}
    for kernel in (True, False, True, False):
        g, keep = captured_step(model, 1, embed_torch=not kernel)  # ran at eaf04d0 as embed_kernel=kernel
        r["kernel" if kernel else "torch ops"].append(round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4))
        del g, keep
    print(name, "b1 step ms, embedding by", r, flush=True)
json.dump(res, open(os.environ["OUT"] + "/verify-s6/embed.json", "w"), indent=1)
PY
echo "embed rc=$?" >> $W/embed.log; tail -3 $W/embed.log
