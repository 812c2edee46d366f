#!/usr/bin/env bash
# Session-6 GPU calls on one H200 (results to $OUT; OVERLAPDECODE_COMMIT names the commit, the copy has no .git).
#   bash scripts/gpu_session6.sh A   # the 1B bench with PDL LATE (fused, interleaved, HF peer from .whl), the
#                                    # GPT-2 step's kernel table, then tests/gpu in full
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=/tmp/gw-$STAGE; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $W/gpu.txt
B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3"
peer() {  # the HF peer's transformers from .whl into /tmp/site (the image's is used if it does not import)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 -c "import transformers, transformers.models.llama; print('peer transformers', transformers.__version__)" \
    > $W/peer.txt 2>&1 || { echo "transformers from .whl does not import: the image's is used" >> $W/peer.txt; rm -rf /tmp/site; }
}
if [ "$STAGE" = A ]; then
  peer
  PYTHONPATH=/tmp/site:src timeout 225 $B --model llama-1b-random --strategies fused,interleaved --peers hf-compiled \
    --dtype-batch bfloat16:1,bfloat16:8 --time-budget 205 --out $W/h200-fused-1b-late > $W/bench-1b.log 2>&1
  echo "bench rc=$?" >> $W/bench-1b.log
  grep -hE "│|rc=" $W/bench-1b.log | tail -12
  PYTHONPATH=src:scripts timeout 45 python3 -c "
import sys; sys.argv=['x']
from kernel_sweep import step_profile
print(step_profile(1, '$W', 'gpt2-random'))" > $W/gpt2-profile.log 2>&1; echo "profile rc=$?" >> $W/gpt2-profile.log
  tail -2 $W/gpt2-profile.log
  PYTHONPATH=src timeout 310 python3 -m pytest -m cuda tests/gpu -p no:cacheprovider -rA --durations=15 \
    > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "FAILED|ERROR|passed|failed|rc=" $W/gpu-tests.log | tail -8
  rm -f $W/step-trace-*.json
  tar czf $OUT/work-A.tgz -C $W .
fi
