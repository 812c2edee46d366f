"""The report's speculative decoding: the verify step's cost, the speculative rows, and the model they are set
beside, from results.json's `verify` and `speculative` rows (bench/speculative.py measures them).

The model: a round drafts K tokens and verifies them in one step of the model over K + 1 positions. If each draft
is accepted with probability a (independently, until the first rejection), a round emits on average

    E[tokens per round] = (1 - a^(K+1)) / (1 - a)        (1 at a = 0, K + 1 at a = 1)

tokens, and costs the verify step, c(K + 1) one-token steps (its measured cost ratio), plus, where a draft
model runs, its K + 1 one-token forwards (K drafts and the K-th fed back), each d of the model's step. So the
speed-up over one token a step is E / (c + (K + 1) d). The loop's own work per round (the acceptance, the cache
cut, a host read) is not in the model: the measured points lie below the curve by that much. Nor is a call's prefill,
which speculation does not shorten: the model's figure is the decode's speed-up, each call's time less its time to
first token (bench/speculative.py speed_up), which the plot and the table set beside it; the table gives the whole
call's speed-up too.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from .figures import spread
from .markdown import fmt, table
from .plots import _panels


def expected_tokens(a: float, k: int) -> float:
    """E[tokens per round] = 1 + a + ... + a^K = (1 - a^(K+1)) / (1 - a) for an acceptance probability `a` in
    [0, 1] and K drafts a round: 1 at a = 0, K + 1 at a = 1."""
    if not 0 <= a <= 1:
        raise ValueError(f"a must be an acceptance probability in [0, 1], got {a}")
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def round_cost(k: int, verify_ratio: float, draft_ratio: float = 0.0, feed_ratio: float | None = None) -> float:
    """A round's cost in one-token steps of the model: the verify step (`verify_ratio` at K + 1 tokens) and the
    draft's K forwards (`draft_ratio` the draft's one-token forward / the model's, 0 for prompt lookup), then its
    K-th draft fed with no logits read (`feed_ratio`; None: a whole forward, as the Hugging Face caches feed it)."""
    return verify_ratio + k * draft_ratio + (draft_ratio if feed_ratio is None else feed_ratio)


def model_speedup(
    a: float, k: int, verify_ratio: float, draft_ratio: float = 0.0, feed_ratio: float | None = None
) -> float:
    """The model's speed-up over one token a step: E[tokens per round] / the round's cost (round_cost)."""
    return expected_tokens(a, k) / round_cost(k, verify_ratio, draft_ratio, feed_ratio)


def spec_rows(rows) -> list:
    """The measured speculative rows."""
    return [r for r in rows if r.get("workload") == "speculative" and "seq_s" in r]


def verify_rows(rows) -> list:
    """The measured verify-step rows."""
    return [r for r in rows if r.get("workload") == "verify" and "verify_ratio" in r]


def _where(r: dict) -> tuple:
    return (r.get("model"), r["allocator"], r["dtype"], r["batch"], r["strategy"].split("+")[0])


def verify_of(rows, row: dict) -> dict | None:
    """The verify row of a speculative row's preset and configuration (a sampled variant verifies as its preset)."""
    return next((v for v in verify_rows(rows) if _where(v) == _where(row)), None)


def ratio_at(verify: dict, tokens: int) -> float | None:
    """The verify step's cost over `tokens` positions / a one-token step's, or None where not measured."""
    have = verify.get("verify_tokens") or []
    return verify["verify_ratio"][have.index(tokens)] if tokens in have else None


def draft_cost(row: dict, verify: dict) -> tuple[float | None, float | None]:
    """A row's draft costs per one-token step of the model -> (a forward's, the last draft's feed's): 0 for prompt
    lookup; for a draft model its one-token forward / the model's (None where the verify row lacks it) and its
    feed without logits / the model's (None where not measured: a whole forward)."""
    if row.get("speculation") == "prompt_lookup":
        return 0.0, 0.0
    return verify.get("draft_ratio"), verify.get("draft_feed_ratio")


def model_rate(row: dict) -> float | None:
    """A row's acceptance rate as the model has it: each checked draft's (`draft_acceptance`, bench/speculative.py
    round_figures), or accepted / offered in rows recorded before that figure was (the same where every draft
    offered is accepted or none is)."""
    a = row.get("draft_acceptance")
    return row.get("acceptance_rate") if a is None and "draft_acceptance" not in row else a


def predicted(rows, row: dict) -> float | None:
    """The model's speed-up at a row's measured acceptance rate (model_rate), K and verify cost (None without
    them)."""
    verify = verify_of(rows, row)
    a = model_rate(row)
    if verify is None or a is None:
        return None
    c, (d, f) = ratio_at(verify, row["k"] + 1), draft_cost(row, verify)
    return None if c is None or d is None else model_speedup(a, row["k"], c, d, f)


