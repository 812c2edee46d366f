"""Tables, plots and the check of the brief's claims, built from DIR/results.json alone.

`overlapdecode report DIR` calls `build(DIR)`; the bench calls it at the end of a run. Nothing here
measures: every figure comes from the JSON, and every claim is stated with the figures it rests on.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import defaultdict

from .peers import label
from .results import load

ORDER = ["baseline", "kv", "static", "compiled", "deferred", "interleaved", "nocheck", "hf-dynamic", "hf-static",
         "hf-compiled"]


def _order(names):
    return sorted(set(names), key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def timed(rows, workload="fixed"):
    return [r for r in rows if r.get("workload") == workload and "seq_s" in r]


def fit_exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(time) against log(N): about 1 for O(N), 2 for O(N^2)."""
    pts = [(math.log(n), math.log(t)) for n, t in points if n > 0 and t > 0]
    if len(pts) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    den = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / den if den else None


def series(rows) -> dict:
    """(allocator, dtype, batch) -> strategy -> sorted [(length, row)] for the fixed workload."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for r in timed(rows):
        out[(r["allocator"], r["dtype"], r["batch"])][r["strategy"]].append((r["max_new_tokens"], r))
    for per in out.values():
        for s in per:
            per[s].sort(key=lambda p: p[0])
    return out


def exponents(points) -> tuple[float | None, float | None]:
    """(over all lengths, over the two longest lengths)."""
    xy = [(n, r["seq_s"]) for n, r in points]
    return fit_exponent(xy), fit_exponent(xy[-2:])


def _f(v, fmt="{:.2f}", none="-"):
    return none if v is None else fmt.format(v)


def _table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _at(points, n):
    for m, r in points:
        if m == n:
            return r
    return None


def _nearest(lengths, target):
    return min(lengths, key=lambda n: abs(n - target)) if lengths else None


def mbu(row) -> float | None:
    """Model-bandwidth utilisation: weight bytes / the device's measured bandwidth / time per step (None
    without both figures, e.g. on CPU)."""
    if not row.get("weight_bytes") or not row.get("bandwidth_gbs") or not row.get("ms_per_token"):
        return None
    return row["weight_bytes"] / (row["bandwidth_gbs"] * 1e9) / (row["ms_per_token"] / 1e3)


def _spread(row) -> float:
    """(slowest - fastest) / median of a row's timed calls: how far apart two medians must be to mean anything."""
    times = row.get("seq_s_all") or [row["seq_s"]]
    return (max(times) - min(times)) / row["seq_s"]


# A claim rests on at least this many timed calls per figure: with fewer, the spread says nothing.
MIN_REPEATS = 3


def _repeats(row) -> int:
    return len(row.get("seq_s_all") or [row["seq_s"]])


def _on_gpu(*rows) -> bool:
    return all(str(r.get("device", "")).startswith("cuda") for r in rows)


def _why_not(slow, fast, gpu_claim: bool = True) -> str | None:
    """Why the ratio slow/fast cannot carry a claim (None: it can): a CPU run for a GPU claim, too few timed
    calls, or a difference inside the spread of the timed calls."""
    if gpu_claim and not _on_gpu(slow, fast):
        return "measured on CPU, and the claim is about a GPU"
    n = min(_repeats(slow), _repeats(fast))
    if n < MIN_REPEATS:
        return f"{n} timed call(s) per figure, fewer than the {MIN_REPEATS} needed to know the spread"
    ratio, noise = slow["seq_s"] / fast["seq_s"], max(_spread(slow), _spread(fast))
    if abs(ratio - 1) <= noise:
        return f"the difference ({(ratio - 1) * 100:+.1f}%) is within the spread of the timed calls ({noise * 100:.0f}%)"
    return None


def _ratio_claim(label: str, ratio_text: str, why: str | None) -> str:
    return f"- {label}: {ratio_text}." if why is None else f"- {label}: not stated: {why} ({ratio_text})."


