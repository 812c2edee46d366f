#!/usr/bin/env bash
# Session-5 GPU calls on an nvidia-h200-x2 (results to $OUT; OVERLAPDECODE_COMMIT names the commit, the copy
# has no .git).
#   bash scripts/gpu_session5.sh A   # GPU 0: the StepGraph/PDL tests, then scripts/fused_gap.py;
#                                    # GPU 1: tests/gpu in full, then the 1B bench (fused vs interleaved)
#   bash scripts/gpu_session5.sh B   # after the attention ticket and the PDL modes: GPU 0: the fused and attention
#                                    # GPU tests, then scripts/fused_gap.py; GPU 1: the benches (1B with the HF
#                                    # peer from .whl, GPT-2, 8B; fused vs interleaved)
#   bash scripts/gpu_session5.sh C   # both GPUs: tensor parallelism, 8B, fused; then llama-70b-random, tp=2, fused
#   bash scripts/gpu_session5.sh D   # after the symmetric-memory all-reduce: tp=2 fused tokens = tp=1 (float32,
#                                    # 1B), then the 8B speed part again
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $OUT/gpu.txt
B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3"
W=/tmp/gw-$STAGE; mkdir -p $W
if [ "$STAGE" = A ]; then
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" > $W/versions.txt 2>&1
    timeout 200 taskset -c 0-15 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA \
      -k "captured or pdl" > $W/gpu-new-tests.log 2>&1
    echo "new tests rc=$?" >> $W/gpu-new-tests.log
    timeout 330 taskset -c 0-15 python3 scripts/fused_gap.py $W/gap > $W/gap.log 2>&1; echo "gap rc=$?" >> $W/gap.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=src
    timeout 360 taskset -c 16-31 python3 -m pytest -m cuda tests/gpu -p no:cacheprovider -rA --durations=15 \
      > $W/gpu-tests.log 2>&1
    echo "tests rc=$?" >> $W/gpu-tests.log
    timeout 170 taskset -c 16-31 $B --model llama-1b-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1,bfloat16:8 --time-budget 150 --out $W/h200-fused-1b-graph > $W/bench-1b.log 2>&1
    echo "bench rc=$?" >> $W/bench-1b.log
  ) &
  wait
  rm -f $W/gap/fused-generate-trace.json.gz; gzip -q $W/gap/fused-generate-trace.json
  tar czf $OUT/work-A.tgz -C $W .
  cat $W/versions.txt; tail -8 $W/gpu-new-tests.log; cat $W/gap/fused-gap.json; tail -3 $W/gap.log
  tail -25 $W/gpu-tests.log; tail -14 $W/bench-1b.log
elif [ "$STAGE" = B ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 -c "import transformers, transformers.models.llama; print('peer transformers', transformers.__version__)" \
    > $W/peer.txt 2>&1 || { echo "transformers from .whl does not import: the image's is used" >> $W/peer.txt; rm -rf /tmp/site; }
  (
    export CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src:tests
    timeout 60 taskset -c 0-15 python3 -m pytest tests/fused_kernel_cases.py -p no:cacheprovider -q > $W/gpu-tests.log 2>&1
    echo "kernel cases rc=$?" >> $W/gpu-tests.log
    timeout 200 taskset -c 0-15 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py tests/gpu/test_gpu_decode_attention.py \
      tests/test_kernel_decode_attention.py -p no:cacheprovider -rA >> $W/gpu-tests.log 2>&1
    echo "tests rc=$?" >> $W/gpu-tests.log
    timeout 300 taskset -c 0-15 python3 scripts/fused_gap.py $W/gap > $W/gap.log 2>&1; echo "gap rc=$?" >> $W/gap.log
  ) &
  (
    export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site:src
    timeout 230 taskset -c 16-31 $B --model llama-1b-random --strategies fused,interleaved --peers hf-compiled \
      --dtype-batch bfloat16:1,bfloat16:8 --time-budget 210 --out $W/h200-fused-1b-graph > $W/bench-1b.log 2>&1
    echo "bench rc=$?" >> $W/bench-1b.log
    timeout 80 taskset -c 16-31 $B --model gpt2-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 65 --out $W/h200-fused-gpt2-graph > $W/bench-gpt2.log 2>&1
    echo "bench rc=$?" >> $W/bench-gpt2.log
    timeout 150 taskset -c 16-31 $B --model llama-8b-random --strategies fused,interleaved --peers none \
      --dtype-batch bfloat16:1 --time-budget 130 --out $W/h200-fused-8b-graph > $W/bench-8b.log 2>&1
    echo "bench rc=$?" >> $W/bench-8b.log
  ) &
  wait
  rm -f $W/gap/fused-generate-trace.json.gz; gzip -q $W/gap/fused-generate-trace.json
  tar czf $OUT/work-B.tgz -C $W .
  grep -E "passed|failed|rc=" $W/gpu-tests.log | tail -5; cat $W/gap/fused-gap.json; tail -2 $W/gap.log
  tail -14 $W/bench-1b.log; tail -7 $W/bench-gpt2.log $W/bench-8b.log
elif [ "$STAGE" = C ]; then
  # the decode-attention GPU tests stage B's 200 s ran out before (reads-only-live-slots at GPT-2, graph replay)
  CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src:tests timeout 60 python3 -m pytest -m cuda tests/gpu/test_gpu_decode_attention.py \
    -p no:cacheprovider -rA -k "reads_only_slots_in_start_to_length and gpt2 or graph_replay" > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "passed|failed|rc=" $W/gpu-tests.log | tail -3
  PYTHONPATH=src timeout 185 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-speed.json --parts speed \
    --strategy fused --part-timeout 170 > $W/tp.log 2>&1; echo "tp rc=$?" >> $W/tp.log
  tail -12 $W/tp.log
  PYTHONPATH=src timeout 330 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-70b.json --parts big \
    --strategy fused --part-timeout 310 > $W/tp-70b.log 2>&1; echo "tp rc=$?" >> $W/tp-70b.log
  tar czf $OUT/work-C.tgz -C $W .
  tail -20 $W/tp-70b.log
elif [ "$STAGE" = D ]; then
  PYTHONPATH=src timeout 250 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-equal.json --parts equal \
    --equal-strategies fused --part-timeout 230 > $W/tp-equal.log 2>&1; echo "tp rc=$?" >> $W/tp-equal.log
  grep -E "rank 0|rc=" $W/tp-equal.log | tail -4
  PYTHONPATH=src timeout 185 torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-speed.json --parts speed \
    --strategy fused --part-timeout 170 > $W/tp.log 2>&1; echo "tp rc=$?" >> $W/tp.log
  tar czf $OUT/work-D.tgz -C $W .
  grep -E "rank 0|rc=|Error|error" $W/tp.log | tail -6
fi
