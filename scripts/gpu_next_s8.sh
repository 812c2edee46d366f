#!/usr/bin/env bash
# What session 7 wrote after its device time ran out, to run first on one H200 (results tar'd to
# $OUT/next-s8.tgz: at most 8 files come back from a call):
# 1. the GPU test of the hand-captured prefill (fused_options prefill_graph=True: PrefillGraph, never run on a
#    GPU): its float32 tokens equal torch.compile's CUDA-graph prefill's, one graph per bucket, again after a clear;
# 2. scripts/ttft_profile.py: TTFT and 200-token ms/token, default against prefill_graph=True, alternating
#    (if it wins, make it the default in fused/model.py and say so with these figures).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
W=/tmp/next-s8; rm -rf $W; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
timeout 250 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q -k "prefill_graph" \
  > $W/gpu-tests.log 2>&1
echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $W/gpu-tests.log | tail -6
timeout 320 python3 scripts/ttft_profile.py $W/ttft > $W/ttft.log 2>&1
echo "ttft rc=$?" >> $W/ttft.log; tail -4 $W/ttft.log
tar czf $OUT/next-s8.tgz -C /tmp next-s8
