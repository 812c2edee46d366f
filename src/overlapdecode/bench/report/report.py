"""The benchmark's markdown report, DIR/report.md, built from DIR/results.json alone: the run and its machine,
the progression's claims (claims.py), the tables of every configuration, the early-stop and GPU busy tables,
and the plots (plots.py).

`overlapdecode report DIR` calls `build(DIR)`; the bench calls it at the end of a run. Nothing here
measures: every figure comes from the JSON, and every claim is stated with the figures it rests on.
"""

from __future__ import annotations

from . import outdir
from .claims import MIN_REPEATS, claims
from .figures import (
    at,
    exponents,
    first_call_overheads,
    largest_overhead,
    mbu,
    order,
    row_decode_ms,
    series,
    spread,
    timed,
)
from .figures import order as _order  # noqa: F401  (cli/bench.py's name for it)
from .gather import gather  # noqa: F401  (`overlapdecode report --markdown`, cli/bench.py)
from .markdown import fmt, label, table
from .plots import plots
from .results import load
from .speculation import plot as speculation_plot
from .speculation import section as speculation_section
from .tp_summary import tp_probe_summary  # noqa: F401  (cli/bench.py)

# what a run on CPU is worth, in one line: the terminal prints it under the tables, report.md under the claims
CPU_TAKEAWAY = (
    "On CPU: use `kv` (it starts at once; `compiled` and `interleaved` compile for tens of seconds per new shape "
    "first). These are CPU times, which move with the host's load; overlapdecode's speed claims are made on a "
    "CUDA GPU (the README's table)."
)


def on_cpu(rows) -> bool:
    """Whether a run measured nothing on a CUDA device."""
    return not any(str(r.get("device", "")).startswith("cuda") for r in rows)


def build(out_dir: str) -> str:
    """Write DIR/report.md and DIR/*.png from DIR/results.json; returns the report's path."""
    results = load(out_dir)
    outdir.may_write(out_dir, "report.md", "bench")  # before the plots: a refused report writes nothing
    rows = results["rows"]
    gpu_rows = [r for r in rows if r.get("device", "").startswith("cuda")]
    md = _header(results) + _claims(results, gpu_rows) + _configurations(rows) + _eos(rows) + _busy(rows)
    md += speculation_section(rows)
    md += ["", "## Plots", ""]
    for png, what in plots(results, out_dir) + speculation_plot(results, out_dir):
        md.append(f"![{what}]({png})")
    if not gpu_rows:
        md += ["", "No CUDA device: memory and GPU figures are unavailable, times are CPU times."]
    return outdir.write_text(out_dir, "report.md", "\n".join(md) + "\n", "bench")


def _header(results: dict) -> list[str]:
    """The command that made the run, its machine and versions, what each figure is, what was not measured."""
    rows = results["rows"]
    env = results["environment"]
    md = ["# overlapdecode benchmark report", ""]
    md.append("Made by: " + "; then ".join(f"`{c}`" for c in results["commands"]))
    md.append("")
    if results.get("interrupted"):
        md += [
            f"**Interrupted run**: its workers were stopped before the end ("
            f"{results.get('interrupted_reason') or 'the reason was not recorded'}); the rows below are "
            "those measured before that, and configurations missing from the tables were not measured.",
            "",
        ]
    if env.get("recorded") is False:
        md.append(f"Machine: not recorded in the JSON ({env.get('note')}).")
    else:
        md.append(
            f"Machine: {env.get('gpu') or 'CPU only'}; torch {env['torch']}, transformers {env['transformers']}, "
            f"CUDA {env.get('cuda')}, Python {env['python']}, commit {env['git_commit']}."
        )
    peer_versions = sorted({r["transformers"] for r in rows if r.get("kind") == "peer" and r.get("transformers")})
    if peer_versions:
        md.append(f"Hugging Face peers ran transformers {', '.join(peer_versions)} (recorded in every row).")
    cfg = results["config"]
    md.append(
        f"Model {cfg['model']}, prompt {cfg['prompt_len']} tokens, greedy; each figure is the median of "
        + " / ".join(
            sorted(
                {
                    f"{c['repeats']} timed calls after {c['warmup']} warm-up call(s)"
                    for c in results.get("configs", [cfg])
                }
            )
        )
        + " (the first call of each configuration is not timed with them: see `First-call overhead`); "
        "`spread` is (slowest - fastest) / median of the timed calls. "
        "Fragmentation = (peak reserved - peak allocated) / peak reserved. MBU (model-bandwidth utilisation) = "
        "weight bytes / the device's bandwidth, measured once per worker by a device-to-device copy (recorded "
        "in every row as `bandwidth_gbs`) / ms per token. ms/step = the decode step with the prefill excluded, "
        "measured as (the median call - the median one-token call, TTFT) / (new tokens - 1); toll us/layer = "
        "(ms/step - weight bytes / the measured bandwidth) / layers: what a step costs beyond reading its weights "
        "once, per layer; kernels/step = GPU kernels per decode step, counted by the PyTorch profiler over one call "
        "of the same configuration (the profile workload; CUDA only). `-`: not measured (no CUDA, no profile "
        "at that length, a Hugging Face peer's kernels, or a row recorded without its layer count)."
    )
    errors = [r for r in rows if "error" in r]
    if errors:
        md += [
            "",
            "Not measured: "
            + "; ".join(
                f"{r['strategy']} {r['dtype']} b{r['batch']} {r['workload']} n{r['max_new_tokens']} ({r['allocator']}): "
                f"{r['error']}"
                for r in errors
            ),
        ]
    return md


