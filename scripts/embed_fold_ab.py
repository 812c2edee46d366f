"""Does folding the step's embedding into layer 0's QKV launch (kernels/norm_qkv.py embed_norm_qkv, StepOps.embed_qkv)
make the fused step faster? A/B on one GPU, bfloat16, in one session, per case:
- the step alone replayed from one CUDA graph (kernel_sweep.captured_step; without the fold: StepOps.embed_qkv None,
  the embedding kernel then norm_qkv), do_bench median, ROUNDS rounds alternating;
- whether one eager step's logits are bitwise the same;
- the decode loop through od.Decoder ((208 - 16) / 192 tokens) and a 200-token call, median of CALL_ROUNDS
  alternating rounds, EOS off.

    python3 scripts/embed_fold_ab.py OUT.json [--models gpt2-random:1,llama-1b-random:1]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch
import triton.testing

import overlapdecode as od
from kernel_sweep import captured_step  # scripts/ is on the path when run as a script

ROUNDS = 3
CALL_ROUNDS = 5


def unfold(ops):
    return ops._replace(embed_qkv=None)


def step_logits(model, B: int, fold: bool) -> torch.Tensor:
    from overlapdecode.fused.model import FusedModel

    fm = FusedModel(model, compile_prefill=False)
    if not fold:
        fm.ops = unfold(fm.ops)
    cache = fm.cache_for(B, 300)
    g = torch.Generator(device="cuda").manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda").to(t.dtype))
    cache.pad.zero_()
    ids = torch.randint(0, 1000, (B, 1), device="cuda", generator=g)
    pos = torch.full((B, 1), 200, device="cuda")
    with torch.no_grad():
        return fm(input_ids=ids, position_ids=pos, past_key_values=cache).logits.clone()


def call_ms(dec, ids, n: int) -> float:
    torch.cuda.synchronize()  # host sync: timing boundary
    t = time.perf_counter()
    dec.generate(ids, max_new_tokens=n, eos_token_id=[], strategy="fused")
    torch.cuda.synchronize()  # host sync: the call's end, as the bench times it
    return (time.perf_counter() - t) * 1e3


def main(out: str, cases: list) -> None:
    if os.path.exists(out):
        raise SystemExit(f"{out} exists: choose a new path (no run overwrites an earlier one)")
    res = {"device": torch.cuda.get_device_name(), "commit": os.environ.get("OVERLAPDECODE_COMMIT", "unknown")}
    for name, B in cases:
        model = od.load_model(name, dtype="bfloat16", device="cuda")
        r = res[f"{name} b{B}"] = {}
        r["logits bitwise equal"] = bool(torch.equal(step_logits(model, B, True), step_logits(model, B, False)))
        graphs = {"fold": captured_step(model, B), "no fold": captured_step(model, B, edit_ops=unfold)}
        times: dict = {v: [] for v in graphs}
        for _ in range(ROUNDS):
            for v, (g, _keep) in graphs.items():
                times[v].append(triton.testing.do_bench(g.replay, rep=200, return_mode="median"))
        r["graph step ms (median of rounds)"] = {v: round(statistics.median(t), 4) for v, t in times.items()}
        r["graph step ms (rounds)"] = {v: [round(x, 4) for x in t] for v, t in times.items()}
        del graphs
        ids = torch.randint(0, 1000, (B, 32), device="cuda")
        decs = {}
        for v in ("fold", "no fold"):
            dec = od.Decoder(model)
            if v == "no fold":  # before the first call captures the step
                dec.fused_model().ops = unfold(dec.fused_model().ops)
            decs[v] = dec
        calls = {v: {16: [], 208: [], 200: []} for v in decs}
        for dec in decs.values():
            for n in (16, 208, 200):
                call_ms(dec, ids, n)  # compiles, captures
        for _ in range(CALL_ROUNDS):
            for v, dec in decs.items():
                for n in (16, 208, 200):
                    calls[v][n].append(call_ms(dec, ids, n))
        for v in decs:
            c = {n: statistics.median(t) for n, t in calls[v].items()}
            r[f"{v}: decode ms/token"] = round((c[208] - c[16]) / 192, 4)
            r[f"{v}: 200-token call ms/token"] = round(c[200] / 200, 4)
        print(name, B, json.dumps(r), flush=True)
        del decs, model
        torch.cuda.empty_cache()
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--models"):
        raise SystemExit("usage: python3 scripts/embed_fold_ab.py OUT.json [--models NAME:BATCH,...]")
    spec = args[2] if len(args) == 3 else "gpt2-random:1,llama-1b-random:1"
    try:
        cases = [(n, int(b)) for n, b in (c.split(":") for c in spec.split(","))]
    except ValueError:
        raise SystemExit(f"--models takes NAME:BATCH,... (got {spec!r})") from None
    main(args[0], cases)