def exponent_range(points) -> tuple[float, float] | None:
    """(lowest, highest) exponent between the shortest and the longest length that the timed calls allow."""
    (n0, r0), (n1, r1) = points[0], points[-1]
    if n1 <= n0:
        return None
    t0, t1 = r0.get("seq_s_all") or [r0["seq_s"]], r1.get("seq_s_all") or [r1["seq_s"]]
    span = math.log(n1 / n0)
    return math.log(min(t1) / max(t0)) / span, math.log(max(t1) / min(t0)) / span


def claims(results: dict) -> list[str]:
    """The brief's claims, each stated only where this run's figures carry it: enough timed calls, a
    difference beyond their spread, and a GPU for the claims about a GPU; otherwise the line says why not."""
    rows = results["rows"]
    ser = series(rows)
    out = []
    for (alloc, dtype, batch), per in sorted(ser.items()):
        if alloc != "default":
            continue
        tag = f"{dtype}, batch {batch}"
        lengths = sorted({n for pts in per.values() for n, _ in pts})
        if not lengths:
            continue
        longest, shortest = lengths[-1], lengths[0]
        if "baseline" in per and "kv" in per and len(per["baseline"]) > 1 and len(per["kv"]) > 1:
            b_all, b_long = exponents(per["baseline"])
            k_all, k_long = exponents(per["kv"])
            b_rng, k_rng = exponent_range(per["baseline"]), exponent_range(per["kv"])
            text = (f"time-vs-N exponent over {shortest}-{longest} tokens: baseline {_f(b_all)} (last two lengths "
                    f"{_f(b_long)}; the timed calls allow {b_rng[0]:.2f} to {b_rng[1]:.2f}), kv {_f(k_all)} (last two "
                    f"{_f(k_long)}; {k_rng[0]:.2f} to {k_rng[1]:.2f})")
            rows_used = [r for _, r in per["baseline"] + per["kv"]]
            n = min(_repeats(r) for r in rows_used)
            why = None
            if n < MIN_REPEATS:
                why = f"{n} timed call(s) per figure, fewer than the {MIN_REPEATS} needed to know the spread"
            elif b_rng[0] <= k_rng[1]:
                why = "the exponents' ranges overlap: the baseline is not shown to grow faster than kv"
            out.append(_ratio_claim(f"O(N^2) vs O(N) ({tag})", text, why))
        if "static" in per and "kv" in per:
            s2, k2 = _at(per["static"], longest), _at(per["kv"], longest)
            if s2 and k2:
                out.append(_ratio_claim(f"static vs dynamic cache, no compile ({tag}, {longest} tokens)",
                                        f"static/kv time = {s2['seq_s'] / k2['seq_s']:.2f} (< 1: static faster)",
                                        _why_not(s2, k2)))
        if "compiled" in per and "static" in per:
            c, st = _at(per["compiled"], longest), _at(per["static"], longest)
            if c and st:
                out.append(_ratio_claim(f"compile ({tag}, {longest} tokens)",
                                        f"compiled is {st['seq_s'] / c['seq_s']:.2f}x static", _why_not(st, c)))
        if "hf-compiled" in per and "hf-static" in per:
            c, st = _at(per["hf-compiled"], longest), _at(per["hf-static"], longest)
            if c and st:
                out.append(_ratio_claim(f"Hugging Face auto-compile ({tag}, {longest} tokens)",
                                        f"hf-compiled is {st['seq_s'] / c['seq_s']:.2f}x hf-static", _why_not(st, c)))
        n400 = _nearest(lengths, 400)
        inter = _at(per.get("interleaved", []), n400)
        if inter:
            label = f"interleaved ({tag}, {n400} tokens, {inter['ms_per_token']:.3f} ms/token)"
            for other, what in (("baseline", "baseline"), ("compiled", "compiled (sync check)")):
                r = _at(per.get(other, []), n400)
                if r:
                    out.append(_ratio_claim(f"{label} vs {other}", f"{r['seq_s'] / inter['seq_s']:.2f}x {what}",
                                            _why_not(r, inter)))
            upper = _at(per.get("nocheck", []), n400)
            if upper:
                gap = inter["seq_s"] / upper["seq_s"] - 1
                why = _why_not(inter, upper)
                text = f"{gap * 100:+.1f}% vs the no-check upper bound"
                # "as fast as the upper bound" is the claim here: a gap inside the spread supports it
                if why is not None and why.startswith("the difference"):
                    out.append(f"- {label} vs nocheck: {text}, within the spread of the timed calls "
                               f"({max(_spread(inter), _spread(upper)) * 100:.0f}%): no cost of the check resolved.")
                else:
                    out.append(_ratio_claim(f"{label} vs nocheck", text, why))
            peers = [(p, _at(per[p], n400)) for p in per if p.startswith("hf-") and _at(per[p], n400)]
            if peers:
                best, row = min(peers, key=lambda pr: pr[1]["seq_s"])
                version = row.get("transformers")
                out.append(_ratio_claim(
                    f"{label} vs the fastest Hugging Face peer",
                    f"{row['seq_s'] / inter['seq_s']:.2f}x {best}" + (f" (transformers {version})" if version else ""),
                    _why_not(row, inter)))
    # fragmentation: per strategy and allocator, at the one length where most of them were measured (GPU only:
    # the CPU has no caching allocator, and its rows carry no memory figures)
    mem = [r for r in timed(rows) if r.get("fragmentation") is not None]
    presets = ("baseline", "kv", "static", "compiled", "interleaved")
    for dtype, batch in sorted({(r["dtype"], r["batch"]) for r in mem}):
        sub = [r for r in mem if (r["dtype"], r["batch"]) == (dtype, batch) and r["strategy"] in presets]
        if not sub:
            continue
        n = max({r["max_new_tokens"] for r in sub}, key=lambda m: (sum(r["max_new_tokens"] == m for r in sub), m))
        for strat in presets:
            parts = [
                f"{r['allocator']}: reserved {r['peak_reserved_mb']:.0f} MB vs allocated {r['peak_allocated_mb']:.0f} MB "
                f"({r['fragmentation'] * 100:.1f}%)"
                for r in sorted(sub, key=lambda r: r["allocator"]) if r["strategy"] == strat and r["max_new_tokens"] == n
            ]
            if parts:
                out.append(f"- fragmentation, {strat} ({dtype}, batch {batch}, {n} tokens, one measured call): "
                           + "; ".join(parts) + ".")
    return out


