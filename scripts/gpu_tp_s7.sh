#!/usr/bin/env bash
# Session 7, on two H200s (nvidia-h200-x2): the fused step's symmetric-memory all-reduce
# (FusedModel(symmetric_all_reduce=True), built in session 6, never run on two GPUs): tp=2 fused float32 tokens
# against tp=1 (llama-1b-random, 200 tokens), then llama-8b-random bfloat16 batch 1 tp=2 / tp=1 ms per token.
# Rank 0 writes the JSON after each part; results to $OUT/tp-s7.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=$OUT/tp-s7; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $W/gpu.txt
timeout ${TP_TIMEOUT:-230} torchrun --nproc-per-node 2 scripts/tp_probe.py $W/tp-symmetric.json --parts ${TP_PARTS:-equal,speed} \
  --equal-strategies fused --strategy fused --symmetric-all-reduce --part-timeout 150 > $W/tp.log 2>&1
echo "tp rc=$?" >> $W/tp.log
grep -E "rank 0|rc=|Error|error" $W/tp.log | tail -8
python3 -c "
import json
d = json.load(open('$W/tp-symmetric.json'))['parts']
e = d.get('equal', {}); s = d.get('speed', {})
print('equal', {k: v for k, v in e.items() if k != 'model'})
print('speed ratio', s.get('ratio_ms_per_token'), s.get('ratio_decode_ms_per_token'),
      'tp1', s.get('tp1', {}).get('ms_per_token'), 'tp2', s.get('tp2', {}).get('ms_per_token'))
" 2>&1 | tail -3
