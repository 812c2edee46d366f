"""Decoder layers on a GPU: today's five kernels per layer against the persistent layer kernel, in CUDA graphs.

Per shape (the model's first LAYERS layers, each its own weights and cache, bfloat16) and batch: the five kernels
as the fused step runs them (FusedModel's ops: its tiles, PDL LATE, the RMSNorm sums from 2 rows on) captured
layer after layer in one CUDA graph, and the persistent layer (kernels/persistent_layer.py, one launch per layer)
in another, in each of its variants; the graphs replayed in alternating repeats, the median of the repeats after a
warm-up. Reported per layer: us, the weight floor (the layer's weight bytes over the bandwidth of a 2 GiB
device-to-device copy measured in the same run) and the toll over it. Exactness, on layer 0 from the same input:
the persistent layer against the five kernels with the persistent plan's own tiles (matching_ops: the same
partial sums, so bitwise equal unless programs race), against the step's five kernels, and both against the torch
references; the same in float32 on the first shape's layer 0 (unless --no-fp32, while the budget lasts).

    python3 scripts/persistent_layer_ab.py --out OUT.json [--shapes llama-1b,gpt2,llama-8b] [--batches 1,8]
        [--layers 16] [--repeats 7] [--replays 20] [--time-budget 150] [--variants dynamic,per-sm-1,...]
        [--no-fp32]
    TRITON_INTERPRET=1 python3 scripts/persistent_layer_ab.py --out OUT.json --dry-run    (CPU: the script itself)

--dry-run runs the script's code paths on CPU in Triton's interpreter with tiny-llama (2 layers, batch 3, a
64-slot cache, the first variant, eager calls for the graphs, the host clock for CUDA events): its times mean
nothing, its exactness checks are real.

Order of the work: the first shape with every variant, its float32 check, the other shapes with the
first variant, then their other variants; what the budget leaves out is listed in the JSON ("skipped") and the
summary. Needs a CUDA GPU (PDL: sm_90).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

# shape -> embedded model; the layer shapes are that model's
MODELS = {
    "llama-1b": "llama-1b-random",
    "gpt2": "gpt2-random",
    "llama-8b": "llama-8b-random",
    "smollm2-360m": "smollm2-360m-random",
    "qwen2.5-0.5b": "qwen2.5-0.5b-random",
    "qwen2.5-1.5b": "qwen2.5-1.5b-random",
    "smollm2-1.7b": "smollm2-1.7b-random",
    "tiny-llama": "tiny-llama",
}
# variant -> PersistentLayer keywords (and "plan": make_plan keywords, other tiles than the five kernels')
VARIANTS = {
    "dynamic": {},
    "per-sm-1": dict(per_sm=1),
    "static": dict(claim="static"),
    "prefetch": dict(prefetch=256),
    "no-sums": dict(norm_sums=False),
    "wide-k": dict(plan=dict(o_block_k=256, down_block_k=256)),
}
DEFAULT_VARIANTS = "dynamic,per-sm-1,static,prefetch,no-sums"  # each but per-sm-1 is a compile of its own
CACHE, POSITION = 512, 255  # cache slots; every row at this position (row b padded by b % 4 on the left)
DRY_CACHE, DRY_POSITION = 64, 40  # --dry-run's: the interpreter is slow


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write (refused if it exists)")
    ap.add_argument("--shapes", default="llama-1b,gpt2,llama-8b", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--layers", type=int, default=16, help="layers per graph (at most the model's)")
    ap.add_argument("--repeats", type=int, default=7, help="timed repeats of every graph, alternating")
    ap.add_argument("--replays", type=int, default=20, help="graph replays per timed repeat")
    ap.add_argument("--time-budget", type=float, default=150.0, help="seconds; later work is skipped past it")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of {', '.join(VARIANTS)}")
    ap.add_argument("--no-fp32", action="store_true", help="skip the float32 exactness check")
    ap.add_argument("--dry-run", action="store_true", help="CPU, TRITON_INTERPRET=1: the script's code on tiny-llama")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.shapes, args.batches, args.layers, args.repeats, args.replays = "tiny-llama", "3", 2, 1, 1
        args.variants, args.time_budget = "dynamic", float("inf")
    args.shapes = [s for s in args.shapes.split(",") if s]
    args.variants = [v for v in args.variants.split(",") if v]
    bad = [s for s in args.shapes if s not in MODELS] + [v for v in args.variants if v not in VARIANTS]
    if bad or not args.shapes or not args.variants:
        ap.error(f"unknown or empty --shapes / --variants: {bad}")
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        ap.error(f"--batches takes comma-separated ints, got {args.batches!r}")
    if not args.batches or min(args.batches) < 1 or min(args.layers, args.repeats, args.replays) < 1:
        ap.error("--batches, --layers, --repeats and --replays must be positive")
    if os.path.exists(args.out):
        ap.error(f"--out {args.out} exists; choose another file")
    return args


def layer_bytes(layer) -> int:
    return sum(t.numel() * t.element_size() for t in vars(layer).values() if isinstance(t, torch.Tensor))


def inputs(W, B: int, n_layers: int, dtype, dev, cache: int, position: int, seed: int = 0):
    """h (B, H), per layer (B, Hkv, cache, D) caches of random keys and values, each row's position, slot, start
    (its left padding) and length (slot + 1)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    h = torch.randn(B, W.hidden, device=dev, generator=g).to(dtype)
    shape = (B, W.n_kv_heads, cache, W.head_dim)
    caches = [
        (torch.randn(shape, device=dev, generator=g).to(dtype), torch.randn(shape, device=dev, generator=g).to(dtype))
        for _ in range(n_layers)
    ]
    start = torch.arange(B, device=dev) % 4
    state = torch.zeros(B, 3, dtype=torch.long, device=dev)
    state[:, 1] = position  # the decode loop's positions are a strided column of its state
    pos = state[:, 1]
    slot = pos + start
    return h, caches, pos, slot, start, slot + 1