def first_call_overheads(per: dict) -> dict:
    """strategy -> [(length, first call - median timed call)]: compile, CUDA-graph recording and warm-up.

    A process compiles a shape once, at the first configuration that meets it, so the overhead shows at one
    length and not at the others; the largest of them is the strategy's compile time in this run."""
    return {s: [(n, r["first_call_s"] - r["seq_s"]) for n, r in pts] for s, pts in per.items()}


def build(out_dir: str) -> str:
    """Write DIR/report.md and DIR/*.png from DIR/results.json; returns the report's path."""
    results = load(out_dir)
    rows = results["rows"]
    env = results["environment"]
    gpu_rows = [r for r in rows if r.get("device", "").startswith("cuda")]
    md = ["# overlapdecode benchmark report", ""]
    md.append("Made by: " + "; then ".join(f"`{c}`" for c in results["commands"]))
    md.append("")
    if results.get("interrupted"):
        md += [f"**Interrupted run**: its workers were stopped before the end ("
               f"{results.get('interrupted_reason') or 'the reason was not recorded'}); the rows below are "
               "those measured before that, and configurations missing from the tables were not measured.", ""]
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
        + " / ".join(sorted({f"{c['repeats']} timed calls after {c['warmup']} warm-up call(s)"
                             for c in results.get("configs", [cfg])}))
        + " (the first call of each configuration is not timed with them: see `First-call overhead`); "
        "`spread` is (slowest - fastest) / median of the timed calls. "
        "Fragmentation = (peak reserved - peak allocated) / peak reserved. MBU (model-bandwidth utilisation) = "
        "weight bytes / the device's bandwidth, measured once per worker by a device-to-device copy (recorded "
        "in every row as `bandwidth_gbs`) / ms per token."
    )
    errors = [r for r in rows if "error" in r]
    if errors:
        md += ["", "Not measured: " + "; ".join(
            f"{r['strategy']} {r['dtype']} b{r['batch']} {r['workload']} n{r['max_new_tokens']} ({r['allocator']}): "
            f"{r['error']}" for r in errors)]
    md += ["", "## The brief's claims, checked against this run", ""]
    if not gpu_rows:
        md += ["This run is on CPU: the brief's claims are about a GPU (CUDA graphs, streams, the caching "
               "allocator), so none of them is stated from it; each line below says so, with the figure it would "
               "rest on.", ""]
    md += [f"A claim is stated only where its figures carry it: at least {MIN_REPEATS} timed calls each, and a "
           "difference beyond the spread of those calls; otherwise the line says `not stated` and why.", ""]
    md += claims(results) or ["- (not enough rows)"]

    ser = series(rows)
    for (alloc, dtype, batch), per in sorted(ser.items()):
        lengths = sorted({n for pts in per.values() for n, _ in pts})
        md += ["", f"## ms per token, fixed length (EOS disabled): {dtype}, batch {batch}, allocator {alloc}", ""]
        body = []
        for s in _order(per):
            e_all, e_long = exponents(per[s])
            cells = [_f(_at(per[s], n)["ms_per_token"], "{:.3f}") if _at(per[s], n) else "-" for n in lengths]
            body.append([label(per[s][0][1])] + cells + [_f(e_all), _f(e_long)])
        md.append(_table(["strategy"] + [f"N={n}" for n in lengths] + ["exponent", "exponent (last two)"], body))
        n = lengths[-1]
        base = _at(per.get("baseline", []), n)
        md += ["", f"At N={n}:", ""]
        body = []
        for s in _order(per):
            r = _at(per[s], n)
            if not r:
                continue
            frag = r.get("fragmentation")
            body.append([
                label(r), _f(r["seq_s"], "{:.3f}"), _f(r["ms_per_token"], "{:.3f}"), _f(r["tokens_per_s"], "{:.0f}"),
                f"{_spread(r) * 100:.0f}%", _f(r["ttft_ms"], "{:.2f}"),
                _f(base["seq_s"] / r["seq_s"], "{:.2f}x") if base else "-",
                _f(r.get("peak_allocated_mb"), "{:.0f}"), _f(r.get("peak_reserved_mb"), "{:.0f}"),
                _f(frag and frag * 100, "{:.1f}%"), _f(r.get("device_mallocs"), "{}"),
                _f(r.get("alloc_requests"), "{}"), _f(mbu(r), "{:.0%}"),
            ])
        md.append(_table(["strategy", "s/seq", "ms/token", "tok/s", "spread", "TTFT ms", "vs baseline",
                          "peak alloc MB", "peak reserved MB", "fragmentation", "cudaMalloc calls",
                          "alloc requests", "MBU"], body))
        over = first_call_overheads(per)
        md += ["", f"First-call overhead (compile, CUDA-graph recording, warm-up) = first call - median timed call, "
                   f"in seconds, per length: a process compiles a shape once, at the first configuration that meets "
                   f"it, so the largest figure of a strategy is its compile time here ({dtype}, batch {batch}, "
                   f"allocator {alloc}):", ""]
        body = [[label(per[s][0][1])] + [_f(dict(over[s]).get(m), "{:.2f}") for m in lengths]
                + [_f(max(v for _, v in over[s]), "{:.2f}")] for s in _order(per)]
        md.append(_table(["strategy"] + [f"N={m}" for m in lengths] + ["largest (compile)"], body))

    eos = timed(rows, "eos")
    if eos:
        md += ["", "## EOS forced per row (early stop exercised)", ""]
        body = [[r["allocator"], r["dtype"], r["batch"], r["max_new_tokens"], label(r), r["new_tokens"],
                 _f(r["seq_s"], "{:.3f}"), _f(r["ms_per_token"], "{:.3f}")] for r in
                sorted(eos, key=lambda r: (r["allocator"], r["dtype"], r["batch"], _order([r["strategy"]])[0]))]
        md.append(_table(["allocator", "dtype", "batch", "max new", "strategy", "steps run", "s/seq", "ms/token"],
                         body))

    busy = [r for r in rows if r.get("workload") == "profile" and "busy" in r]
    if busy:
        md += ["", "## GPU busy fraction over the decode loop (PyTorch profiler, one call)", ""]
        body = []
        for r in busy:
            b = r["busy"]
            if b.get("available") and b.get("decode_steps") is None:  # a peer: whole call, prefill included
                body.append([r["allocator"], r["dtype"], r["batch"], label(r),
                             f"{b['busy_fraction'] * 100:.1f}% (whole call)", "-", f"{b['host_sync_ms']:.2f}", "-",
                             "-"])
            elif b.get("available"):
                fed = f" (fed {b['fed_fraction'] * 100:.1f}%)" if "fed_fraction" in b else ""
                body.append([r["allocator"], r["dtype"], r["batch"], label(r),
                             f"{b['busy_fraction'] * 100:.1f}%{fed}",
                             f"{b['median_idle_gap_us']:.1f}", f"{b['host_sync_ms']:.2f}",
                             f"{b['launches_per_step']:.1f}", f"{b['kernels_per_step']:.1f}"])
            else:
                body.append([r["allocator"], r["dtype"], r["batch"], label(r), "unavailable: " + b["reason"],
                             "-", "-", "-", "-"])
        md.append(_table(["allocator", "dtype", "batch", "strategy", "GPU busy", "median idle gap us",
                          "host blocked ms", "launch calls/step", "kernels/step"], body))

    md += ["", "## Plots", ""]
    for png, what in plots(results, out_dir):
        md.append(f"![{what}]({png})")
    if not gpu_rows:
        md += ["", "No CUDA device: memory and GPU figures are unavailable, times are CPU times."]
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    return path


