"""A/B measurements of the fused step on a GPU: two or more variants timed in alternation in one process, so that a
difference is not the machine drifting.

Every subcommand writes one JSON file (with the device and the commit) under --out DIR and refuses a file that is
already there; run `python3 scripts/ab.py SUBCOMMAND --help` for its options.

  lm-head            GPT-2's LM head (norm_linear at (50257, 768)): tiles in the step in one CUDA graph, the greedy
                     choice's logits per program, and each tile alone over weight copies that do not fit the L2
  step-tiles         Llama-1B's five GEMVs: candidate tiles put into the whole step one (kernel, N, K) at a time
                     (phase 1), then each kernel's winner combined (phase 2); --check validates every candidate
                     table on any machine
  tile-confirm       one TILES entry against the one it replaced (CONFIRM_KEY), at batch 2 (where it does not
                     apply: the noise), 4, 8 and 16
  attention-pieces   the decode attention's pieces (cache slots per program, number of pieces) in the step
  step-gap           the step alone in one graph with and without programmatic dependent launch, and with the
                     embedding by torch ops, against `generate`'s decode steps (fused, fused without stop check,
                     interleaved); a trace and kernel table of one 32-token fused call
  stop-check-pairs   interleaved against nocheck in pairs alternating which runs first, alone and with processes
                     spinning on the host's cores (the ping-pong's host work must stay ahead of the GPU)

The figures docs/ cite, by the commands that made them (each results folder's report names its commit):

  python3 scripts/ab.py lm-head --out results/h200/gpt2-lm-head-tiles --batch B          (B = 1, 8)
  python3 scripts/ab.py step-tiles --out results/h200/llama-1b-step-tiles --batch B      (B = 1, 8)
  python3 scripts/ab.py tile-confirm --out results/h200/llama-1b-step-tiles
  python3 scripts/ab.py attention-pieces --out results/h200/llama-1b-step-tiles
  python3 scripts/ab.py step-gap --out DIR               (results/h200/shapes-pdl-modes: its off and LATE columns)
  python3 scripts/ab.py stop-check-pairs --out results/h200/gpt2-stop-check-contended-host --burn 14

Figures are medians over alternating passes ("rounds" in the JSON); "fastest" is the best pass. Tables of tile
keywords use FusedModel's `tiles` format ((kernel, N, K) or (kernel, N, K, min_batch) -> keywords).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

ROUNDS, ROUNDS_CONFIRM, MIN_GAIN = 3, 5, 0.003
H, I, V, QKV = 2048, 8192, 128256, 3072  # Llama-3.2-1B: hidden, intermediate, vocabulary, (32 + 2 x 8) heads x 64
SMS = 132  # H200; `programs` is linear_residual's and norm_qkv's absolute split-K target


# ----------------------------------------------------------------------------------------------------------------
# shared: output, timing


def fail(message: str):
    """A user's mistake: one line on stderr, exit status 2, before any GPU work."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


def out_path(out_dir: str, name: str) -> str:
    """DIR/name, DIR made if needed; a file already there is refused (no run overwrites an earlier one)."""
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
        fail(f"ab.py: {path} exists: choose a new --out (no run overwrites an earlier one)")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        fail(f"ab.py: --out {out_dir} is a file, not a directory")
    os.makedirs(out_dir, exist_ok=True)
    return path


