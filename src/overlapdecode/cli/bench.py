"""The `bench`, `profile` and `report` subcommands: their flags (checked by bench_flags.py) and what each runs.

Only args.py, bench_flags.py and bench/config.py (no torch) are imported at the top: `overlapdecode bench --help`
must not pay for torch and transformers. Each command imports what it runs inside its function, for that reason
alone.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import threading

from ..bench.report.outdir import MANIFEST
from .args import DTYPE_NAMES, STRATEGY_HELP, CliError, Interrupted, add_quantize_flags, writable_file
from .bench_flags import (
    BASE_STRATEGIES,
    LENGTHS_CPU,
    MAIN_BATCH_CUDA,
    MAIN_BF16_PAIR,
    MAIN_BF16_STRATEGIES,
    MAIN_LENGTHS_CUDA,
    MAIN_MODEL_CUDA,
    OTHER_LENGTHS_CUDA,
    PEER_NAMES,
    bench_config,
    check_device,
    check_dtype,
    check_model_name,
    check_out,
    check_positions,
    check_strategies,
)


def _out_flag(parser, default: str, holds: str, reused: str) -> None:
    """--out of a command that writes a directory: what it holds, and the directory it may write again."""
    parser.add_argument(
        "--out",
        default=default,
        help=f"output directory ({holds}): new, empty, or {reused}; anything else is refused before any work",
    )


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
    b.add_argument(
        "--prompt-lookup",
        default=None,
        metavar="K[,K...]",
        help="speculative rows: each strategy that speculates (kv, static, compiled, interleaved, fused and their "
        "variants), drafting K tokens a round by prompt lookup, at every --lengths, beside the verify step's cost "
        "for K + 1 = 1..9 tokens (docs/BENCHMARKING.md, 'Speculative decoding') (default: none)",
    )
    b.add_argument(
        "--prompt-lookup-loop",
        default=None,
        metavar="K[,K...]",
        help="speculative rows of prompt lookup on a prompt whose continuation repeats it: the row's own greedy "
        "tokens, generated until they loop, into the loop (two periods, K + 2 tokens at least: the drafts then "
        "the model's own tokens), or where they wander, one token repeated that the model continues with itself; "
        "the speed-up over the same strategy on that prompt (default: none)",
    )
    b.add_argument(
        "--assistant",
        default=None,
        metavar="SPEC",
        help="speculative rows with a draft model: self (the model as its own draft: every draft accepted), "
        "random (the model's shape, unrelated random weights: about none accepted), oracle or oracle:A (a "
        "one-layer draft that proposes the model's own greedy tokens, a share A of them right, A = 1 by default: "
        "the acceptance set by construction at almost no draft cost; oracle[:A]@MODEL: a draft of MODEL's shape, "
        "a name or directory of the same vocabulary, its LM head fitted so: the acceptance set, the draft cost "
        "MODEL's), or a model name or directory of the same vocabulary; with --prompt-lookup-loop its rows run on "
        "the looping prompt too (default: none)",
    )
    b.add_argument(
        "--num-assistant-tokens",
        default=None,
        metavar="K[,K...]",
        help="tokens the --assistant drafts a round, comma-separated (default: 4 with --assistant)",
    )
    add_quantize_flags(b)
    b.add_argument("--append", action="store_true", help="add to the results already in --out")
    _out_flag(
        b,
        "bench-out",
        "results.json, report.md, plots, worker logs",
        f"one an earlier bench wrote, which lists every file it made in {MANIFEST} and is only written again with "
        "--append (then only the files it lists are replaced)",
    )

    p = sub.add_parser("profile", help="profiler trace, timeline and GPU-idle summary per strategy")
    p.add_argument("--model", default=None, help="default: gpt2-random on CUDA, tiny-gpt2 on CPU")
    p.add_argument("--strategies", default="compiled,interleaved", help=f"comma-separated; {STRATEGY_HELP}")
    p.add_argument("--batch", type=int, default=1, help="batch size")
    p.add_argument("--new-tokens", type=int, default=64, help="new tokens per call (EOS disabled)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens (random ids)")
    p.add_argument("--dtype", default="float32", help=f"one of {', '.join(DTYPE_NAMES)}")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    _out_flag(
        p,
        "profile-out",
        "traces, timelines, summary",
        f"one an earlier profile left without a summary.json (it lists every file it made in {MANIFEST})",
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

    from ..bench.report.figures import mbu
    from ..bench.report.markdown import fmt, label
    from ..bench.report.report import _order, series

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


SPEC_COLUMNS = ("strategy", "drafts", "K", "acc.", "tok/rnd", "ms/tok", "vs plain")


def speculation_tables(rows) -> list:
    """The terminal's speculative rows: per (allocator, dtype, batch), at the longest length, a rich Table of each
    strategy, draft and K: the acceptance rate, tokens per round, ms/token and the speed-up over the same strategy
    without speculation (`!` where the timed calls' spread covers it)."""
    from rich.table import Table  # imported when the command runs, not for --help

    from ..bench.report.markdown import fmt
    from ..bench.report.speculation import spec_rows, speedup_text

    groups: dict = {}
    for r in spec_rows(rows):
        groups.setdefault((r["allocator"], r["dtype"], r["batch"]), []).append(r)
    out = []
    for (alloc, dtype, batch), members in sorted(groups.items()):
        n = max(r["max_new_tokens"] for r in members)
        where = f", allocator {alloc}" if alloc != "default" else ""
        table = Table(title=f"speculative, {dtype}, batch {batch}{where}, {n} new tokens")
        for i, name in enumerate(SPEC_COLUMNS):
            table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True)
        for r in sorted(members, key=lambda r: (r["strategy"], r["speculation"], r["k"])):
            if r["max_new_tokens"] != n:
                continue
            drafts = "lookup" if r["speculation"] == "prompt_lookup" else os.path.basename(str(r["assistant"]))
            if r.get("lookup_prompt") == "loop":  # prompt lookup's or the draft model's row on the looping prompt
                drafts += ", loop"
            table.add_row(
                r["strategy"],
                drafts,
                str(r["k"]),
                fmt(r.get("acceptance_rate"), "{:.2f}"),
                fmt(r.get("tokens_per_round"), "{:.2f}"),
                f"{r['ms_per_token']:.3f}",
                speedup_text(rows, r),
            )
        out.append(table)
    return out


