"""One benchmark process: one allocator setting, every dtype, batch, workload, length and strategy asked of it.

The allocator setting (PYTORCH_ALLOC_CONF) is process-wide and read when CUDA starts, so the runner starts
one of these per setting with the variable already in its environment. Rows go to a JSON-lines file as
they are measured; progress lines go to stdout for the runner's progress bar.

Per configuration: a first call (compile and CUDA-graph recording included, reported as `first_call_s`),
`warmup` more calls, then `repeats` timed calls (host clock around a synchronised call; the median is the
figure; the last one starts from an emptied allocator cache and gives the allocator figures), then
`repeats` timed one-token calls for time to first token. From those two medians, the decode ms/step with the
prefill excluded = (call - TTFT) / (new tokens - 1), and the per-layer toll = (that - weight bytes / the measured
bandwidth) / layers (figures.step_toll). The GPU busy fraction and kernels per step come from one profiled call
per strategy at the shortest length (timeline.analyze), after the fixed workload's timed rows of that dtype, so
that no profiler has run before them; results.json gives that count to the fixed row of the same shape
(results.with_kernel_counts). With speculation (speculative.py), after the fixed rows of a dtype: a verify row per
strategy that speculates (its verify step's cost), then a speculative row per strategy, draft and K, timed as any
row, with its rounds' figures and its speed-up over the fixed row of the same strategy measured just before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import transformers

import overlapdecode as od

from ..facts import model_facts, step_weight_bytes
from ..inputs import model_limits
from . import memory, timeline
from .config import BenchConfig, config_from_json, plan
from .oracle import oracle_acceptance, oracle_draft
from .peers import PEERS, peer_compiles, run_peer
from .report.figures import step_toll
from .report.results import environment
from .speculative import generate_kwargs as speculation_kwargs
from .speculative import (
    greedy_successor,
    load_draft,
    looping_prompt,
    round_figures,
    speed_up,
    verify_row,
)
from .variants import generate_kwargs, split_variant
from .workloads import ForcedEOS, eos_steps, prompt


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: timing boundary, outside the measured region's steps


def _timed(fn, device):
    """(seconds, result) of one synchronised call."""
    _sync(device)
    t = time.perf_counter()
    result = fn()
    _sync(device)
    return time.perf_counter() - t, result


def device_bandwidth_gbs(device, nbytes: int = 1 << 31, repeats: int = 10) -> float | None:
    """The device's memory bandwidth in GB/s, from a device-to-device copy (bytes read + written / time,
    median of `repeats`): the ceiling that MBU is measured against. None without CUDA."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()  # host sync: timing boundary
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e9


def _runner(name, model, ids, max_new, eos, pad, seed: int = 0, spec: dict | None = None):
    """The call that a row of strategy or peer `name` times; `spec`: od.generate's speculation arguments."""
    if name in PEERS:
        return lambda n=max_new: run_peer(name, model, ids, torch.ones_like(ids), n, eos, pad)
    base, _ = split_variant(name)  # a sampled variant: NAME+key=value (variants.py)
    sampling = generate_kwargs(name, seed)
    mask = torch.ones_like(ids)  # unpadded rows, said so: a mask is never inferred from the pad id in random ids
    return lambda n=max_new: od.generate(
        model,
        ids,
        attention_mask=mask,
        max_new_tokens=n,
        strategy=base,
        eos_token_id=eos,
        pad_token_id=pad,
        **sampling,
        **(spec or {}),
    )


