#!/usr/bin/env bash
# Session-7 GPU calls on one H200 (results to $OUT/s7-STAGE; OVERLAPDECODE_COMMIT names the commit, the copy has
# no .git).
#   bash scripts/gpu_session7.sh A   # Llama-1B GEMV tiles at batch 8 (kernel_sweep --batch 8, 128-column tiles
#                                    # too); the step in one graph at batch 8 with the defaults, the batch-8 best
#                                    # and each kernel's best alone, at batch 1, 4, 16; GPT-2 and 1B attention splits
#   bash scripts/gpu_session7.sh B   # with the RMSNorm sums (NormSums) and the batch-4+ LM-head tile: the kernel
#                                    # cases and fused GPU tests (Llama float32 tokens = HF, bf16 logit error); the
#                                    # step in one graph with and without the sums and the tile (1B b1/b4/b8/b16,
#                                    # 8B b1); the 1B bench (fused, interleaved, batch 1 and 8)
#   bash scripts/gpu_session7.sh C   # sums from 2 rows on: the fused float32 200-token GPU tests; the 1B bench
#                                    # (fused, interleaved, hf-compiled from .whl, batch 1 and 8) and the GPT-2
#                                    # bench (fused, interleaved); everything in one tar (8 files come back at most)
set -uo pipefail
STAGE=${1:?stage}
export PYTHONUNBUFFERED=1 OVERLAPDECODE_COMMIT=${OVERLAPDECODE_COMMIT:-unknown}
export PYTHONPATH=$PWD/src:$PWD/tests:$PWD/scripts
W=$OUT/s7-$STAGE; mkdir -p $W
echo "$OVERLAPDECODE_COMMIT" > $W/commit.txt
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv > $W/gpu.txt
if [ "$STAGE" = A ]; then
  timeout 260 python3 scripts/kernel_sweep.py $W/sweep --shapes llama-1b --batch 8 --budget 32 --no-steps \
    > $W/sweep.log 2>&1; echo "sweep rc=$?" >> $W/sweep.log
  grep -E "best|rc=" $W/sweep.log | cut -c1-220
  timeout 300 python3 - $W > $W/steps.log 2>&1 <<'PY'
import functools, json, sys
import torch, triton.testing
import overlapdecode as od
from kernel_sweep import best_tiles, captured_step
from overlapdecode.fused.kernels.decode_attention import decode_attention
from overlapdecode.fused.model import TILES
W = sys.argv[1]
best8 = best_tiles(json.load(open(f"{W}/sweep/kernel-sweep.json"))["sweep"])
json.dump({repr(k): v for k, v in best8.items()}, open(f"{W}/tiles-b8.json", "w"), indent=1)
res = {}
def save():
    json.dump(res, open(f"{W}/steps.json", "w"), indent=1)
def ms(model, B, **kw):
    g, keep = captured_step(model, B, **kw)
    t = round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)
    del g, keep
    return t
model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
variants = {"defaults": None, "b8 best": {**TILES, **best8}}
variants.update({f"{k[0]} {k[1]}x{k[2]} best only": {**TILES, k: v} for k, v in best8.items()})
for rnd in range(2):
    for name, tiles in variants.items():
        if rnd == 0 or not name.endswith("only"):
            res.setdefault(f"1b b8 {name}", []).append(ms(model, 8, tiles=tiles))
    res.setdefault("1b b1 defaults", []).append(ms(model, 1))
    print(json.dumps(res), flush=True); save()
for B in (4, 16):
    for name in ("defaults", "b8 best"):
        res[f"1b b{B} {name}"] = ms(model, B, tiles=variants[name])
print(json.dumps(res), flush=True); save()
def splits(n):
    return lambda ops: ops._replace(attention=functools.partial(ops.attention, num_splits=n))
for splits_ in (1, 2, 3):
    res[f"1b b1 attention splits {splits_}"] = ms(model, 1, edit_ops=splits(splits_))
del model; torch.cuda.empty_cache()
model = od.load_model("gpt2-random", dtype="bfloat16", device="cuda")
for rnd in range(2):
    res.setdefault("gpt2 b1 defaults", []).append(ms(model, 1))
    for splits_ in (1, 2, 3):
        res.setdefault(f"gpt2 b1 attention splits {splits_}", []).append(ms(model, 1, edit_ops=splits(splits_)))
print(json.dumps(res), flush=True); save()
PY
  echo "steps rc=$?" >> $W/steps.log; tail -2 $W/steps.log | cut -c1-1500
