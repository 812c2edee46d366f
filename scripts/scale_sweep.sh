#!/usr/bin/env bash
# Decode over rows and prompt lengths on one H200 (at most 4 minutes: the sweep 150 s, the test 90 s): Llama-1B shape, bfloat16, fused against
# interleaved; rows 1, 16, 32, 64, 128 at a 32-token prompt (64 new tokens), rows 1 and 8 at 4K, 8K and 16K-token
# prompts (32 new tokens). Then the GPU test of the fused tokens at 64 and 128 rows and at a 4K prompt (float32,
# against Hugging Face). Writes OUT_DIR/scale.{json,md}, traces/ and gpu-test.log.
#     bash scripts/scale_sweep.sh OUT_DIR
set -uo pipefail
OUT_DIR=${1:?usage: scale_sweep.sh OUT_DIR}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests
mkdir -p "$OUT_DIR"
timeout 150 python3 scripts/scale_sweep.py --out "$OUT_DIR" --model llama-1b-random --dtype bfloat16 \
  --rows 1,16,32,64,128 --prompts 32 --long-rows 1,8 --long-prompts 4096,8192,16384 \
  --strategies fused,interleaved --new-tokens 64 --long-new-tokens 32 --repeats 3 --time-budget 115 \
  > "$OUT_DIR/sweep.log" 2>&1; echo "sweep rc=$?" >> "$OUT_DIR/sweep.log"
tail -30 "$OUT_DIR/sweep.log"
timeout 90 python3 -m pytest -m cuda tests/gpu/test_gpu_scale.py -p no:cacheprovider -rA > "$OUT_DIR/gpu-test.log" 2>&1
echo "gpu test rc=$?" >> "$OUT_DIR/gpu-test.log"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" "$OUT_DIR/gpu-test.log"
