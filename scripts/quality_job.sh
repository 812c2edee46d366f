#!/usr/bin/env bash
# The quantization quality run on one GPU, in one go (about 5.5 minutes on an H200, from the repository root):
#     bash scripts/quality_job.sh OUTDIR
# 1. scripts/train_stdlib.py: the target (~34M parameters; its loop stopped at 160 s)  -> OUTDIR/target/
# 2. scripts/train_stdlib.py: a draft on the target's tokenizer (~7M; loop 45 s)         -> OUTDIR/draft/
# 3. scripts/quant_quality.py on the target, then on the draft: perplexity in bfloat16, int8, int4 groups 128
#    and 64 -> OUTDIR/quality.json, OUTDIR/draft-quality.json (their tables at the end of the logs)
# Each step's output goes to OUTDIR/<step>.log, the GPU and versions to OUTDIR/gpu.txt, each step's wall time
# and exit status to OUTDIR/timings.txt. OUTDIR must be new or empty. The exit status is non-zero if a step failed;
# a failed target stops the run.
set -uo pipefail
usage="usage: bash scripts/quality_job.sh OUTDIR"
[ $# -eq 1 ] || { echo "quality_job.sh: expected one argument, OUTDIR; $usage" >&2; exit 2; }
case "$1" in -h|--help) echo "$usage"; exit 0 ;; -*) echo "quality_job.sh: unknown option '$1'; $usage" >&2; exit 2 ;; esac
out=$1
[ ! -e "$out" ] || [ -d "$out" ] || { echo "quality_job.sh: $out is a file, not a directory" >&2; exit 2; }
[ ! -d "$out" ] || [ -z "$(ls -A "$out")" ] || { echo "quality_job.sh: $out is not empty: choose a new OUTDIR" >&2; exit 2; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: not available"
  python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
} > "$out/gpu.txt" 2>&1
status=0
start=$SECONDS

step() {  # step NAME LIMIT_S COMMAND...: run it under a time limit, its output to NAME.log and the terminal
  local name=$1 limit=$2 t=$SECONDS rc
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  rc=${PIPESTATUS[0]}
  echo "$name $((SECONDS - t)) s rc=$rc" | tee -a "$out/timings.txt"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}

if step target 300 python3 scripts/train_stdlib.py --out "$out/target" --max-seconds 160; then
  step draft 150 python3 scripts/train_stdlib.py --out "$out/draft" --tokenizer "$out/target" \
    --hidden 256 --layers 4 --heads 4 --kv-heads 2 --intermediate 768 --max-seconds 45
  step quality 150 python3 scripts/quant_quality.py "$out/target" --out "$out/quality.json"
  [ ! -f "$out/draft/train.json" ] ||
    step draft-quality 120 python3 scripts/quant_quality.py "$out/draft" --out "$out/draft-quality.json"
fi
echo "total $((SECONDS - start)) s status=$status" | tee -a "$out/timings.txt"
exit "$status"
