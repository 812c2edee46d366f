"""A/B on a GPU: the MLP block as two kernels (norm_linear, then linear_residual: the fused step's today) against
one persistent launch with a grid barrier (kernels/norm_mlp.py), bfloat16, at GPT-2 (H 768, I 3072, LayerNorm,
biases, tanh GELU) and Llama-1B (H 2048, I 8192, RMSNorm, no biases, SiLU(gate) * up), batch 1 and 8.

Each configuration is timed as ONE CUDA graph of a chain of L MLP blocks over L distinct weight copies (12 for
GPT-2, 16 for 1B: more than the L2 holds, as in a step), h flowing from one to the next, replayed in rounds:
the median round gives us per MLP. Its final h is compared with the two kernels' (bitwise, and the max abs
difference): with the same tiles and split, norm_mlp computes the same bits.

A grid barrier that deadlocks must not hang the GPU call: each (shape, batch) group runs in a child process
under a timeout, and each configuration too (90 s by default, compiles included); a child that times out is
killed (one that fails exits) and a new one carries on after the configuration
it was running, which is recorded as an error. The whole run stops starting groups after --budget seconds.

    python3 scripts/norm_mlp_ab.py OUT_DIR [--dry-run] [--budget S] [--group-timeout S] [--config-timeout S]
                                   [--only "gpt2 b1"]

Writes OUT_DIR/norm_mlp_ab.json (after every group) and prints a table.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

SHAPES = {  # H, I, act, LayerNorm and biases, layers in the chain
    "gpt2": (768, 3072, "gelu_tanh", True, 12),
    "llama-1b": (2048, 8192, "silu_mul", False, 16),
}
BATCHES = (1, 8)
ROUNDS, REPS = 10, 20


def baseline_tiles(shape: str) -> tuple[dict, dict]:
    """The up- and down-projections' keywords in the FusedModel (fused/model.py TILES, else the defaults)."""
    from overlapdecode.fused.model import TILES

    H, I, act, _, _ = SHAPES[shape]
    up_rows = 2 * I if act == "silu_mul" else I
    return dict(TILES.get(("norm_linear", up_rows, H), {})), dict(TILES.get(("linear_residual", H, I), {}))


