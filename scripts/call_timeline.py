"""Where a whole `fused` call's time goes beyond its decode steps, on a GPU: MODEL (default gpt2-random), DTYPE
(default bfloat16), BATCH rows (default 1), prompt 32, greedy or (--top-p P) sampled with a seed.

1. Unprofiled: wall time of calls of N = 1, 2, 3, 10, 200 tokens (EOS off), ROUNDS alternating rounds after
   warm-up, medians: a call of N tokens costs about fixed + (N - 1) x step, and the differences show whether the
   first decode steps of a call cost more than later ones.
2. One profiled 200-token call (torch.profiler, CPU and CUDA activity): from its Chrome trace, the host time before
   the GPU's first kernel, the prefill's GPU span (first kernel to the end of the first greedy choice kernel,
   which ends step 0; a sampled call's finish kernel), the gap to the first decode step's first kernel, each
   decode step's span (the end of one greedy choice kernel to the next's), the GPU's idle gaps, and the time from
   the last kernel to the call's end.
   The profiler adds host time per operation; the GPU spans are the kernels' own. "Decode step spans" run from
   the end of one greedy choice kernel to the next's, so the first includes the host's gap after the prefill.
3. From that trace, the decode steps' kernels (steps 50 to 149): per position in the step, the kernel's median
   duration; the step's median span (its first kernel's start to its last one's end); the median gap before each
   kernel (negative: it started before the one ahead ended, PDL), the first one being the gap from the previous
   step's last kernel (step-kernels.json). Each kernel's role in its layer (`roles`: QKV, attention, O, gate/up,
   down; the embedding, the LM head and the choice once a step) gives the bytes it must read (`role_bytes`: its
   weights from the fused layout, packed ones at their packed size; attention the K and V of the median analysed
   step's positions), so also its achieved bandwidth, its floor at the device's copy bandwidth (measured in the
   run, as the bench does) and what it adds over that floor; per role the median over the layers, and a layer's
   sum: where the per-layer toll goes (step-table.md). `--analyse TRACE.json.gz` runs this part alone on a saved
   trace, with the bytes and bandwidth of the timeline.json beside it where there is one.

    python3 scripts/call_timeline.py --out DIR [--model MODEL] [--batch B] [--top-p P] [--dtype D] [--quantize Q]
                                   (on a GPU: timeline.json, step-kernels.json, step-table.md, trace.json.gz)
    python3 scripts/call_timeline.py --analyse TRACE.json.gz --out DIR   (anywhere: DIR/step-kernels.json,
                                                                          step-table.md)

The figures of docs/KERNELS.md, "Where the time goes" (results/h200/<the --out folder>):

    python3 scripts/call_timeline.py --out results/h200/llama-1b-call-timeline --model llama-1b-random
    python3 scripts/call_timeline.py --out results/h200/gpt2-call-timeline --model gpt2-random
    python3 scripts/call_timeline.py --out results/h200/llama-1b-timeline-64-rows --model llama-1b-random --batch 64
    python3 scripts/call_timeline.py --out results/h200/llama-1b-timeline-128-rows --model llama-1b-random --batch 128
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics

import torch
from ab import timed_call  # scripts/ is on the path when run as a script
from kernel_sweep import weight_bytes

import overlapdecode as od
from overlapdecode.bench.report.figures import read_ms
from overlapdecode.bench.worker import device_bandwidth_gbs
from overlapdecode.fused.layout import fuse_weights

ROUNDS = 15
LENGTHS = (1, 2, 3, 10, 200)


# the last kernel of each step: the greedy choice, or the sampled choice's finish (fused/kernels/sample.py)
STEP_END = ("greedy", "_finish_kernel")


def _ends_step(name: str) -> bool:
    return any(k in name for k in STEP_END)


def timed(model, ids, n: int, sampling: dict) -> float:
    """ms of one `fused` call of n tokens, EOS off (ab.timed_call)."""
    return timed_call(model, ids, n, "fused", **sampling) * 1e3


def analyse(trace: dict) -> dict:
    events = trace["traceEvents"]
    call = next(e for e in events if e.get("name") == "od_call" and e.get("ph") == "X")
    c0, c1 = call["ts"], call["ts"] + call["dur"]
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "kernel" and c0 <= e["ts"] <= c1
    )
    greedy_ends = [end for start, end, name in kernels if _ends_step(name)]
    steps = [b - a for a, b in zip(greedy_ends, greedy_ends[1:])]
    after_prefill = next(start for start, end, name in kernels if start >= greedy_ends[0])
    gaps, busy_to = [], kernels[0][1]
    for start, end, name in kernels[1:]:
        if start > busy_to:
            gaps.append((start - busy_to, start - c0, name))
        busy_to = max(busy_to, end)
    big = sorted(gaps, reverse=True)[:12]
    us = lambda v: round(v, 1)  # noqa: E731
    return {
        "call us (profiled)": us(c1 - c0),
        "kernels": len(kernels),
        "greedy choice kernels (steps incl. step 0)": len(greedy_ends),
        "host before the first kernel us": us(kernels[0][0] - c0),
        "prefill GPU span us (first kernel to the end of step 0's choice)": us(greedy_ends[0] - kernels[0][0]),
        "gap from step 0's choice to the first decode kernel us": us(after_prefill - greedy_ends[0]),
        "decode step spans us: first 5": [us(s) for s in steps[:5]],
        "decode step spans us: median": us(statistics.median(steps)) if steps else None,
        "decode step spans us: max": us(max(steps)) if steps else None,
        "decode step spans us: last 3": [us(s) for s in steps[-3:]],
        "last kernel end to the call's end us": us(c1 - busy_to),
        "GPU idle inside the call us (sum of gaps between kernels)": us(sum(g for g, _, _ in gaps)),
        "largest gaps (us, at us after the call's start, the kernel after)": [
            (us(g), us(t), n[:60]) for g, t, n in big
        ],
    }


# a kernel's role in the step, by its Triton function's name; a projection kernel that serves two roles takes
# them in the order the layer launches them (linear_residual: O, then down; norm_linear: gate/up, then the LM head)
ROLE_OF = {
    "_embed_kernel": "embedding",
    "_norm_qkv_kernel": "norm + QKV + RoPE + cache write",
    "_split_kernel": "attention",
    "_combine_query": "attention combine",
    "_greedy_kernel": "token choice",
    "_finish_kernel": "token choice",
}
O, DOWN, UP, HEAD = "O + residual", "down + residual", "norm + gate/up", "norm + LM head"
LAYER_ROLES = (ROLE_OF["_norm_qkv_kernel"], "attention", O, UP, DOWN)  # the roles whose bytes role_bytes counts
SMALL_READS = ("attention combine", "_norm_rows_kernel")  # launches that read activations only, no weights


def roles(names: list[str]) -> list[str]:
    """Each kernel's role, in a step's launch order (`ROLE_OF`; a name not listed keeps its own name)."""
    out, seen = [], set()
    for name in names:
        role = ROLE_OF.get(name, name)
        if role == ROLE_OF["_norm_qkv_kernel"]:
            seen = set()  # a new layer
        elif name == "_linear_split_kernel":
            role = DOWN if O in seen else O
        elif name == "_norm_linear_kernel":
            role = HEAD if UP in seen or not seen else UP
        seen.add(role)
        out.append(role)
    return out


def _nbytes(t) -> int:
    return 0 if t is None else weight_bytes(t)  # a PackedWeight: its codes and group numbers


def role_bytes(weights, rows: int, positions: int, kv_bytes: int) -> dict:
    """The bytes each role's kernel must read at least, per launch: the first layer's projections (with their
    biases), the LM head, one embedding row per row; attention, the K and V of `positions` slots per row
    (`kv_bytes` a value). A mixture of experts' gate/up and down are left out (their kernels are its own, and
    what they read depends on the routing)."""
    layer = weights.layers[0]
    out = {
        ROLE_OF["_norm_qkv_kernel"]: _nbytes(layer.w_qkv) + _nbytes(layer.b_qkv) + _nbytes(layer.norm1_w),
        "attention": 2 * weights.n_kv_heads * weights.head_dim * positions * rows * kv_bytes,
        O: _nbytes(layer.w_o) + _nbytes(layer.b_o),
        UP: _nbytes(layer.w_up) + _nbytes(layer.b_up) + _nbytes(layer.norm2_w),
        DOWN: _nbytes(layer.w_down) + _nbytes(layer.b_down),
        HEAD: _nbytes(weights.lm_head) + _nbytes(weights.norm_w),
        "embedding": rows * weights.hidden * weights.embed.element_size(),
    }
    return {k: v for k, v in out.items() if layer.router is None or k not in (UP, DOWN)}


def by_role(rows: list[dict], layers: int, nbytes: dict | None, bandwidth_gbs: float | None) -> list[dict]:
    """Per role, over its launches in a step: launches, median us, median us it adds (its duration plus the gap
    before it), and where the bytes are known its bandwidth and floor; the last row is a layer's share of the
    step (every kernel between the embedding and the LM head's, over the layers)."""
    out = []
    for role in dict.fromkeys(r["role"] for r in rows):
        mine = [r for r in rows if r["role"] == role]
        row = {
            "role": role,
            "launches per step": len(mine),
            "median us": round(statistics.median(r["median us"] for r in mine), 2),
            "adds us": round(statistics.median(r["median us"] + r["median gap before it us"] for r in mine), 2),
        }
        b = (nbytes or {}).get(role)
        if b is not None:
            row["MB"] = round(b / 1e6, 2)
            row["TB/s"] = round(b / row["median us"] / 1e6, 2) if row["median us"] > 0 else None
            if bandwidth_gbs:
                row["floor us"] = round(read_ms(b, bandwidth_gbs) * 1e3, 2)
                row["over floor us"] = round(row["adds us"] - row["floor us"], 2)
        out.append(row)
    # a layer: the kernels from the one after the embedding to the last layer's down projection (a launch that
    # normalises rows before a projection included), their sums over the layers
    span = rows[1 : max((i for i, r in enumerate(rows) if r["role"] == DOWN), default=0) + 1]
    total = {"role": "a layer", "launches per step": round(len(span) / layers, 2) if layers else 0}
    if span and layers:
        total["median us"] = round(sum(r["median us"] for r in span) / layers, 2)
        total["adds us"] = round(sum(r["median us"] + r["median gap before it us"] for r in span) / layers, 2)
        read = [(nbytes or {}).get(r["role"]) for r in span if r["role"] in LAYER_ROLES]
        if read and None not in read and all(r["role"] in LAYER_ROLES + SMALL_READS for r in span):
            total["MB"] = round(sum(read) / layers / 1e6, 2)
            if bandwidth_gbs:
                total["floor us"] = round(read_ms(sum(read) / layers, bandwidth_gbs) * 1e3, 2)
                total["over floor us"] = round(total["adds us"] - total["floor us"], 2)
    return out + [total]


def table(result: dict) -> str:
    """step-kernels.json's roles as a markdown table."""
    keys = ["role", "launches per step", "median us", "adds us", "MB", "TB/s", "floor us", "over floor us"]
    lines = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    for r in result["roles"]:
        lines.append("| " + " | ".join("" if r.get(k) is None else str(r[k]) for k in keys) + " |")
    head = [f"{k}: {v}" for k, v in result.items() if k not in ("kernels", "roles")]
    return "\n".join(["- " + h for h in head] + [""] + lines) + "\n"


def step_kernels(
    trace: dict, first: int = 50, last: int = 150, nbytes: dict | None = None, bandwidth_gbs: float | None = None
) -> dict:
    """Per kernel of a decode step (steps first .. last - 1 of the profiled call), its role, median duration and
    the median gap before it; the step's median span and sums; per role (`by_role`) the bytes, bandwidth and floor
    where `nbytes` (role_bytes) and the copy bandwidth are given."""
    kernels = sorted((e["ts"], e["ts"] + e["dur"], e["name"]) for e in trace["traceEvents"] if e.get("cat") == "kernel")
    ends = [i for i, k in enumerate(kernels) if _ends_step(k[2])]  # the last kernel of each step (step 0's: prefill)
    steps = [kernels[ends[i] + 1 : ends[i + 1] + 1] for i in range(first, min(last, len(ends) - 1))]
    n = len(steps[0])
    if any(len(st) != n for st in steps):
        raise SystemExit("the analysed steps do not all have the same kernels")
    prev_end = [kernels[ends[i]][1] for i in range(first, first + len(steps))]
    med = statistics.median
    rows = []
    for j, role in enumerate(roles([k[2] for k in steps[0]])):
        gaps = [st[j][0] - (st[j - 1][1] if j else prev_end[k]) for k, st in enumerate(steps)]
        rows.append(
            {
                "kernel": steps[0][j][2][:60],
                "role": role,
                "median us": round(med([st[j][1] - st[j][0] for st in steps]), 2),
                "median gap before it us": round(med(gaps), 2),
            }
        )
    layers = sum(r["role"] == ROLE_OF["_norm_qkv_kernel"] for r in rows)
    return {
        "steps analysed": len(steps),
        "kernels per step": n,
        "step span us (first kernel start to last kernel end), median": round(
            med([st[-1][1] - st[0][0] for st in steps]), 1
        ),
        "sum of the kernels' durations per step us, median": round(
            med([sum(e - b for b, e, _ in st) for st in steps]), 1
        ),
        "layers": layers,
        "copy bandwidth GB/s": bandwidth_gbs and round(bandwidth_gbs, 1),
        "kernels": rows,
        "roles": by_role(rows, layers, nbytes, bandwidth_gbs),
    }


def measure(
    out_dir: str,
    name: str = "gpt2-random",
    batch: int = 1,
    top_p: float | None = None,
    dtype: str = "bfloat16",
    quantize: str | None = None,
) -> None:
    os.makedirs(out_dir, exist_ok=True)
    model = od.load_model(name, dtype=dtype, device="cuda", quantize=quantize)
    ids = torch.randint(0, 1000, (batch, 32), device="cuda")
    mask = torch.ones_like(ids)  # unpadded: never a mask inferred from a pad id among random ids
    # top-p alone: top_k=0, not the generation config's or Hugging Face's default of 50
    sampling = dict(do_sample=True, top_p=top_p, top_k=0, seed=0) if top_p is not None else {}
    for n in LENGTHS:
        timed(model, ids, n, sampling)  # compiles, captures
    times = {n: [] for n in LENGTHS}
    for _ in range(ROUNDS):
        for n in LENGTHS:
            times[n].append(timed(model, ids, n, sampling))
    med = {n: statistics.median(t) for n, t in times.items()}
    res = {
        "model": name,
        "batch": batch,
        "dtype": dtype,
        "quantize": quantize,
        "sampling": sampling or "greedy",
        "device": torch.cuda.get_device_name(),
        "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
        "call ms, median": {n: round(v, 4) for n, v in med.items()},
        "call ms, fastest": {n: round(min(t), 4) for n, t in times.items()},
        "step ms from 10 -> 200": round((med[200] - med[10]) / 190, 4),
        "ms of 1 -> 2, 2 -> 3, 3 -> 10 per step": [
            round(med[2] - med[1], 4),
            round(med[3] - med[2], 4),
            round((med[10] - med[3]) / 7, 4),
        ],
    }
    res["fixed ms (200-token call - 199 steps of 10 -> 200)"] = round(med[200] - 199 * res["step ms from 10 -> 200"], 4)
    print(json.dumps(res), flush=True)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        with torch.profiler.record_function("od_call"):
            od.generate(
                model, ids, attention_mask=mask, max_new_tokens=200, strategy="fused", eos_token_id=[], **sampling
            )
            torch.cuda.synchronize()  # host sync: the call's end, inside the annotated range
    path = os.path.join(out_dir, "trace.json")
    prof.export_chrome_trace(path)
    trace = json.load(open(path))
    with gzip.open(path + ".gz", "wt") as f:
        json.dump(trace, f)
    os.remove(path)
    res["profiled 200-token call"] = analyse(trace)
    print(json.dumps(res["profiled 200-token call"], indent=1), flush=True)
    # the bytes each kernel reads, from the layout the call made (fuse_weights finds the views and copies nothing);
    # attention's K and V at the median analysed step (steps 50-149: the prompt's 32 slots and 100 more)
    weights = fuse_weights(model)
    res["role bytes"] = role_bytes(weights, batch, 32 + 100, model.dtype.itemsize)
    res["copy bandwidth GB/s"] = device_bandwidth_gbs(torch.device("cuda"))
    json.dump(res, open(os.path.join(out_dir, "timeline.json"), "w"), indent=1)
    write_steps(step_kernels(trace, nbytes=res["role bytes"], bandwidth_gbs=res["copy bandwidth GB/s"]), out_dir)


def write_steps(result: dict, out_dir: str) -> None:
    json.dump(result, open(os.path.join(out_dir, "step-kernels.json"), "w"), indent=1)
    with open(os.path.join(out_dir, "step-table.md"), "w") as f:
        f.write(table(result))
    print(table(result), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the results (must be empty or new)")
    ap.add_argument("--model", default="gpt2-random", help="default: %(default)s")
    ap.add_argument("--batch", type=int, default=1, help="rows; default: %(default)s")
    ap.add_argument("--dtype", default="bfloat16", help="default: %(default)s")
    ap.add_argument("--top-p", type=float, default=None, help="sample with this top_p (seed 0); default: greedy")
    ap.add_argument("--quantize", choices=("int4", "int8", "fp8"), help="the weights quantized at load (group 128)")
    ap.add_argument("--analyse", metavar="TRACE.json.gz", help="only analyse a saved trace's decode steps")
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        ap.error(f"--out {args.out} is not an empty directory (no run overwrites an earlier one)")
    if args.analyse:
        with gzip.open(args.analyse, "rt") as f:
            trace = json.load(f)
        beside = os.path.join(os.path.dirname(args.analyse), "timeline.json")  # the run's bytes and bandwidth
        run = json.load(open(beside)) if os.path.exists(beside) else {}
        result = step_kernels(trace, nbytes=run.get("role bytes"), bandwidth_gbs=run.get("copy bandwidth GB/s"))
        os.makedirs(args.out, exist_ok=True)
        write_steps(result, args.out)
    else:
        measure(args.out, args.model, args.batch, args.top_p, args.dtype, args.quantize)


if __name__ == "__main__":
    main()
