"""Llama-1B's five GEMV tiles timed in the whole step, on a GPU: does a tile the isolated sweep never tried win there?

scripts/kernel_sweep.py chose the defaults from each kernel alone, over weight copies larger than the L2, at 16-64
columns per program at batch 1. At GPT-2 the LM head's best tile in the step (128 x 64, session 10,
benchmarks/h200-session10-lm-head) was one that sweep never tried, 20% faster than the default. This script asks the
same at the Llama-1B shape, where QKV and the O-projection reach a third of the bandwidth.

Phase 1: the step replayed from one CUDA graph (kernel_sweep.captured_step, do_bench median), the current table and
one candidate per run for one (kernel, N, K) at a time, ROUNDS rounds with all of them alternating. Phase 2: the
current table against the combination of each kernel's best candidate that beat it by more than MIN_GAIN in phase 1,
ROUNDS2 alternating rounds. A candidate is put in as a (kernel, N, K, B) entry, so it overrides the table at this
batch only.

    python3 scripts/step_tiles_ab.py OUT.json [BATCH]        (on a GPU)
    python3 scripts/step_tiles_ab.py --check                 (anywhere: every candidate table passes FusedModel's check)
    python3 scripts/step_tiles_ab.py --confirm OUT.json      (on a GPU: CONFIRM_KEY's entry before and now, below)

    python3 scripts/step_tiles_ab.py --attention OUT.json    (on a GPU: the attention's pieces, below)

--attention: in the Llama-1B step's profile (benchmarks/h200-session11-timeline-1b) the attention kernel takes 6.1 us
per layer (4.2 after the 1.9 it starts early under PDL) to read about 0.5 MB of cache: latency, not bandwidth. Its
pieces are 64 cache slots (block_n), as many as the cache holds up to 64 per (row, KV head) (5 at the 300-slot cache of
captured_step, 4 of them live at position 200). This times the step with smaller pieces, hence more of them in
flight, at Llama-1B batch 1 and 8 and GPT-2 batch 1, ROUNDS2 alternating rounds.

--confirm: phase 2 at batch 8 (6eb2c7e, benchmarks/h200-session11-step-tiles) picked the LM head's 128 x 128, 8 warps,
3 stages (0.9594 -> 0.9548 ms). TILES now has it from 4 rows on; this times the table with the entry it had before
(CONFIRM_OLD) against TILES, ROUNDS2 alternating rounds at batch 2 (where the entry does not apply: both tables run
the same kernels, so the difference there is the noise), 4, 8 and 16.
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from overlapdecode.fused.model import TILES, check_option_values

ROUNDS, ROUNDS2, MIN_GAIN = 3, 5, 0.003
H, I, V, QKV = 2048, 8192, 128256, 3072  # Llama-3.2-1B: hidden, intermediate, vocabulary, (32 + 2 x 8) heads x 64
SMS = 132  # H200; `programs` is linear_residual's and norm_qkv's absolute split-K target
# (kernel, N, K) -> candidates (keywords); the defaults (KERNELS.md "Tiles") are HALF 32 x 256, 4 warps, 3 stages,
# 4 x SMs for QKV; 32 x 128, 4, 3, 2 x SMs for O and down; 32 x 256, 4, 3 for gate/up and the LM head (TILES as of
# 6eb2c7e: 64 x 128 from 4 rows)
CANDIDATES = {
    ("norm_qkv", QKV, H): [dict(half=32, block_k=128, num_warps=4, num_stages=4, programs=4 * SMS),
                           dict(half=32, block_k=256, num_warps=4, num_stages=3, programs=8 * SMS),
                           dict(half=16, block_k=256, num_warps=4, num_stages=3, programs=4 * SMS),
                           dict(half=32, block_k=256, num_warps=8, num_stages=3, programs=4 * SMS),
                           dict(half=32, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS)],
    ("linear_residual", H, H): [dict(block_n=64, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS),
                                dict(block_n=128, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS),
                                dict(block_n=32, block_k=128, num_warps=4, num_stages=3, programs=4 * SMS),
                                dict(block_n=64, block_k=64, num_warps=4, num_stages=4, programs=4 * SMS),
                                dict(block_n=16, block_k=128, num_warps=4, num_stages=4, programs=2 * SMS)],
    ("norm_linear", 2 * I, H): [dict(block_n=64, block_k=128, num_warps=4, num_stages=3),
                                dict(block_n=128, block_k=64, num_warps=4, num_stages=4),
                                dict(block_n=128, block_k=64, num_warps=8, num_stages=4),
                                dict(block_n=64, block_k=64, num_warps=4, num_stages=4),
                                dict(block_n=64, block_k=256, num_warps=8, num_stages=3)],
    ("linear_residual", H, I): [dict(block_n=64, block_k=128, num_warps=4, num_stages=3, programs=2 * SMS),
                                dict(block_n=128, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS),
                                dict(block_n=32, block_k=128, num_warps=4, num_stages=4, programs=4 * SMS),
                                dict(block_n=64, block_k=128, num_warps=8, num_stages=3, programs=4 * SMS),
                                dict(block_n=32, block_k=64, num_warps=4, num_stages=4, programs=2 * SMS)],
    ("norm_linear", V, H): [dict(block_n=32, block_k=256, num_warps=4, num_stages=3),
                            dict(block_n=64, block_k=128, num_warps=4, num_stages=3),
                            dict(block_n=128, block_k=64, num_warps=4, num_stages=4),
                            dict(block_n=128, block_k=128, num_warps=8, num_stages=3)],
}


def with_entry(tiles: dict, key: tuple, cfg: dict, B: int) -> dict:
    """`tiles` with `cfg` for (kernel, N, K) at B rows and more: a (kernel, N, K, B) entry, replacing an entry of
    that very min_batch (a 3-tuple key is min_batch 1)."""
    full = (*key, B)
    kept = {k: v for k, v in tiles.items() if (k if len(k) == 4 else (*k, 1)) != full}
    return {**kept, (full if B > 1 else key): cfg}


CONFIRM_KEY = ("norm_linear", V, H, 4)
CONFIRM_OLD = dict(block_n=64, block_k=128, num_warps=4, num_stages=3)  # the entry from session 7 to 11


def tables(B: int) -> dict:
    """name -> tiles table: the current one and each candidate."""
    out = {"current": dict(TILES)}
    for key, cands in CANDIDATES.items():
        for cfg in cands:
            out[f"{key[0]} {key[1]}x{key[2]} {cfg}"] = with_entry(TILES, key, cfg, B)
    return out


def check() -> None:
    for B in (1, 8):
        for name, t in tables(B).items():
            check_option_values(tiles=t)
    print(f"{len(tables(1))} tables per batch pass check_option_values")


def timed(graphs: dict, rounds: int) -> dict:
    """name -> ms of each round: every graph replayed (do_bench median) once per round, the graphs alternating."""
    import triton.testing

    times = {k: [] for k in graphs}
    for _ in range(rounds):
        for k, (g, _keep) in graphs.items():
            times[k].append(triton.testing.do_bench(g.replay, rep=200, return_mode="median"))
    return times


def main(out: str, B: int) -> None:
    import torch

    import overlapdecode as od
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    if os.path.exists(out):
        raise SystemExit(f"{out} exists: choose a new path (no run overwrites an earlier one)")
    model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
    res = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "batch": B, "rounds": ROUNDS}

    graphs = {}
    for name, t in tables(B).items():
        try:
            graphs[name] = captured_step(model, B, tiles=t)
        except Exception as e:  # a configuration that does not compile (shared memory, registers) is recorded
            res[f"{name} error"] = str(e)[:200]
    times = timed(graphs, ROUNDS)
    med = {k: statistics.median(v) for k, v in times.items()}
    res["phase 1 step ms, median of rounds"] = {k: round(v, 4) for k, v in med.items()}
    res["phase 1 step ms, rounds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
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
        graphs = {"current": captured_step(model, B, tiles=dict(TILES)),
                  "combined": captured_step(model, B, tiles=combo)}
        times = timed(graphs, ROUNDS2)
        res["phase 2 step ms, median of rounds"] = {k: round(statistics.median(v), 4) for k, v in times.items()}
        res["phase 2 step ms, rounds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
    print(json.dumps(res, indent=1), flush=True)
    json.dump(res, open(out, "w"), indent=1)


def confirm(out: str) -> None:
    import torch

    import overlapdecode as od
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    if os.path.exists(out):
        raise SystemExit(f"{out} exists: choose a new path (no run overwrites an earlier one)")
    model = od.load_model("llama-1b-random", dtype="bfloat16", device="cuda")
    res = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "key": str(CONFIRM_KEY), "before": CONFIRM_OLD, "now": TILES[CONFIRM_KEY], "rounds": ROUNDS2}
    for B in (2, 4, 8, 16):
        graphs = {"before": captured_step(model, B, tiles={**TILES, CONFIRM_KEY: CONFIRM_OLD}),
                  "now": captured_step(model, B, tiles=dict(TILES))}
        times = timed(graphs, ROUNDS2)
        res[f"batch {B} step ms, median of rounds"] = {k: round(statistics.median(v), 4) for k, v in times.items()}
        res[f"batch {B} step ms, rounds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
        del graphs
        torch.cuda.empty_cache()
    print(json.dumps(res, indent=1), flush=True)
    json.dump(res, open(out, "w"), indent=1)


ATTENTION = [dict(), dict(block_n=32), dict(block_n=16), dict(block_n=32, num_splits=4)]


def attention(out: str) -> None:
    import functools

    import torch

    import overlapdecode as od
    from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

    if os.path.exists(out):
        raise SystemExit(f"{out} exists: choose a new path (no run overwrites an earlier one)")
    res = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown"),
           "rounds": ROUNDS2}
    for name, B in (("llama-1b-random", 1), ("llama-1b-random", 8), ("gpt2-random", 1)):
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        graphs = {}
        for kw in ATTENTION:
            edit = lambda ops, kw=kw: ops._replace(attention=functools.partial(ops.attention, **kw))  # noqa: E731
            try:
                graphs[str(kw) if kw else "default"] = captured_step(model, B, edit_ops=edit)
            except Exception as e:  # a plan the kernel refuses is recorded
                res[f"{name} {B} {kw} error"] = str(e)[:200]
        times = timed(graphs, ROUNDS2)
        res[f"{name} batch {B} step ms, median of rounds"] = {k: round(statistics.median(v), 4)
                                                               for k, v in times.items()}
        res[f"{name} batch {B} step ms, rounds"] = {k: [round(x, 4) for x in v] for k, v in times.items()}
        del graphs, model
        torch.cuda.empty_cache()
    print(json.dumps(res, indent=1), flush=True)
    json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--attention":
        attention(sys.argv[2])
        raise SystemExit(0)
    if sys.argv[1:] == ["--check"]:
        check()
        raise SystemExit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--confirm":
        confirm(sys.argv[2])
        raise SystemExit(0)
    if len(sys.argv) not in (2, 3):
        raise SystemExit("usage: python3 scripts/step_tiles_ab.py OUT.json [BATCH] | --check")
    if len(sys.argv) == 3 and not sys.argv[2].isdigit():
        raise SystemExit(f"BATCH must be a positive integer, got {sys.argv[2]!r}")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 1)
