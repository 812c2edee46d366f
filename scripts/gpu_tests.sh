#!/usr/bin/env bash
# The GPU tests, on a CUDA machine, from the repository root:
#   bash scripts/gpu_tests.sh --out DIR [--only tests|sanitizer] [--tests PATHS] [--sanitizer-k EXPR]
# 1. python3 -m pytest -q -m cuda tests/gpu (or --tests, space-separated paths) -> DIR/gpu-tests.log
# 2. the eager stream paths under PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1), which raises on any
#    cross-stream access without an ordering event; it includes a planted race that must be reported, so the
#    run shows the sanitizer was active -> DIR/sanitizer.log
# DIR/gpu.txt records the GPU, the driver and the versions. The exit status is non-zero if either run failed.
set -uo pipefail
out="" only="" tests="tests/gpu"
sanitizer_k="eager-pingpong or eager-deferred or eager-kv or sanitizer"
usage="usage: bash scripts/gpu_tests.sh --out DIR [--only tests|sanitizer] [--tests PATHS] [--sanitizer-k EXPR]"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:-}; shift 2 || { echo "gpu_tests.sh: --out needs a directory; $usage" >&2; exit 2; } ;;
    --only) only=${2:-}; shift 2 || { echo "gpu_tests.sh: --only needs tests or sanitizer" >&2; exit 2; } ;;
    --tests) tests=${2:-}; shift 2 || { echo "gpu_tests.sh: --tests needs paths" >&2; exit 2; } ;;
    --sanitizer-k) sanitizer_k=${2:-}; shift 2 || { echo "gpu_tests.sh: --sanitizer-k needs an expression" >&2; exit 2; } ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "gpu_tests.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_tests.sh: --out DIR is required; $usage" >&2; exit 2; }
case "$only" in ""|tests|sanitizer) ;; *) echo "gpu_tests.sh: --only takes tests or sanitizer, got '$only'" >&2; exit 2 ;; esac
[ ! -e "$out" ] || [ -d "$out" ] || { echo "gpu_tests.sh: --out $out is a file, not a directory" >&2; exit 2; }
for log in gpu-tests.log sanitizer.log; do
  [ ! -e "$out/$log" ] || { echo "gpu_tests.sh: $out/$log exists: choose a new --out" >&2; exit 2; }
done
mkdir -p "$out" && out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: not available"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
} > "$out/gpu.txt"
status=0
if [ "$only" != sanitizer ]; then
  # shellcheck disable=SC2086  # --tests is a space-separated list of paths
  python3 -m pytest -q -m cuda $tests -p no:cacheprovider -rA > "$out/gpu-tests.log" 2>&1 || status=1
  tail -3 "$out/gpu-tests.log"
fi
if [ "$only" != tests ]; then
  TORCH_CUDA_SANITIZER=1 python3 -m pytest -q -m cuda tests/gpu -p no:cacheprovider -rA -k "$sanitizer_k" \
    > "$out/sanitizer.log" 2>&1 || status=1
  tail -3 "$out/sanitizer.log"
fi
exit $status