def _save(fig, axes, out_dir: str, name: str) -> None:
    """One legend for the figure, outside the axes (never over the data)."""
    import matplotlib.pyplot as plt

    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, name), dpi=110, bbox_inches="tight")
    plt.close(fig)


def _log_ticks_at(ax, xs, axis="x") -> None:
    """Log axis ticks exactly at the measured lengths, written as plain numbers (no 2x10^1)."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(FixedLocator(sorted(xs)))
    target.set_major_formatter(ScalarFormatter())
    target.set_minor_locator(NullLocator())


def _err(rows) -> list[list[float]]:
    """Asymmetric error bars (below, above the median) from each row's fastest and slowest timed call."""
    lo = [r["seq_s"] - min(r.get("seq_s_all") or [r["seq_s"]]) for r in rows]
    hi = [max(r.get("seq_s_all") or [r["seq_s"]]) - r["seq_s"] for r in rows]
    return [lo, hi]


def plots(results: dict, out_dir: str) -> list[tuple[str, str]]:
    import matplotlib  # slow to import: only when plots are drawn (a report rebuilt from JSON needs nothing else)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    ser = {k: v for k, v in series(rows).items() if k[0] == "default"} or series(rows)
    written = []
    if not ser:
        return written
    keys = sorted(ser)
    names = _order(s for per in ser.values() for s in per)  # one colour per strategy in every plot
    colour = {s: f"C{i % 10}" for i, s in enumerate(names)}

    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        per = ser[key]
        lengths = sorted({n for pts in per.values() for n, _ in pts})
        for s in _order(per):
            pts = per[s]
            ax.errorbar([n for n, _ in pts], [r["seq_s"] for _, r in pts], yerr=_err([r for _, r in pts]),
                        marker="o", markersize=4, capsize=3, label=s, color=colour[s],
                        linestyle="--" if s.startswith("hf-") else "-")
        ref = per.get("kv") or next(iter(per.values()))
        t0, n0 = ref[0][1]["seq_s"], ref[0][0]
        ax.plot(lengths, [t0 * (n / n0) for n in lengths], color="grey", linestyle=":", label="O(N) guide")
        ax.plot(lengths, [t0 * (n / n0) ** 2 for n in lengths], color="black", linestyle=":", label="O(N^2) guide")
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_ticks_at(ax, lengths)
        ax.set_xlabel("new tokens N (ticks at the measured lengths)")
        ax.set_ylabel("seconds per sequence (bars: fastest-slowest call)")
        ax.set_title(f"{key[1]}, batch {key[2]}, allocator {key[0]}")
    _save(fig, axes, out_dir, "time_vs_length.png")
    written.append(("time_vs_length.png", "time per sequence vs N, log-log, with O(N) and O(N^2) guides; error bars: "
                                          "fastest and slowest timed call"))

    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        per = ser[key]
        lengths = sorted({n for pts in per.values() for n, _ in pts})
        if "baseline" not in per:
            ax.text(0.5, 0.5, "no baseline in this run", ha="center", transform=ax.transAxes)
            continue
        others = [s for s in _order(per) if s != "baseline"]
        width = 0.8 / max(len(lengths), 1)
        for i, n in enumerate(lengths):
            base = _at(per["baseline"], n)
            vals, lo, hi = [], [], []
            for s in others:
                r = _at(per[s], n)
                if not (base and r):
                    vals.append(0), lo.append(0), hi.append(0)
                    continue
                v = base["seq_s"] / r["seq_s"]
                b_all, r_all = base.get("seq_s_all") or [base["seq_s"]], r.get("seq_s_all") or [r["seq_s"]]
                vals.append(v)  # bars: the ratio's range over the fastest/slowest calls of both
                lo.append(v - min(b_all) / max(r_all))
                hi.append(max(b_all) / min(r_all) - v)
            ax.bar([j + i * width for j in range(len(others))], vals, width, yerr=[lo, hi], capsize=2,
                   label=f"N={n}", color=f"C{i % 10}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(others))], others, rotation=45, ha="right", fontsize=8)
        ax.axhline(1, color="grey", linewidth=0.8)
        ax.set_ylabel("speed-up over baseline (x); bars: range")
        ax.set_title(f"{key[1]}, batch {key[2]}")
    _save(fig, axes, out_dir, "speedup.png")
    written.append(("speedup.png", "speed-up over baseline per preset and peer; error bars: the range the fastest and "
                                   "slowest timed calls allow"))

    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        over = first_call_overheads(ser[key])
        order = _order(over)
        ax.bar(range(len(order)), [max(0.0, max(v for _, v in over[s])) for s in order],
               color=[colour[s] for s in order])
        ax.set_xticks(range(len(order)), order, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("compile time: largest first-call overhead (s)")
        ax.set_title(f"{key[1]}, batch {key[2]}, allocator {key[0]}")
    _save(fig, axes, out_dir, "compile.png")
    written.append(("compile.png", "compile time per strategy: the largest (first call - median timed call) over "
                                   "its lengths"))

    mem = [r for r in timed(rows) if r.get("peak_reserved_mb") is not None]
    if mem:
        mkeys = sorted({(r["dtype"], r["batch"]) for r in mem})
        fig, axes = plt.subplots(1, len(mkeys), figsize=(6 * len(mkeys), 4.2), squeeze=False)
        for ax, (dtype, batch) in zip(axes[0], mkeys):
            sub = [r for r in mem if r["dtype"] == dtype and r["batch"] == batch]
            n = max(r["max_new_tokens"] for r in sub)
            sub = [r for r in sub if r["max_new_tokens"] == n]
            allocs = sorted({r["allocator"] for r in sub})
            strategies = _order(r["strategy"] for r in sub)
            width = 0.8 / (2 * len(allocs))
            for i, a in enumerate(allocs):
                by = {r["strategy"]: r for r in sub if r["allocator"] == a}
                xs = range(len(strategies))
                ax.bar([x + (2 * i) * width for x in xs],
                       [by[s]["peak_reserved_mb"] if s in by else 0 for s in strategies], width,
                       label=f"reserved ({a})")
                ax.bar([x + (2 * i + 1) * width for x in xs],
                       [by[s]["peak_allocated_mb"] if s in by else 0 for s in strategies], width,
                       label=f"allocated ({a})")
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(strategies))], strategies, rotation=45, ha="right",
                          fontsize=8)
            ax.set_ylabel("MB at peak")
            ax.set_title(f"peak memory, {dtype}, batch {batch}, N={n}")
        _save(fig, axes, out_dir, "memory.png")
        written.append(("memory.png", "peak reserved vs allocated per preset and allocator"))

    # the busy chart only where a GPU trace gave figures: on CPU it would be an empty chart of "n/a"
    busy = [r for r in rows if r.get("workload") == "profile" and "busy" in r]
    if any(r["busy"].get("available") for r in busy):
        bkeys = sorted({(r["allocator"], r["dtype"], r["batch"]) for r in busy})
        fig, axes = plt.subplots(1, len(bkeys), figsize=(5.5 * len(bkeys), 4.2), squeeze=False)
        for ax, key in zip(axes[0], bkeys):
            sub = {r["strategy"]: r["busy"] for r in busy if (r["allocator"], r["dtype"], r["batch"]) == key}
            order = _order(sub)
            vals = [sub[s]["busy_fraction"] * 100 if sub[s].get("available") else 0 for s in order]
            ax.bar(range(len(order)), vals, color="#2ca02c")
            for x, s in enumerate(order):
                if not sub[s].get("available"):
                    ax.text(x, 2, "n/a", ha="center", fontsize=7, rotation=90)
            ax.set_xticks(range(len(order)), order, rotation=45, ha="right", fontsize=8)
            ax.set_ylim(0, 100)
            ax.set_ylabel("GPU busy over the decode loop (%)")
            ax.set_title(f"{key[1]}, batch {key[2]}, allocator {key[0]}")
        _save(fig, axes, out_dir, "busy.png")
        written.append(("busy.png", "GPU busy fraction per preset and peer"))
    return written


