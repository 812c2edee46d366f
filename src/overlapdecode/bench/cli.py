"""The `bench`, `profile` and `report` subcommands: flags -> BenchConfig fields, checked before any work.

Only cliargs (no torch) is imported at the top: `overlapdecode bench --help` must not pay for torch and
transformers. Each command imports what it runs inside its function, for that reason alone.
"""

from __future__ import annotations

import os
import shlex

from ..cliargs import (
    DTYPE_NAMES,
    STRATEGY_HELP,
    CliError,
    Interrupted,
    add_quantize_flags,
    check_model_flag,
    check_quantize_flags,
    ints,
    lag_beyond,
    lag_of,
    names,
    split_pair,
    writable_dir,
    writable_file,
)
from .config import BenchConfig
from .outdir import MANIFEST

ALLOCATOR_NAMES = ("default", "expandable")  # bench.runner.ALLOCATORS (a test keeps them equal)
BASE_STRATEGIES = ("baseline", "kv", "static", "compiled", "interleaved")  # + fused on CUDA where it applies

# `overlapdecode bench` with no arguments (the main job). On CUDA: gpt2-random in float32 at batch 16, where
# the baseline's per-step work (the whole sequence) outgrows the launch-bound floor of an eager step within the
# first tens of tokens, so its O(N^2) growth shows between 48 and 192 new tokens; batch 16 is one row tile of the
# fused kernels; the busy-fraction profile is left to `overlapdecode profile`. Beside it, the bfloat16
# configuration `fused` is built for: gpt2-random in bfloat16 at batch 1, `fused` and `interleaved` alone at the
# longest length, so that the whole run stays within a few minutes (docs/BENCHMARKING.md). On CPU the quick sweep
# of tiny-gpt2. Other models on CUDA keep batch 1 and 64,96 tokens: a real-size baseline at batch 16 would take
# many minutes.
MAIN_MODEL_CUDA = "gpt2-random"
MAIN_LENGTHS_CUDA, MAIN_BATCH_CUDA = (48, 192), 16
MAIN_BF16_PAIR, MAIN_BF16_STRATEGIES = "bfloat16:1", ("interleaved", "fused")
OTHER_LENGTHS_CUDA, LENGTHS_CPU = (64, 96), (16, 48)
PEER_NAMES = ("hf-dynamic", "hf-static", "hf-compiled")  # bench.peers.PEERS (likewise)
WORKLOAD_NAMES = ("fixed", "eos")  # bench.workloads.WORKLOADS (likewise)


