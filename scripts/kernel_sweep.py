"""Tune the fused step's kernels on a GPU, and show where one step's time goes.

1. Each GEMV kernel at the Llama-1B, Llama-8B and GPT-2 shapes (batch 1, or --batch), over a grid of launch configurations
   (block sizes, warps, pipeline stages, split-K target), timed as CUDA-graph replays over enough distinct
   weight copies that no copy stays in L2 (as in the step, where every layer reads its own weights): achieved
   GB/s of the weight bytes against the device's copy bandwidth.
2. The whole fused step of llama-1b-random (or --step-models; bfloat16, batch 1 and 8), captured in one CUDA graph,
   under the torch profiler: kernels per step and the time of each kind of kernel.
With --quantize int4|int8|fp8 both parts run on packed weights (quant/packed.py; GB/s of the bytes a launch reads:
codes and group numbers).

    python3 scripts/kernel_sweep.py --out DIR [--quick] [--shapes llama-1b,llama-8b,gpt2] [--budget S] [--batch B]
                                    [--no-steps] [--quantize int4|int8|fp8] [--group-size G] [--step-models M,...]

Writes DIR/kernel-sweep.json (after each part, so a run cut short keeps what it measured) and the step profiles'
kernel tables. The figures of docs/KERNELS.md, "Tiles: how they were chosen":

    python3 scripts/kernel_sweep.py --out results/h200/llama-kernel-sweep --shapes llama-1b,llama-8b --no-steps
    python3 scripts/kernel_sweep.py --out results/h200/gpt2-kernel-sweep --shapes gpt2 --budget 40 --no-steps
 Also the home of the timing functions scripts/ab.py uses (captured_step, rotated, time_rotated,
per_token_ms).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import torch
import triton.testing

DEV = "cuda"
SHAPES = {
    "llama-1b": (2048, 32, 8, 64, 8192, 128256),
    "llama-8b": (4096, 32, 8, 128, 14336, 128256),
    "gpt2": (768, 12, 12, 64, 3072, 50257),
}
L2_BYTES = 50 * 2**20


def copy_gbs() -> float:
    a = torch.empty(2**30, dtype=torch.uint8, device=DEV)
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), rep=200, return_mode="median")
    return 2 * a.numel() / ms / 1e6


def rotated(make, nbytes: int):
    """Enough copies of a kernel's inputs that their weights are 4x the L2."""
    n = max(2, -(-4 * L2_BYTES // nbytes))
    return [make() for _ in range(n)]


def time_rotated(fn, sets) -> float:
    """us per call: one graph replays fn over every input set in turn."""

    def all_sets():
        for s in sets:
            fn(*s)

    ms = triton.testing.do_bench_cudagraph(all_sets, rep=60, return_mode="median")
    return ms * 1e3 / len(sets)


def timed_row(row: dict, fn, sets, nbytes: int) -> dict:
    """`row` with fn's us per call over `sets` (time_rotated) and GB/s of `nbytes` per call, or the error of a
    launch that does not compile (registers, shared memory), printed."""
    try:
        us = time_rotated(fn, sets)
        row.update(us=round(us, 2), gbs=round(nbytes / us / 1e3, 1))
    except Exception as e:  # recorded, not raised: the sweep goes on with the next candidate
        row["error"] = str(e)[:160]
    print(row, flush=True)
    return row


def packed(w: torch.Tensor, scheme: str | None, group_size: int):
    """w as the fused kernels read it: itself (scheme None), or quantized and packed (quant/packed.py)."""
    if scheme is None:
        return w
    from overlapdecode.quant.packed import PackedWeight
    from overlapdecode.quant.schemes import quantize_fp8, quantize_int4, quantize_int8

    if scheme == "int4":
        return PackedWeight("int4", *quantize_int4(w, group_size), w.shape[1], group_size)
    q, scales = (quantize_int8 if scheme == "int8" else quantize_fp8)(w)
    return PackedWeight(scheme, q, scales, None, w.shape[1], w.shape[1])


def weight_bytes(w) -> int:
    """The bytes a launch reads of its weight (codes and group numbers for a packed one)."""
    tensors = w.tensors() if hasattr(w, "tensors") else [w]
    return sum(t.numel() * t.element_size() for t in tensors)


def sweep(shape: str, B: int, quick: bool, budget: float, quantize: str | None = None, group_size: int = 128):
    from overlapdecode.fused.kernels.linear_residual import Tickets, linear_residual
    from overlapdecode.fused.kernels.norm_linear import norm_linear
    from overlapdecode.fused.kernels.norm_qkv import norm_qkv

    H, Hq, Hkv, D, I, V = SHAPES[shape]
    dt = torch.bfloat16
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    tk = Tickets(DEV)
    r = lambda *s: torch.randn(*s, device=DEV, dtype=dt) * 0.02  # noqa: E731
    x, nw = r(B, H), r(H) + 1
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.full((B,), 200, device=DEV)
    kc, vc = r(B, Hkv, 300, D), r(B, Hkv, 300, D)
    a, m = r(B, Hq * D), r(B, I)
    rows = []
    kernels = {
        "qkv": ((Hq + 2 * Hkv) * D, H),
        "o_proj": (H, Hq * D),
        "gate_up": (2 * I, H),
        "down": (H, I),
        "lm_head": (V, H),
    }
    if shape == "gpt2":  # GPT-2's MLP input projection: fc (I rows) with tanh GELU, no gate
        kernels = {("fc" if k == "gate_up" else k): ((I, H) if k == "gate_up" else v) for k, v in kernels.items()}
    # (block_n, block_k, num_warps, num_stages, programs / SMs); programs is the split-K target and applies
    # to qkv, o_proj and down only; for qkv block_n is HALF, the dimensions of each half of a head
    # at batch > 1 also 128 columns per program: fewer programs re-read the (B, K) activations from L2
    # int4 also at 128 columns: each warp's K-tile instructions spent on its x fragment are shared by more weights
    # (sm_90 loop of O and down: 0.175-0.176 warp instructions a weight at 32 columns, 0.107-0.108 at 128;
    # scripts/sass_counts.py --tile)
    widths = (16, 32, 64) if B == 1 and quantize != "int4" else (16, 32, 64, 128)
    # int4 codes are a quarter of bfloat16's bytes a tile: K tiles of 512 (4 groups of 128) and 8 programs an SM
    # hold as many bytes in flight as bfloat16's tiles (the int4 GEMVs read as issue-bound under Nsight Compute,
    # results/h100/llama-int4-gemv-counters; the sweep times both directions)
    depths, mults = ((128, 256, 512), (1, 2, 4, 8)) if quantize == "int4" else ((64, 128, 256), (1, 2, 4))
    tiles = [(bn, bk, w, st) for bn in widths for bk in depths for w in (2, 4, 8) for st in (2, 3, 4, 5)]
    if shape == "gpt2":  # latency-bound: more, shorter programs; no LM head (a few % of its step)
        tiles = [(bn, bk, w, st) for bn in (16, 32) for bk in (64, 128, 256) for w in (2, 4) for st in (2, 3, 4)]
        kernels.pop("lm_head")
    if quick:
        tiles = [(32, 128, 4, 3), (32, 256, 4, 3)]
    for name, (N, K) in kernels.items():
        nbytes = weight_bytes(packed(r(N, K), quantize, group_size))
        sets = rotated(lambda: (packed(r(N, K), quantize, group_size),), nbytes)
        t_kernel = time.time()
        configs = [(*t, m) for t in tiles for m in (mults if name in ("qkv", "o_proj", "down") else (1,))]
        random.Random(0).shuffle(configs)  # under the time budget, a spread of the grid, not one corner
        first = [(32, 128, 4, 3, 2), (32, 256, 4, 3, 4)]
        if quantize == "int4" and not quick:  # timed before the random spread: wider tiles, 8 warps, more programs
            first += [(bn, 128, w, 3, m) for bn in (64, 128) for w in (4, 8) for m in (2, 4)] + [(16, 512, 4, 3, 4)]
        if name not in ("qkv", "o_proj", "down"):  # programs is split-K's target: the others' launches ignore it
            first = [(bn, bk, w, st, 1) for bn, bk, w, st, _ in first]
        timed = set()
        for bn, bk, nw_, ns, mult in first + configs:
            if (bn, bk, nw_, ns, mult) in timed:
                continue  # the first tiles come again in the spread
            timed.add((bn, bk, nw_, ns, mult))
            if name == "qkv" and bn > D // 2:
                continue  # norm_qkv's tile is HALF = block_n dimensions of each half of a head
            if name in ("gate_up", "fc", "lm_head") and bk * bn > (128 * 128 if quantize == "int4" else 32 * 256):
                continue  # too many registers for the silu_mul pair / little to learn
            cfg = dict(block_n=bn, block_k=bk, num_warps=nw_, num_stages=ns, programs=mult * sms)
            if name == "qkv":
                fn = lambda w, c=cfg: norm_qkv(
                    x,
                    nw,
                    None,
                    1e-5,
                    w,
                    None,
                    inv,
                    1.0,
                    pos,
                    pos,
                    kc,
                    vc,
                    Hq,
                    Hkv,
                    D,  # noqa: E731
                    half=c["block_n"],
                    block_k=c["block_k"],
                    programs=c["programs"],
                    num_warps=c["num_warps"],
                    num_stages=c["num_stages"],
                    tickets=tk,
                    dense=False,  # the GEMV's tiles are what is swept, at any --batch
                )
            elif name in ("o_proj", "down"):
                inp = a if name == "o_proj" else m
                fn = lambda w, c=cfg, inp=inp: linear_residual(
                    inp,
                    w,
                    None,
                    x,
                    block_n=c["block_n"],  # noqa: E731
                    block_k=c["block_k"],
                    programs=c["programs"],
                    num_warps=c["num_warps"],
                    num_stages=c["num_stages"],
                    tickets=tk,
                    dense=False,
                )
            else:
                act, od = {"gate_up": ("silu_mul", None), "fc": ("gelu_tanh", None)}.get(name, ("none", torch.float32))
                fn = lambda w, c=cfg, act=act, od=od: norm_linear(
                    x,
                    nw,
                    None,
                    1e-5,
                    w,
                    None,
                    act,
                    od,  # noqa: E731
                    block_n=c["block_n"],
                    block_k=c["block_k"],
                    num_warps=c["num_warps"],
                    num_stages=c["num_stages"],
                )
            if time.time() - t_kernel > budget:
                break
            try:
                us = time_rotated(fn, sets)
                row = dict(
                    shape=shape, B=B, kernel=name, N=N, K=K, **cfg, us=round(us, 2), gbs=round(nbytes / us / 1e3, 1)
                )
            except Exception as e:  # a configuration that does not compile (shared memory) is recorded
                row = dict(shape=shape, B=B, kernel=name, N=N, K=K, **cfg, error=str(e)[:200])
            row.update(quantize=quantize, group_size=group_size if quantize == "int4" else None)
            rows.append(row)
        del sets
        torch.cuda.empty_cache()
        best = min((r_ for r_ in rows if r_["kernel"] == name and "us" in r_), key=lambda r_: r_["us"])
        print(f"{shape} B={B} {name}: best {best}", flush=True)
    return rows


def captured_step(
    model, B: int, pdl: bool | None = None, tiles: dict | None = None, embed_torch: bool = False, edit_ops=None
):
    """The fused model step (one token per row, 200 positions in) captured in one CUDA graph: (graph, keep),
    `keep` holding what the graph reads. `pdl`, `tiles`: FusedModel's (default: its own); `embed_torch`: the
    step's embedding, slot and length by torch ops (`embed_ref`, its torch twin) instead of the kernel of
    kernels/embed.py, to compare; `edit_ops`: a function of the FusedModel's StepOps returning those to capture
    (another attention split, for example)."""
    from overlapdecode.fused.kernels.embed import embed_ref
    from overlapdecode.fused.model import FusedModel

    fm = FusedModel(model, pdl=pdl, tiles=tiles)
    if embed_torch:
        fm.ops = fm.ops._replace(embed=embed_ref)
    if edit_ops is not None:
        fm.ops = edit_ops(fm.ops)
    cache = fm.cache_for(B, 300)
    ids = torch.randint(0, 1000, (B, 1), device=DEV)
    pos = torch.full((B, 1), 200, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):  # warm-up (Triton compiles) off the capture
            fm(input_ids=ids, position_ids=pos, past_key_values=cache)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        fm(input_ids=ids, position_ids=pos, past_key_values=cache)
    return g, (fm, cache, ids, pos)


def step_profile(
    B: int, out_dir: str, name: str = "llama-1b-random", quantize: str | None = None, group_size: int = 128
) -> dict:
    """The fused step of `name` (bfloat16, its weights quantized with `quantize`) in one CUDA graph: ms per step
    and the profiler's kernel table."""
    import overlapdecode as od

    weights = {} if quantize is None else dict(quantize=quantize, group_size=group_size)
    model = od.load_model(name, dtype="bfloat16", device=DEV, **weights)
    g, keep = captured_step(model, B)
    ms = triton.testing.do_bench(g.replay, rep=200, return_mode="median")
    steps = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            g.replay()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in events if "Memcpy" not in e.name and "Memset" not in e.name]
    busy = sum(e.device_time for e in kernels) / 1e3 / steps  # ms of kernel time per step
    tag = ("" if name == "llama-1b-random" else f"{name}-") + ("" if quantize is None else f"{quantize}-")
    open(os.path.join(out_dir, f"step-profile-{tag}b{B}.txt"), "w").write(table)
    try:
        prof.export_chrome_trace(os.path.join(out_dir, f"step-trace-{tag}b{B}.json"))
    except Exception:
        pass
    del model, g, keep
    torch.cuda.empty_cache()
    return dict(
        model=name,
        quantize=quantize,
        B=B,
        graph_ms_per_step=round(ms, 4),
        kernels_per_step=len(kernels) / steps,
        kernel_ms_per_step=round(busy, 4),
    )


def per_token_ms(model, ids, strategy) -> float:
    """ms per token of `generate`'s decode steps alone: (a 144-token call - a 16-token call) / 128, the best
    of two rounds after a first that compiles."""
    import overlapdecode as od

    times: dict = {}
    for n in (16, 144, 16, 144, 16, 144):
        torch.cuda.synchronize()  # host sync: timing boundary
        t = time.perf_counter()
        od.generate(
            model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, strategy=strategy, eos_token_id=[]
        )
        torch.cuda.synchronize()  # host sync: timing boundary
        times.setdefault(n, []).append(time.perf_counter() - t)
    return round((min(times[144][1:]) - min(times[16][1:])) / 128 * 1e3, 4)


def generate_profile(B: int, out_dir: str) -> dict:
    """`generate` with the fused preset (llama-1b-random, bfloat16): ms per token of the decode steps alone
    ((a 144-token call - a 16-token call) / 128) and the profiler's kernel table of a 16-token call."""
    import overlapdecode as od

    model = od.load_model("llama-1b-random", dtype="bfloat16", device=DEV)
    ids = torch.randint(0, 1000, (B, 32), device=DEV)
    res = {f"{strategy} ms/token": per_token_ms(model, ids, strategy) for strategy in ("fused", "interleaved")}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        od.generate(
            model, ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, strategy="fused", eos_token_id=[]
        )
        torch.cuda.synchronize()
    open(os.path.join(out_dir, f"generate-profile-b{B}.txt"), "w").write(
        prof.key_averages().table(sort_by="cuda_time_total", row_limit=60)
    )
    del model
    torch.cuda.empty_cache()
    return res


KERNEL_OF = {
    "qkv": "norm_qkv",
    "o_proj": "linear_residual",
    "down": "linear_residual",
    "gate_up": "norm_linear",
    "fc": "norm_linear",
    "lm_head": "norm_linear",
}


def best_tiles(rows: list[dict]) -> dict:
    """The fastest configuration of each swept kernel and weight shape as a FusedModel `tiles` table:
    {(kernel function, N, K): keywords} (norm_qkv's block_n is its `half`; `programs`, an absolute split-K
    target of the GPU swept, applies to the split-K kernels only)."""
    table = {}
    for name, N, K in {(r["kernel"], r["N"], r["K"]) for r in rows}:
        best = min(
            (r for r in rows if (r["kernel"], r["N"], r["K"]) == (name, N, K) and "us" in r),
            key=lambda r: r["us"],
        )
        fn = KERNEL_OF[name]
        cfg = dict(block_k=best["block_k"], num_warps=best["num_warps"], num_stages=best["num_stages"])
        cfg["half" if fn == "norm_qkv" else "block_n"] = best["block_n"]
        if fn != "norm_linear":
            cfg["programs"] = best["programs"]
        table[(fn, N, K)] = cfg
    return table


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for kernel-sweep.json and the profiles (made if needed)")
    ap.add_argument("--quick", action="store_true", help="two tiles per kernel only")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated, of %(default)s")
    ap.add_argument("--budget", type=float, default=25.0, help="seconds per kernel (default: %(default)s)")
    ap.add_argument("--batch", type=int, default=1, help="rows of the sweep (default: %(default)s)")
    ap.add_argument("--no-steps", action="store_true", help="skip the step and generate profiles")
    ap.add_argument(
        "--quantize", choices=("int4", "int8", "fp8"), help="sweep packed weights (default: the 16-bit weights)"
    )
    ap.add_argument("--group-size", type=int, default=128, help="int4 group (default: %(default)s)")
    ap.add_argument(
        "--step-models",
        default="llama-1b-random",
        help="models of the step profiles, comma-separated (default: %(default)s)",
    )
    args = ap.parse_args(argv)
    unknown = sorted(set(args.shapes.split(",")) - set(SHAPES))
    if unknown:
        ap.error(f"--shapes: unknown {', '.join(unknown)}; the shapes are {', '.join(SHAPES)}")
    path = os.path.join(args.out, "kernel-sweep.json")
    if os.path.exists(path):
        ap.error(f"{path} exists: choose a new --out (no run overwrites an earlier one)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    out_dir = args.out
    os.makedirs(out_dir, exist_ok=True)
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "copy_gbs": round(copy_gbs(), 1),
        "steps": [],
        "sweep": [],
    }
    print("copy GB/s", res["copy_gbs"], flush=True)
    path = os.path.join(out_dir, "kernel-sweep.json")
    for name, B in [] if args.no_steps else [(n, b) for n in args.step_models.split(",") for b in (1, 8)]:
        t = time.time()
        res["steps"].append(step_profile(B, out_dir, name, args.quantize, args.group_size))
        print("step", res["steps"][-1], f"{time.time() - t:.0f}s", flush=True)
        json.dump(res, open(path, "w"), indent=1)
    if not args.no_steps and args.quantize is None:
        t = time.time()
        res["generate"] = generate_profile(1, out_dir)
        print("generate", res["generate"], f"{time.time() - t:.0f}s", flush=True)
        json.dump(res, open(path, "w"), indent=1)
    for shape in args.shapes.split(","):
        t = time.time()
        res["sweep"] += sweep(shape, args.batch, args.quick, args.budget, args.quantize, args.group_size)
        print(shape, f"{time.time() - t:.0f}s", flush=True)
        json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main()