def write(path: str, res: dict) -> None:
    print(json.dumps(res, indent=1), flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def meta(**extra) -> dict:
    import torch

    from overlapdecode.bench.report.results import git_commit

    return {"device": torch.cuda.get_device_name(), "commit": git_commit(), **extra}


def timed_call(model, ids, n: int, strategy, **generate_kwargs) -> float:
    """Seconds of one `od.generate` call of n tokens, EOS off, synchronised as the bench times it (sampling
    settings, if any, in `generate_kwargs`)."""
    import torch

    import overlapdecode as od

    torch.cuda.synchronize()  # host sync: timing boundary
    t = time.perf_counter()
    od.generate(
        model,
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        strategy=strategy,
        eos_token_id=[],
        **generate_kwargs,
    )
    torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
    return time.perf_counter() - t


def graph_rounds(graphs: dict, rounds: int) -> dict:
    """name -> ms of each pass: every graph replayed (do_bench median) once per pass, the graphs alternating."""
    import triton.testing

    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, (g, _keep) in graphs.items():
            times[k].append(triton.testing.do_bench(g.replay, rep=200, return_mode="median"))
    return times


def medians(times: dict) -> dict:
    return {k: round(statistics.median(v), 4) for k, v in times.items()}


def every_round(times: dict) -> dict:
    return {k: [round(x, 4) for x in v] for k, v in times.items()}


# ----------------------------------------------------------------------------------------------------------------
# lm-head

LM_HEAD_KEY = ("norm_linear", 50257, 768)
# (block_n, block_k, num_warps, num_stages); the first is norm_linear's default, the second TILES' entry
LM_HEADS = [
    (32, 256, 4, 3),
    (128, 64, 4, 4),
    (64, 256, 4, 3),
    (64, 256, 8, 3),
    (64, 128, 4, 4),
    (128, 128, 8, 3),
    (16, 256, 4, 3),
    (32, 128, 4, 4),
    (32, 256, 4, 2),
    (64, 256, 8, 2),
    (128, 256, 8, 2),
    (64, 128, 8, 4),
    (256, 64, 4, 4),
    (256, 32, 4, 4),
    (128, 32, 4, 5),
    (128, 64, 4, 5),
    (128, 64, 8, 4),
    (128, 64, 4, 3),
    (256, 64, 8, 4),
    (128, 128, 4, 4),
]
GREEDY_BLOCKS = (1024, 4096, 8192)  # the greedy choice's logits per program (its default for one row: 2048)


def _head_cfg(t) -> dict:
    return dict(block_n=t[0], block_k=t[1], num_warps=t[2], num_stages=t[3])


def lm_head(args) -> None:
    path = out_path(args.out, f"lm-head-b{args.batch}.json")
    import torch
    from kernel_sweep import captured_step, rotated, time_rotated  # scripts/ is on the path when run as a script

    import overlapdecode as od
    from overlapdecode.fused.kernels.norm_linear import norm_linear
    from overlapdecode.fused.model import TILES

    B = args.batch
    model = od.load_model("gpt2-random", dtype="bfloat16", device="cuda")
    res = meta(batch=B, rounds=ROUNDS)
    graphs = {}
    for t in LM_HEADS:
        try:
            graphs[f"head {t}"] = captured_step(model, B, tiles={**TILES, LM_HEAD_KEY: _head_cfg(t)})
        except Exception as e:  # a configuration that does not compile (shared memory, registers) is recorded
            res[f"head {t} error"] = str(e)[:200]
    for bv in GREEDY_BLOCKS:
        edit = lambda ops, bv=bv: ops._replace(greedy=functools.partial(ops.greedy, block_v=bv))  # noqa: E731
        graphs[f"greedy block_v {bv}"] = captured_step(model, B, edit_ops=edit)
    times = graph_rounds(graphs, ROUNDS)
    res["step ms, median of rounds"] = medians(times)
    res["step ms, rounds"] = every_round(times)
    del graphs
    torch.cuda.empty_cache()
    x = torch.randn(B, 768, device="cuda", dtype=torch.bfloat16)
    nw, nb = torch.ones(768, device="cuda", dtype=torch.bfloat16), torch.zeros(768, device="cuda", dtype=torch.bfloat16)
    sets = rotated(lambda: (torch.randn(50257, 768, device="cuda", dtype=torch.bfloat16) * 0.02,), 50257 * 768 * 2)
    alone = {}
    for t in LM_HEADS:
        if f"head {t} error" in res:
            continue
        fn = lambda w, t=t: norm_linear(x, nw, nb, 1e-5, w, None, "none", torch.float32, **_head_cfg(t))  # noqa: E731
        us = time_rotated(fn, sets)
        alone[str(t)] = {"us": round(us, 2), "GB/s": round(50257 * 768 * 2 / us / 1e3, 1)}
    res["LM head alone (cold L2)"] = alone
    write(path, res)


# ----------------------------------------------------------------------------------------------------------------
# step-tiles, tile-confirm, attention-pieces

# (kernel, N, K) -> candidates (keywords); the defaults (docs/KERNELS.md "Tiles") are HALF 32 x 256, 4 warps,
# 3 stages, 4 x SMs for QKV; 32 x 128, 4, 3, 2 x SMs for O and down; 32 x 256, 4, 3 for gate/up and the LM head
CANDIDATES = {
    ("norm_qkv", QKV, H): [
        dict(half=32, block_k=128, num_warps=4, num_stages=4, programs=4 * SMS),
        dict(half=32, block_k=256, num_warps=4, num_stages=3, programs=8 * SMS),
        dict(half=16, block_k=256, num_warps=4, num_stages=3, programs=4 * SMS),
        dict(half=32, block_k=256, num_warps=8, num_stages=3, programs=4 * SMS),
        dict(half=32, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS),
    ],
    ("linear_residual", H, H): [
        dict(block_n=64, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS),
        dict(block_n=128, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS),
        dict(block_n=32, block_k=128, num_warps=4, num_stages=3, programs=4 * SMS),
        dict(block_n=64, block_k=64, num_warps=4, num_stages=4, programs=4 * SMS),
        dict(block_n=16, block_k=128, num_warps=4, num_stages=4, programs=2 * SMS),
    ],
    ("norm_linear", 2 * I, H): [
        dict(block_n=64, block_k=128, num_warps=4, num_stages=3),
        dict(block_n=128, block_k=64, num_warps=4, num_stages=4),
        dict(block_n=128, block_k=64, num_warps=8, num_stages=4),
        dict(block_n=64, block_k=64, num_warps=4, num_stages=4),
        dict(block_n=64, block_k=256, num_warps=8, num_stages=3),
    ],
    ("linear_residual", H, I): [
        dict(block_n=64, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS),
        dict(block_n=128, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS),
        dict(block_n=32, block_k=128, num_warps=4, num_stages=4, programs=4 * SMS),
        dict(block_n=64, block_k=128, num_warps=8, num_stages=3, programs=4 * SMS),
        dict(block_n=32, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS),
    ],
    ("norm_linear", V, H): [
        dict(block_n=32, block_k=256, num_warps=4, num_stages=3),
        dict(block_n=64, block_k=128, num_warps=4, num_stages=3),
        dict(block_n=128, block_k=64, num_warps=4, num_stages=4),
        dict(block_n=128, block_k=128, num_warps=8, num_stages=3),
    ],
}
# tile-confirm: TILES' entry for the 1B LM head from 4 rows on, against the entry it replaced
CONFIRM_KEY = ("norm_linear", V, H, 4)
CONFIRM_OLD = dict(block_n=64, block_k=128, num_warps=4, num_stages=3)
# attention-pieces: the decode attention's keywords (default: 64 cache slots per piece, as many pieces as needed)
ATTENTION = [dict(), dict(block_n=32), dict(block_n=16), dict(block_n=32, num_splits=4)]


def with_entry(tiles: dict, key: tuple, cfg: dict, B: int) -> dict:
    """`tiles` with `cfg` for (kernel, N, K) at B rows and more: a (kernel, N, K, B) entry, replacing an entry of
    that very min_batch (a 3-tuple key is min_batch 1)."""
    full = (*key, B)
    kept = {k: v for k, v in tiles.items() if (k if len(k) == 4 else (*k, 1)) != full}
    return {**kept, (full if B > 1 else key): cfg}


def tile_tables(B: int) -> dict:
    """name -> tiles table: the current one and each candidate."""
    from overlapdecode.fused.model import TILES

    out = {"current": dict(TILES)}
    for key, cands in CANDIDATES.items():
        for cfg in cands:
            out[f"{key[0]} {key[1]}x{key[2]} {cfg}"] = with_entry(TILES, key, cfg, B)
    return out


def check_tables() -> int:
    """Every candidate table passes FusedModel's check of its `tiles` option (any machine); the number checked."""
    from overlapdecode.fused.model import check_option_values

    n = 0
    for B in (1, 8):
        for t in tile_tables(B).values():
            check_option_values(tiles=t)
            n += 1
    return n


def step_tiles(args) -> None:
    if args.check:
        print(f"{check_tables()} candidate tables pass check_option_values")
        return
    if args.out is None:
        fail("ab.py step-tiles: --out is required (or --check)")
    path = out_path(args.out, f"step-tiles-b{args.batch}.json")
    import torch
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    import overlapdecode as od
    from overlapdecode.fused.model import TILES

    B = args.batch
    model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
    res = meta(batch=B, rounds=ROUNDS)
    graphs = {}
    for name, t in tile_tables(B).items():
        try:
            graphs[name] = captured_step(model, B, tiles=t)
        except Exception as e:  # a configuration that does not compile (shared memory, registers) is recorded
            res[f"{name} error"] = str(e)[:200]
    times = graph_rounds(graphs, ROUNDS)
    med = {k: statistics.median(v) for k, v in times.items()}
    res["phase 1 step ms, median of rounds"] = medians(times)
    res["phase 1 step ms, rounds"] = every_round(times)
    del graphs
    torch.cuda.empty_cache()

    combo, picked = dict(TILES), {}
    for key, cands in CANDIDATES.items():
        named = {f"{key[0]} {key[1]}x{key[2]} {cfg}": cfg for cfg in cands}
        scored = [(med[n], n) for n in named if n in med]
        if scored and min(scored)[0] < med["current"] * (1 - MIN_GAIN):
            best = min(scored)[1]
            picked[str(key)] = named[best]
            combo = with_entry(combo, key, named[best], B)
    res["phase 2 picked"] = picked
    if picked:
        graphs = {
            "current": captured_step(model, B, tiles=dict(TILES)),
            "combined": captured_step(model, B, tiles=combo),
        }
        times = graph_rounds(graphs, ROUNDS_CONFIRM)
        res["phase 2 step ms, median of rounds"] = medians(times)
        res["phase 2 step ms, rounds"] = every_round(times)
    write(path, res)


def tile_confirm(args) -> None:
    path = out_path(args.out, "tile-confirm.json")
    import torch
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    import overlapdecode as od
    from overlapdecode.fused.model import TILES

    model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
    res = meta(key=str(CONFIRM_KEY), before=CONFIRM_OLD, now=TILES[CONFIRM_KEY], rounds=ROUNDS_CONFIRM)
    for B in (2, 4, 8, 16):
        graphs = {
            "before": captured_step(model, B, tiles={**TILES, CONFIRM_KEY: CONFIRM_OLD}),
            "now": captured_step(model, B, tiles=dict(TILES)),
        }
        times = graph_rounds(graphs, ROUNDS_CONFIRM)
        res[f"batch {B} step ms, median of rounds"] = medians(times)
        res[f"batch {B} step ms, rounds"] = every_round(times)
        del graphs
        torch.cuda.empty_cache()
    write(path, res)


def attention_pieces(args) -> None:
    path = out_path(args.out, "attention-pieces.json")
    import torch
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    import overlapdecode as od

    res = meta(rounds=ROUNDS_CONFIRM)
    for name, B in (("llama-1b-random", 1), ("llama-1b-random", 8), ("gpt2-random", 1)):
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        graphs = {}
        for kw in ATTENTION:
            edit = lambda ops, kw=kw: ops._replace(attention=functools.partial(ops.attention, **kw))  # noqa: E731
            try:
                graphs[str(kw) if kw else "default"] = captured_step(model, B, edit_ops=edit)
            except Exception as e:  # a plan the kernel refuses is recorded
                res[f"{name} {B} {kw} error"] = str(e)[:200]
        times = graph_rounds(graphs, ROUNDS_CONFIRM)
        res[f"{name} batch {B} step ms, median of rounds"] = medians(times)
        res[f"{name} batch {B} step ms, rounds"] = every_round(times)
        del graphs, model
        torch.cuda.empty_cache()
    write(path, res)


# ----------------------------------------------------------------------------------------------------------------
# step-gap


def step_gap(args) -> None:
    path = out_path(args.out, "step-gap.json")
    import torch
    import triton.testing
    from kernel_sweep import captured_step, per_token_ms  # scripts/ is on the path when run as a script

    import overlapdecode as od

    def graph_step_ms(model, B: int, pdl: bool | None = None, embed_torch: bool = False) -> float:
        g, _keep = captured_step(model, B, pdl=pdl, embed_torch=embed_torch)
        return round(triton.testing.do_bench(g.replay, rep=200, return_mode="median"), 4)

    cases = (("llama-1b-random", 1), ("llama-1b-random", 8), ("gpt2-random", 1))
    res = meta()
    for name, B in cases:
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        ids = torch.randint(0, 1000, (B, 32), device="cuda")
        r = res[f"{name} b{B}"] = {}
        for pdl in (False, True):  # kernels/pdl.py
            r[f"graph step ms, pdl {'on' if pdl else 'off'}"] = graph_step_ms(model, B, pdl)
        r["graph step ms, embedding by torch ops"] = graph_step_ms(model, B, embed_torch=True)
        r["fused ms/token"] = per_token_ms(model, ids, "fused")
        r["fused, no stop check, ms/token"] = per_token_ms(
            model, ids, od.Strategy(cache="fused", compile=True, stop_check="end")
        )
        r["interleaved ms/token"] = per_token_ms(model, ids, "interleaved")
        if (name, B) == cases[0]:
            with torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            ) as prof:
                od.generate(
                    model,
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=32,
                    strategy="fused",
                    eos_token_id=[],
                )
                torch.cuda.synchronize()  # host sync: end of the profiled call
            prof.export_chrome_trace(os.path.join(args.out, "fused-generate-trace.json"))
            with open(os.path.join(args.out, "fused-generate-kernels.txt"), "w") as f:
                f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=60))
        del model
        torch.cuda.empty_cache()
    write(path, res)