def add_commands(sub) -> None:
    b = sub.add_parser(
        "bench",
        help="measure every strategy and Hugging Face generate() side by side",
        description="Measure strategies and Hugging Face peers; write DIR/results.json, report.md "
        "and plots. An existing results.json is never overwritten: use --append or a "
        "new --out.",
    )
    b.add_argument(
        "--model",
        default=None,
        help="embedded name, local directory or hub name (default: gpt2-random on CUDA, tiny-gpt2 on CPU)",
    )
    b.add_argument(
        "--strategies",
        default=None,
        help=f"comma-separated; {STRATEGY_HELP} (default: {','.join(BASE_STRATEGIES)}, and fused on CUDA "
        f"where the model's family has it)",
    )
    b.add_argument(
        "--peers",
        default=",".join(PEER_NAMES),
        help=f"Hugging Face generate() peers, comma-separated ({', '.join(PEER_NAMES)}), or 'none'",
    )
    b.add_argument(
        "--lengths",
        default=None,
        help=f"new tokens per sequence, comma-separated (default: "
        f"{','.join(map(str, MAIN_LENGTHS_CUDA))} for {MAIN_MODEL_CUDA} on CUDA, where the baseline's "
        f"O(N^2) growth shows; {','.join(map(str, OTHER_LENGTHS_CUDA))} for another model on CUDA; "
        f"{','.join(map(str, LENGTHS_CPU))} on CPU)",
    )
    b.add_argument(
        "--batch",
        default=None,
        help=f"batch sizes, comma-separated (default: 1; {MAIN_BATCH_CUDA} for {MAIN_MODEL_CUDA} on CUDA, and "
        f"beside it, where --batch, --dtype, --dtype-batch and --strategies are all left out, "
        f"{MAIN_BF16_PAIR.replace(':', ' at batch ')} with {' and '.join(MAIN_BF16_STRATEGIES)} alone at the "
        f"longest length)",
    )
    b.add_argument(
        "--dtype-batch",
        default=None,
        help="dtype:batch pairs measured instead of every --dtype x --batch, e.g. float32:1,bfloat16:8 "
        "(default: every --dtype x --batch)",
    )
    b.add_argument(
        "--dtype", default=None, help=f"comma-separated: {', '.join(DTYPE_NAMES)} (default: float32; see --batch)"
    )
    b.add_argument(
        "--allocator",
        default="default",
        help="comma-separated: default, expandable (expandable_segments:True; CUDA only); each runs in its own process",
    )
    b.add_argument(
        "--workloads",
        default="fixed",
        help="comma-separated: fixed (EOS disabled, full length), eos (EOS forced per row)",
    )
    b.add_argument(
        "--eos-lengths",
        default=None,
        help="lengths of the eos workload, comma-separated (default: the longest of --lengths)",
    )
    b.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default: 32 on CUDA, 16 on CPU)")
    b.add_argument("--warmup", type=int, default=1, help="untimed calls after the first call, per configuration")
    b.add_argument("--repeats", type=int, default=3, help="timed calls per configuration (the median is reported)")
    b.add_argument("--no-profile", action="store_true", help="skip the GPU busy-fraction profile")
    b.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    b.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel shards: run as torchrun --nproc-per-node N -m overlapdecode bench --tp N; "
        "rank 0 writes the results",
    )
    b.add_argument(
        "--gpus",
        default=None,
        help="CUDA device indices, e.g. 0,1,2,3: spread the allocator x dtype:batch units over them, "
        "one process per GPU at a time (default: one device, see --device)",
    )
    b.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds; configurations not started by then are recorded as not run (default: no limit)",
    )
    add_quantize_flags(b)
    b.add_argument("--append", action="store_true", help="add to the results already in --out")
    b.add_argument(
        "--out",
        default="bench-out",
        help="output directory (results.json, report.md, plots, worker logs): new, empty, or one an earlier "
        f"bench wrote, which lists every file it made in {MANIFEST} and is only written again with --append "
        "(then only the files it lists are replaced); anything else is refused before any work",
    )

    p = sub.add_parser("profile", help="profiler trace, timeline and GPU-idle summary per strategy")
    p.add_argument("--model", default=None, help="default: gpt2-random on CUDA, tiny-gpt2 on CPU")
    p.add_argument("--strategies", default="compiled,interleaved", help=f"comma-separated; {STRATEGY_HELP}")
    p.add_argument("--batch", type=int, default=1, help="batch size")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens per call (EOS disabled)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (random ids)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPE_NAMES)}")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument(
        "--out",
        default="profile-out",
        help="output directory (traces, timelines, summary): new, empty, or one an earlier profile left "
        f"without a summary.json (it lists every file it made in {MANIFEST}); anything else is refused "
        "before any work",
    )

    r = sub.add_parser("report", help="rebuild report.md and the plots of a bench directory from its JSON")
    r.add_argument("dir", nargs="+", help="bench directories (results.json) or profile directories (summary.json)")
    r.add_argument(
        "--markdown",
        default=None,
        help="also write one markdown file gathering every directory's report (e.g. BENCHMARKS.md; default: none)",
    )
    r.add_argument(
        "--interrupted",
        metavar="COMMAND",
        default=None,
        help="DIR holds rows.jsonl of a run stopped early: keep its rows, recording COMMAND as its "
        "command (default: off)",
    )


def check_device(text: str | None, flag: str = "--device"):
    """The torch device a --device flag names, or a CliError naming the flag."""
    from ..models import check_device as library_check  # torch: imported when a command runs, not for --help

    try:
        return library_check(text)
    except (ValueError, TypeError) as err:
        raise CliError(f"{flag}: {err}") from None