def plain_of(rows, row: dict) -> dict | None:
    """The fixed row a speculative row's speed-up divides: the same strategy and configuration without it."""
    key = ("model", "allocator", "dtype", "batch", "prompt_len", "max_new_tokens", "strategy")
    return next(
        (r for r in rows if r.get("workload") == "fixed" and "seq_s" in r and all(r.get(k) == row.get(k) for k in key)),
        None,
    )


def speedup_text(rows, row: dict) -> str:
    """A speculative row's speed-up, `!` marked where the spread of its own or its plain row's timed calls covers
    the difference (as the other tables mark theirs); `-` where the plain row is missing."""
    if row.get("speedup") is None:
        return "-"
    plain = plain_of(rows, row)
    if plain is None and row.get("plain_seq_s_all"):  # timed beside it on its own prompt (a looping prompt)
        plain = dict(seq_s=statistics.median(row["plain_seq_s_all"]), seq_s_all=row["plain_seq_s_all"])
    noise = max(spread(row), spread(plain) if plain else 0.0)
    return f"{row['speedup']:.2f}x" + (" !" if abs(row["speedup"] - 1) <= noise else "")


def draft_label(row: dict) -> str:
    """How a row drafts, `prompt lookup` or `draft SPEC`, and on which prompt: `, looping prompt` on one whose
    continuation repeats it, `, one token repeated` where that prompt is one token the model continues with
    itself."""
    kind = "prompt lookup" if row.get("speculation") == "prompt_lookup" else f"draft {row.get('assistant')}"
    if row.get("lookup_prompt") != "loop":
        return kind
    fixed = str(row.get("loop_found", "")).startswith("one token")
    return f"{kind}, one token repeated" if fixed else f"{kind}, looping prompt"


def _rate(v) -> str:
    return fmt(v, "{:.2f}")


def section(rows) -> list[str]:
    """report.md's speculative part: the verify step's cost per preset, then every speculative row."""
    verify, spec = verify_rows(rows), spec_rows(rows)
    if not verify and not spec:
        return []
    md = ["", "## Speculative decoding", ""]
    md.append(
        "Random weights make an acceptance rate no forecast: these rows measure the mechanism at the rates the "
        "drafts give (`draft self`: the model as its own draft, every draft accepted; `draft random`: unrelated "
        "random weights of its shape, about none; prompt lookup: whatever the model's greedy output repeats; on a "
        "looping prompt, the model's own greedy tokens into the loop they fall into, or where its output wanders, "
        "one token repeated that the model continues with itself: every draft that fits; its speed-up is over the "
        "same strategy on that prompt)."
    )
    if verify:
        tokens = sorted({t for v in verify for t in v["verify_tokens"]})
        md += [
            "",
            "The verify step's cost: one forward over K + 1 tokens against a cache of the prompt, as the round "
            "loop runs it, / a one-token forward (the median of repeated forwards; CUDA events on a GPU). `draft`: "
            "the draft model's one-token forward / the model's. `timed`: `graph` where each timed forward was the "
            "replay of one CUDA graph per K + 1, as the captured rounds replay theirs (`compiled`, `interleaved`, "
            "`fused`; for `fused` K + 1 = 1 is its one-token decode step), `eager` where it ran eagerly.",
            "",
        ]
        body = [
            [v["strategy"], v["dtype"], v["batch"], fmt(v["verify_ms"][0], "{:.3f}")]
            + [_rate(ratio_at(v, t)) for t in tokens]
            + [_rate(v.get("draft_ratio")), "graph" if v.get("verify_graph") else "eager"]
            for v in sorted(verify, key=_where)
        ]
        head = ["strategy", "dtype", "batch", "1-token ms"] + [f"K+1={t}" for t in tokens] + ["draft", "timed"]
        md.append(table(head, body))
    if spec:
        md += [
            "",
            "Each speculative row: drafts offered and accepted over all rounds and rows, the acceptance rate "
            "(accepted / offered), a (a checked draft's: accepted / (accepted + rejected), one rejection in each "
            "round of a row that accepted fewer than it offered: the model's a), tokens per round of a row "
            "((accepted + rounds) / rounds), ms/token, the same strategy's ms/token without speculation in this "
            "run, the speed-up (its time / this row's), the decode's speed-up (each call's time less its time to "
            "first token: the prefill, which speculation does not shorten) and the model's speed-up of the "
            "decode at a, E[tokens per round] / (verify cost + the draft's K forwards + the feed of its last "
            "draft, a forward without its LM head on `fused`); `!`: a speed-up within the spread of this row's or "
            "the plain row's timed calls; `-` where a figure is missing (no draft offered, no verify row; a row "
            "recorded before a was, whose model takes accepted / offered).",
            "",
        ]
        body = [
            [
                r["strategy"],
                r["dtype"],
                r["batch"],
                draft_label(r),
                r["k"],
                r["max_new_tokens"],
                r.get("drafts_offered", "-"),
                r.get("drafts_accepted", "-"),
                _rate(r.get("acceptance_rate")),
                _rate(r.get("draft_acceptance")),
                _rate(r.get("tokens_per_round")),
                fmt(r["ms_per_token"], "{:.3f}"),
                fmt(r.get("plain_ms_per_token"), "{:.3f}"),
                speedup_text(rows, r),
                fmt(r.get("decode_speedup"), "{:.2f}x"),
                fmt(predicted(rows, r), "{:.2f}x"),
            ]
            for r in sorted(spec, key=lambda r: (_where(r), r["speculation"], r["k"], r["max_new_tokens"]))
        ]
        md.append(
            table(
                [
                    "strategy",
                    "dtype",
                    "batch",
                    "drafts by",
                    "K",
                    "N",
                    "offered",
                    "accepted",
                    "acceptance",
                    "a",
                    "tokens/round",
                    "ms/token",
                    "without ms/token",
                    "speed-up",
                    "decode speed-up",
                    "model",
                ],
                body,
            )
        )
    return md


