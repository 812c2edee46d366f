#!/usr/bin/env bash
# Session-4 GPU calls on an nvidia-h200-x2. Stage A: GPU 0 tunes the fused kernels and profiles the fused
# step (scripts/kernel_sweep.py); GPU 1 runs the named sanitizer check and then tests/gpu.
#   bash scripts/gpu_session4.sh A
# Results go to $OUT. OVERLAPDECODE_COMMIT names the commit (the copy has no .git).
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $OUT/gpu.txt
if [ "$STAGE" = A ]; then
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src
    mkdir -p $OUT/sweep
    timeout 540 taskset -c 0-15 python3 scripts/kernel_sweep.py $OUT/sweep > $OUT/sweep.log 2>&1
    echo "sweep rc=$?" >> $OUT/sweep.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=src
    TORCH_CUDA_SANITIZER=1 timeout 120 taskset -c 16-31 python3 -m pytest -m cuda tests/gpu -p no:cacheprovider -rA \
      -k "second_call or sanitizer" > $OUT/gpu-sanitizer.log 2>&1
    echo "sanitizer rc=$?" >> $OUT/gpu-sanitizer.log
    timeout 410 taskset -c 16-31 python3 -m pytest -m cuda tests/gpu -p no:cacheprovider -rA --durations=15 \
      > $OUT/gpu-tests.log 2>&1
    echo "tests rc=$?" >> $OUT/gpu-tests.log
  ) &
  wait
  tail -4 $OUT/gpu-sanitizer.log; tail -25 $OUT/gpu-tests.log; tail -20 $OUT/sweep.log
elif [ "$STAGE" = B ]; then
  W=/tmp/gw-B; mkdir -p $W
  # GPU 0: the sweep again (after a kernel change); GPU 1: the fused tests on the GPU, then a profiled bench
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src
    mkdir -p $W/sweep
    timeout 500 taskset -c 0-15 python3 scripts/kernel_sweep.py $W/sweep > $W/sweep.log 2>&1
    echo "sweep rc=$?" >> $W/sweep.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=src:tests
    timeout 90 taskset -c 16-31 python3 -m pytest tests/fused_kernel_cases.py -p no:cacheprovider -q > $W/gpu-tests.log 2>&1
    echo "kernel cases rc=$?" >> $W/gpu-tests.log
    timeout 220 taskset -c 16-31 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py tests/gpu/test_gpu_decode_attention.py \
      -p no:cacheprovider -rA >> $W/gpu-tests.log 2>&1
    echo "tests rc=$?" >> $W/gpu-tests.log
    timeout 200 taskset -c 16-31 python3 -m overlapdecode.cli bench --model llama-1b-random --strategies fused,interleaved \
      --peers none --dtype-batch bfloat16:1,bfloat16:8 --lengths 200 --warmup 1 --repeats 3 --time-budget 170 \
      --out $W/bench-1b > $W/bench-1b.log 2>&1
    echo "bench rc=$?" >> $W/bench-1b.log
  ) &
  wait
  tar czf $OUT/work-B.tgz -C $W .
  tail -6 $W/gpu-tests.log; tail -12 $W/bench-1b.log; tail -20 $W/sweep.log
elif [ "$STAGE" = C ]; then
  # GPU 0: where fused's time goes beyond its step (scripts/fused_gap.py), then the 8B bench; GPU 1: the 1B
  # bench with the Hugging Face peer (transformers from .whl, the newest release), then GPT-2. Then both
  # GPUs: tensor parallelism, 8B, fused (scripts/tp_probe.py --parts speed).
  W=/tmp/gw-C; mkdir -p $W
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 -c "import transformers, transformers.models.llama; print('peer transformers', transformers.__version__)" \
    > $W/peer.txt 2>&1 || { echo "transformers from .whl does not import: the image's is used" >> $W/peer.txt; rm -rf /tmp/site; }
  B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3"
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src
    timeout 170 taskset -c 0-15 python3 scripts/fused_gap.py $W/gap > $W/gap.log 2>&1; echo "gap rc=$?" >> $W/gap.log
    timeout 150 taskset -c 0-15 $B --model llama-8b-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 130 --out $W/h200-fused-8b > $W/bench-8b.log 2>&1
    echo "bench rc=$?" >> $W/bench-8b.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site:src
    timeout 235 taskset -c 16-31 $B --model llama-1b-random --strategies fused,interleaved --peers hf-compiled \
      --dtype-batch bfloat16:1,bfloat16:8 --time-budget 215 --out $W/h200-fused-1b > $W/bench-1b.log 2>&1
    echo "bench rc=$?" >> $W/bench-1b.log
    timeout 85 taskset -c 16-31 $B --model gpt2-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 70 --out $W/h200-fused-gpt2 > $W/bench-gpt2.log 2>&1
    echo "bench rc=$?" >> $W/bench-gpt2.log
  ) &
  wait
  PYTHONPATH=src timeout 230 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-speed.json --parts speed \
    --strategy fused --part-timeout 200 > $W/tp.log 2>&1; echo "tp rc=$?" >> $W/tp.log
  rm -f $W/gap/fused-generate-trace.json.gz; gzip -q $W/gap/fused-generate-trace.json
  tar czf $OUT/work-C.tgz -C $W .
  cat $W/gap/fused-gap.json; tail -3 $W/gap.log; tail -14 $W/bench-1b.log; tail -8 $W/bench-8b.log $W/bench-gpt2.log; tail -12 $W/tp.log
fi
