#!/usr/bin/env bash
# Session-3 final GPU calls on an nvidia-h200-x2 (two H200s of one host), in two stages run back to back:
#   bash scripts/gpu_final.sh A   # GPU 0: tests/gpu, then the sanitizer run; GPU 1: the bench of fused vs
#                                 # interleaved vs Hugging Face (transformers from .whl, the newest release)
#   bash scripts/gpu_final.sh B   # both GPUs: tensor parallelism (scripts/tp_probe.py under torchrun)
# Each half of the host's 32 cores serves one GPU (taskset), so the two jobs of stage A do not share cores.
# Results go to $OUT/gpu-work-$STAGE.tgz. OVERLAPDECODE_COMMIT names the commit (the copy has no .git).
set -uo pipefail
STAGE=${1:?stage A or B}
W=/tmp/gw-$STAGE; mkdir -p $W
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $W/gpu.txt
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' >> $W/gpu.txt
if [ "$STAGE" = A ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src
    timeout 300 taskset -c 0-15 python3 -m pytest -m cuda tests/gpu -q -p no:cacheprovider -rA -s \
      > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
    TORCH_CUDA_SANITIZER=1 timeout 170 taskset -c 0-15 python3 -m pytest -m cuda tests/gpu -q -p no:cacheprovider -rA \
      -k "(eager and not gpt2-random) or second_call or sanitizer" > $W/gpu-sanitizer.log 2>&1
    echo "sanitizer rc=$?" >> $W/gpu-sanitizer.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site:src
    B="taskset -c 16-31 python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3 --no-profile"
    timeout 190 $B --model llama-1b-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1,bfloat16:8 --time-budget 150 --out $W/h200-fused-1b > $W/bench-1b.log 2>&1
    timeout 75 $B --model gpt2-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 50 --out $W/h200-fused-gpt2 > $W/bench-gpt2.log 2>&1
    timeout 85 $B --model llama-8b-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 60 --out $W/h200-fused-8b > $W/bench-8b.log 2>&1
    timeout 100 $B --model llama-1b-random --strategies fused --peers hf-compiled --append \
      --dtype-batch bfloat16:1 --time-budget 80 --out $W/h200-fused-1b > $W/bench-1b-peer.log 2>&1
  ) &
  wait
  tail -5 $W/gpu-tests.log; tail -3 $W/gpu-sanitizer.log; tail -25 $W/bench-*.log
else
  PYTHONPATH=src timeout 250 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp.json --parts equal,speed \
    --part-timeout 200 > $W/tp.log 2>&1; echo "tp rc=$?" >> $W/tp.log
  tail -30 $W/tp.log
fi
tar czf $OUT/gpu-work-$STAGE.tgz -C $W .