def _row_draft(
    cfg: BenchConfig, name: str, model, draft, ids, n: int, eos_id: int, made: dict, key: tuple, spec_kind: str, k: int
) -> tuple:
    """(draft, fits) of a speculative row on the prompt `ids`: the run's (`draft`, fits None), or for a draft model's
    row under `--assistant oracle[:A]` one made for this prompt from the model's own greedy tokens (`name`'s preset
    without its sampling variant; no EOS, as the row runs), a share A of its drafts accepted by construction
    (oracle.oracle_draft). The tokens it learns are those of the speculative call itself, fitted to a fixed
    point (_oracle_fit; fits: the calls that took): in bfloat16 a K + 1-token verify step rounds otherwise than the
    one-token step, and on random weights, whose top logits lie close, that flips a greedy token within a few steps,
    after which a draft of the call without speculation predicts nothing. Kept in `made` under `key` (the
    configuration, which prompt and K) for the rows after it, so that its fused steps are compiled and captured
    once. A prompt-lookup row drafts nothing: it gets the run's `draft` as it is."""
    acceptance = oracle_acceptance(cfg.assistant)
    if acceptance is None or not spec_kind.startswith("assistant"):
        return draft, None
    if key not in made:
        plain = split_variant(name)[0]
        out = _runner(plain, model, ids, n, [], eos_id, cfg.seed)()
        for old, _ in made.values():  # one at a time: an earlier configuration's draft and its fused caches go
            od.decoder_for(old).clear()
        made.clear()
        made[key] = _oracle_fit(
            lambda d: _runner(plain, model, ids, n, [], eos_id, cfg.seed, speculation_kwargs(spec_kind, k, d))(),
            lambda out: oracle_draft(model, ids, out, acceptance, cfg.seed + 1, body=draft),
            out,
        )
    return made[key]


ORACLE_FITS = 24  # at most this many speculative calls to reach the fixed point (a few suffice: tests/bench)


def _oracle_fit(speculate, fit, out: torch.Tensor, limit: int = ORACLE_FITS, drop=None) -> tuple:
    """(draft, fits): the draft `fit` makes from the tokens `out` (the call without speculation), refitted to the
    tokens the speculative call `speculate` gives with it until they are the tokens it learned, at most `limit`
    times. Each fit keeps every token before the first that changed, and the call with the new draft then runs the
    same rounds up to one token further at least (the token the target chose where the old draft was refused), so
    the tokens that agree grow by a token or more a fit; fits: the speculative calls made, `limit` + 1 if the
    tokens never settled (the row's measured acceptance then says how far they are). `drop(draft)` frees a draft
    that is refitted (default: its fused caches)."""
    drop = drop or (lambda d: od.decoder_for(d).clear())
    draft = fit(out)
    for fits in range(1, limit + 1):
        got = speculate(draft)
        if torch.equal(got, out):
            return draft, fits
        drop(draft)
        out, draft = got, fit(got)
    return draft, limit + 1


def _compiles(name: str, device) -> bool:
    """Whether the strategy or peer `name` runs compiled on `device` (Hugging Face compiles on CUDA only)."""
    return peer_compiles(name, device) if name in PEERS else od.resolve_strategy(split_variant(name)[0]).compile


def _busy(fn, device) -> dict:
    """Profile one call; the decode-loop summary (busy fraction etc.), or why it is unavailable."""
    if device.type != "cuda":
        return dict(available=False, reason="no CUDA: busy fraction unavailable")
    with tempfile.TemporaryDirectory() as tmp:
        return timeline.analyze(timeline.trace_call(fn, device, os.path.join(tmp, "trace.json")))


def measure(cfg: BenchConfig, name, model, ids, max_new, eos, pad, device, spec: dict | None = None) -> dict:
    """A timed row's figures; with `spec` (od.generate's speculation arguments) also those of the last timed
    call's rounds (speculative.round_figures)."""
    run = _runner(name, model, ids, max_new, eos, pad, cfg.seed, spec)
    first, _ = _timed(run, device)
    for _ in range(cfg.warmup):
        _timed(run, device)
    times = []
    for i in range(cfg.repeats):
        # the allocator figures come from the last repeat, which starts from an emptied cache
        before = memory.start(device) if i == cfg.repeats - 1 else None
        seconds, out = _timed(run, device)
        times.append(seconds)
    rounds = round_figures(od.decoder_for(model).last_speculation) if spec else {}
    mem = memory.stop(device, before)
    run(1)  # warm the one-token path (a new cache shape)
    ttft = [_timed(lambda: run(1), device)[0] for _ in range(cfg.repeats)]
    B, P = ids.shape
    n_new = out.shape[1] - P
    med = statistics.median(times)
    return dict(
        strategy=name,
        kind="peer" if name in PEERS else "overlapdecode",
        compiled=_compiles(name, device),
        new_tokens=n_new,
        seq_s=med,
        seq_s_all=times,
        ms_per_token=med * 1e3 / n_new,
        tokens_per_s=B * n_new / med,
        ttft_ms=statistics.median(ttft) * 1e3,
        first_call_s=first,
        **mem,
        **rounds,
    )


