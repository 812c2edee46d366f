#!/usr/bin/env bash
# Session-6 GPU calls on one H200 (results to $OUT; OVERLAPDECODE_COMMIT names the commit, the copy has no .git).
#   bash scripts/gpu_session6.sh A   # the 1B bench with PDL LATE (fused, interleaved, HF peer from .whl), the
#                                    # GPT-2 step's kernel table, then tests/gpu in full
#   bash scripts/gpu_session6.sh B   # ran at eae1736, with the weight prefetch (since removed: it lost, see
#                                    # docs/KERNELS.md): the kernel cases and the fused PDL/prefetch tests, the
#                                    # step in one graph per PDL mode x prefetch bytes, the TTFT profile
#   bash scripts/gpu_session6.sh C   # the GEMV tiles at the GPT-2 shapes (kernel_sweep --shapes gpt2), the GPT-2
#                                    # step in one graph with the defaults and with the best tiles; the 8B bench
#                                    # with PDL LATE; the GPU tests call A's time limit cut
#   bash scripts/gpu_session6.sh D   # with GPT-2's tiles (fused/model.py TILES): their GPU tests, the GPT-2 bench
#                                    # (fused, interleaved), the 1B bench (fused, batch 1 and 8)
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
export W=/tmp/gw-$STAGE; mkdir -p $W
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
elif [ "$STAGE" = B ]; then
  echo "stage B ran at eae1736: its prefetch (captured_step(prefetch=...)) has been removed since"; exit 2
  export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
  timeout 90 python3 -m pytest tests/fused_kernel_cases.py -p no:cacheprovider -q > $W/gpu-tests.log 2>&1
  echo "kernel cases rc=$?" >> $W/gpu-tests.log
  timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    -k "prefetch or captured" >> $W/gpu-tests.log 2>&1; echo "tests rc=$?" >> $W/gpu-tests.log
  grep -E "PASSED|FAILED|ERROR|passed|failed|rc=" $W/gpu-tests.log | tail -8
  timeout 200 python3 - > $W/prefetch.log 2>&1 <<'PY'
import json, os, torch, triton.testing
import overlapdecode as od
from kernel_sweep import captured_step
res = {}
for name, B in (("gpt2-random", 1), ("llama-1b-random", 1), ("llama-1b-random", 8)):
    model = od.load_model(name, dtype="bfloat16", device="cuda")
    for pdl, prefetch in ((3, 0), (3, 512), (3, 2048), (3, 8192), (3, 1 << 20), (1, 2048), (2, 0), (2, 2048), (2, 1 << 20)):
        g, keep = captured_step(model, B, pdl=pdl, prefetch=prefetch)
        res[f"{name} b{B} pdl {pdl} prefetch {prefetch}"] = round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)
        del g, keep
        print(json.dumps(res), flush=True)
    del model; torch.cuda.empty_cache()
json.dump(res, open(os.environ["W"] + "/prefetch.json", "w"), indent=1)
PY
  echo "prefetch rc=$?" >> $W/prefetch.log
  python3 -c "import json; [print(k, v) for k, v in json.load(open('$W/prefetch.json')).items()]"; tail -1 $W/prefetch.log
  timeout 100 python3 scripts/ttft_profile.py $W/ttft > $W/ttft.log 2>&1; echo "ttft rc=$?" >> $W/ttft.log
  tail -3 $W/ttft.log
  tar czf $OUT/work-B.tgz -C $W .
elif [ "$STAGE" = C ]; then
  export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
  timeout 190 python3 scripts/kernel_sweep.py $W/sweep --shapes gpt2 --budget 40 --no-steps > $W/sweep.log 2>&1
  echo "sweep rc=$?" >> $W/sweep.log; grep -E "best|rc=" $W/sweep.log
  timeout 60 python3 - > $W/tiles.log 2>&1 <<'PY'
import json, os, torch, triton.testing
import overlapdecode as od
from kernel_sweep import best_tiles, captured_step
W = os.environ["W"]
table = best_tiles(json.load(open(W + "/sweep/kernel-sweep.json"))["sweep"])
print({str(k): v for k, v in table.items()})
model = od.load_model("gpt2-random", dtype="bfloat16", device="cuda")
res = {}
for label, tiles in (("defaults", None), ("best", table), ("defaults again", None), ("best again", table)):
    g, keep = captured_step(model, 1, tiles=tiles)
    res[label] = round(triton.testing.do_bench(g.replay, rep=300, return_mode="median"), 4)
    del g, keep
for kernel in ("norm_qkv", "linear_residual", "norm_linear"):  # each kernel's best tiles alone
    g, keep = captured_step(model, 1, tiles={k: v for k, v in table.items() if k[0] == kernel})
    res["best " + kernel + " only"] = round(triton.testing.do_bench(g.replay, rep=300, return_mode="median"), 4)
    del g, keep
print(json.dumps(res), flush=True)
json.dump(dict(tiles={str(k): v for k, v in table.items()}, step_ms=res), open(W + "/tiles.json", "w"), indent=1)
PY
  echo "tiles rc=$?" >> $W/tiles.log; tail -3 $W/tiles.log
  B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3"
  timeout 150 $B --model llama-8b-random --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 \
    --time-budget 130 --out $W/h200-fused-8b-late > $W/bench-8b.log 2>&1; echo "bench rc=$?" >> $W/bench-8b.log
  grep -hE "│ +(fused|interleaved)|rc=" $W/bench-8b.log
  timeout 140 python3 -m pytest -m cuda tests/gpu/test_gpu_interleaved.py tests/gpu/test_gpu_tp_symmetric.py \
    tests/gpu/test_gpu_fused.py::test_pdl_changes_no_logit -p no:cacheprovider -rA -q > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "FAILED|ERROR|passed|failed|rc=" $W/gpu-tests.log | tail -5
  tar czf $OUT/work-C.tgz -C $W .
elif [ "$STAGE" = D ]; then
  export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
  timeout 170 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    -k "real_shapes and gpt2 or 200_steps and gpt2 or captured or pdl" > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=|divergence" $W/gpu-tests.log | tail -14
  B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3 --peers none"
  timeout 80 $B --model gpt2-random --strategies fused,interleaved --dtype-batch bfloat16:1 --time-budget 65 \
    --out $W/h200-fused-gpt2-tiles > $W/bench-gpt2.log 2>&1; echo "bench rc=$?" >> $W/bench-gpt2.log
  grep -hE "│ +(fused|interleaved)|rc=" $W/bench-gpt2.log
  timeout 90 $B --model llama-1b-random --strategies fused --dtype-batch bfloat16:1,bfloat16:8 --time-budget 75 \
    --out $W/h200-fused-1b-late-2 > $W/bench-1b.log 2>&1; echo "bench rc=$?" >> $W/bench-1b.log
  grep -hE "│ +(fused|interleaved)|rc=" $W/bench-1b.log
  tar czf $OUT/work-D.tgz -C $W .
fi