def _positive(values, flag):
    if not values:
        raise CliError(f"{flag} needs at least one value")
    bad = [v for v in values if v < 1]
    if bad:
        raise CliError(f"{flag} values must be >= 1, got {bad}")
    return tuple(values)


def _check_names(values, known, flag):
    bad = [n for n in values if n not in known]
    if bad:
        raise CliError(f"{flag}: unknown {', '.join(bad)}; choose from {', '.join(known)}")
    return tuple(values)


def check_strategies(text: str, flag: str, max_new_tokens: int) -> tuple[str, ...]:
    """Preset or variant names, `NAME:K` for a lag of K (interleaved:2); a lag beyond the shortest run is
    refused here, before a worker starts (it would only allocate K + 1 pinned slots for nothing)."""
    from ..sampling import check_sampling
    from ..strategy import resolve_strategy
    from .variants import split_variant

    found = names(text)
    for n in found:
        try:
            base, sampling = split_variant(n)
            resolve_strategy(base)
            check_sampling(
                sampling.get("do_sample", False),
                sampling.get("temperature", 1.0),
                sampling.get("top_k"),
                sampling.get("top_p"),
                0,
                sampling.get("min_p"),
                sampling.get("repetition_penalty"),
            )
        except (ValueError, TypeError) as err:
            raise CliError(f"{flag}: {err}") from None
        if lag_of(base) > max_new_tokens:
            raise lag_beyond(flag, n, f"the {max_new_tokens} new tokens of the shortest run")
    return tuple(found)


def _check_dtype(d: str, flag: str) -> str:
    from ..models import parse_dtype  # torch: imported when a command runs, not for --help

    try:
        parse_dtype(d)
    except ValueError as err:
        raise CliError(f"{flag}: {err}") from None
    return d