class Eager:
    """--dry-run's stand-in for a CUDA graph: replay() calls the layers."""

    def __init__(self, run_layers, h0):
        self.replay = lambda: run_layers(h0)


def capture(run_layers, h0):
    """run_layers(h0) -> the list of layer outputs, warmed up eagerly (Triton compiles there) on a side stream,
    then captured in one CUDA graph: (graph, the captured outputs). Off CUDA (--dry-run): run once, and Eager."""
    if h0.device.type != "cuda":
        return Eager(run_layers, h0), run_layers(h0)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())  # stream hand-off: the inputs were made on the default stream
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            run_layers(h0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        outs = run_layers(h0)
    return g, outs


def time_graphs(graphs: dict, repeats: int, replays: int) -> dict:
    """name -> median ms per replay over `repeats` alternating repeats (after one warm-up repeat)."""
    times = {name: [] for name in graphs}
    for r in range(repeats + 1):
        for name, g in graphs.items():
            if isinstance(g, Eager):  # --dry-run: the host clock
                t = time.perf_counter()
                for _ in range(replays):
                    g.replay()
                ms = (time.perf_counter() - t) * 1e3
            else:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(replays):
                    g.replay()
                end.record()
                end.synchronize()  # host sync: timing boundary
                ms = start.elapsed_time(end)
            if r:
                times[name].append(ms / replays)
    return {name: statistics.median(t) for name, t in times.items()}


def diff(a, b) -> dict:
    d = (a.float() - b.float()).abs()
    return {"max_abs": d.max().item(), "equal": bool(torch.equal(a, b)), "ref_max_abs": b.float().abs().max().item()}


def exactness(W, layer, plan, pl, step_ops, h, kv, pos, slot, start, length) -> dict:
    """Layer 0 from one input (each on copies of its cache): persistent vs the plan's five kernels, vs the step's
    five kernels, vs the torch references; the step's five kernels vs the torch references."""
    from overlapdecode.fused import forward
    from overlapdecode.fused.kernels.norm_linear import NormSums
    from overlapdecode.fused.kernels.persistent_layer import matching_ops
    from overlapdecode.fused.model import REFERENCE_OPS

    def run(fn):
        k, v = kv[0].clone(), kv[1].clone()
        with torch.no_grad():
            out = fn(k, v)
        return out, k

    per, kp = run(lambda k, v: pl(W, layer, h, k, v, pos, slot, start, length))
    pl.check()  # host sync: no wait gave up
    plan_ops = matching_ops(plan, norm_sums=NormSums(min_rows=1) if pl.norm_sums else None)  # sums as pl hands them
    plan_k, kk = run(lambda k, v: forward.decode_layer(W, layer, h, k, v, pos, slot, start, length, plan_ops))
    step, _ = run(lambda k, v: forward.decode_layer(W, layer, h, k, v, pos, slot, start, length, step_ops))
    ref, _ = run(lambda k, v: forward.decode_layer(W, layer, h, k, v, pos, slot, start, length, REFERENCE_OPS))
    return {
        "persistent_vs_plan_kernels": diff(per, plan_k),
        "cache_vs_plan_kernels": diff(kp, kk),
        "persistent_vs_step_kernels": diff(per, step),
        "persistent_vs_torch": diff(per, ref),
        "step_kernels_vs_torch": diff(step, ref),
    }


def one_layer_fp32(W):
    """W with its first layer alone, every tensor in float32 (a copy)."""
    import copy

    W32 = copy.copy(W)
    layer = copy.copy(W.layers[0])
    for k, v in vars(layer).items():
        if isinstance(v, torch.Tensor):
            setattr(layer, k, v.float().contiguous())
    W32.layers = [layer]
    W32.embed = W.embed[:1].float()
    return W32


class Run:
    """The state of one run: arguments, device, bandwidth, the clock, the results so far, the model loaded."""

    def __init__(self, args, argv):
        self.args, self.t0 = args, time.perf_counter()
        from overlapdecode.bench.worker import device_bandwidth_gbs

        self.dev = torch.device("cpu" if args.dry_run else "cuda")
        self.cache, self.position = (DRY_CACHE, DRY_POSITION) if args.dry_run else (CACHE, POSITION)
        if args.dry_run:  # no bandwidth to measure: 1 GB/s, the floors mean nothing
            self.sms, self.gbs, name = 1, 1.0, "cpu (dry run: Triton's interpreter)"
        else:
            self.sms = torch.cuda.get_device_properties(self.dev).multi_processor_count
            self.gbs, name = device_bandwidth_gbs(self.dev, 1 << 31), torch.cuda.get_device_name(self.dev)
        self.result = {
            "device": name,
            "dry_run": args.dry_run,
            "sms": self.sms,
            "bandwidth_gbs": self.gbs,
            "cache_slots": self.cache,
            "position": self.position,
            "command": "python3 scripts/persistent_layer_ab.py " + " ".join(argv),
            "rows": [],
            "exactness": [],
            "skipped": [],
        }
        self.loaded = (None, None)  # (shape, FusedModel)

    def left(self) -> float:
        return self.args.time_budget - (time.perf_counter() - self.t0)

    def fused(self, shape: str):
        """The FusedModel of `shape`'s embedded model in bfloat16 (one model on the GPU at a time)."""
        import overlapdecode as od
        from overlapdecode.fused.model import FusedModel

        if self.loaded[0] != shape:
            self.loaded = (None, None)
            torch.cuda.empty_cache()
            dtype = "float16" if self.args.dry_run else "bfloat16"  # the interpreter's bfloat16 truncates
            model = od.load_model(MODELS[shape], dtype=dtype, device=self.dev)
            self.loaded = (shape, FusedModel(model, kernels="triton"))
        return self.loaded[1]


def run_shape(run: Run, shape: str, variants: list[str]) -> None:
    """The five kernels and each variant of the persistent layer at every batch, timed; exactness with the
    first variant of the run."""
    from overlapdecode.fused import forward
    from overlapdecode.fused.kernels.persistent_layer import PersistentLayer
    from overlapdecode.fused.kernels.persistent_schedule import make_plan

    args = run.args
    fm = run.fused(shape)  # the step's ops: its tiles, PDL, RMSNorm sums
    W = fm.weights
    L = min(args.layers, len(W.layers))
    per_layer = layer_bytes(W.layers[0])
    for B in args.batches:
        if run.left() <= 0:
            run.result["skipped"].append(f"{shape} batch {B}: {', '.join(variants)} (time budget)")
            continue
        dtype = W.embed.dtype
        h0, caches, pos, slot, start, length = inputs(W, B, L, dtype, run.dev, run.cache, run.position)

        def five(h):
            outs = []
            for layer, (kc, vc) in zip(W.layers[:L], caches):
                h = forward.decode_layer(W, layer, h, kc, vc, pos, slot, start, length, fm.ops)
                outs.append(h)
            return outs

        graphs = {"five": capture(five, h0)[0]}
        layers = {}
        plans = {}
        for variant in variants:
            kw = dict(VARIANTS[variant])
            plans[variant] = make_plan(
                B,
                W.hidden,
                W.n_heads,
                W.n_kv_heads,
                W.head_dim,
                W.layers[0].w_down.shape[1],
                run.cache,
                dtype,
                run.sms,
                **kw.pop("plan", {}),
            )
            pl = PersistentLayer(plans[variant], run.dev, dtype, pdl=fm.pdl, **kw)
            bufs = [torch.empty_like(h0) for _ in range(L)]

            def persistent(h, pl=pl, bufs=bufs):
                for layer, (kc, vc), out in zip(W.layers[:L], caches, bufs):
                    h = pl(W, layer, h, kc, vc, pos, slot, start, length, out=out)
                return bufs

            graphs[variant] = capture(persistent, h0)[0]
            layers[variant] = pl
        ms = time_graphs(graphs, args.repeats, args.replays)
        for pl in layers.values():
            pl.check()  # host sync: no wait gave up during the timed replays
        floor_us = per_layer / (run.gbs * 1e3)
        five_us = ms["five"] * 1e3 / L
        for variant, pl in layers.items():
            us = ms[variant] * 1e3 / L
            run.result["rows"].append(
                {
                    "shape": shape,
                    "batch": B,
                    "layers": L,
                    "variant": variant,
                    "layer_weight_bytes": per_layer,
                    "floor_us": floor_us,
                    "five_us": five_us,
                    "five_toll_us": five_us - floor_us,
                    "persistent_us": us,
                    "persistent_toll_us": us - floor_us,
                    "speedup": five_us / us,
                    "programs": pl.programs,
                    "tasks": pl.schedule.n_tasks,
                    "plan": vars(plans[variant]),
                }
            )
            print(
                f"{shape:>12} B={B:<2} {variant:>9}: five {five_us:7.2f} us/layer (toll {five_us - floor_us:6.2f})"
                f"  persistent {us:7.2f} (toll {us - floor_us:6.2f})  floor {floor_us:6.2f}  x{five_us / us:.3f}"
                f"  P={pl.programs} tasks={pl.schedule.n_tasks}",
                flush=True,
            )
        if variants[0] == args.variants[0]:
            ex = exactness(
                W, W.layers[0], plans[variants[0]], layers[variants[0]], fm.ops, h0, caches[0], pos, slot, start, length
            )
            run.result["exactness"].append({"shape": shape, "batch": B, "dtype": str(dtype)[6:], **ex})
            print_exactness(f"{shape} B={B} {str(dtype)[6:]}", ex)
        del graphs, layers
        torch.cuda.empty_cache()


def print_exactness(label: str, ex: dict) -> None:
    print(
        f"{label:>22} layer 0: "
        + ", ".join(f"{k} {v['max_abs']:.3g}" + (" (equal)" if v["equal"] else "") for k, v in ex.items()),
        flush=True,
    )


def run_fp32(run: Run, shape: str) -> None:
    """`shape`'s layer 0 in float32: the persistent layer against the five kernels (the step's, for float32: no
    tiles table) and the torch references."""
    from overlapdecode.fused.kernels.persistent_layer import PersistentLayer
    from overlapdecode.fused.kernels.persistent_schedule import make_plan
    from overlapdecode.fused.model import triton_ops

    fm = run.fused(shape)
    W32 = one_layer_fp32(fm.weights)
    ops32 = triton_ops(run.dev, fm.pdl, {}, norm_sums=W32.norm == "rms")
    for B in run.args.batches:
        if run.left() <= 0:
            run.result["skipped"].append(f"float32 exactness batch {B} (time budget)")
            continue
        h0, caches, pos, slot, start, length = inputs(W32, B, 1, torch.float32, run.dev, run.cache, run.position)
        kw = dict(VARIANTS[run.args.variants[0]])
        plan = make_plan(
            B,
            W32.hidden,
            W32.n_heads,
            W32.n_kv_heads,
            W32.head_dim,
            W32.layers[0].w_down.shape[1],
            run.cache,
            torch.float32,
            run.sms,
            **kw.pop("plan", {}),
        )
        pl = PersistentLayer(plan, run.dev, torch.float32, pdl=fm.pdl, **kw)
        ex = exactness(W32, W32.layers[0], plan, pl, ops32, h0, caches[0], pos, slot, start, length)
        run.result["exactness"].append({"shape": shape, "batch": B, "dtype": "float32", **ex})
        print_exactness(f"{shape} B={B} float32", ex)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.dry_run:
        import triton.language as tl
        from triton.runtime.jit import JITFunction

        if isinstance(tl.cdiv, JITFunction):
            print("persistent_layer_ab.py: --dry-run needs TRITON_INTERPRET=1 in the environment", file=sys.stderr)
            return 2
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
        from triton_interpreter import patch_interpreter

        patch_interpreter()  # the interpreter's loop bounds and dots (tests/triton_interpreter.py)
    elif not torch.cuda.is_available():
        print("persistent_layer_ab.py: needs a CUDA GPU (none here); nothing was run", file=sys.stderr)
        return 2
    run = Run(args, argv)
    res = run.result
    print(f"{res['device']}: {run.sms} SMs, copy bandwidth {run.gbs:.0f} GB/s", flush=True)
    first, rest = args.shapes[0], args.shapes[1:]
    stages = [("shape", first, args.variants)]
    if not args.no_fp32:
        stages.append(("fp32", first, []))
    stages += [("shape", s, args.variants[:1]) for s in rest]
    stages += [("shape", s, args.variants[1:]) for s in rest if len(args.variants) > 1]
    for kind, shape, variants in stages:
        # a stage's compiles take tens of seconds: start one only with that much of the budget left
        if run.left() < (30 if kind == "fp32" else 0):
            res["skipped"].append(f"{shape}: {', '.join(variants) or 'float32 exactness'} (time budget)")
            continue
        if kind == "fp32":
            run_fp32(run, shape)
        else:
            run_shape(run, shape, variants)
    run.loaded = (None, None)

    res["seconds"] = time.perf_counter() - run.t0
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(
        f"\nus per layer (median of {args.repeats} repeats x {args.replays} replays); floor = the layer's weight "
        f"bytes / {run.gbs:.0f} GB/s; toll = us - floor:"
    )
    print(
        f"{'shape':>12} {'B':>3} {'variant':>9} {'floor':>7} {'five':>7} {'toll':>6} {'persist':>7} {'toll':>6} "
        f"{'speedup':>7}"
    )
    for r in res["rows"]:
        print(
            f"{r['shape']:>12} {r['batch']:>3} {r['variant']:>9} {r['floor_us']:7.2f} {r['five_us']:7.2f} "
            f"{r['five_toll_us']:6.2f} {r['persistent_us']:7.2f} {r['persistent_toll_us']:6.2f} {r['speedup']:7.3f}"
        )
    bad = [e for e in res["exactness"] if not e["persistent_vs_plan_kernels"]["equal"]]
    for e in bad:
        print(
            f"NOT EQUAL: {e['shape']} batch {e['batch']} {e['dtype']}: persistent vs the plan's five kernels, "
            f"max abs {e['persistent_vs_plan_kernels']['max_abs']:.3g}"
        )
    for s in res["skipped"]:
        print(f"skipped: {s}")
    print(f"wrote {args.out} ({res['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
