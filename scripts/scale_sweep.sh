#!/usr/bin/env bash
# Decode over rows and prompt lengths on one H200 (at most 4 minutes: the sweep 150 s, the test 90 s): Llama-1B shape,
# bfloat16, fused against interleaved; rows 1, 16, 32, 64, 128 at a 32-token prompt (64 new tokens), rows 1 and 8 at
# 4K, 8K and 16K-token prompts (32 new tokens). Then the GPU test of the fused tokens at 64 and 128 rows and at a 4K
# prompt (float32, against Hugging Face). Writes DIR/scale.{json,md}, traces/, sweep.log and gpu-test.log.
#     bash scripts/scale_sweep.sh --out DIR
# made results/h200/llama-1b-scale-rows (docs/KERNELS.md, "Swapped tiles from 17 rows on": the step before them).
set -uo pipefail
out=""
usage="usage: bash scripts/scale_sweep.sh --out DIR"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:-}; shift 2 || { echo "scale_sweep.sh: --out needs a directory; $usage" >&2; exit 2; } ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "scale_sweep.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "scale_sweep.sh: --out DIR is required; $usage" >&2; exit 2; }
[ ! -e "$out" ] || [ -d "$out" ] || { echo "scale_sweep.sh: --out $out is a file, not a directory" >&2; exit 2; }
for name in scale.json sweep.log gpu-test.log; do  # an earlier run's: never overwritten
  [ ! -e "$out/$name" ] || { echo "scale_sweep.sh: $out/$name exists: choose a new --out" >&2; exit 2; }
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src:$PWD/tests"
timeout 150 python3 scripts/scale_sweep.py --out "$out" --model llama-1b-random --dtype bfloat16 \
  --rows 1,16,32,64,128 --prompts 32 --long-rows 1,8 --long-prompts 4096,8192,16384 \
  --strategies fused,interleaved --new-tokens 64 --long-new-tokens 32 --repeats 3 --time-budget 115 \
  > "$out/sweep.log" 2>&1; echo "sweep rc=$?" >> "$out/sweep.log"
tail -30 "$out/sweep.log"
timeout 90 python3 -m pytest -m cuda tests/gpu/test_gpu_scale.py -p no:cacheprovider -rA > "$out/gpu-test.log" 2>&1
echo "gpu test rc=$?" >> "$out/gpu-test.log"
grep -E "^(PASSED|FAILED|ERROR)|passed|failed|rc=" "$out/gpu-test.log"