fi
if [ "$STAGE" = B ]; then
  timeout 100 python3 -m pytest tests/fused_kernel_cases.py -q -p no:cacheprovider > $W/kernel-cases.log 2>&1
  echo "kernel cases rc=$?" >> $W/kernel-cases.log; tail -2 $W/kernel-cases.log
  timeout 150 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q \
    -k "200_steps and llama-1b-random or bfloat16" > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=|divergence" $W/gpu-tests.log | tail -8
  timeout 170 python3 - $W > $W/steps.log 2>&1 <<'PY'
import json, sys
import torch, triton.testing
import overlapdecode as od
from kernel_sweep import captured_step
from overlapdecode.fused.model import TILES, triton_ops
W = sys.argv[1]
res = {}
def ms(model, B, **kw):
    g, keep = captured_step(model, B, **kw)
    t = round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)
    del g, keep
    return t
no_sums = lambda ops: triton_ops(torch.device("cuda"), 3, TILES, norm_sums=False)  # noqa: E731
no_head_tile = {k: v for k, v in TILES.items() if len(k) == 3}
model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
for rnd in range(2):
    for B in (1, 8):
        res.setdefault(f"1b b{B} sums", []).append(ms(model, B))
        res.setdefault(f"1b b{B} no sums", []).append(ms(model, B, edit_ops=no_sums))
    res.setdefault("1b b8 sums, no head tile", []).append(ms(model, 8, tiles=no_head_tile))
    print(json.dumps(res), flush=True)
for B in (4, 16):
    res[f"1b b{B} sums"] = ms(model, B)
    res[f"1b b{B} no sums"] = ms(model, B, edit_ops=no_sums)
json.dump(res, open(f"{W}/steps.json", "w"), indent=1)
del model; torch.cuda.empty_cache()
model = od.load_model("llama-8b-random", dtype="bfloat16", device="cuda")
res["8b b1 sums"] = ms(model, 1)
res["8b b1 no sums"] = ms(model, 1, edit_ops=no_sums)
print(json.dumps(res), flush=True)
json.dump(res, open(f"{W}/steps.json", "w"), indent=1)
PY
  echo "steps rc=$?" >> $W/steps.log; tail -2 $W/steps.log | cut -c1-1500
  timeout 170 python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3 --peers none \
    --model llama-1b-random --strategies fused,interleaved --dtype-batch bfloat16:1,bfloat16:8 --time-budget 150 \
    --out $W/h200-fused-1b-sums > $W/bench-1b.log 2>&1
  echo "bench rc=$?" >> $W/bench-1b.log; grep -hE "│|rc=" $W/bench-1b.log | tail -12
fi
if [ "$STAGE" = C ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  PYTHONPATH=/tmp/site python3 -c "import transformers, transformers.models.llama; print('peer transformers', transformers.__version__)" \
    > $W/peer.txt 2>&1 || { echo "transformers from .whl does not import: the image's is used" >> $W/peer.txt; rm -rf /tmp/site; }
  B="python3 -m overlapdecode.cli bench --lengths 200 --warmup 1 --repeats 3"
  PYTHONPATH=/tmp/site:src timeout 230 $B --model llama-1b-random --strategies fused,interleaved --peers hf-compiled \
    --dtype-batch bfloat16:1,bfloat16:8 --time-budget 205 --out $W/h200-fused-1b-s7 > $W/bench-1b.log 2>&1
  echo "bench rc=$?" >> $W/bench-1b.log; grep -hE "│|rc=" $W/bench-1b.log | tail -14
  timeout 100 $B --model gpt2-random --strategies fused,interleaved --peers none --dtype-batch bfloat16:1 \
    --time-budget 70 --out $W/h200-fused-gpt2-s7 > $W/bench-gpt2.log 2>&1
  echo "bench rc=$?" >> $W/bench-gpt2.log; grep -hE "│|rc=" $W/bench-gpt2.log | tail -6
  timeout 130 python3 -m pytest -m cuda tests/gpu/test_gpu_fused.py -p no:cacheprovider -rA -q -k "200_steps" \
    > $W/gpu-tests.log 2>&1
  echo "tests rc=$?" >> $W/gpu-tests.log; grep -E "PASSED|FAILED|ERROR|passed|failed|rc=|divergence" $W/gpu-tests.log | tail -12
  tar czf $OUT/s7-C.tgz -C $OUT s7-C
fi