# ----------------------------------------------------------------------------------------------------------------
# stop-check-pairs


def _spin(stop) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(10000):
            x += 1


def stop_check_pairs(args) -> None:
    path = out_path(args.out, "stop-check-pairs.json")
    import torch

    import overlapdecode as od

    def timed_ms(model, ids, strategy) -> float:
        return statistics.median(
            timed_call(model, ids, args.new_tokens, strategy) / args.new_tokens * 1e3 for _ in range(args.calls)
        )

    rows = []
    for pair in args.dtype_batch.split(","):
        dtype, batch = pair.split(":")
        model = od.load_model(args.model, dtype=dtype, device="cuda")
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, model.config.vocab_size - 1, (int(batch), 32), generator=g).cuda()
        for s in ("interleaved", "nocheck"):  # compile and record the graphs before any timing
            for _ in range(2):
                timed_call(model, ids, args.new_tokens, s)
        for cond, nburn in [("alone", 0)] + ([("burn", args.burn)] if args.burn else []):
            stop = mp.Event()
            procs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(nburn)]
            for p in procs:
                p.start()
            try:
                for i in range(args.pairs):
                    order = ("interleaved", "nocheck") if i % 2 == 0 else ("nocheck", "interleaved")
                    for s in order:
                        rows.append(
                            dict(
                                condition=cond,
                                pair=i,
                                strategy=s,
                                first=order[0],
                                dtype=dtype,
                                batch=int(batch),
                                burners=nburn,
                                ms_per_token=timed_ms(model, ids, s),
                            )
                        )
            finally:
                stop.set()
                for p in procs:
                    p.join(timeout=10)
            got = [r for r in rows if (r["condition"], r["dtype"], r["batch"]) == (cond, dtype, int(batch))]
            inter = [r["ms_per_token"] for r in got if r["strategy"] == "interleaved"]
            noch = [r["ms_per_token"] for r in got if r["strategy"] == "nocheck"]
            ratios = [a / b for a, b in zip(inter, noch)]
            print(
                f"{dtype} b{batch} {cond:5s}: interleaved median {statistics.median(inter):.3f} "
                f"[{min(inter):.3f}-{max(inter):.3f}] nocheck {statistics.median(noch):.3f} "
                f"[{min(noch):.3f}-{max(noch):.3f}] ms/token; ratio per pair median "
                f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]",
                flush=True,
            )
        del model
        torch.cuda.empty_cache()
    env = meta(torch=torch.__version__, cpus=os.cpu_count(), args={k: v for k, v in vars(args).items() if k != "fn"})
    write(path, {"environment": env, "rows": rows})