def _claims(results: dict, gpu_rows: list) -> list[str]:
    """The progression's steps, each a claim checked against this run's figures (claims.py)."""
    md = ["", "## The progression, checked against this run", ""]
    md += [
        "The progression: baseline (no cache: O(N^2) work), kv (a KV cache: O(N)), static (a static cache), "
        "compiled (torch.compile, CUDA graphs on a GPU), interleaved (the stop flag read a step late, the steps "
        "on two streams); each step is a claim about what it gains, stated below beside the Hugging Face peers "
        "and the allocators' fragmentation.",
        "",
    ]
    if not gpu_rows:
        md += [
            "This run is on CPU: the progression's steps past the KV cache are claims about a GPU (CUDA graphs, "
            "streams, the caching allocator), so they are not stated from it; each such line says so, with the "
            "figure it would rest on.",
            "",
            CPU_TAKEAWAY,
            "",
        ]
    md += [
        f"A claim is stated only where its figures carry it: at least {MIN_REPEATS} timed calls each, and a "
        "difference beyond the spread of those calls; otherwise the line says `not stated` and why.",
        "",
    ]
    return md + (claims(results) or ["- (not enough rows)"])


def _configurations(rows) -> list[str]:
    """Per (allocator, dtype, batch): ms per token per length, every figure at the longest length, and the
    first-call overheads."""
    md: list[str] = []
    for (alloc, dtype, batch), per in sorted(series(rows).items()):
        lengths = sorted({n for pts in per.values() for n, _ in pts})
        md += ["", f"## ms per token, fixed length (EOS disabled): {dtype}, batch {batch}, allocator {alloc}", ""]
        body = []
        for s in order(per):
            e_all, e_long = exponents(per[s])
            cells = [fmt(at(per[s], n)["ms_per_token"], "{:.3f}") if at(per[s], n) else "-" for n in lengths]
            body.append([label(per[s][0][1])] + cells + [fmt(e_all), fmt(e_long)])
        md.append(table(["strategy"] + [f"N={n}" for n in lengths] + ["exponent", "exponent (last two)"], body))
        md += [
            "",
            "exponent: of time against new tokens, 1 for O(N), 2 for O(N^2); `within noise` where the timed calls "
            "allow 0 or below (no growth at all) or the fit is negative.",
        ]
        n = lengths[-1]
        base = at(per.get("baseline", []), n)
        md += ["", f"At N={n} (`!`: a speed-up within the spread of the row's or the baseline's timed calls):", ""]
        body = []
        for s in order(per):
            r = at(per[s], n)
            if not r:
                continue
            frag = r.get("fragmentation")
            body.append(
                [
                    label(r),
                    fmt(r["seq_s"], "{:.3f}"),
                    fmt(r["ms_per_token"], "{:.3f}"),
                    fmt(r["tokens_per_s"], "{:.0f}"),
                    f"{spread(r) * 100:.0f}%",
                    fmt(r["ttft_ms"], "{:.2f}"),
                    _speed_up(r, base),
                    fmt(r.get("peak_allocated_mb"), "{:.0f}"),
                    fmt(r.get("peak_reserved_mb"), "{:.0f}"),
                    fmt(frag and frag * 100, "{:.1f}%"),
                    fmt(r.get("device_mallocs"), "{}"),
                    fmt(r.get("alloc_requests"), "{}"),
                    fmt(mbu(r), "{:.0%}"),
                    fmt(row_decode_ms(r), "{:.3f}"),
                    fmt(r.get("toll_us_per_layer"), "{:.1f}"),
                    fmt(r.get("kernels_per_step"), "{:.0f}"),
                ]
            )
        md.append(
            table(
                [
                    "strategy",
                    "s/seq",
                    "ms/token",
                    "tok/s",
                    "spread",
                    "TTFT ms",
                    "vs baseline",
                    "peak alloc MB",
                    "peak reserved MB",
                    "fragmentation",
                    "cudaMalloc calls",
                    "alloc requests",
                    "MBU",
                    "ms/step",
                    "toll us/layer",
                    "kernels/step",
                ],
                body,
            )
        )
        over = first_call_overheads(per)
        md += [
            "",
            f"First-call overhead (compile, CUDA-graph recording, warm-up) = first call - median timed call, "
            f"in seconds, per length: a process compiles a shape once, at the first configuration that meets "
            f"it, so the largest figure of a strategy is its compile time here; `within noise` where it is no "
            f"more than the timed calls' own range, slowest - fastest ({dtype}, batch {batch}, allocator {alloc}):",
            "",
        ]
        body = [
            [label(per[s][0][1])]
            + [fmt(dict(over[s]).get(m), "{:.2f}") for m in lengths]
            + [fmt(largest_overhead(over[s]), "{:.2f}")]
            for s in order(per)
        ]
        md.append(table(["strategy"] + [f"N={m}" for m in lengths] + ["largest (compile)"], body))

    return md


