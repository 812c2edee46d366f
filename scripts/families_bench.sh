#!/usr/bin/env bash
# The fused step of every embedded family shape beside Llama's, on one GPU: `overlapdecode bench` at batch 1, 200 new
# tokens, bfloat16, `fused` only, one results folder per shape and one log each, named without the -random suffix
# (mixtral-random: DIR/mixtral-fused-b1, DIR/mixtral.log), each run cut at SECONDS (default 150: a real-size shape's
# first call compiles the prefill and the kernels).
#     bash scripts/families_bench.sh --out DIR [--seconds S] [NAME ...]   (default: every family shape below)
# The results folders go under results/<gpu>/ as they are (results/h200/*-fused-b1, rows of the README's table); the
# README table: python3 -m overlapdecode.bench.report.results_table results/h200 --readme README.md
set -uo pipefail
FAMILIES=(qwen3-0.6b-random gemma3-1b-random qwen3-moe-random phi3-mini-random olmo2-1b-random smollm3-3b-random
  granite-2b-random gemma2-2b-random mixtral-random gpt-oss-random)
out=""
seconds=150
names=()
usage="usage: bash scripts/families_bench.sh --out DIR [--seconds S] [NAME ...]"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:-}; shift 2 || { echo "families_bench.sh: --out needs a directory; $usage" >&2; exit 2; } ;;
    --seconds) seconds=${2:-}; shift 2 || { echo "families_bench.sh: --seconds needs a number; $usage" >&2; exit 2; } ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "families_bench.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
    *) names+=("$1"); shift ;;
  esac
done
[ -n "$out" ] || { echo "families_bench.sh: --out DIR is required; $usage" >&2; exit 2; }
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "families_bench.sh: --seconds must be a positive integer, got '$seconds'" >&2; exit 2; }
[ ! -e "$out" ] || [ -d "$out" ] || { echo "families_bench.sh: --out $out is a file, not a directory" >&2; exit 2; }
[ ${#names[@]} -gt 0 ] || names=("${FAMILIES[@]}")
for name in "${names[@]}"; do  # an earlier run's: never overwritten
  dir="$out/${name%-random}-fused-b1"
  [ ! -e "$dir" ] || { echo "families_bench.sh: $dir exists: choose a new --out" >&2; exit 2; }
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
for name in "${names[@]}"; do
  timeout "$seconds" python3 -m overlapdecode bench --model "$name" --dtype bfloat16 --batch 1 --lengths 200 \
    --strategies fused --peers none --warmup 1 --repeats 3 --no-profile --out "$out/${name%-random}-fused-b1" \
    > "$out/${name%-random}.log" 2>&1
  echo "$name rc=$?" | tee -a "$out/${name%-random}.log"
done
