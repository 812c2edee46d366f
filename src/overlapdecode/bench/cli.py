"""The `bench`, `profile` and `report` subcommands: flags -> BenchConfig fields, checked before any work."""

from __future__ import annotations

import shlex

from ..cli import CliError, _ints, _names


def add_commands(sub) -> None:
    b = sub.add_parser("bench", help="measure every strategy and Hugging Face generate() side by side")
    b.add_argument("--model", default=None, help="default: gpt2-random on CUDA, tiny-gpt2 on CPU")
    b.add_argument("--strategies", default="baseline,kv,static,compiled,interleaved",
                   help="presets or variants (deferred, nocheck), comma-separated")
    b.add_argument("--peers", default="hf-dynamic,hf-static,hf-compiled", help="Hugging Face peers, or 'none'")
    b.add_argument("--lengths", default=None, help="new tokens per sequence (default: 64,96 CUDA; 16,48 CPU)")
    b.add_argument("--batch", default="1")
    b.add_argument("--dtype-batch", default=None,
                   help="dtype:batch pairs instead of every dtype x batch, e.g. float32:1,bfloat16:8")
    b.add_argument("--dtype", default="float32", help="comma-separated: float32,bfloat16,float16")
    b.add_argument("--allocator", default="default", help="default,expandable (each in its own process)")
    b.add_argument("--workloads", default="fixed", help="fixed (EOS disabled), eos (EOS forced per row)")
    b.add_argument("--eos-lengths", default=None, help="lengths for the eos workload (default: the longest)")
    b.add_argument("--prompt-len", type=int, default=None, help="default 32 on CUDA, 16 on CPU")
    b.add_argument("--warmup", type=int, default=1)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--no-profile", action="store_true", help="skip the GPU busy-fraction profile")
    b.add_argument("--device", default=None)
    b.add_argument("--gpus", default=None,
                   help="CUDA device indices, e.g. 0,1,2,3: spread the allocator x dtype:batch units over them, "
                        "one process per GPU at a time")
    b.add_argument("--time-budget", type=float, default=None,
                   help="seconds; configurations not started by then are recorded as not run")
    b.add_argument("--append", action="store_true", help="add to the results already in --out")
    b.add_argument("--out", default="bench-out")

    p = sub.add_parser("profile", help="profiler trace, timeline and GPU-idle summary per strategy")
    p.add_argument("--model", default=None, help="default: gpt2-random on CUDA, tiny-gpt2 on CPU")
    p.add_argument("--strategies", default="compiled,interleaved")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="profile-out")

    r = sub.add_parser("report", help="rebuild report.md and the plots of a bench directory from its JSON")
    r.add_argument("dir", nargs="+", help="bench directories (results.json) or profile directories (summary.json)")
    r.add_argument("--markdown", default=None,
                   help="also write one markdown file gathering every directory's report (e.g. BENCHMARKS.md)")
    r.add_argument("--interrupted", metavar="COMMAND", default=None,
                   help="DIR holds rows.jsonl of a run stopped early: keep its rows, recording COMMAND as its command")