def print_summary(results: dict, out_dir: str, file=None) -> None:
    """The tables, their warnings, on CPU the line that says what the run is worth, and where the report is;
    `file`: where to print (default stdout, at its width: 80 columns when piped unless COLUMNS says)."""
    from rich.console import Console  # imported when the command runs, not for --help

    from ..bench.report.report import CPU_TAKEAWAY, on_cpu

    console = Console(file=file)
    for table, warnings in summary_tables(results["rows"], results["config"]["model"]):
        console.print(table)
        for line in warnings:
            console.print(line, markup=False, highlight=False)
    for table in speculation_tables(results["rows"]):
        console.print(table)
    if on_cpu(results["rows"]):
        console.print(CPU_TAKEAWAY, markup=False, highlight=False)
    console.print(f"report: {out_dir}/report.md (results: {out_dir}/results.json)", markup=False, highlight=False)


@contextlib.contextmanager
def sigterm_ends_the_run():
    """While a run lasts, SIGTERM (a `timeout`, a job scheduler, `kill`) raises runner.Terminated in the main thread,
    which ends the run as Ctrl-C does: the workers stopped, the rows measured so far in results.json and the report.
    The handler before it comes back after. Off the main thread (where Python takes no handler) nothing changes."""
    from ..bench.runner import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminate(signum, frame):
        raise Terminated

    before = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def cmd_bench(args) -> int:
    from ..bench.runner import BenchError, BenchInterrupted, run_bench  # imported when the command runs, not for --help

    cfg = bench_config(args)
    try:
        with sigterm_ends_the_run():
            results = run_bench(cfg, args.out, _command(args), append=args.append)
    except BenchInterrupted as err:
        raise Interrupted(str(err), err.reason) from None
    except BenchError as err:
        raise CliError(str(err)) from None
    if results is None:  # a tensor-parallel rank other than 0: it measured in step with rank 0, which reports
        return 0
    print_summary(results, args.out)
    return 0


def cmd_profile(args) -> int:
    from ..bench.profile import profile_strategies  # imported when the command runs, not for --help

    if args.batch < 1 or args.new_tokens < 1 or args.prompt_len < 1:
        raise CliError("--batch, --new-tokens and --prompt-len must be >= 1")
    strategies = check_strategies(args.strategies, "--strategies", args.new_tokens)
    device = check_device(args.device)
    check_dtype(args.dtype, "--dtype")
    model = args.model or ("gpt2-random" if device.type == "cuda" else "tiny-gpt2")
    check_model_name(model)
    check_positions(model, args.prompt_len, args.new_tokens)
    check_out(args.out, "profile")  # as bench: an earlier measurement, or a file of the user's, is never replaced
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
    from ..bench.profile import rebuild
    from ..bench.report.report import build, gather, tp_probe_summary
    from ..bench.report.results import finalize, rows_files

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
