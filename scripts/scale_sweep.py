"""Decode over batch rows and prompt lengths, fused against interleaved, in one process (bench/scale.py computes
the figures): ms/step, tok/s, MBU and the per-layer toll with the KV bytes each step reads, kernels per step.

    python3 scripts/scale_sweep.py --out DIR [--model llama-1b-random] [--dtype bfloat16]
        [--rows 1,16,32,64,128] [--prompts 32] [--long-rows 1,8] [--long-prompts 4096,8192,16384]
        [--strategies fused,interleaved] [--new-tokens 64] [--long-new-tokens 32] [--repeats 3]
        [--time-budget 120] [--no-kernels] [--prenorm rule|never|always] [--rope-table rule|never]
        [--variants rule,dense:qkv+o,...] [--rounds 1] [--quantize int4|int8|fp8 [--group-size 128]]

It made the step figures of docs/KERNELS.md over rows and prompt lengths; each results/h200 folder's README gives
its exact command, e.g. (results/h200/llama-1b-scale-paired, "Swapped tiles from 17 rows on"):

    python3 scripts/scale_sweep.py --out results/h200/llama-1b-scale-paired --model llama-1b-random \
        --dtype bfloat16 --rows 1,16,32,64,128 --prompts 32 --long-rows 1,8 --long-prompts 4096,16384 \
        --strategies fused --new-tokens 32 --long-new-tokens 16 --repeats 3 --time-budget 100

Points run short prompts first, every strategy at a point before the next; past --time-budget seconds (from the
start, the model's load included) no new point starts and the rest are listed as not run. The fused prefill runs
eagerly (compiled, it would compile per batch and prompt bucket; the decode figures do not need it): its TTFT is
the eager prefill's. DIR gets scale.json, scale.md (the table) and, unless --no-kernels, one profiler trace per
point (traces/). A point that runs out of memory is recorded as such. On CPU it runs too (no bandwidth, hence no
MBU or toll; no kernel counts): `--model tiny-llama --dtype float32`. `--prenorm never` / `always`: the swapped launches
normalise their rows in registers / by one launch beforehand at every row count (swap_ab.use_prenorm's rule
replaced), to measure that rule; `--rope-table never`: every QKV launch computes RoPE's sin and cos itself
(forward.step_rope_tables replaced by no tables), to measure the step's rotary table. `--quantize`: the weights
quantized at load (od.load_model's `quantize`, int4 in groups of --group-size), MBU and toll over the packed bytes.

`--variants`: an A/B in one process: at each point `fused` runs once per variant (each with its own Decoder, so
its own CUDA graphs), the variants in the order given, `--rounds` times over. A variant is `rule` (the code as it
is) or one rule replaced: `dense:none` / `dense:qkv+o+down` (any of qkv, o, down: those projections in dense form
from 17 rows, kernels/dense.py, the others not), `rope-table:never`, `prenorm:never` / `prenorm:always`,
`two-per-sm:off` (swap_ab.swap_tiles's pipelines as deep as one program per SM allows), `residual-norm:off` (the
dense O and down epilogues leave the next norm to its own launch, residual_norm.ENABLED), `dense-pieces:off`
(every dense product over the whole of K, dense.pieces_for), `attention-direct:off` (64 keys on 4 warps at many
rows too, decode_attention.direct_tiles); and a FusedModel option: `pdl:off` (no programmatic dependent launch,
kernels/pdl.py). Each row of the table names its variant.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

import overlapdecode as od
from overlapdecode.bench import scale
from overlapdecode.bench.worker import device_bandwidth_gbs
from overlapdecode.facts import step_weight_bytes, weight_bytes


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive ints, got {text!r}")
    return values


DENSE_KINDS = ("qkv", "o", "down")
# variants that are FusedModel options rather than a rule replaced
OPTION_VARIANTS = {
    "pdl:off": dict(pdl=False),
}


def _variants(text: str) -> list[str]:
    names = [v for v in text.split(",") if v]
    for v in names:
        key, _, value = v.partition(":")
        ok = (
            v == "rule"
            or (key == "dense" and (value == "none" or set(value.split("+")) <= set(DENSE_KINDS)))
            or (key == "rope-table" and value == "never")
            or (key == "prenorm" and value in ("never", "always"))
            or (key in ("two-per-sm", "residual-norm", "dense-pieces", "attention-direct") and value == "off")
            or v in OPTION_VARIANTS
        )
        if not ok:
            raise argparse.ArgumentTypeError(
                f"unknown variant {v!r}: rule, dense:none, dense:<qkv+o+down>, rope-table:never, prenorm:never|always, "
                "two-per-sm:off, residual-norm:off, dense-pieces:off, attention-direct:off, pdl:off"
            )
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct comma-separated variants, got {text!r}")
    return names


def _dense_shapes(model, kinds) -> set:
    """The (N, K) weight shapes of the projections `kinds` name, from the model's config."""
    cfg = model.config
    H, hq = cfg.hidden_size, cfg.num_attention_heads
    hkv = getattr(cfg, "num_key_value_heads", None) or hq
    d = getattr(cfg, "head_dim", None) or H // hq
    inter = getattr(cfg, "intermediate_size", None) or 4 * H
    shapes = dict(qkv=((hq + 2 * hkv) * d, H), o=(H, hq * d), down=(H, inter))
    return {shapes[k] for k in kinds}