def _cuda(device) -> bool:
    import torch

    return (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")


def _positive(values, flag):
    if not values:
        raise CliError(f"{flag} needs at least one value")
    bad = [v for v in values if v < 1]
    if bad:
        raise CliError(f"{flag} values must be >= 1, got {bad}")
    return tuple(values)


def _check_names(names, known, flag):
    bad = [n for n in names if n not in known]
    if bad:
        raise CliError(f"{flag}: unknown {', '.join(bad)}; choose from {', '.join(known)}")
    return tuple(names)


def _check_strategies(text: str) -> tuple[str, ...]:
    """Preset or variant names, `NAME:K` for a lag of K (interleaved:2)."""
    from ..strategy import resolve_strategy

    names = _names(text)
    for n in names:
        try:
            resolve_strategy(n)
        except ValueError as err:
            raise CliError(f"--strategies: {err}") from None
    return tuple(names)


def bench_config(args):
    from ..models import parse_dtype
    from .peers import PEERS
    from .runner import ALLOCATORS
    from .worker import BenchConfig
    from .workloads import WORKLOADS

    cuda = _cuda(args.device)
    strategies = _check_strategies(args.strategies)
    peers = () if args.peers.strip() == "none" else _check_names(_names(args.peers), list(PEERS), "--peers")
    if not strategies and not peers:
        raise CliError("--strategies and --peers are both empty: nothing to measure")
    lengths = _positive(_ints(args.lengths, "--lengths") if args.lengths else ([64, 96] if cuda else [16, 48]),
                        "--lengths")
    batches = _positive(_ints(args.batch, "--batch"), "--batch")
    dtypes = tuple(_names(args.dtype))
    for d in dtypes:
        try:
            parse_dtype(d)
        except ValueError as err:
            raise CliError(f"--dtype: {err}") from None
    pairs = ()
    if args.dtype_batch:
        pairs = tuple(_names(args.dtype_batch))
        for p in pairs:
            d, _, b = p.partition(":")
            if not b.isdigit() or int(b) < 1:
                raise CliError(f"--dtype-batch takes dtype:batch pairs such as bfloat16:8, got {p!r}")
            try:
                parse_dtype(d)
            except ValueError as err:
                raise CliError(f"--dtype-batch: {err}") from None
        dtypes = tuple(dict.fromkeys(p.split(":")[0] for p in pairs))
        batches = tuple(dict.fromkeys(int(p.split(":")[1]) for p in pairs))
    if args.time_budget is not None and args.time_budget <= 0:
        raise CliError("--time-budget must be > 0 seconds")
    allocators = _check_names(_names(args.allocator), list(ALLOCATORS), "--allocator")
    if "expandable" in allocators and not cuda:
        raise CliError("--allocator expandable needs CUDA (it configures the CUDA caching allocator)")
    workloads = _check_names(_names(args.workloads), list(WORKLOADS), "--workloads")
    eos_lengths = _positive(_ints(args.eos_lengths, "--eos-lengths"), "--eos-lengths") if args.eos_lengths else ()
    prompt_len = args.prompt_len if args.prompt_len is not None else (32 if cuda else 16)
    if prompt_len < 1:
        raise CliError(f"--prompt-len must be >= 1, got {prompt_len}")
    if args.warmup < 0 or args.repeats < 1:
        raise CliError("--warmup must be >= 0 and --repeats >= 1")
    model = args.model or ("gpt2-random" if cuda else "tiny-gpt2")
    _check_positions(model, prompt_len, max(lengths + eos_lengths))
    gpus = _check_gpus(args.gpus, args.device) if args.gpus else ()
    return BenchConfig(gpus=gpus, model=model, strategies=strategies, peers=peers, lengths=lengths, batches=batches,
                       dtypes=dtypes, pairs=pairs, time_budget_s=args.time_budget, allocators=allocators,
                       workloads=workloads, eos_lengths=eos_lengths, prompt_len=prompt_len, warmup=args.warmup,
                       repeats=args.repeats, profile=not args.no_profile, device=args.device)


def _check_gpus(text: str, device) -> tuple[int, ...]:
    import torch

    if device is not None:
        raise CliError("--gpus and --device exclude each other: --gpus pins each worker to one GPU itself")
    gpus = _ints(text, "--gpus")
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise CliError(f"--gpus takes distinct CUDA device indices such as 0,1,2,3, got {text!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise CliError("--gpus needs CUDA devices; this machine has none")
    if max(gpus) >= count:
        raise CliError(f"--gpus {text}: this machine has {count} CUDA device(s), indices 0-{count - 1}")
    return tuple(gpus)


def _check_positions(model: str, prompt_len: int, longest: int) -> None:
    from ..models import EMBEDDED, embedded_config

    if model in EMBEDDED:
        cfg = embedded_config(model)
        limit = getattr(cfg, "n_positions", None) or cfg.max_position_embeddings
        if prompt_len + longest > limit:
            raise CliError(f"--prompt-len {prompt_len} + longest length {longest} exceeds {model}'s {limit} positions")


def cmd_bench(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .report import _order, series
    from .runner import BenchError, run_bench

    cfg = bench_config(args)
    command = "overlapdecode " + " ".join(shlex.quote(a) for a in args.argv)
    try:
        results = run_bench(cfg, args.out, command, append=args.append)
    except BenchError as err:
        raise CliError(str(err)) from None
    console = Console()
    for (alloc, dtype, batch), per in sorted(series(results["rows"]).items()):
        n = max(m for pts in per.values() for m, _ in pts)
        base = dict(per.get("baseline", [])).get(n)
        table = Table(title=f"{cfg.model}, {dtype}, batch {batch}, allocator {alloc}, {n} new tokens")
        for col in ("strategy", "ms/token", "tok/s", "TTFT ms", "vs baseline", "peak reserved MB"):
            table.add_column(col, justify="right")
        for s in _order(per):
            r = dict(per[s]).get(n)
            if r is None:
                continue
            table.add_row(s, f"{r['ms_per_token']:.3f}", f"{r['tokens_per_s']:.0f}", f"{r['ttft_ms']:.2f}",
                          f"{base['seq_s'] / r['seq_s']:.2f}x" if base else "-",
                          "-" if r["peak_reserved_mb"] is None else f"{r['peak_reserved_mb']:.0f}")
        console.print(table)
    console.print(f"report: {args.out}/report.md (results: {args.out}/results.json)")
    return 0


def cmd_profile(args) -> int:
    from .profile import profile_strategies

    strategies = _check_strategies(args.strategies)
    if args.batch < 1 or args.new_tokens < 1:
        raise CliError("--batch and --new-tokens must be >= 1")
    model = args.model or ("gpt2-random" if _cuda(args.device) else "tiny-gpt2")
    result = profile_strategies(model, strategies, args.batch, args.new_tokens, args.out, dtype=args.dtype,
                                prompt_len=args.prompt_len, device=args.device,
                                command="overlapdecode " + " ".join(shlex.quote(a) for a in args.argv))
    for name, s in result["strategies"].items():
        busy = (f"GPU busy {s['busy_fraction'] * 100:.1f}%, fed {s['fed_fraction'] * 100:.1f}%" if s.get("available")
                else s["reason"])
        print(f"{name}: {busy}; host blocked {s['host_sync_ms']:.2f} ms; {s['launches_per_step']:.1f} launch calls/step")
    print(f"summary: {args.out}/summary.md")
    return 0


def cmd_report(args) -> int:
    import os

    from .profile import rebuild
    from .report import build, gather
    from .runner import finalize, rows_files

    if args.interrupted is not None:
        if len(args.dir) != 1 or not rows_files(args.dir[0]):
            raise CliError("--interrupted takes one directory holding the rows*.jsonl of a stopped run")
        finalize(args.dir[0], args.interrupted, interrupted=True)
    for d in args.dir:
        if os.path.exists(os.path.join(d, "summary.json")) and not os.path.exists(os.path.join(d, "results.json")):
            rebuild(d)  # a profile directory: analyse its saved traces again
            print(f"profile summary: {os.path.join(d, 'summary.md')}")
            continue
        try:
            print(f"report: {build(d)}")
        except FileNotFoundError as err:
            raise CliError(str(err)) from None
    if args.markdown:
        gather(args.dir, args.markdown, "overlapdecode " + " ".join(shlex.quote(a) for a in args.argv))
        print(f"gathered: {args.markdown}")
    return 0


HANDLERS = {"bench": cmd_bench, "profile": cmd_profile, "report": cmd_report}