# ----------------------------------------------------------------------------------------------------------------
# the command line


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        fail(f"{self.prog}: {message} (see --help)")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="ab.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name, fn, help_text, out_required=True):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--out", required=out_required, help="directory for the JSON (made if needed)")
        p.set_defaults(fn=fn)
        return p

    p = add("lm-head", lm_head, "GPT-2's LM head tiles and the greedy choice's block, in the step and alone")
    p.add_argument("--batch", type=_positive, default=1, help="rows (default: 1)")
    p = add("step-tiles", step_tiles, "Llama-1B's GEMV tiles in the whole step", out_required=False)
    p.add_argument("--batch", type=_positive, default=1, help="rows (default: 1)")
    p.add_argument("--check", action="store_true", help="only check every candidate table (no GPU needed)")
    add("tile-confirm", tile_confirm, "one TILES entry against the entry it replaced, at batch 2, 4, 8, 16")
    add("attention-pieces", attention_pieces, "the decode attention's pieces in the step")
    add("step-gap", step_gap, "the step alone with and without PDL against generate's decode steps")
    p = add("stop-check-pairs", stop_check_pairs, "interleaved against nocheck in pairs, alone and on a busy host")
    p.add_argument("--model", default="gpt2-random", help="default: %(default)s")
    p.add_argument("--dtype-batch", default="bfloat16:1,bfloat16:8", help="default: %(default)s")
    p.add_argument("--new-tokens", type=_positive, default=400, help="default: %(default)s")
    p.add_argument("--pairs", type=_positive, default=10, help="default: %(default)s")
    p.add_argument(
        "--calls", type=_positive, default=3, help="calls per timing, the median taken (default: %(default)s)"
    )
    p.add_argument(
        "--burn",
        type=int,
        default=max(1, (os.cpu_count() or 2) - 1),
        help="host processes spinning in the contended condition, 0 to skip it (default: cores - 1)",
    )
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.fn(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