def tp_probe_summary(d: str) -> str | None:
    """Markdown tables of the scripts/tp_probe.py results (JSON with `env` and `parts`) in directory `d`,
    or None if it holds none: tokens of tp=2 against tp=1 (equal), ms/token of tp=1 and tp=2 (speed), and
    the big model's ms/token, weight bytes per GPU and MBU (big)."""
    files = []
    if not os.path.isdir(d):
        return None
    for name in sorted(os.listdir(d)):
        if name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                data = json.load(f)
            if isinstance(data, dict) and "parts" in data and "env" in data:
                files.append((name, data))
    if not files:
        return None
    out = ["Written by `scripts/tp_probe.py` (two GPUs of one host, torchrun); ms/token = the whole call / new "
           "tokens, decode = (call of N - call of 1) / (N - 1); MBU = bytes read per token per GPU / its time / "
           "the 4.8 TB/s spec, and against the device copy the probe measured."]
    for name, data in files:
        env, parts = data["env"], data["parts"]
        out += ["", f"### `{name}`", "", f"Command: `{' '.join(env.get('argv', []))}`; commit {env.get('commit')}, "
                f"torch {env.get('torch')}, {env.get('gpu')}, NCCL {env.get('nccl')}."]
        if not parts:
            out += ["", "No part finished (the probe was stopped before writing a result)."]
        eq = parts.get("equal")
        if eq:
            rows = [[k, v.get("equal_tp1"), v.get("ranks_agree")] for k, v in eq.items() if isinstance(v, dict)]
            out += ["", f"equal: {eq.get('model')} {eq.get('dtype')}, {eq.get('new_tokens')} new tokens", "",
                    _table(["strategy", "tp=2 tokens = tp=1", "ranks agree"], rows)]
        sp = parts.get("speed")
        if sp and "tp1" in sp and "tp2" in sp:
            rows = [[k, sp[k]["strategy"], _f(sp[k]["ms_per_token"], "{:.3f}"), _f(sp[k]["decode_ms_per_token"], "{:.3f}"),
                     _f(sp[k]["weight_bytes_per_gpu"] / 1e9, "{:.2f}")] for k in ("tp1", "tp2")]
            out += ["", f"speed: {sp.get('model')} {sp.get('dtype')}, batch {sp.get('batch')}; tp=2 / tp=1 = "
                    f"{_f(sp.get('ratio_ms_per_token'), '{:.2f}')} (decode {_f(sp.get('ratio_decode_ms_per_token'), '{:.2f}')})",
                    "", _table(["tp", "strategy", "ms/token", "decode ms/token", "weights GB per GPU"], rows)]
        big = parts.get("big")
        if big and "ms_per_token" in big:
            rows = [[big["strategy"], big["tp"], big["new_tokens"], _f(big["ms_per_token"], "{:.2f}"),
                     _f(big["weight_bytes_per_gpu"] / 1e9, "{:.1f}"), _f(100 * big["mbu_ms_per_token"], "{:.0f}%"),
                     _f(100 * big["mbu_vs_copy_ms_per_token"], "{:.0f}%"), _f(big["first_call_s"], "{:.0f}")]]
            out += ["", f"big: {big.get('model')} {big.get('dtype')}, batch {big.get('batch')}", "",
                    _table(["strategy", "tp", "new tokens", "ms/token", "weights GB per GPU", "MBU (spec)",
                            "MBU (copy)", "first call s"], rows)]
    return "\n".join(out) + "\n"


