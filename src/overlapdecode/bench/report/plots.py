"""The report's plots, drawn from results.json's rows: time vs length, speed-up over the baseline, compile time,
peak memory and GPU busy fraction, each a row of panels (one per configuration) drawn by `_panels`.

matplotlib is imported only when plots are drawn: a report rebuilt from JSON needs nothing else.
"""

from __future__ import annotations

from . import outdir
from .figures import WITHIN_NOISE, at, first_call_overheads, largest_overhead, order, series, timed


def _save(fig, axes, out_dir: str, name: str) -> None:
    """One legend for the figure, outside the axes (never over the data)."""
    import matplotlib.pyplot as plt

    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    fig.tight_layout()
    try:  # to a temporary name, then renamed; never over a file the bench did not write
        outdir.write_file(out_dir, name, lambda tmp: fig.savefig(tmp, dpi=110, bbox_inches="tight"), "bench")
    finally:
        plt.close(fig)


def _panels(out_dir: str, name: str, keys: list, draw, width: float = 5.5) -> None:
    """DIR/`name`: one panel per key, side by side, each drawn by `draw(ax, key)`, with one legend."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(width * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        draw(ax, key)
    _save(fig, axes, out_dir, name)


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


def _lengths(per: dict) -> list:
    return sorted({n for pts in per.values() for n, _ in pts})


def _time_vs_length(ax, key, per: dict, colour: dict) -> None:
    lengths = _lengths(per)
    for s in order(per):
        pts = per[s]
        ax.errorbar(
            [n for n, _ in pts],
            [r["seq_s"] for _, r in pts],
            yerr=_err([r for _, r in pts]),
            marker="o",
            markersize=4,
            capsize=3,
            label=s,
            color=colour[s],
            linestyle="--" if s.startswith("hf-") else "-",
        )
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


def _speedup(ax, key, per: dict) -> None:
    lengths = _lengths(per)
    if "baseline" not in per:
        ax.text(0.5, 0.5, "no baseline in this run", ha="center", transform=ax.transAxes)
        return
    others = [s for s in order(per) if s != "baseline"]
    width = 0.8 / max(len(lengths), 1)
    for i, n in enumerate(lengths):
        base = at(per["baseline"], n)
        vals, lo, hi = [], [], []
        for s in others:
            r = at(per[s], n)
            if not (base and r):
                vals.append(0), lo.append(0), hi.append(0)
                continue
            v = base["seq_s"] / r["seq_s"]
            b_all, r_all = base.get("seq_s_all") or [base["seq_s"]], r.get("seq_s_all") or [r["seq_s"]]
            vals.append(v)  # bars: the ratio's range over the fastest/slowest calls of both
            lo.append(v - min(b_all) / max(r_all))
            hi.append(max(b_all) / min(r_all) - v)
        ax.bar(
            [j + i * width for j in range(len(others))],
            vals,
            width,
            yerr=[lo, hi],
            capsize=2,
            label=f"N={n}",
            color=f"C{i % 10}",
        )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(others))], others, rotation=45, ha="right", fontsize=8)
    ax.axhline(1, color="grey", linewidth=0.8)
    ax.set_ylabel("speed-up over baseline (x); bars: range")
    ax.set_title(f"{key[1]}, batch {key[2]}")


def _compile(ax, key, per: dict, colour: dict) -> None:
    over = first_call_overheads(per)
    names = order(over)
    tall = [largest_overhead(over[s]) for s in names]  # within the timed calls' noise: no bar
    ax.bar(range(len(names)), [0.0 if v == WITHIN_NOISE else v for v in tall], color=[colour[s] for s in names])
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("compile time: largest first-call overhead (s)")
    ax.set_title(f"{key[1]}, batch {key[2]}, allocator {key[0]}")


def _memory(ax, key, mem: list) -> None:
    dtype, batch = key
    sub = [r for r in mem if r["dtype"] == dtype and r["batch"] == batch]
    n = max(r["max_new_tokens"] for r in sub)
    sub = [r for r in sub if r["max_new_tokens"] == n]
    allocs = sorted({r["allocator"] for r in sub})
    strategies = order(r["strategy"] for r in sub)
    width = 0.8 / (2 * len(allocs))
    for i, a in enumerate(allocs):
        by = {r["strategy"]: r for r in sub if r["allocator"] == a}
        xs = range(len(strategies))
        ax.bar(
            [x + (2 * i) * width for x in xs],
            [by[s]["peak_reserved_mb"] if s in by else 0 for s in strategies],
            width,
            label=f"reserved ({a})",
        )
        ax.bar(
            [x + (2 * i + 1) * width for x in xs],
            [by[s]["peak_allocated_mb"] if s in by else 0 for s in strategies],
            width,
            label=f"allocated ({a})",
        )
    ax.set_xticks(
        [x + 0.4 - width / 2 for x in range(len(strategies))], strategies, rotation=45, ha="right", fontsize=8
    )
    ax.set_ylabel("MB at peak")
    ax.set_title(f"peak memory, {dtype}, batch {batch}, N={n}")


def _busy(ax, key, busy: list) -> None:
    sub = {r["strategy"]: r["busy"] for r in busy if (r["allocator"], r["dtype"], r["batch"]) == key}
    names = order(sub)
    vals = [sub[s]["busy_fraction"] * 100 if sub[s].get("available") else 0 for s in names]
    ax.bar(range(len(names)), vals, color="#2ca02c")
    for x, s in enumerate(names):
        if not sub[s].get("available"):
            ax.text(x, 2, "n/a", ha="center", fontsize=7, rotation=90)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_ylabel("GPU busy over the decode loop (%)")
    ax.set_title(f"{key[1]}, batch {key[2]}, allocator {key[0]}")


def plots(results: dict, out_dir: str) -> list[tuple[str, str]]:
    """Draw the plots this run's rows allow into `out_dir`; -> [(file name, what it shows)]."""
    import matplotlib  # slow to import: only when plots are drawn (a report rebuilt from JSON needs nothing else)

    matplotlib.use("Agg")

    rows = results["rows"]
    ser = {k: v for k, v in series(rows).items() if k[0] == "default"} or series(rows)
    written = []
    if not ser:
        return written
    keys = sorted(ser)
    names = order(s for per in ser.values() for s in per)  # one colour per strategy in every plot
    colour = {s: f"C{i % 10}" for i, s in enumerate(names)}

    _panels(out_dir, "time_vs_length.png", keys, lambda ax, key: _time_vs_length(ax, key, ser[key], colour))
    written.append(
        (
            "time_vs_length.png",
            "time per sequence vs N, log-log, with O(N) and O(N^2) guides; error bars: fastest and slowest timed call",
        )
    )
    _panels(out_dir, "speedup.png", keys, lambda ax, key: _speedup(ax, key, ser[key]))
    written.append(
        (
            "speedup.png",
            "speed-up over baseline per preset and peer; error bars: the range the fastest and "
            "slowest timed calls allow",
        )
    )
    _panels(out_dir, "compile.png", keys, lambda ax, key: _compile(ax, key, ser[key], colour))
    written.append(
        ("compile.png", "compile time per strategy: the largest (first call - median timed call) over its lengths")
    )

    mem = [r for r in timed(rows) if r.get("peak_reserved_mb") is not None]
    if mem:
        mkeys = sorted({(r["dtype"], r["batch"]) for r in mem})
        _panels(out_dir, "memory.png", mkeys, lambda ax, key: _memory(ax, key, mem), width=6)
        written.append(("memory.png", "peak reserved vs allocated per preset and allocator"))

    # the busy chart only where a GPU trace gave figures: on CPU it would be an empty chart of "n/a"
    busy = [r for r in rows if r.get("workload") == "profile" and "busy" in r]
    if any(r["busy"].get("available") for r in busy):
        bkeys = sorted({(r["allocator"], r["dtype"], r["batch"]) for r in busy})
        _panels(out_dir, "busy.png", bkeys, lambda ax, key: _busy(ax, key, busy))
        written.append(("busy.png", "GPU busy fraction per preset and peer"))
    return written
