#!/usr/bin/env bash
# For the next session with two H200s (nvidia-h200-x2), written in session 7 after its device time ran out:
# the fused step's vocabulary-parallel LM head (tp.VocabShard, c008da0; never run with NCCL) with the symmetric
# all-reduce: tp=2 float32 tokens = tp=1 (llama-1b-random, 200 tokens), then llama-8b-random bfloat16 batch 1
# tp=2 / tp=1 with the sharded head and, for comparison in the same session, with the replicated head
# (--replicated-head: session 7's 0.74x configuration). Results tar'd to $OUT/tp-next.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=/tmp/tp-next; rm -rf $W; mkdir -p $W
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $W/gpu.txt
P="torchrun --nproc-per-node 2 scripts/tp_probe.py"
timeout 200 $P $W/tp-head-sharded.json --parts equal,speed --equal-strategies fused,interleaved --strategy fused \
  --symmetric-all-reduce --part-timeout 150 > $W/tp-head-sharded.log 2>&1; echo "rc=$?" >> $W/tp-head-sharded.log
timeout 170 $P $W/tp-head-replicated.json --parts speed --strategy fused --symmetric-all-reduce --replicated-head \
  --part-timeout 150 > $W/tp-head-replicated.log 2>&1; echo "rc=$?" >> $W/tp-head-replicated.log
for f in $W/tp-head-*.json; do python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))['parts']; s = d.get('speed', {})
print(sys.argv[1], 'equal', d.get('equal', {}).get('all_equal'), 'ratio', s.get('ratio_ms_per_token'),
      'tp1', s.get('tp1', {}).get('ms_per_token'), 'tp2', s.get('tp2', {}).get('ms_per_token'), s.get('error', ''))" $f; done
tar czf $OUT/tp-next.tgz -C /tmp tp-next