def _first_eos(model, vocab: int) -> int:
    """The model's first EOS id (generation config, then config, as Hugging Face reads it), else the last id."""
    eos = model.generation_config.eos_token_id
    if eos is None:
        eos = getattr(model.config.get_text_config(decoder=True), "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return vocab - 1 if eos is None else int(eos)


def run_worker(cfg: BenchConfig, out_path: str) -> None:
    device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if cfg.tp > 1 and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))  # where load_model puts the shard
    allocator = memory.allocator_setting()
    combos, rows = plan(cfg)
    print(f"PLAN {len(rows)}", flush=True)
    model = forced = model_dtype = draft = None
    plain = {}  # (dtype, batch, length, strategy) -> the fixed row: what a speculative row's speed-up divides
    loops = {}  # (dtype, batch, length, strategy, K) -> a looping prompt, how it was found, its row without speculation
    oracles = {}  # the oracle draft and its fits of the current configuration, prompt and K (_row_draft)
    started = time.perf_counter()
    with open(out_path, "a") as sink:
        meta = dict(
            environment(),
            allocator=allocator,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            cpus=",".join(map(str, sorted(os.sched_getaffinity(0)))) if os.environ.get("OVERLAPDECODE_CPUS") else None,
        )  # the cores this process really runs on
        sink.write(json.dumps(dict(meta=meta)) + "\n")  # kept if interrupted
        bandwidth = device_bandwidth_gbs(device)  # once per worker, before any model is on the device
        for i, (dtype, batch, workload, n, name) in enumerate(rows):
            spec_kind = k = fits = None
            if workload == "speculative":  # (strategy, kind, K): bench/config.py speculative_names
                name, spec_kind, k = name
            base = dict(
                model=cfg.model,
                tp=cfg.tp,
                device=str(device),
                allocator=allocator,
                dtype=dtype,
                batch=batch,
                prompt_len=cfg.prompt_len,
                max_new_tokens=n,
                workload=workload,
                visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                transformers=transformers.__version__,  # the version the Hugging Face peers ran
                bandwidth_gbs=bandwidth,
                quantize=cfg.quantize,
                group_size=cfg.group_size if cfg.quantize == "int4" else None,
            )
            if spec_kind is not None:
                kind = "prompt_lookup" if spec_kind.startswith("prompt_lookup") else "assistant"
                base.update(speculation=kind, k=k, assistant=cfg.assistant if kind == "assistant" else None)
                if kind == "prompt_lookup" or spec_kind == "assistant_loop":  # which prompt (ROW_IDENTITY)
                    base.update(lookup_prompt="loop" if spec_kind.endswith("_loop") else "random")
            if cfg.time_budget_s is not None and time.perf_counter() - started > cfg.time_budget_s:
                row = dict(base, strategy=name, error=f"not run: time budget of {cfg.time_budget_s:.0f} s spent")
                sink.write(json.dumps(row) + "\n")
                continue
            if model is None or model_dtype != dtype:
                if model is not None:
                    od.decoder_for(model).clear()
                model = forced = draft = None
                model = od.load_model(
                    cfg.model,
                    dtype=dtype,
                    device=device,
                    seed=cfg.seed,
                    tp=cfg.tp,
                    quantize=cfg.quantize,
                    group_size=cfg.group_size,
                )
                model_dtype = dtype
            if draft is None and cfg.assistant and workload in ("verify", "speculative"):  # once per dtype
                draft = load_draft(
                    cfg.assistant, cfg.model, model, dtype, device, cfg.seed, cfg.quantize, cfg.group_size
                )
            vocab = model.config.get_text_config().vocab_size
            eos_id = _first_eos(model, vocab)
            ids = prompt(batch, cfg.prompt_len, vocab, device, cfg.seed)
            shown = name if spec_kind is None else f"{name} {spec_kind} K={k}"
            print(f"STEP {i} {dtype} b{batch} {workload} n{n} {shown}", flush=True)
            try:
                if workload == "verify":
                    row = dict(base, **verify_row(cfg, name, model, draft, batch, vocab, device))
                elif workload == "speculative" and spec_kind.endswith("_loop"):
                    # the prompt: the row's own greedy tokens into their loop; its time without speculation measured
                    # on the same prompt, since the fixed rows' prompt is another; both kept for the rows after it
                    # of the same configuration (prompt lookup's and the draft model's, at each K)
                    key = (dtype, batch, n, name, k)
                    if key not in loops:
                        plain_name = split_variant(name)[0]
                        looped, how = looping_prompt(
                            lambda x, m: _runner(plain_name, model, x, m, [], eos_id, cfg.seed)(),
                            ids,
                            n,
                            k,
                            model_limits(model)[1],
                            greedy_successor(model),
                            vocab,
                        )
                        loops[key] = looped, how, measure(cfg, name, model, looped, n, [], eos_id, device)
                    looped, how, without = loops[key]
                    row_draft, fits = _row_draft(
                        cfg, name, model, draft, looped, n, eos_id, oracles, (*key, "loop"), spec_kind, k
                    )
                    spec = speculation_kwargs(spec_kind, k, row_draft)
                    row = dict(base, **measure(cfg, name, model, looped, n, [], eos_id, device, spec))
                    row.update(speed_up(without, row), prompt_len=looped.shape[1], plain_seq_s_all=without["seq_s_all"])
                    row["loop_found"] = how
                elif workload == "speculative":
                    row_draft, fits = _row_draft(
                        cfg, name, model, draft, ids, n, eos_id, oracles, (dtype, batch, n, name, k), spec_kind, k
                    )
                    spec = speculation_kwargs(spec_kind, k, row_draft)
                    row = dict(base, **measure(cfg, name, model, ids, n, [], eos_id, device, spec))
                    row.update(speed_up(plain.get((dtype, batch, n, name)), row))
                elif workload == "profile":
                    run = _runner(name, model, ids, n, [], eos_id, cfg.seed)
                    run()  # same shape as the sweep's shortest length: compiled already
                    row = dict(base, strategy=name, busy=_busy(run, device), compiled=_compiles(name, device))
                elif workload == "eos":
                    if forced is None:  # registered once, kept: see plan()
                        forced = ForcedEOS(model, eos_id, max(b for _, b in combos), device).__enter__()
                    forced.set_steps(eos_steps(batch, n), [cfg.prompt_len] * batch)
                    row = dict(
                        base,
                        **measure(cfg, name, model, ids, n, [eos_id], eos_id, device),
                        eos_steps=eos_steps(batch, n),
                    )
                else:
                    row = dict(base, **measure(cfg, name, model, ids, n, [], eos_id, device))
                    plain[(dtype, batch, n, name)] = row
                if fits is not None:  # the speculative calls the oracle draft took to settle
                    row["oracle_fits"] = fits
                row["weight_bytes"] = step_weight_bytes(model, batch)  # the experts this batch can reach
                if "seq_s" in row:  # a timed row: its decode ms/step and per-layer toll beside MBU
                    row.update(step_toll(row, model_facts(model).layers or None))
            except torch.cuda.OutOfMemoryError as err:  # a figure we could not get is recorded as such
                if cfg.tp > 1:
                    # one rank's out-of-memory: its peers may be inside this row's collectives, and a rank that went
                    # on to the next row would leave them waiting for ever; only ending every rank is safe
                    raise
                row = dict(base, strategy=name, error=f"out of memory: {err}".splitlines()[0])
            except ValueError as err:  # a model the round loop refuses (spec/options.py): recorded, the run goes on
                if spec_kind is None and workload != "verify":
                    raise
                row = dict(base, strategy=name, error=f"not run: {err}")
            sink.write(json.dumps(row) + "\n")
            sink.flush()
    print("DONE", flush=True)


def main(argv=None) -> int:
    if os.environ.get("OVERLAPDECODE_CPUS"):  # this GPU's share of the host's cores (runner.cpu_shares)
        os.sched_setaffinity(0, {int(c) for c in os.environ["OVERLAPDECODE_CPUS"].split(",")})
    ap = argparse.ArgumentParser(description="one benchmark process (started by `overlapdecode bench`)")
    ap.add_argument("--config", required=True, help="BenchConfig as JSON")
    ap.add_argument("--out", required=True, help="JSON-lines file to append rows to")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = config_from_json(f.read())
    run_worker(cfg, args.out)
    if cfg.tp > 1:
        # destroy_process_group() has hung at exit under torchrun with NCCL: after a barrier (no rank still
        # needs the group) leave without tearing it down; the rows file is closed and stdout flushed
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
