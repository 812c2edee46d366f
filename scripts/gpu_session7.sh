#!/usr/bin/env bash
# Session-7 GPU calls on one H200 (results to $OUT/s7-STAGE; OVERLAPDECODE_COMMIT names the commit, the copy has
# no .git).
#   bash scripts/gpu_session7.sh A   # Llama-1B GEMV tiles at batch 8 (kernel_sweep --batch 8, 128-column tiles
#                                    # too); the step in one graph at batch 8 with the defaults, the batch-8 best
#                                    # and each kernel's best alone, at batch 1, 4, 16; GPT-2 and 1B attention splits
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