@contextlib.contextmanager
def _patched(variant: str | None, model):
    """The rule a variant replaces, replaced where the step reads it, for the duration (None or rule: nothing)."""
    from overlapdecode.fused import forward
    from overlapdecode.fused.kernels import decode_attention, dense, norm_prologue, residual_norm, swap_ab

    key, _, value = (variant or "rule").partition(":")
    if key == "dense":
        shapes = set() if value == "none" else _dense_shapes(model, value.split("+"))

        def rule(rows, n_out, K, forced=None, swap=None):
            if forced is not None:
                return bool(forced)
            return swap is None and rows > 16 and (n_out, K) in shapes

        target, name, new = dense, "use_dense", rule
    elif key == "rope-table":
        target, name, new = forward, "step_rope_tables", lambda *a, **k: {}
    elif key == "prenorm":
        target, name, new = norm_prologue, "use_prenorm", lambda rows, packed=False: value == "always"
    elif key == "two-per-sm":
        target, name, new = swap_ab, "TWO_PER_SM", False
    elif key == "residual-norm":  # every launch is linear_residual's
        target, name, new = residual_norm, "ENABLED", False
    elif key == "dense-pieces":
        target, name, new = dense, "pieces_for", lambda n_out, K, sms: 1
    elif key == "attention-direct":
        target, name, new = decode_attention, "direct_tiles", lambda *shape: None
    else:
        yield
        return
    old = getattr(target, name)
    setattr(target, name, new)
    try:
        yield
    finally:
        setattr(target, name, old)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-1b-random")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=_ints, default=[1, 16, 32, 64, 128])
    ap.add_argument("--prompts", type=_ints, default=[32])
    ap.add_argument("--long-rows", type=_ints, default=[1, 8])
    ap.add_argument("--long-prompts", type=_ints, default=[4096, 8192, 16384])
    ap.add_argument("--strategies", default="fused,interleaved")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--long-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=120.0)
    ap.add_argument("--no-kernels", action="store_true", help="no profiler trace per point (no kernels/step)")
    ap.add_argument("--prenorm", choices=("rule", "never", "always"), default="rule", help="default: %(default)s")
    ap.add_argument("--rope-table", choices=("rule", "never"), default="rule", help="default: %(default)s")
    ap.add_argument("--variants", type=_variants, default=None, help="an A/B of rules in one process (see above)")
    ap.add_argument("--rounds", type=int, default=1, help="passes over --variants at each point")
    ap.add_argument("--quantize", choices=("int4", "int8", "fp8"), help="the weights quantized at load")
    ap.add_argument("--group-size", type=int, default=128, help="int4's group (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.variants and not args.no_kernels:
        ap.error("--variants needs --no-kernels (one profiler trace per point and strategy)")
    if args.new_tokens < 2 or args.long_new_tokens < 2:
        ap.error("--new-tokens and --long-new-tokens must be >= 2 (decode time = call of N - call of 1)")
    if os.path.exists(os.path.join(args.out, "scale.json")):
        ap.error(f"--out {args.out} already holds a sweep (scale.json); choose another directory")
    strategies = [s for s in args.strategies.split(",") if s]
    if args.prenorm != "rule":  # the one place that decides it (norm_prologue.swapped_operand) reads this name
        from overlapdecode.fused.kernels import norm_prologue

        norm_prologue.use_prenorm = lambda rows, packed=False: args.prenorm == "always"
    if args.rope_table == "never":  # the one place that decides it (forward.decode_step) reads this name
        from overlapdecode.fused import forward

        forward.step_rope_tables = lambda *a, **k: {}
    os.makedirs(args.out, exist_ok=True)
    traces = None if args.no_kernels else os.path.join(args.out, "traces")
    if traces:
        os.makedirs(traces, exist_ok=True)

    start = time.monotonic()
    model = od.load_model(args.model, dtype=args.dtype, quantize=args.quantize, group_size=args.group_size)
    device = next(model.parameters()).device
    bandwidth = device_bandwidth_gbs(device)
    wbytes = weight_bytes(model)  # the whole model's; a point's figures count the experts its rows can reach

    # the fused prefill runs eagerly: compiled it would compile once per batch and prompt bucket (tens of seconds
    # each on a 1B model), which the decode figures do not need; TTFT is then the eager prefill's
    def new_decoder(variant=None):
        return od.Decoder(model, fused_options=dict(compile_prefill=False, **OPTION_VARIANTS.get(variant, {})))

    variants = args.variants or [None]
    decoders = {}
    for v in variants:
        with _patched(v, model):
            decoders[v] = new_decoder(v)
    todo = scale.points(args.rows, args.prompts, args.long_rows, args.long_prompts, strategies)
    result = dict(
        config=dict(vars(args), strategies=strategies),
        bandwidth_gbs=bandwidth,
        weight_bytes=wbytes,
        device=str(device),
        rows=[],
        not_run=[],
    )
    for i, (name, rows, prompt_len) in enumerate(todo):
        if time.monotonic() - start > args.time_budget:
            result["not_run"] = [list(p) for p in todo[i:]]
            break
        n = args.new_tokens if prompt_len in args.prompts else args.long_new_tokens
        step_bytes = step_weight_bytes(model, rows)  # a mixture of experts' step reads only min(E, rows x k) experts
        runs = [(r, v) for r in range(args.rounds) for v in variants] if name == "fused" else [(0, None)]
        for round_, v in runs:
            key = v if name == "fused" else variants[0]  # the other strategies share the first variant's Decoder
            try:
                with _patched(v, model):
                    row = scale.measure_point(
                        decoders[key], model, name, rows, prompt_len, n, args.repeats, bandwidth, step_bytes, traces
                    )
            except torch.OutOfMemoryError:
                row = dict(strategy=name, rows=rows, prompt_len=prompt_len, error="out of memory")
                with _patched(key, model):
                    decoders[key] = new_decoder(key)  # drop the kept caches and graphs
                torch.cuda.empty_cache()
            if v is not None:
                row.update(variant=v, round=round_)
            result["rows"].append(row)
            scale.write(args.out, result)
            print(scale.markdown(result).splitlines()[-1], flush=True)
    scale.write(args.out, result)
    print(scale.markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
