#!/usr/bin/env bash
# Session 10 on one H200 (OVERLAPDECODE_COMMIT names the commit; results tar'd to $OUT/s10-<stage>.tgz: at most 8 files
# come back from a call). Stage 1 ran at 1758cd1 (the weight preload, since dropped; that commit's version of this
# script, benchmarks/h200-session10-preload). Stage 2 (about 5 min):
# 1. scripts/call_timeline.py at GPT-2: where a 200-token call's time goes beyond its decode steps;
# 2. the fused GPU tests that run the loop, after session 9's review fixes (0e998d0: the output copied out of the step
#    log before the end event; the host wait after a late stop), which stage 1 did not reach: float32 200 tokens
#    against HF, captured against eager, the late stops, and the second call from another stream, which now also
#    checks the first call's output.
# Stage 3 (about 3 min): scripts/lm_head_ab.py at GPT-2, batch 1 and 8: the LM head's tiles and the greedy choice's
# block in the step.
# Stage 4 (about 5 min), with TILES' new GPT-2 LM head entry (128 x 64, 4 warps, 4 stages): a second lm_head_ab.py
# sweep around it (batch 1); the GPU tests that use the entry (each kernel against its reference with the shape's
# tiles; float32 GPT-2 with the 16-bit tiles forced on, 200 tokens against HF); the GPT-2 bench (fused, interleaved).
# Stage 5 (about 3 min): is `interleaved` at GPT-2 slower because of the code or the machine? scripts/preset_ab.py
# (200-token calls, bfloat16 batch 1) with session 7's code (0a8ee8b, .carry/old/src: its bench gave 0.575 ms/token)
# and this tree, alternating old, new, old, new on one machine.
# Stage 6 (ran at a910f30 only: the embedding fold and scripts/embed_fold_ab.py were reverted after it, so it cannot
# run at a later commit; the last ~7 min of device time; results tar'd after each step, so that a call cut short
# still returns what ran): the step's embedding folded into layer 0's QKV launch (embed_norm_qkv): its GPU tests (each kernel
# against its reference at the GPT-2 and Llama-1B shapes, the folded one included; float32 200 tokens against HF at
# GPT-2 b4 and Llama-1B b1; PDL changing no logit), scripts/embed_fold_ab.py (GPT-2 b1, Llama-1B b1), the GPT-2
# bench, and scripts/preset_ab.py's interleaved old/new with the garbage collector's pauses per call.
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown} PYTHONPATH=$PWD/src
W=/tmp/s10-$STAGE; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/gpu.txt 2>&1
if [ "$STAGE" = 2 ]; then
  timeout 150 python3 scripts/call_timeline.py $W/timeline-gpt2 > $W/timeline.log 2>&1; echo "timeline rc=$?" >> $W/timeline.log
  tail -30 $W/timeline.log
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 220 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider \
    -rA -q -k "gpt2-random-4-fused] or llama-1b-random-1-fused] or late_stop or second_call or captured_once" \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie" $W/gpu-tests.log | tail -16
fi
if [ "$STAGE" = 3 ]; then
  for B in 1 8; do
    timeout 140 python3 scripts/lm_head_ab.py $W/lm-head-b$B.json $B > $W/lm-head-b$B.log 2>&1; echo "b$B rc=$?" >> $W/lm-head-b$B.log
    grep -A16 '"step ms, median of rounds"' $W/lm-head-b$B.log; tail -1 $W/lm-head-b$B.log
  done
fi
if [ "$STAGE" = 4 ]; then
  timeout 100 python3 scripts/lm_head_ab.py $W/lm-head-b1.json 1 > $W/lm-head-b1.log 2>&1; echo "b1 rc=$?" >> $W/lm-head-b1.log
  grep -A12 '"step ms, median of rounds"' $W/lm-head-b1.log; tail -1 $W/lm-head-b1.log
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 120 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider \
    -rA -q -k "real_shapes and gpt2 or fused+tiles" > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie" $W/gpu-tests.log | tail -8
  timeout 120 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model gpt2-random \
    --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget 80 --out $W/h200-fused-gpt2-s10 \
    > $W/bench-gpt2.log 2>&1; echo "bench gpt2 rc=$?" >> $W/bench-gpt2.log; tail -12 $W/bench-gpt2.log
fi
if [ "$STAGE" = 5 ]; then
  for round in 1 2; do
    for tree in old new; do
      [ $tree = old ] && P=$PWD/.carry/old/src || P=$PWD/src
      PYTHONPATH=$P timeout 70 python3 scripts/preset_ab.py $W/interleaved-$tree-$round.json $tree-$round \
        > $W/interleaved-$tree-$round.log 2>&1; echo "rc=$?" >> $W/interleaved-$tree-$round.log
      tail -2 $W/interleaved-$tree-$round.log
    done
  done
fi
if [ "$STAGE" = 6 ]; then
  save() { tar czf $OUT/s10-6.tgz -C /tmp s10-6; }
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider \
    -rA -q -k "real_shapes and (gpt2 or llama-1b) or gpt2-random-4-fused] or llama-1b-random-1-fused] or pdl_changes" \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie" $W/gpu-tests.log | tail -12; save
  timeout 100 python3 scripts/embed_fold_ab.py $W/embed-fold.json > $W/embed-fold.log 2>&1; echo "ab rc=$?" >> $W/embed-fold.log
  tail -3 $W/embed-fold.log; save
  timeout 110 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model gpt2-random \
    --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 --time-budget 80 --out $W/h200-fused-gpt2-s10b \
    > $W/bench-gpt2.log 2>&1; echo "bench gpt2 rc=$?" >> $W/bench-gpt2.log; tail -8 $W/bench-gpt2.log; save
  for tree in old new; do
    [ $tree = old ] && P=$PWD/.carry/old/src || P=$PWD/src
    PYTHONPATH=$P timeout 45 python3 scripts/preset_ab.py $W/interleaved-$tree.json $tree > $W/interleaved-$tree.log 2>&1
    echo "rc=$?" >> $W/interleaved-$tree.log; tail -2 $W/interleaved-$tree.log; save
  done
fi
[ "$STAGE" = 6 ] || tar czf $OUT/s10-$STAGE.tgz -C /tmp s10-$STAGE