def bench_config(args):
    device = check_device(args.device) if args.device is not None else None
    cuda = (device.type if device is not None else _default_device().type) == "cuda"
    model = args.model or (MAIN_MODEL_CUDA if cuda else "tiny-gpt2")
    main_job = cuda and model == MAIN_MODEL_CUDA
    default_lengths = MAIN_LENGTHS_CUDA if main_job else OTHER_LENGTHS_CUDA if cuda else LENGTHS_CPU
    lengths = _positive(ints(args.lengths, "--lengths") if args.lengths else list(default_lengths), "--lengths")
    eos_lengths = _positive(ints(args.eos_lengths, "--eos-lengths"), "--eos-lengths") if args.eos_lengths else ()
    strategies = None  # by default, chosen once the model's config is known (fused where its family has it)
    if args.strategies is not None:
        strategies = check_strategies(args.strategies, "--strategies", min(lengths + eos_lengths))
    peers = () if args.peers.strip() == "none" else _check_names(names(args.peers), PEER_NAMES, "--peers")
    if strategies == () and not peers:
        raise CliError("--strategies and --peers are both empty: nothing to measure")
    batches = _positive(
        ints(args.batch, "--batch") if args.batch is not None else [MAIN_BATCH_CUDA if main_job else 1], "--batch"
    )
    dtypes = tuple(_check_dtype(d, "--dtype") for d in names("float32" if args.dtype is None else args.dtype))
    if not dtypes and not args.dtype_batch:
        raise CliError(
            f"--dtype names no dtype ({args.dtype!r}): nothing to measure; choose from {', '.join(DTYPE_NAMES)}"
        )
    pairs, narrowed = (), ()
    if args.dtype_batch is not None:
        pairs = tuple(names(args.dtype_batch))
        if not pairs:
            raise CliError(f"--dtype-batch names no pair ({args.dtype_batch!r}): nothing to measure")
        parsed = [split_pair(p) for p in pairs]
        for d, _ in parsed:
            _check_dtype(d, "--dtype-batch")
        dtypes = tuple(dict.fromkeys(d for d, _ in parsed))
        batches = tuple(dict.fromkeys(b for _, b in parsed))
    if args.time_budget is not None and not args.time_budget > 0:
        raise CliError("--time-budget must be > 0 seconds")
    allocators = _check_names(names(args.allocator), ALLOCATOR_NAMES, "--allocator")
    if not allocators:
        raise CliError("--allocator names no allocator: nothing to measure")
    if "expandable" in allocators and not cuda:
        raise CliError("--allocator expandable needs CUDA (it configures the CUDA caching allocator)")
    workloads = _check_names(names(args.workloads), WORKLOAD_NAMES, "--workloads")
    if not workloads:
        raise CliError("--workloads names no workload: nothing to measure")
    prompt_len = args.prompt_len if args.prompt_len is not None else (32 if cuda else 16)
    if prompt_len < 1:
        raise CliError(f"--prompt-len must be >= 1, got {prompt_len}")
    if args.warmup < 0 or args.repeats < 1:
        raise CliError("--warmup must be >= 0 and --repeats >= 1")
    config = _check_model_name(model)
    group_size = check_quantize_flags(dict_args(args, model=model), config)
    if args.quantize is not None and args.tp > 1:
        raise CliError("--quantize: tensor-parallel shards are not quantized yet; bench it with --tp 1")
    if strategies is None:
        strategies = default_strategies(model, config, cuda)
        if main_job and args.batch is None and args.dtype is None and args.dtype_batch is None:
            pairs = (f"float32:{MAIN_BATCH_CUDA}", MAIN_BF16_PAIR)
            dtypes, batches = tuple(split_pair(p)[0] for p in pairs), tuple(split_pair(p)[1] for p in pairs)
            own = tuple(s for s in MAIN_BF16_STRATEGIES if s in strategies)
            narrowed = ((MAIN_BF16_PAIR, own, (max(lengths),)),)
    _check_positions(model, prompt_len, max(lengths + eos_lengths))
    gpus = _check_gpus(args.gpus, args.device) if args.gpus else ()
    _check_tp(args)
    if args.tp > 1:
        _check_tp_model(model, args.tp, config)
    _check_out(args.out, "bench", args.append)
    return BenchConfig(
        tp=args.tp,
        gpus=gpus,
        model=model,
        strategies=strategies,
        peers=peers,
        lengths=lengths,
        batches=batches,
        dtypes=dtypes,
        pairs=pairs,
        narrowed=narrowed,
        time_budget_s=args.time_budget,
        allocators=allocators,
        workloads=workloads,
        eos_lengths=eos_lengths,
        prompt_len=prompt_len,
        warmup=args.warmup,
        repeats=args.repeats,
        # the main job without --strategies skips the busy-fraction profile (`overlapdecode profile` makes it)
        profile=not args.no_profile and not (main_job and args.strategies is None),
        device=args.device,
        quantize=args.quantize,
        group_size=group_size,
    )


def dict_args(args, **changes):
    """`args` with some attributes changed (the model a run without --model measures)."""
    from types import SimpleNamespace

    return SimpleNamespace(**dict(vars(args), **changes))


def default_strategies(model: str, config, cuda: bool) -> tuple[str, ...]:
    """The strategies of a run without --strategies: the presets, with `fused` on CUDA where the model's
    family has it (`config`: the model's, None for an embedded one). On CPU `fused` runs its kernels' torch
    twins, compiled: a slow start for no figure of its own, so the CPU default leaves it out."""
    return BASE_STRATEGIES + ("fused",) if cuda and _fused_applies(model, config) else BASE_STRATEGIES


def _fused_applies(model: str, config) -> bool:
    """Whether the fused path takes this model: its family (fused/layout.py SUPPORTED) and, for the Llama family,
    no sliding-window layers, read from the config alone (the other checks need the weights; they refuse very few
    models)."""
    from types import SimpleNamespace

    from ..models import embedded_config  # torch: imported when a command runs, not for --help

    try:
        from ..fused.layout import LLAMA_FAMILY, model_family  # Triton: imported only where fused may be measured
    except ImportError:
        return False
    config = embedded_config(model) if config is None else config
    try:
        model_family(SimpleNamespace(config=config))
    except ValueError:
        return False
    if getattr(config, "model_type", None) not in LLAMA_FAMILY:
        return True  # the other families' sliding layers are the step's own (layout.LayerWeights.window)
    return "sliding_attention" not in (getattr(config, "layer_types", None) or [])


