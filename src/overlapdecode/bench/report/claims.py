"""The progression's claims, each checked against one run: the O(N^2) baseline against the O(N) KV cache, the
static cache against the dynamic one, compile against eager, the interleaved stop check against the sync one
and against the no-check upper bound, and against the fastest Hugging Face peer; the allocators'
fragmentation beside them.

A claim is stated only where this run's figures carry it: enough timed calls, a difference beyond their spread,
and a GPU for the claims about a GPU; otherwise the line says why not, with the figure it would rest on.
"""

from __future__ import annotations

from .figures import WITHIN_NOISE, at, exponent_range, exponents, nearest, repeats, series, spread, timed
from .markdown import fmt

# A claim rests on at least this many timed calls per figure: with fewer, the spread says nothing.
MIN_REPEATS = 3


def _on_gpu(*rows) -> bool:
    return all(str(r.get("device", "")).startswith("cuda") for r in rows)


def _why_not(slow, fast, gpu_claim: bool = True) -> str | None:
    """Why the ratio slow/fast cannot carry a claim (None: it can): a CPU run for a GPU claim, too few timed
    calls, or a difference inside the spread of the timed calls."""
    if gpu_claim and not _on_gpu(slow, fast):
        return "measured on CPU, and the claim is about a GPU"
    n = min(repeats(slow), repeats(fast))
    if n < MIN_REPEATS:
        return f"{n} timed call(s) per figure, fewer than the {MIN_REPEATS} needed to know the spread"
    ratio, noise = slow["seq_s"] / fast["seq_s"], max(spread(slow), spread(fast))
    if abs(ratio - 1) <= noise:
        return (
            f"the difference ({(ratio - 1) * 100:+.1f}%) is within the spread of the timed calls ({noise * 100:.0f}%)"
        )
    return None


def _ratio_claim(label: str, ratio_text: str, why: str | None) -> str:
    return f"- {label}: {ratio_text}." if why is None else f"- {label}: not stated: {why} ({ratio_text})."


def claims(results: dict) -> list[str]:
    """The progression's claims, one line each, each stated only where this run's figures carry it: enough timed
    calls, a difference beyond their spread, and a GPU for the claims about a GPU; otherwise the line says why
    not."""
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
            text = (
                f"time-vs-N exponent over {shortest}-{longest} tokens: baseline {fmt(b_all)} (last two lengths "
                f"{fmt(b_long)}; the timed calls allow {b_rng[0]:.2f} to {b_rng[1]:.2f}), kv {fmt(k_all)} (last two "
                f"{fmt(k_long)}; {k_rng[0]:.2f} to {k_rng[1]:.2f})"
            )
            rows_used = [r for _, r in per["baseline"] + per["kv"]]
            n = min(repeats(r) for r in rows_used)
            why = None
            if n < MIN_REPEATS:
                why = f"{n} timed call(s) per figure, fewer than the {MIN_REPEATS} needed to know the spread"
            elif WITHIN_NOISE in (b_all, k_all):
                why = "the timed calls do not resolve how time grows with length"
            elif b_rng[0] <= k_rng[1]:
                why = "the exponents' ranges overlap: the baseline is not shown to grow faster than kv"
            out.append(_ratio_claim(f"O(N^2) vs O(N) ({tag})", text, why))
        # (a, b, claim, text, speed_up): the text's ratio is a's time / b's, or b's / a's (a's speed-up) where speed_up
        for a, b, title, text, speed_up in (
            ("static", "kv", "static vs dynamic cache, no compile", "static/kv time = {:.2f} (< 1: static faster)", 0),
            ("compiled", "static", "compile", "compiled is {:.2f}x static", 1),
            ("hf-compiled", "hf-static", "Hugging Face auto-compile", "hf-compiled is {:.2f}x hf-static", 1),
        ):
            x, y = (at(per[a], longest), at(per[b], longest)) if a in per and b in per else (None, None)
            if x and y:
                first, second = (y, x) if speed_up else (x, y)
                ratio = first["seq_s"] / second["seq_s"]
                out.append(
                    _ratio_claim(f"{title} ({tag}, {longest} tokens)", text.format(ratio), _why_not(first, second))
                )
        n400 = nearest(lengths, 400)
        inter = at(per.get("interleaved", []), n400)
        if inter:
            label = f"interleaved ({tag}, {n400} tokens, {inter['ms_per_token']:.3f} ms/token)"
            for other, what in (("baseline", "baseline"), ("compiled", "compiled (sync check)")):
                r = at(per.get(other, []), n400)
                if r:
                    out.append(
                        _ratio_claim(
                            f"{label} vs {other}", f"{r['seq_s'] / inter['seq_s']:.2f}x {what}", _why_not(r, inter)
                        )
                    )
            upper = at(per.get("nocheck", []), n400)
            if upper:
                gap = inter["seq_s"] / upper["seq_s"] - 1
                why = _why_not(inter, upper)
                text = f"{gap * 100:+.1f}% vs the no-check upper bound"
                # "as fast as the upper bound" is the claim here: a gap inside the spread supports it
                if why is not None and why.startswith("the difference"):
                    out.append(
                        f"- {label} vs nocheck: {text}, within the spread of the timed calls "
                        f"({max(spread(inter), spread(upper)) * 100:.0f}%): no cost of the check resolved."
                    )
                else:
                    out.append(_ratio_claim(f"{label} vs nocheck", text, why))
            peers = [(p, at(per[p], n400)) for p in per if p.startswith("hf-") and at(per[p], n400)]
            if peers:
                best, row = min(peers, key=lambda pr: pr[1]["seq_s"])
                version = row.get("transformers")
                out.append(
                    _ratio_claim(
                        f"{label} vs the fastest Hugging Face peer",
                        f"{row['seq_s'] / inter['seq_s']:.2f}x {best}"
                        + (f" (transformers {version})" if version else ""),
                        _why_not(row, inter),
                    )
                )
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
                for r in sorted(sub, key=lambda r: r["allocator"])
                if r["strategy"] == strat and r["max_new_tokens"] == n
            ]
            if parts:
                out.append(
                    f"- fragmentation, {strat} ({dtype}, batch {batch}, {n} tokens, one measured call): "
                    + "; ".join(parts)
                    + "."
                )
    return out
