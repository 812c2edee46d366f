#!/usr/bin/env bash
# Session-3 GPU call 1: the decoder's GPU tests, the sanitizer on the eager stream paths, and the stop-check
# pairs experiment (alone and with the host's cores contended), plus one profile under contention.
set -uo pipefail
export WORK=/tmp/gw OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown} PYTHONPATH=src PYTHONUNBUFFERED=1
mkdir -p $WORK
TESTS="tests/gpu/test_gpu_decoder.py tests/gpu/test_gpu_interleaved.py" bash scripts/gpu_check.sh tests
SAN_K="(eager and not gpt2-random) or second_call" bash scripts/gpu_check.sh sanitize
python3 scripts/stopcheck_pairs.py --out $WORK/pairs --burn 14 2>&1 | tee $WORK/pairs.log
for i in $(seq 14); do (while :; do :; done) & done
python3 -m overlapdecode.cli profile --model gpt2-random --dtype bfloat16 --strategies interleaved,nocheck \
  --batch 1 --new-tokens 400 --out $WORK/profile-burn 2>&1 | tail -8
kill $(jobs -p) 2>/dev/null
python3 -m overlapdecode.cli profile --model gpt2-random --dtype bfloat16 --strategies interleaved,nocheck \
  --batch 1 --new-tokens 400 --out $WORK/profile-alone 2>&1 | tail -8
DEST=$OUT bash scripts/gpu_check.sh pack