def _check_tp(args) -> None:
    """--tp N: N processes of torchrun, each measuring its shard in step with the others. Whatever could make
    the ranks decide differently (a time budget read on each host clock, units spread over GPUs) is refused."""
    if args.tp < 1:
        raise CliError(f"--tp must be >= 1, got {args.tp}")
    world = os.environ.get("WORLD_SIZE")
    if args.tp == 1:
        if world not in (None, "1"):
            raise CliError(
                f"WORLD_SIZE={world} (torchrun) without --tp: every process would write --out; run "
                f"torchrun --nproc-per-node {world} -m overlapdecode bench --tp {world} ..., or bench "
                f"without torchrun"
            )
        return
    if world != str(args.tp):
        raise CliError(
            f"--tp {args.tp} runs under torchrun: torchrun --nproc-per-node {args.tp} -m overlapdecode "
            f"bench --tp {args.tp} ... (this process has WORLD_SIZE={world})"
        )
    if args.gpus:
        raise CliError("--tp and --gpus exclude each other: with --tp every rank uses its own GPU (cuda:LOCAL_RANK)")
    if args.time_budget is not None:
        raise CliError("--tp and --time-budget exclude each other: the ranks must run the same configurations")


def _check_tp_model(model: str, tp: int, config) -> None:
    """--tp against the model's heads and sharding plan, before any worker starts: a worker would fail on every
    rank with a traceback and leave its rows file in --out. `config`: the model's, None for an embedded one."""
    from ..models import embedded_config  # torch: imported when a command runs, not for --help
    from ..tp import check_config

    if config is None:
        config = embedded_config(model)
    try:
        check_config(config, tp)
    except ValueError as err:
        raise CliError(f"--tp: {err}") from None


def _default_device():
    from ..models import check_device as library_check  # torch: imported when a command runs, not for --help

    return library_check(None)


def _check_model_name(model: str):
    """An embedded name (None), or a directory or hub name whose config loads and is a causal LM (its config),
    checked here: a worker would only fail later, after starting, with its log's traceback."""
    return check_model_flag(model)


def _check_out(out: str, command: str, append: bool = False) -> None:
    """--out before any work (bench.outdir.check): a new or empty directory, or one an earlier run of the same
    command wrote (its manifest lists every file in it); made now, and probed with a file."""
    from .outdir import OutDirError, check  # light (no torch), but only the commands need it

    try:
        check(out, command, append)
    except OutDirError as err:
        raise CliError(str(err)) from None
    writable_dir(out, "--out")  # last: it makes the directory


