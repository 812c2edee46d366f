#!/usr/bin/env bash
# Session-8 GPU calls on one H200 (results tar'd to $OUT/s8-STAGE.tgz: at most 8 files come back from a call;
# OVERLAPDECODE_COMMIT names the commit, the copy has no .git).
#   bash scripts/gpu_session8.sh A   # the greedy choice kernel (kernels/greedy.py; at 4f77f6c the same work in
#                                    # the LM head's programs): its kernel cases on the GPU; the fused float32 200-token tests against HF, the captured step
#                                    # against the eager one (bf16, greedy and sampling), the late-stop tests; the
#                                    # step graph with the finish against the torch choice (scripts/finish_ab.py);
#                                    # the GPT-2 bench (fused, interleaved)
#   bash scripts/gpu_session8.sh B   # the greedy kernel with fewer logits per program from 2 rows on: the step
#                                    # graph A/B again (finish_ab.py); the 1B bench (fused, interleaved, batch 1, 8)
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
W=/tmp/s8-$STAGE; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv > $W/gpu.txt
bench() {  # bench NAME MODEL DTYPE_BATCH STRATEGIES TIMEOUT
  timeout $5 python3 -m overlapdecode bench --lengths 200 --warmup 1 --repeats 3 --model $2 --strategies $4 \
    --peers none --dtype-batch $3 --time-budget $(( $5 - 30 )) --out $W/$1 > $W/bench-$1.log 2>&1
  echo "bench $1 rc=$?" >> $W/bench-$1.log; grep -E "^\| (fused|interleaved) |rc=" $W/bench-$1.log | head -8
}
if [ "$STAGE" = A ]; then
  timeout 150 python3 -m pytest tests/fused_kernel_cases.py -p no:cacheprovider -q -k "greedy or whole_step or generate_with" > $W/kernel-cases.log 2>&1
  echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
  timeout 300 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    -k "float32_tokens or captured_once or late_stop_checks_equal or second_call" > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=|divergence" $W/gpu-tests.log | tail -24
  timeout 150 python3 scripts/finish_ab.py $W/finish-ab > $W/finish-ab.log 2>&1
  echo "finish_ab rc=$?" >> $W/finish-ab.log; tail -5 $W/finish-ab.log
  bench h200-fused-gpt2-s8 gpt2-random bfloat16:1 fused,interleaved 110
elif [ "$STAGE" = B ]; then
  timeout 150 python3 scripts/finish_ab.py $W/finish-ab > $W/finish-ab.log 2>&1
  echo "finish_ab rc=$?" >> $W/finish-ab.log; tail -5 $W/finish-ab.log
  bench h200-fused-1b-s8 llama-1b-random bfloat16:1,bfloat16:8 fused,interleaved 330
fi
tar czf $OUT/s8-$STAGE.tgz -C /tmp s8-$STAGE
