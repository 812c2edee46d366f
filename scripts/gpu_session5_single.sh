#!/usr/bin/env bash
# Session 5's last GPU call, on one H200 (no two-GPU machine was lent after stage C): the fused GPU tests after
# the prefill became a CUDA graph (and PDL mode 3), the 1B and GPT-2 fused benches (TTFT), and the step in one
# graph per PDL mode at 1B and GPT-2, batch 1. Results to $OUT/work-E.tgz.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
W=/tmp/gw-E; mkdir -p $W
timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
  -k "200_steps or captured or bfloat16 or compiles_once or pdl" > $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $W/gpu-tests.log | tail -14
B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3 --peers none --dtype-batch bfloat16:1 --no-profile"
timeout 75 $B --model llama-1b-random --strategies fused --time-budget 60 --out $W/h200-fused-1b-prefill-graph > $W/bench-1b.log 2>&1
echo "bench rc=$?" >> $W/bench-1b.log
timeout 50 $B --model gpt2-random --strategies fused --time-budget 40 --out $W/h200-fused-gpt2-prefill-graph > $W/bench-gpt2.log 2>&1
echo "bench rc=$?" >> $W/bench-gpt2.log
grep -hE "│ +fused|rc=" $W/bench-1b.log $W/bench-gpt2.log
timeout 60 python3 - > $W/pdl-modes.log 2>&1 <<'PY'
import json
import triton.testing
import overlapdecode as od
from kernel_sweep import captured_step
res = {}
for name in ("llama-1b-random", "gpt2-random"):
    model = od.load_model(name, dtype="bfloat16", device="cuda")
    for pdl in (0, 1, 2, 3):
        g, keep = captured_step(model, 1, pdl=pdl)
        res[f"{name} b1 graph step ms, pdl {pdl}"] = round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)
        del g, keep
    print(json.dumps(res), flush=True)
PY
echo "pdl modes rc=$?" >> $W/pdl-modes.log
tar czf $OUT/work-E.tgz -C $W .
tail -2 $W/pdl-modes.log