def _check_gpus(text: str, device) -> tuple[int, ...]:
    import torch  # imported when the command runs, not for --help

    if device is not None:
        raise CliError("--gpus and --device exclude each other: --gpus pins each worker to one GPU itself")
    gpus = ints(text, "--gpus")
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise CliError(f"--gpus takes distinct CUDA device indices such as 0,1,2,3, got {text!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise CliError("--gpus needs CUDA devices; this machine has none")
    if max(gpus) >= count:
        raise CliError(f"--gpus {text}: this machine has {count} CUDA device(s), indices 0-{count - 1}")
    return tuple(gpus)


def _check_positions(model: str, prompt_len: int, longest: int) -> None:
    from ..embedded import EMBEDDED
    from ..models import embedded_config  # torch: imported when a command runs, not for --help

    if model in EMBEDDED:
        cfg = embedded_config(model)
        limit = getattr(cfg, "n_positions", None) or cfg.max_position_embeddings
        if prompt_len + longest > limit:
            raise CliError(f"--prompt-len {prompt_len} + longest length {longest} exceeds {model}'s {limit} positions")


def _command(args) -> str:
    return "overlapdecode " + " ".join(shlex.quote(a) for a in args.argv)


def spread(row) -> float:
    """(slowest - fastest) / median of a row's timed calls."""
    times = row.get("seq_s_all") or [row["seq_s"]]
    return (max(times) - min(times)) / row["seq_s"]


# the terminal table's columns: the figures that decide, each cell whole at 80 columns; the rest (TTFT, ms/step,
# the toll, memory, kernels per step) is in results.json and report.md
SUMMARY_COLUMNS = ("strategy", "ms/token", "vs baseline", "spread", "MBU")
# under a float32 table where `fused` trails `interleaved`: why
FLOAT32_FUSED = (
    "float32: fused multiplies gate/up and the LM head on the CUDA cores (float32 precision takes no tensor "
    "cores), where interleaved's cuBLAS GEMMs are faster from a few rows; fused leads in bfloat16 "
    "(docs/KERNELS.md, 'Float32 weights')"
)


def summary_tables(rows, model: str) -> list:
    """The terminal's summary: per (allocator, dtype, batch), a rich Table of each strategy at the longest
    length: ms/token, its speed-up over the baseline, the spread of its timed calls and MBU; a column that is
    `-` in every row (MBU on CPU, the speed-up without a baseline) is left out. A `!` marks a speed-up that
    the spread of the timed calls does not resolve, and its warning line quotes the spread of the row it names:
    the row's own, or, where only the baseline's is wide enough to hide it, the baseline's on a line of its own.
    On a busy host a figure such as "36x" can rest on calls far apart."""
    from rich.table import Table  # imported when the command runs, not for --help

    from .figures import mbu
    from .markdown import fmt
    from .peers import label
    from .report import _order, series

    out = []
    for (alloc, dtype, batch), per in sorted(series(rows).items()):
        n = max(m for pts in per.values() for m, _ in pts)
        base = dict(per.get("baseline", [])).get(n)
        body, warnings, hidden = [], [], []
        for s in _order(per):
            r = dict(per[s]).get(n)
            if r is None:
                continue
            vs = "-"
            if base:
                ratio = base["seq_s"] / r["seq_s"]
                vs = f"{ratio:.2f}x"
                if r is not base and abs(ratio - 1) <= spread(r):
                    vs += " !"
                    warnings.append(
                        f"! {label(r)}: {ratio:.2f}x the baseline is within the spread of its own timed calls "
                        f"({spread(r) * 100:.0f}%): not resolved on this run"
                    )
                elif r is not base and abs(ratio - 1) <= spread(base):
                    vs += " !"
                    hidden.append(f"{label(r)} {ratio:.2f}x")
            body.append(
                (
                    label(r),
                    f"{r['ms_per_token']:.3f}",
                    vs,
                    f"{spread(r) * 100:.0f}%" if len(r.get("seq_s_all") or ()) > 1 else "-",
                    fmt(mbu(r), "{:.0%}"),
                )
            )
        ms = {s: dict(per[s]).get(n, {}).get("ms_per_token") for s in ("fused", "interleaved") if s in per}
        if dtype == "float32" and len(ms) == 2 and None not in ms.values() and ms["fused"] > ms["interleaved"]:
            warnings.append(FLOAT32_FUSED)
        if hidden:
            warnings.append(
                f"! baseline: its own timed calls spread {spread(base) * 100:.0f}%, which hides the speed-up "
                f"over it of {', '.join(hidden)}: not resolved on this run"
            )
        shown = [i for i in range(len(SUMMARY_COLUMNS)) if i == 0 or any(cells[i] != "-" for cells in body)]
        where = f", allocator {alloc}" if alloc != "default" else ""
        table = Table(title=f"{model}, {dtype}, batch {batch}{where}, {n} new tokens")
        for i in shown:
            table.add_column(SUMMARY_COLUMNS[i], justify="left" if i == 0 else "right", no_wrap=True)
        for cells in body:
            table.add_row(*(cells[i] for i in shown))
        out.append((table, warnings))
    return out


def print_summary(results: dict, out_dir: str, file=None) -> None:
    """The tables, their warnings, on CPU the line that says what the run is worth, and where the report is;
    `file`: where to print (default stdout, at its width: 80 columns when piped unless COLUMNS says)."""
    from rich.console import Console  # imported when the command runs, not for --help

    from .report import CPU_TAKEAWAY, on_cpu

    console = Console(file=file)
    for table, warnings in summary_tables(results["rows"], results["config"]["model"]):
        console.print(table)
        for line in warnings:
            console.print(line, markup=False, highlight=False)
    if on_cpu(results["rows"]):
        console.print(CPU_TAKEAWAY, markup=False, highlight=False)
    console.print(f"report: {out_dir}/report.md (results: {out_dir}/results.json)", markup=False, highlight=False)


def cmd_bench(args) -> int:
    from .runner import BenchError, BenchInterrupted, run_bench  # imported when the command runs, not for --help

    cfg = bench_config(args)
    try:
        results = run_bench(cfg, args.out, _command(args), append=args.append)
    except BenchInterrupted as err:
        raise Interrupted(str(err)) from None
    except BenchError as err:
        raise CliError(str(err)) from None
    if results is None:  # a tensor-parallel rank other than 0: it measured in step with rank 0, which reports
        return 0
    print_summary(results, args.out)
    return 0


def cmd_profile(args) -> int:
    from .profile import profile_strategies  # imported when the command runs, not for --help

    if args.batch < 1 or args.new_tokens < 1 or args.prompt_len < 1:
        raise CliError("--batch, --new-tokens and --prompt-len must be >= 1")
    strategies = check_strategies(args.strategies, "--strategies", args.new_tokens)
    device = check_device(args.device)
    _check_dtype(args.dtype, "--dtype")
    model = args.model or ("gpt2-random" if device.type == "cuda" else "tiny-gpt2")
    _check_model_name(model)
    _check_positions(model, args.prompt_len, args.new_tokens)
    _check_out(args.out, "profile")  # as bench: an earlier measurement, or a file of the user's, is never replaced
    result = profile_strategies(
        model,
        strategies,
        args.batch,
        args.new_tokens,
        args.out,
        dtype=args.dtype,
        prompt_len=args.prompt_len,
        device=str(device),
        command=_command(args),
    )
    for name, s in result["strategies"].items():
        busy = (
            f"GPU busy {s['busy_fraction'] * 100:.1f}%, fed {s['fed_fraction'] * 100:.1f}%"
            if s.get("available")
            else s["reason"]
        )
        print(
            f"{name}: {busy}; host blocked {s['host_sync_ms']:.2f} ms; {s['launches_per_step']:.1f} launch calls/step"
        )
    print(f"summary: {args.out}/summary.md")
    return 0


def cmd_report(args) -> int:
    # imported when the command runs, not for --help
    from .profile import rebuild
    from .report import build, gather, tp_probe_summary
    from .results import finalize, rows_files

    if args.markdown:
        writable_file(args.markdown, "--markdown")
        if os.path.isfile(args.markdown) and args.markdown.endswith((".json", ".jsonl", ".gz")):
            # results.json, summary.json, rows*.jsonl, traces: measurements that the markdown would replace
            raise CliError(
                f"--markdown {args.markdown}: is a JSON file of measurements, which it would replace; "
                f"give a .md path (such as BENCHMARKS.md)"
            )
    if args.interrupted is not None:
        if len(args.dir) != 1 or not rows_files(args.dir[0]):
            raise CliError("--interrupted takes one directory holding the rows*.jsonl of a stopped run")
        finalize(args.dir[0], args.interrupted, interrupted=True)
    for d in args.dir:
        if os.path.exists(os.path.join(d, "summary.json")) and not os.path.exists(os.path.join(d, "results.json")):
            try:
                rebuild(d)  # a profile directory: analyse its saved traces again
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # a malformed summary.json
                raise CliError(
                    f"{os.path.join(d, 'summary.json')}: cannot be used ({type(err).__name__}: {err})"
                ) from None
            print(f"profile summary: {os.path.join(d, 'summary.md')}")
            continue
        if not os.path.exists(os.path.join(d, "results.json")) and not rows_files(d) and tp_probe_summary(d):
            print(f"tensor-parallel probe results: {d} (gathered as they are)")
            continue
        try:
            print(f"report: {build(d)}")
        except FileNotFoundError as err:
            raise CliError(str(err)) from None
    if args.markdown:
        gather(args.dir, args.markdown, _command(args))
        print(f"gathered: {args.markdown}")
    return 0


HANDLERS = {"bench": cmd_bench, "profile": cmd_profile, "report": cmd_report}