def _draw(ax, key, rows, panel: list) -> None:
    """One panel: per (draft, K) the model's curve over a in [0, 1] and the measured points at their rates: the
    decode's speed-up, and hollow, the whole call's."""
    groups = defaultdict(list)
    for r in panel:
        groups[(draft_label(r), r["k"])].append(r)
    ks = sorted({k for _, k in groups})
    grid = [i / 50 for i in range(51)]
    for (drafts, k), members in sorted(groups.items()):
        colour = f"C{ks.index(k) % 10}"
        style, marker = ("-", "o") if drafts.startswith("prompt lookup") else ("--", "^")
        verify = verify_of(rows, members[0])
        c = ratio_at(verify, k + 1) if verify else None
        d, f = draft_cost(members[0], verify) if verify else (None, None)
        if c is not None and d is not None:
            ax.plot(grid, [model_speedup(a, k, c, d, f) for a in grid], color=colour, linestyle=style, linewidth=1)
        rated = [r for r in members if model_rate(r) is not None]
        # filled: the decode's speed-up (a row recorded before it was: its call's); hollow: the whole call's
        pts = [(model_rate(r), r.get("decode_speedup") or r["speedup"]) for r in rated]
        calls = [(model_rate(r), r["speedup"]) for r in rated if r.get("decode_speedup") is not None]
        pts = [(a, s) for a, s in pts if s is not None]
        if pts:
            ax.scatter(*zip(*pts), color=colour, marker=marker, zorder=3, label=f"{drafts}, K={k}")
        if calls:
            ax.scatter(*zip(*calls), facecolors="none", edgecolors=colour, marker=marker, zorder=3)
    for drafts, style in (("prompt lookup", "-"), ("a draft model", "--")):  # the lines' key, in the legend
        ax.plot([], [], color="grey", linestyle=style, linewidth=1, label=f"model, {drafts}")
    ax.axhline(1, color="grey", linewidth=0.8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_xlabel("acceptance rate a of a checked draft (measured)")
    ax.set_ylabel("decode speed-up over no speculation (x; hollow: the whole call)")
    allocator, dtype, batch, strategy = key
    ax.set_title(f"{strategy}, {dtype}, batch {batch}" + (f", allocator {allocator}" if allocator != "default" else ""))


def plot(results: dict, out_dir: str) -> list[tuple[str, str]]:
    """speculation.png (where the run has speculative rows): per (allocator, dtype, batch, strategy) a panel of
    the measured speed-up against the measured acceptance rate, each (draft, K) with the model's curve
    E[tokens per round] / (verify cost + draft cost) over a in [0, 1]; -> [(file name, what it shows)]."""
    rows = results["rows"]
    spec = [r for r in spec_rows(rows) if r.get("speedup") is not None]
    if not spec:
        return []
    import matplotlib  # slow to import: only when plots are drawn

    matplotlib.use("Agg")
    panels = defaultdict(list)
    for r in spec:
        panels[(r["allocator"], r["dtype"], r["batch"], r["strategy"])].append(r)
    keys = sorted(panels)
    _panels(out_dir, "speculation.png", keys, lambda ax, key: _draw(ax, key, rows, panels[key]))
    return [
        (
            "speculation.png",
            "speculative decoding: the decode's measured speed-up against the measured acceptance rate (points; "
            "hollow: the whole call's, its prefill included), and the model E[tokens per round] / (verify cost + "
            "draft cost) per K (lines; dashed: a draft model)",
        )
    ]