def gather(dirs: list[str], path: str, command: str) -> None:
    """One markdown file holding every directory's report (bench), summary (profile) or tensor-parallel
    probe results (scripts/tp_probe.py JSON), links rebased."""
    base = os.path.dirname(os.path.abspath(path))
    parts = [
        "# Benchmarks",
        "",
        f"Generated by `{command}` from the JSON in each directory below; nothing here is typed by hand. "
        "Each section names the command that measured it.",
    ]
    parents = {os.path.dirname(os.path.abspath(d)) for d in dirs}
    notes = os.path.join(parents.pop(), "README.md") if len(parents) == 1 else None
    if notes and os.path.exists(notes):  # the hand-written notes beside the directories: commits, what did not run
        parts += ["", f"What each directory is, the commit it ran at, what did not run and how to read the figures: "
                      f"[{os.path.relpath(notes, base)}]({os.path.relpath(notes, base)})."]
    for d in dirs:
        rel = os.path.relpath(os.path.abspath(d), base)
        tp_text = None if os.path.exists(os.path.join(d, "results.json")) else tp_probe_summary(d)
        if tp_text is not None:
            text = tp_text
        else:
            name = "report.md" if os.path.exists(os.path.join(d, "results.json")) else "summary.md"
            with open(os.path.join(d, name)) as f:
                text = f.read()
        text = re.sub(r"^(#+) ", lambda m: "#" + m.group(1) + " ", text, flags=re.M)  # one level down
        text = re.sub(r"\]\((?!https?:)([^)]+)\)", lambda m: f"]({rel}/{m.group(1)})", text)
        text = re.sub(r"\| (trace-[^ |]+) \|", lambda m: f"| [{m.group(1)}]({rel}/{m.group(1)}) |", text)
        parts += ["", f"## `{rel}`", "", text]
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")
