#!/usr/bin/env bash
# Session 9 on one H200 (OVERLAPDECODE_COMMIT names the commit; results tar'd to $OUT/s9-<stage>.tgz: at most 8 files
# come back from a call). Stage 1 (about 9 min):
# 1. the kernel cases of the greedy choice on the GPU (its flag log in pinned host memory, written by the kernel);
# 2. tests/gpu/test_gpu_fused.py whole: session 8's unrun greedy-graph test, the bf16 logit error, PDL changing no
#    logit, the float32 200-token tests against HF and the late stop checks (these now read the flag log);
# 3. the eager late stop checks under TORCH_CUDA_SANITIZER=1;
# 4. scripts/loop_ab.py: the loop around the step graph, main before the flag log (.carry/old/src, 5d0d534) against
#    this tree, alternating old, new, old, new.
# Stage 2 (under 10 min): scripts/norm_mlp_ab.py (the persistent MLP kernel's first GPU run: bitwise against the two
# kernels, and timed; 280 s budget); the time to first token of `fused`, dd28360 (.carry/old/src: the flag log, not
# yet the TTFT changes) against this tree; then tests/norm_mlp_cases.py on the GPU with the time left. (It ran at
# 1213763; norm_mlp was reverted in 504a253: benchmarks/h200-session9-norm-mlp.)
# Stage 3 (the session's last call, under 10 min): the greedy kernel cases (the step log: tokens on the device, flags
# in pinned host memory); the fused GPU tests that run the loop (float32 200 tokens against HF, late stops, a second
# call after a late stop, captured against eager); the GPT-2 bench (fused, interleaved); loop_ab.py at GPT-2, 504a253
# (.carry/old/src: the flag log, before the token log) against this tree; the Llama-1B bench (batch 1) with the time
# left.
# Stage 4 (the device time left, about 5 min): the Llama-8B bench (batch 1) and the Llama-1B bench at batch 8, at the
# code of stage 3, so that every row of the README's table is of this code.
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=/tmp/s9-$STAGE; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/gpu.txt 2>&1
NEW=$PWD/src; OLD=$PWD/.carry/old/src
if [ "$STAGE" = 1 ]; then
  (cd tests && PYTHONPATH=$NEW timeout 120 python3 -m pytest -q -p no:cacheprovider fused_kernel_cases.py -k greedy) \
    > $W/kernel-cases.log 2>&1; echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
  PYTHONPATH=$NEW:$PWD/tests timeout 300 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie|RMS" $W/gpu-tests.log | tail -30
  TORCH_CUDA_SANITIZER=1 PYTHONPATH=$NEW:$PWD/tests timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py \
    tests/gpu/test_gpu_interleaved.py -p no:cacheprovider -rA -q -k "late_stop_checks and eager or sanitizer" \
    > $W/sanitizer.log 2>&1
  echo "sanitizer rc=$?" >> $W/sanitizer.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $W/sanitizer.log | tail -6
  for round in 1 2; do
    for tree in old new; do
      [ $tree = old ] && P=$OLD || P=$NEW
      PYTHONPATH=$P timeout 150 python3 scripts/loop_ab.py $W/loop-$tree-$round.json "$tree $round" > $W/loop-$tree-$round.log 2>&1
      echo "loop $tree $round rc=$?"; grep -v Warning $W/loop-$tree-$round.log | tail -6
    done
  done
fi
if [ "$STAGE" = 2 ]; then
  T0=$SECONDS
  PYTHONPATH=$NEW timeout 330 python3 scripts/norm_mlp_ab.py $W/norm-mlp --budget 280 > $W/norm-mlp-ab.log 2>&1
  echo "norm_mlp_ab rc=$?" >> $W/norm-mlp-ab.log; grep -v Warning $W/norm-mlp-ab.log | tail -70
  for tree in old new; do
    [ $tree = old ] && P=$OLD || P=$NEW
    PYTHONPATH=$P timeout 100 python3 scripts/loop_ab.py $W/ttft-$tree.json "$tree" --ttft > $W/ttft-$tree.log 2>&1
    echo "ttft $tree rc=$?"; grep -v Warning $W/ttft-$tree.log | tail -3
  done
  LEFT=$(( 560 - (SECONDS - T0) ))
  if [ $LEFT -gt 30 ]; then
    (cd tests && PYTHONPATH=$NEW timeout $LEFT python3 -m pytest -q -p no:cacheprovider norm_mlp_cases.py) > $W/norm-mlp-cases.log 2>&1
    echo "norm_mlp cases rc=$? (timeout $LEFT s)" >> $W/norm-mlp-cases.log; tail -3 $W/norm-mlp-cases.log
  fi
fi
if [ "$STAGE" = 3 ]; then
  T0=$SECONDS
  (cd tests && PYTHONPATH=$NEW timeout 90 python3 -m pytest -q -p no:cacheprovider fused_kernel_cases.py -k greedy) \
    > $W/kernel-cases.log 2>&1; echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
  PYTHONPATH=$NEW:$PWD/tests timeout 170 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    -k "gpt2-random-4-fused] or llama-1b-random-1-fused] or late_stop or second_call or captured_once" \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie" $W/gpu-tests.log | tail -16
  export PYTHONPATH=$NEW
  timeout 110 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model gpt2-random \
    --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget 80 --out $W/h200-fused-gpt2-s9 \
    > $W/bench-gpt2.log 2>&1; echo "bench gpt2 rc=$?" >> $W/bench-gpt2.log
  grep -E "^\| (fused|interleaved) |rc=" $W/bench-gpt2.log | head -6
  for tree in old new; do
    [ $tree = old ] && P=$OLD || P=$NEW
    PYTHONPATH=$P timeout 80 python3 scripts/loop_ab.py $W/loop-$tree.json "$tree" --models gpt2-random \
      > $W/loop-$tree.log 2>&1
    echo "loop $tree rc=$?"; grep -v Warning $W/loop-$tree.log | tail -3
  done
  LEFT=$(( 540 - (SECONDS - T0) ))
  if [ $LEFT -gt 90 ]; then
    timeout $LEFT python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model llama-1b-random \
      --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget $(( LEFT - 20 )) \
      --out $W/h200-fused-1b-s9 > $W/bench-1b.log 2>&1; echo "bench 1b rc=$? (timeout $LEFT s)" >> $W/bench-1b.log
    grep -E "^\| (fused|interleaved) |rc=" $W/bench-1b.log | head -6
  fi
fi
if [ "$STAGE" = 4 ]; then
  export PYTHONPATH=$NEW
  timeout 165 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model llama-8b-random \
    --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget 140 --out $W/h200-fused-8b-s9 \
    > $W/bench-8b.log 2>&1; echo "bench 8b rc=$?" >> $W/bench-8b.log; tail -1 $W/bench-8b.log
  timeout 115 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model llama-1b-random \
    --strategies fused,interleaved --peers none --dtype-batch bfloat16:8 --time-budget 90 --out $W/h200-fused-1b-b8-s9 \
    > $W/bench-1b-b8.log 2>&1; echo "bench 1b b8 rc=$?" >> $W/bench-1b-b8.log; tail -1 $W/bench-1b-b8.log
fi
tar czf $OUT/s9-$STAGE.tgz -C /tmp s9-$STAGE
