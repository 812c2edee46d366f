#!/usr/bin/env bash
# For the next session on one H200, written at the end of session 10 (its device time spent). OVERLAPDECODE_COMMIT
# names the commit; results tar'd to $OUT/s11-<stage>.tgz after each step (at most 8 files come back from a call, and
# a call cut short still returns what ran). With two H200s lent (nvidia-h200-x2), run scripts/gpu_tp_next.sh first.
# Stage 1 (about 9 min): tests/gpu/test_gpu_fused.py whole (session 10 ran it only in parts: the kernels at real
#   shapes with GPT-2's new LM head tile, the float32 200-token tests, the bfloat16 logit error, the greedy kernel in a
#   graph, PDL changing no logit, the late stops, the second call); the eager late stops under the sanitizer.
# Stage 2 (about 9 min): the bench at the current code for the README's Llama rows, measured at session 9's code
#   (fa7357f / 4c7f861): llama-1b-random batch 1 and 8, then llama-8b-random batch 1 (fused, interleaved).
# Stage 3 (added in session 11, about 5 min): scripts/step_tiles_ab.py at batch 1 and 8, Llama-1B's five GEMV tiles
#   timed in the whole step (candidates the isolated sweep never tried, then the winners combined).
# Stage 4 (added in session 11, about 5 min): the LM head's new batch >= 4 tile (stage 3's pick) confirmed at batch
#   2 (control), 4, 8, 16 (step_tiles_ab.py --confirm); the kernels at real shapes against their references, every
#   TILES entry included; the Llama-1B bench at batch 1 and 8 with it.
# Stage 5 (added in session 11, about 2 min): scripts/call_timeline.py at Llama-1B: where a 1B call's and step's time
#   goes, kernel by kernel in the step (KERNELS.md's 1B figures until now are each kernel alone, from the sweeps).
# Stage 6 (added in session 11, about 2 min): step_tiles_ab.py --attention: the attention's pieces of 64, 32, 16 slots.
# Stage 7 (added in session 11, at most 6 min): after the merges of session 11's reviews (sampling, decoder, CLI, tp
#   checks), the decoder's GPU tests and the fused ones at GPT-2, the second call and the late stops, at HEAD.
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown} PYTHONPATH=$PWD/src
W=/tmp/s11-$STAGE; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $W/gpu.txt 2>&1
save() { tar czf $OUT/s11-$STAGE.tgz -C /tmp s11-$STAGE; }
if [ "$STAGE" = 1 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 380 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|near tie|RMS" $W/gpu-tests.log | tail -34; save
  TORCH_CUDA_SANITIZER=1 PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 100 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py \
    tests/gpu/test_gpu_interleaved.py -p no:cacheprovider -rA -k "late_stop_checks and eager or sanitizer" \
    > $W/sanitizer.log 2>&1; echo "sanitizer rc=$?" >> $W/sanitizer.log; grep -E "^(PASSED|FAILED)|rc=" $W/sanitizer.log; save
fi
if [ "$STAGE" = 2 ]; then
  B="python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --strategies fused,interleaved --peers none"
  timeout 250 $B --model llama-1b-random --dtype-batch bfloat16:1,bfloat16:8 --time-budget 220 --out $W/h200-fused-1b-s11 \
    > $W/bench-1b.log 2>&1; echo "bench 1b rc=$?" >> $W/bench-1b.log; tail -12 $W/bench-1b.log; save
  timeout 200 $B --model llama-8b-random --dtype-batch bfloat16:1 --time-budget 170 --out $W/h200-fused-8b-s11 \
    > $W/bench-8b.log 2>&1; echo "bench 8b rc=$?" >> $W/bench-8b.log; tail -8 $W/bench-8b.log; save
fi
if [ "$STAGE" = 3 ]; then
  for B in 1 8; do
    PYTHONPATH=$PYTHONPATH:$PWD/scripts timeout 260 python3 scripts/step_tiles_ab.py $W/step-tiles-b$B.json $B \
      > $W/step-tiles-b$B.log 2>&1; echo "rc=$?" >> $W/step-tiles-b$B.log
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(k, v) for k, v in d.items() if 'phase' in k and 'rounds' not in k or 'error' in k]" $W/step-tiles-b$B.json; save
  done
fi
if [ "$STAGE" = 4 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/scripts timeout 150 python3 scripts/step_tiles_ab.py --confirm $W/confirm.json \
    > $W/confirm.log 2>&1; echo "rc=$?" >> $W/confirm.log; grep -E "median|rc=" -A2 $W/confirm.log | grep -v rounds; save
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA \
    -k "real_shapes" > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $W/gpu-tests.log; save
  timeout 250 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --strategies fused,interleaved --peers none \
    --model llama-1b-random --dtype-batch bfloat16:1,bfloat16:8 --time-budget 220 --out $W/h200-fused-1b-s11b \
    > $W/bench-1b.log 2>&1; echo "bench 1b rc=$?" >> $W/bench-1b.log; tail -12 $W/bench-1b.log; save
fi
if [ "$STAGE" = 5 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/scripts timeout 240 python3 scripts/call_timeline.py $W/timeline-1b llama-1b-random \
    > $W/timeline-1b.log 2>&1; echo "rc=$?" >> $W/timeline-1b.log; tail -5 $W/timeline-1b.log; save
fi
if [ "$STAGE" = 6 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/scripts timeout 200 python3 scripts/step_tiles_ab.py --attention $W/attention.json \
    > $W/attention.log 2>&1; echo "rc=$?" >> $W/attention.log; grep -E "median|rc=|error" -A5 $W/attention.log | grep -v rounds; save
fi
if [ "$STAGE" = 7 ]; then
  PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 330 python3 -m pytest -m cuda tests/gpu/test_gpu_decoder.py tests/gpu/test_gpu_fused.py \
    -p no:cacheprovider -rA -k "test_gpu_decoder or gpt2 or second_call or late_stop or greedy_choice" > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" $W/gpu-tests.log; save
fi
