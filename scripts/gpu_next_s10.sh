#!/usr/bin/env bash
# What session 9 changed after its device time ran out, to run first on one H200 (about 5 min; results tar'd to
# $OUT/next-s10.tgz, at most 8 files come back from a call; OVERLAPDECODE_COMMIT names the commit):
# 1. the fused tests that run the decode loop, after the review fixes of 0e998d0 (the output copied out of the step
#    log before the end event; the host wait after a late stop): float32 200 tokens against HF, captured against
#    eager, the late stops, and the second call from another stream, which now also checks the first call's output;
# 2. the eager late stop checks under TORCH_CUDA_SANITIZER=1;
# 3. the greedy kernel cases (the step log at 17 rows, with a guard row);
# 4. the GPT-2 bench (fused, interleaved) and scripts/loop_ab.py at GPT-2: the figures of fa7357f again.
set -uo pipefail
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown} PYTHONPATH=$PWD/src
W=/tmp/next-s10; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 200 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
  -k "gpt2-random-4-fused] or llama-1b-random-1-fused] or late_stop or second_call or captured_once" \
  > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $W/gpu-tests.log | tail -12
TORCH_CUDA_SANITIZER=1 PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py \
  tests/gpu/test_gpu_interleaved.py -p no:cacheprovider -rA -q -k "late_stop_checks and eager or sanitizer" \
  > $W/sanitizer.log 2>&1; echo "sanitizer rc=$?" >> $W/sanitizer.log; tail -2 $W/sanitizer.log
(cd tests && timeout 90 python3 -m pytest -q -p no:cacheprovider fused_kernel_cases.py -k greedy) > $W/kernel-cases.log 2>&1
echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
timeout 110 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model gpt2-random \
  --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget 80 --out $W/h200-fused-gpt2-s10 \
  > $W/bench-gpt2.log 2>&1; echo "bench gpt2 rc=$?" >> $W/bench-gpt2.log; tail -1 $W/bench-gpt2.log
timeout 80 python3 scripts/loop_ab.py $W/loop.json s10 --models gpt2-random > $W/loop.log 2>&1; tail -3 $W/loop.log
tar czf $OUT/next-s10.tgz -C /tmp next-s10
