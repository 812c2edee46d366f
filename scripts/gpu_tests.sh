#!/usr/bin/env bash
# The GPU tests, on a CUDA machine, from the repository root:
#   bash scripts/gpu_tests.sh --out DIR [--only tests|sanitizer] [--tests PATHS] [--sanitizer-k EXPR] [--file-limit S]
#                             [--workers N]
# 1. python3 -m pytest -v -m cuda on each test file of tests/gpu (or of --tests, space-separated paths) in turn, one
#    process a file (a file's failure or hang cannot take the next file's GPU state with it), each under a time limit
#    of --file-limit seconds (default 600) -> DIR/gpu-tests.log, appended as each test ends (a run cut short keeps
#    what finished), each test's seconds (pytest's durations, for splitting a file across runs by node id), each
#    file's exit status and seconds on a line `== FILE rc=N Ns`, then the totals; each failure's traceback ->
#    DIR/failures.log as the test ends (tests/support/failure_log.py: a run its time limit cuts keeps why its tests
#    failed). --workers N (N > 1, needs pytest-xdist): a file's tests in N processes on the one GPU, for the tests'
#    compiles (CPU work: Triton, ptxas, inductor) to run side by side; no test times anything, and each process owns
#    its own CUDA state. A test that ran out of GPU memory beside the other processes (some allocate tens of GiB)
#    runs again alone, in one process, and its outcome there is its outcome; any other failure stands. The totals
#    count each test's last outcome (pytest's junit reports, DIR/junit-*.xml)
# 2. the eager stream paths under PyTorch's CUDA sanitizer (TORCH_CUDA_SANITIZER=1), which raises on any
#    cross-stream access without an ordering event; it includes a planted race that must be reported, so the
#    run shows the sanitizer was active -> DIR/sanitizer.log
# DIR/gpu.txt records the GPU, the driver and the versions. The exit status is non-zero if either run failed.
set -uo pipefail
out="" only="" tests="tests/gpu" file_limit=600 workers=1
sanitizer_k="eager-pingpong or eager-deferred or eager-kv or sanitizer"
usage="usage: bash scripts/gpu_tests.sh --out DIR [--only tests|sanitizer] [--tests PATHS] [--sanitizer-k EXPR] [--file-limit S] [--workers N]"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=${2:-}; shift 2 || { echo "gpu_tests.sh: --out needs a directory; $usage" >&2; exit 2; } ;;
    --only) only=${2:-}; shift 2 || { echo "gpu_tests.sh: --only needs tests or sanitizer" >&2; exit 2; } ;;
    --tests) tests=${2:-}; shift 2 || { echo "gpu_tests.sh: --tests needs paths" >&2; exit 2; } ;;
    --sanitizer-k) sanitizer_k=${2:-}; shift 2 || { echo "gpu_tests.sh: --sanitizer-k needs an expression" >&2; exit 2; } ;;
    --file-limit) file_limit=${2:-}; shift 2 || { echo "gpu_tests.sh: --file-limit needs seconds" >&2; exit 2; } ;;
    --workers) workers=${2:-}; shift 2 || { echo "gpu_tests.sh: --workers needs a count" >&2; exit 2; } ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "gpu_tests.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || { echo "gpu_tests.sh: --out DIR is required; $usage" >&2; exit 2; }
case "$only" in ""|tests|sanitizer) ;; *) echo "gpu_tests.sh: --only takes tests or sanitizer, got '$only'" >&2; exit 2 ;; esac
case "$file_limit" in ''|*[!0-9]*) echo "gpu_tests.sh: --file-limit takes whole seconds, got '$file_limit'" >&2; exit 2 ;; esac
case "$workers" in ''|*[!0-9]*|0) echo "gpu_tests.sh: --workers takes a count >= 1, got '$workers'" >&2; exit 2 ;; esac
parallel=()
if [ "$workers" -gt 1 ]; then
  python3 -c "import xdist" 2>/dev/null || { echo "gpu_tests.sh: --workers $workers needs pytest-xdist" \
    "(pip install pytest-xdist)" >&2; exit 2; }
  parallel=(-n "$workers")
fi
[ ! -e "$out" ] || [ -d "$out" ] || { echo "gpu_tests.sh: --out $out is a file, not a directory" >&2; exit 2; }
for log in gpu-tests.log sanitizer.log junit-1.xml; do
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
  files=()
  # shellcheck disable=SC2086  # --tests is a space-separated list of paths
  for path in $tests; do
    if [ -d "$path" ]; then files+=("$path"/test_*.py); else files+=("$path"); fi
  done
  : > "$out/gpu-tests.log"
  failures=(-p support.failure_log --failure-log "$out/failures.log")
  n=0 reports=()  # each run's junit report, present or not (a run its time limit cut writes none)
  for file in "${files[@]}"; do
    t=$SECONDS n=$((n + 1))
    junit="$out/junit-$n.xml"
    reports+=("$junit")
    timeout -k 10 "$file_limit" python3 -m pytest -v -m cuda "$file" "${parallel[@]}" -p no:cacheprovider -rA \
      --tb=short --durations=0 --junitxml="$junit" "${failures[@]}" \
      >> "$out/gpu-tests.log" 2>&1
    rc=$?
    if [ "$rc" -eq 1 ] && [ "$workers" -gt 1 ] && [ -f "$junit" ]; then
      # the failures that ran out of GPU memory beside the other workers run again, alone in one process
      mapfile -t oom < <(python3 scripts/junit_outcomes.py --out-of-memory "${file%%::*}" "$junit")
      if [ "${#oom[@]}" -gt 0 ]; then
        echo "== $file: ${#oom[@]} test(s) out of GPU memory beside other workers, run again alone" \
          | tee -a "$out/gpu-tests.log"
        left=$((file_limit - (SECONDS - t)))
        [ "$left" -gt 10 ] || left=10
        reports+=("$out/junit-$n-alone.xml")
        timeout -k 10 "$left" python3 -m pytest -v -m cuda "${oom[@]}" -p no:cacheprovider -rA --tb=short \
          --durations=0 --junitxml="${reports[-1]}" "${failures[@]}" >> "$out/gpu-tests.log" 2>&1
        alone=$?
        # the file passes if the tests run alone were its only failures and pass alone
        python3 scripts/junit_outcomes.py --only-out-of-memory "$junit" && rc=$alone
      fi
    fi
    echo "== $file rc=$rc $((SECONDS - t))s" | tee -a "$out/gpu-tests.log"
    [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || status=1  # 5: no test collected (all deselected)
  done
  echo "== totals: $(python3 scripts/junit_outcomes.py --totals "${reports[@]}")" | tee -a "$out/gpu-tests.log"
fi
if [ "$only" != tests ]; then
  TORCH_CUDA_SANITIZER=1 python3 -m pytest -q -m cuda tests/gpu -p no:cacheprovider -rA -k "$sanitizer_k" \
    > "$out/sanitizer.log" 2>&1 || status=1
  tail -3 "$out/sanitizer.log"
fi
exit $status
