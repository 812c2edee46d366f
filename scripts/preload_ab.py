"""Does loading each GEMV program's first weight tile before its `gdc_wait` (FusedModel(preload=True),
kernels/pdl.py) make the fused step faster? A/B on one GPU, bfloat16, PDL at its default (LATE), in one session:

- the step alone, replayed from one CUDA graph (scripts/kernel_sweep.py captured_step, 200 positions in), ms per
  step (triton.testing.do_bench median), per variant: none, all GEMVs, and at GPT-2 each GEMV kind alone;
  ROUNDS rounds, the variants alternating within each round;
- whether the variants' logits of one eager step are bitwise those without preload;
- `fused` through od.Decoder(fused_options=dict(preload=...)): ms per token of the decode steps alone
  ((a 208-token call - a 16-token call) / 192) and of a whole 200-token call (TTFT included, as the bench
  times it), median of CALL_ROUNDS alternating rounds after a first call that compiles. EOS off.

    python3 scripts/preload_ab.py OUT.json [--models gpt2-random:1,llama-1b-random:1,llama-1b-random:8]
"""

from __future__ import annotations

import functools
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
KINDS = ("norm_qkv", "linear_residual", "norm_linear")


def only(kind: str):
    """An edit_ops for captured_step: preload in `kind`'s launches alone."""
    def edit(ops):
        return ops._replace(**{kind: functools.partial(getattr(ops, kind), preload=True)})  # overrides the False
    return edit


def step_logits(model, B: int, preload: bool) -> torch.Tensor:
    """One eager step's logits from a cache filled by a seeded generator (the same for every variant)."""
    from overlapdecode.fused.model import FusedModel

    fm = FusedModel(model, preload=preload, compile_prefill=False)
    cache = fm.cache_for(B, 300)
    g = torch.Generator(device="cuda").manual_seed(0)
    for t in cache.k + cache.v:
        t.copy_(torch.randn(t.shape, generator=g, device="cuda", dtype=torch.float32).to(t.dtype))
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
        off = step_logits(model, B, False)
        on = step_logits(model, B, True)
        r["logits bitwise equal"] = bool(torch.equal(on, off))
        r["logits max abs diff"] = float((on - off).abs().max())
        variants = {"none": dict(preload=False), "all": dict(preload=True)}
        if name.startswith("gpt2"):
            for kind in KINDS:
                variants[f"{kind} only"] = dict(preload=False, edit_ops=only(kind))
        graphs = {v: captured_step(model, B, **kw) for v, kw in variants.items()}
        times: dict = {v: [] for v in variants}
        for _ in range(ROUNDS):
            for v, (g, _keep) in graphs.items():
                times[v].append(triton.testing.do_bench(g.replay, rep=200, return_mode="median"))
        r["graph step ms (median of rounds)"] = {v: round(statistics.median(t), 4) for v, t in times.items()}
        r["graph step ms (rounds)"] = {v: [round(x, 4) for x in t] for v, t in times.items()}
        del graphs
        ids = torch.randint(0, 1000, (B, 32), device="cuda")
        decs = {p: od.Decoder(model, fused_options=dict(preload=p)) for p in (False, True)}
        calls = {p: {16: [], 208: [], 200: []} for p in decs}
        for p, dec in decs.items():
            for n in (16, 208, 200):
                call_ms(dec, ids, n)  # compiles, captures
        for _ in range(CALL_ROUNDS):
            for p, dec in decs.items():
                for n in (16, 208, 200):
                    calls[p][n].append(call_ms(dec, ids, n))
        for p in decs:
            c = {n: statistics.median(t) for n, t in calls[p].items()}
            key = "preload" if p else "no preload"
            r[f"{key}: decode ms/token"] = round((c[208] - c[16]) / 192, 4)
            r[f"{key}: 200-token call ms/token"] = round(c[200] / 200, 4)
        print(name, B, json.dumps(r), flush=True)
        del decs, model
        torch.cuda.empty_cache()
        json.dump(res, open(out, "w"), indent=1)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--models"):
        raise SystemExit("usage: python3 scripts/preload_ab.py OUT.json [--models NAME:BATCH,...]")
    spec = args[2] if len(args) == 3 else "gpt2-random:1,llama-1b-random:1,llama-1b-random:8"
    try:
        cases = [(n, int(b)) for n, b in (c.split(":") for c in spec.split(","))]
    except ValueError:
        raise SystemExit(f"--models takes NAME:BATCH,... (got {spec!r})") from None
    main(args[0], cases)
