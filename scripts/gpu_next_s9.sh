#!/usr/bin/env bash
# What session 8 wrote after its device time ran out, to run first on one H200 (about 4 min; results tar'd to
# $OUT/next-s9.tgz, at most 8 files come back from a call; OVERLAPDECODE_COMMIT names the commit):
# 1. the GPU test of the greedy choice kernel in a captured graph with PDL, at real vocabularies, with ties, NaN and
#    infinities (test_greedy_choice_in_a_captured_graph_equals_the_loops_choice: written, not yet run);
# 2. what session 8 did not rerun after the greedy kernel: the bfloat16 logit-error test, PDL changing no logit, and
#    the eager late stop checks under TORCH_CUDA_SANITIZER=1;
# 3. scripts/ttft_profile.py at the current code (where the time to first token goes; the TTFT aim is 3 steps).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=/tmp/next-s9; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
timeout 200 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
  -k "greedy_choice_in_a_captured or bfloat16_logit or pdl_changes_no_logit" > $W/gpu-tests.log 2>&1
echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|RMS" $W/gpu-tests.log | tail -12
TORCH_CUDA_SANITIZER=1 timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py tests/gpu/test_gpu_interleaved.py \
  -p no:cacheprovider -rA -q -k "late_stop_checks and eager or sanitizer" > $W/sanitizer.log 2>&1
echo "sanitizer rc=$?" >> $W/sanitizer.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $W/sanitizer.log | tail -6
timeout 200 python3 scripts/ttft_profile.py $W/ttft > $W/ttft.log 2>&1
echo "ttft rc=$?" >> $W/ttft.log; tail -3 $W/ttft.log
tar czf $OUT/next-s9.tgz -C /tmp next-s9
