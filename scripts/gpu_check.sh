#!/usr/bin/env bash
# The GPU proof, in stages: run on a CUDA machine from the repository root; results under $WORK (default
# ./gpu-out), and `pack` tars $WORK into $OUT/gpu-work.tgz (the device tool returns few files).
# A copy of the checkout without .git records `commit unknown`: pass OVERLAPDECODE_COMMIT=<hash> along.
#   bash scripts/gpu_check.sh tests      # GPU tests (TESTS= narrows them)
#   bash scripts/gpu_check.sh sanitize   # eager presets and eager stream paths under TORCH_CUDA_SANITIZER=1
#                                        # (SAN_K= narrows; includes a planted race that must be caught)
#   bash scripts/gpu_check.sh profile    # profiler timelines for compiled and interleaved at batch 1
#   bash scripts/gpu_check.sh bench ARGS # overlapdecode bench ARGS --out $WORK/bench
#   bash scripts/gpu_check.sh pack
set -uo pipefail
OUT=${WORK:-gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
stage=${1:-tests}; shift || true
[ "$stage" = pack ] || nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
[ "$stage" = pack ] || python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' | tee -a "$OUT/gpu.txt"
case "$stage" in
  tests)  # TESTS / SAN_K narrow the run (defaults: the whole GPU suite; eager presets and eager stream paths)
    python3 -m pytest -m cuda ${TESTS:-tests/gpu} -q -p no:cacheprovider -s 2>&1 | tee "$OUT/gpu-tests.log" \
      | grep -v "^$" | tail -25
    ;;
  sanitize)
    TORCH_CUDA_SANITIZER=1 python3 -m pytest -m cuda tests/gpu -q -p no:cacheprovider -rA \
      -k "${SAN_K:-eager and not gpt2-random}" 2>&1 | tee "$OUT/gpu-sanitizer.log" | grep -E "PASS|FAIL|SKIP|passed|failed" | tail -40
    ;;
  profile)
    python3 -m overlapdecode.cli profile --model gpt2-random --strategies ${PROFILE_STRATEGIES:-compiled,interleaved} \
      --batch 1 --new-tokens ${PROFILE_TOKENS:-400} --out "$OUT/profile" 2>&1 | tee "$OUT/profile.log" | tail -8
    ;;
  bench)
    name=${BENCH_NAME:-bench}
    python3 -m overlapdecode.cli bench "$@" --out "$OUT/$name" 2>&1 | tee "$OUT/$name.log" | tail -60
    ;;
  pack)
    tar czf "${DEST:?set DEST to the folder that comes back}/gpu-work.tgz" -C "$OUT" . && ls -la "$DEST"
    ;;
esac
