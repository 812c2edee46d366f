#!/usr/bin/env bash
# Session 10 on one H200 (OVERLAPDECODE_COMMIT names the commit; results tar'd to $OUT/s10-<stage>.tgz: at most 8 files
# come back from a call). Stage 1 (under 10 min):
# 1. the fused GPU tests that run the loop, after session 9's review fixes (0e998d0: the output copied out of the step
#    log before the end event; the host wait after a late stop), never run on a GPU: float32 200 tokens against HF,
#    captured against eager, the late stops, and the second call from another stream, which now also checks the
#    first call's output; and the two tests that cover the weight preload: each kernel against its reference at the
#    real shapes (preload off and on), and PDL (and the preload) changing no logit;
# 2. the eager late stop checks under TORCH_CUDA_SANITIZER=1;
# 3. the kernel cases of the greedy choice and of the three GEMVs (preload off and on) on the GPU;
# 4. scripts/preload_ab.py: the step in one graph and the decode loop with and without the weight preload, GPT-2 b1,
#    Llama-1B b1 and b8.
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown} PYTHONPATH=$PWD/src
W=/tmp/s10-$STAGE; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/gpu.txt 2>&1
if [ "$STAGE" = 1 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 230 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider \
    -rA -q -k "gpt2-random-4-fused] or llama-1b-random-1-fused] or late_stop or second_call or captured_once or real_shapes or pdl_changes" \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie" $W/gpu-tests.log | tail -30
  TORCH_CUDA_SANITIZER=1 PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 100 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py \
    tests/gpu/test_gpu_interleaved.py -p no:cacheprovider -rA -q -k "late_stop_checks and eager or sanitizer" \
    > $W/sanitizer.log 2>&1; echo "sanitizer rc=$?" >> $W/sanitizer.log; tail -2 $W/sanitizer.log
  (cd tests && timeout 80 python3 -m pytest -q -p no:cacheprovider fused_kernel_cases.py \
    -k "greedy or test_norm_linear or test_norm_qkv or test_linear_residual") > $W/kernel-cases.log 2>&1
  echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
  timeout 170 python3 scripts/preload_ab.py $W/preload.json > $W/preload.log 2>&1; echo "preload rc=$?" >> $W/preload.log
  tail -4 $W/preload.log
fi
tar czf $OUT/s10-$STAGE.tgz -C /tmp s10-$STAGE