def _speed_up(r: dict, base: dict | None) -> str:
    """The baseline's time / the row's, with a `!` where the spread of the row's or the baseline's timed calls
    covers the difference (as the terminal table marks it)."""
    if not base:
        return "-"
    ratio = base["seq_s"] / r["seq_s"]
    unresolved = r is not base and abs(ratio - 1) <= max(spread(r), spread(base))
    return f"{ratio:.2f}x" + (" !" if unresolved else "")


def _eos(rows) -> list[str]:
    md: list[str] = []
    eos = timed(rows, "eos")
    if eos:
        md += ["", "## EOS forced per row (early stop exercised)", ""]
        body = [
            [
                r["allocator"],
                r["dtype"],
                r["batch"],
                r["max_new_tokens"],
                label(r),
                r["new_tokens"],
                fmt(r["seq_s"], "{:.3f}"),
                fmt(r["ms_per_token"], "{:.3f}"),
            ]
            for r in sorted(eos, key=lambda r: (r["allocator"], r["dtype"], r["batch"], order([r["strategy"]])[0]))
        ]
        md.append(table(["allocator", "dtype", "batch", "max new", "strategy", "steps run", "s/seq", "ms/token"], body))

    return md


def _busy(rows) -> list[str]:
    md: list[str] = []
    busy = [r for r in rows if r.get("workload") == "profile" and "busy" in r]
    if busy:
        md += ["", "## GPU busy fraction over the decode loop (PyTorch profiler, one call)", ""]
        body = []
        for r in busy:
            b = r["busy"]
            if b.get("available") and b.get("decode_steps") is None:  # a peer: whole call, prefill included
                body.append(
                    [
                        r["allocator"],
                        r["dtype"],
                        r["batch"],
                        label(r),
                        f"{b['busy_fraction'] * 100:.1f}% (whole call)",
                        "-",
                        f"{b['host_sync_ms']:.2f}",
                        "-",
                        "-",
                    ]
                )
            elif b.get("available"):
                fed = f" (fed {b['fed_fraction'] * 100:.1f}%)" if "fed_fraction" in b else ""
                body.append(
                    [
                        r["allocator"],
                        r["dtype"],
                        r["batch"],
                        label(r),
                        f"{b['busy_fraction'] * 100:.1f}%{fed}",
                        f"{b['median_idle_gap_us']:.1f}",
                        f"{b['host_sync_ms']:.2f}",
                        f"{b['launches_per_step']:.1f}",
                        f"{b['kernels_per_step']:.1f}",
                    ]
                )
            else:
                body.append(
                    [
                        r["allocator"],
                        r["dtype"],
                        r["batch"],
                        label(r),
                        "unavailable: " + b["reason"],
                        "-",
                        "-",
                        "-",
                        "-",
                    ]
                )
        md.append(
            table(
                [
                    "allocator",
                    "dtype",
                    "batch",
                    "strategy",
                    "GPU busy",
                    "median idle gap us",
                    "host blocked ms",
                    "launch calls/step",
                    "kernels/step",
                ],
                body,
            )
        )
    return md