def baseline_split(shape: str, sms: int) -> tuple[int, int, int]:
    """(split, block_n, block_k) of linear_residual's down-projection in the step (split-K target 2 x SMs)."""
    from overlapdecode.fused.kernels.linear_residual import split_k

    H, I = SHAPES[shape][:2]
    down = baseline_tiles(shape)[1]
    bn, bk = down.get("block_n", 32), down.get("block_k", 128)
    return split_k(-(-H // bn), I, bk, down.get("programs", 2 * sms)), bn, bk


def configs(shape: str, B: int, sms: int) -> list[dict]:
    """The configurations of one group: the two kernels first (the reference of the comparison), then norm_mlp's.
    norm_mlp takes the two kernels' tiles (so that the same split gives the same bits); `split` None is
    norm_mlp's default (as many K ranges as fill G)."""
    up, down = baseline_tiles(shape)
    split_a, bn, bk = baseline_split(shape, sms)
    tiles = dict(block_n_up=up.get("block_n", 32), block_k_up=up.get("block_k", 256), block_n_down=bn,
                 block_k_down=bk, num_warps=4, num_stages=3)
    out = [dict(name="a two kernels pdl3", kind="a", pdl=3),
           dict(name="a two kernels pdl0", kind="a", pdl=0)]
    if shape != "gpt2" and B > 1:  # the step hands RMSNorm sums from writer to reader from 2 rows on (NormSums)
        out.append(dict(name="a two kernels pdl3 +norm sums", kind="a", pdl=3, norm_sums=True))

    def b(name, **kw):
        cfg = dict(kind="b", phases=3, pdl=3, grid_programs=sms, split=None, prefetch_k=None, cooperative=True,
                   **tiles)
        cfg.update(kw)
        out.append(dict(name=f"b {name}", **cfg))

    b(f"G{sms} pdl3")
    b(f"G{sms} pdl0", pdl=0)
    b(f"G{sms // 2} pdl3", grid_programs=sms // 2)
    b(f"G{2 * sms} pdl3", grid_programs=2 * sms)
    b(f"G{sms} pdl3 split{split_a} (a's)", split=split_a)
    b(f"G{2 * sms} pdl3 split{split_a} (a's)", grid_programs=2 * sms, split=split_a)
    b(f"G{sms} pdl3 no prefetch", prefetch_k=0)
    b(f"G{sms} pdl3 not cooperative", cooperative=False)
    b(f"G{sms} pdl3 2 warps 4 stages", num_warps=2, num_stages=4)
    if tiles["block_n_up"] > 16:  # more, narrower up-projection tiles: fewer idle programs in phase A
        b(f"G{sms} pdl3 block_n_up 16", block_n_up=16)
    b(f"G{sms} pdl3 two launches (no barrier)", phases=(1, 2))
    return out


# ---------------------------------------------------------------- child: one group, on the GPU


def make_weights(shape: str, B: int, dev):
    import torch

    H, I, act, layer, L = SHAPES[shape]
    g = torch.Generator(device=dev).manual_seed(0)
    dt = torch.bfloat16

    def r(*s, scale=0.02):
        return (torch.randn(*s, generator=g, device=dev) * scale).to(dt)

    up_rows = 2 * I if act == "silu_mul" else I
    layers = []
    for _ in range(L):
        layers.append(dict(nw=r(H, scale=0.1) + 1, nb=r(H) if layer else None, wu=r(up_rows, H),
                           bu=r(up_rows) if layer else None, wd=r(H, I), bd=r(H) if layer else None))
    x = torch.randn(B, H, generator=g, device=dev).to(dt)
    return x, layers


def chain_fn(shape: str, cfg: dict, layers, tickets, sms: int):
    """h -> h after every layer's MLP block, in configuration `cfg`."""
    from overlapdecode.fused.kernels.linear_residual import linear_residual
    from overlapdecode.fused.kernels.norm_linear import NormSums, norm_linear
    from overlapdecode.fused.kernels.norm_mlp import norm_mlp

    act = SHAPES[shape][2]
    eps = 1e-5
    if cfg["kind"] == "a":
        up, down = baseline_tiles(shape)
        down = {"programs": 2 * sms, **down}
        sums = dict(norm_sums=NormSums()) if cfg.get("norm_sums") else {}

        def run(h):
            for w in layers:
                m = norm_linear(h, w["nw"], w["nb"], eps, w["wu"], w["bu"], act, pdl=cfg["pdl"], **up, **sums)
                h = linear_residual(m, w["wd"], w["bd"], h, tickets=tickets, pdl=cfg["pdl"], **down, **sums)
            return h
        return run
    kw = {k: cfg[k] for k in ("phases", "pdl", "grid_programs", "split", "prefetch_k", "cooperative", "block_n_up",
                              "block_k_up", "block_n_down", "block_k_down", "num_warps", "num_stages")}

    def run(h):
        for w in layers:
            h = norm_mlp(h, w["nw"], w["nb"], eps, w["wu"], w["bu"], act, w["wd"], w["bd"], tickets=tickets, **kw)
        return h
    return run


def time_config(shape: str, B: int, cfg: dict, x, layers, sms: int):
    """(us per MLP of each round, final h) of the chain captured in one CUDA graph."""
    import torch

    from overlapdecode.fused.kernels.linear_residual import Tickets

    tickets = Tickets(x.device)
    run = chain_fn(shape, cfg, layers, tickets, sms)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # compiles, off the capture
            run(x)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()  # host sync: warm-up done before capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        h = run(x)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()  # host sync: warm-up replays done
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(ROUNDS):
        start.record()
        for _ in range(REPS):
            g.replay()
        end.record()
        end.synchronize()  # host sync: timing boundary
        rounds.append(start.elapsed_time(end) * 1e3 / REPS / len(layers))
    if tickets.counters.any():  # host sync: a counter left non-zero would break the next launch
        raise RuntimeError(f"ticket/barrier counters not zero after the replays: {tickets.counters.nonzero()[:8]}")
    out = h.clone()
    del g
    return rounds, out


def child(shape: str, B: int, skip: set, ref_path: str) -> None:
    """Runs the group's configurations not in `skip`, printing one JSON line before and after each."""
    import torch

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    import triton

    print(json.dumps({"info": dict(device=torch.cuda.get_device_name(dev), torch=torch.__version__,
                                   triton=triton.__version__, sms=sms)}), flush=True)
    x, layers = make_weights(shape, B, dev)
    ref = torch.load(ref_path) if os.path.exists(ref_path) else None
    for cfg in configs(shape, B, sms):
        if cfg["name"] in skip:
            continue
        print(json.dumps({"start": cfg["name"]}), flush=True)
        row = dict(shape=shape, B=B, **{k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items()})
        try:
            rounds, out = time_config(shape, B, cfg, x, layers, sms)
            row.update(us_per_mlp=round(statistics.median(rounds), 3), rounds_us=[round(t, 3) for t in rounds])
            if ref is None and cfg["name"] == "a two kernels pdl3":
                torch.save(out.cpu(), ref_path)
                ref = out.cpu()
            if ref is not None:
                o = out.cpu()
                row.update(equal_to_a=bool(torch.equal(o, ref)),
                           max_abs_diff_to_a=float((o.float() - ref.float()).abs().max()),
                           finite=bool(torch.isfinite(o).all()))
        except Exception as e:  # recorded; the context may be unusable after a device error: a new child goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(json.dumps({"result": row}), flush=True)
            sys.exit(3)
        print(json.dumps({"result": row}), flush=True)
        del out
        torch.cuda.empty_cache()


# ---------------------------------------------------------------- parent: groups under timeouts


def run_group(shape: str, B: int, out_dir: str, timeout: float, deadline: float, info: dict,
              config_timeout: float = 90) -> list[dict]:
    """The group's rows: children under a timeout (the group's, and `config_timeout` per configuration,
    compiles included), each carrying on after what the one before finished or hung on."""
    import queue
    import threading

    rows: list[dict] = []
    done: set = set()
    ref_path = os.path.join(out_dir, f".ref-{shape}-b{B}.pt")
    if os.path.exists(ref_path):
        os.remove(ref_path)
    group_end = min(time.time() + timeout, deadline)
    for _ in range(8):  # at most 8 children per group
        if group_end - time.time() <= 5:
            rows.append(dict(shape=shape, B=B, error="time up before the group finished"))
            break
        cmd = [sys.executable, os.path.abspath(__file__), "--child", shape, str(B), ref_path, json.dumps(sorted(done))]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
        current, timed_out = None, False
        while True:
            wait = min(config_timeout, group_end - time.time())
            try:
                line = lines.get(timeout=max(wait, 0.1))
            except queue.Empty:
                proc.kill()  # the child, which we started: a deadlocked barrier dies with its context
                timed_out = True
                break
            if line is None:
                break
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "info" in msg:
                info.update(msg["info"])
            elif "start" in msg:
                current = msg["start"]
            else:
                rows.append(msg["result"])
                done.add(msg["result"]["name"])
                print(fmt(msg["result"]), flush=True)
                current = None
        proc.wait()
        stderr = proc.stderr.read()
        if current is not None:  # hung (timeout) or died inside a configuration
            why = "timeout (deadlock?)" if timed_out else f"child died: {stderr[-400:]}"
            rows.append(dict(shape=shape, B=B, name=current, error=why))
            done.add(current)
            print(fmt(rows[-1]), flush=True)
            continue
        if timed_out:
            rows.append(dict(shape=shape, B=B, error=f"timeout outside any configuration: {stderr[-400:]}"))
            break
        if proc.returncode == 0:
            break
        if proc.returncode != 3:  # failed outside any configuration (import, weights)
            rows.append(dict(shape=shape, B=B, error=f"child exit {proc.returncode}: {stderr[-600:]}"))
            break
    return rows


def fmt(row: dict) -> str:
    head = f"{row.get('shape', '')} B={row.get('B', '')} {row.get('name', ''):<44}"
    if "error" in row:
        return f"{head} ERROR {row['error'][:200]}"
    eq = {True: "bitwise = a", False: f"max|diff| {row.get('max_abs_diff_to_a', float('nan')):.3g}"}.get(
        row.get("equal_to_a"), "")
    return f"{head} {row['us_per_mlp']:8.2f} us/MLP  {eq}"


def table(rows: list[dict]) -> str:
    """us per MLP per group, with the ratio to the two kernels (PDL 3)."""
    lines = []
    for shape in SHAPES:
        for B in BATCHES:
            group = [r for r in rows if r.get("shape") == shape and r.get("B") == B]
            if not group:
                continue
            base = next((r.get("us_per_mlp") for r in group if r.get("name") == "a two kernels pdl3"), None)
            lines.append(f"--- {shape} batch {B}")
            for r in group:
                ratio = f"  x{r['us_per_mlp'] / base:.3f}" if base and "us_per_mlp" in r else ""
                lines.append(fmt(r) + ratio)
    return "\n".join(lines)


def main() -> None:
    argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        shape, B, ref_path, skip = argv[1], int(argv[2]), argv[3], set(json.loads(argv[4]))
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
        child(shape, B, skip, ref_path)
        return
    if not argv or argv[0].startswith("--"):
        sys.exit(__doc__)
    out_dir = argv[0]
    arg = lambda name, default: argv[argv.index(name) + 1] if name in argv else default  # noqa: E731
    budget, group_timeout, only = float(arg("--budget", 540)), float(arg("--group-timeout", 300)), arg("--only", "")
    config_timeout = float(arg("--config-timeout", 90))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    if "--dry-run" in argv:  # the configurations at an H200's 132 SMs; no GPU needed
        for shape in SHAPES:
            for B in BATCHES:
                for cfg in configs(shape, B, 132):
                    print(shape, B, json.dumps(cfg))
        return
    os.makedirs(out_dir, exist_ok=True)
    deadline = time.time() + budget
    res = dict(rounds=ROUNDS, reps=REPS, rows=[])  # the device, torch and Triton as the children report them
    path = os.path.join(out_dir, "norm_mlp_ab.json")
    for shape in SHAPES:
        for B in BATCHES:
            if only and only not in f"{shape} b{B}":
                continue
            res["rows"] += run_group(shape, B, out_dir, group_timeout, deadline, res, config_timeout)
            json.dump(res, open(path, "w"), indent=1)
    print(table(res["rows"]))
    print("wrote", path)


if __name__ == "__main__":
    main()
