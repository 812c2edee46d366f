"""The README's "which preset to use" table, made from measured results alone: results/<gpu>/*/results.json.

    python -m overlapdecode.bench.report.results_table results/h200 [--readme README.md] [--new-tokens 200]

One line per (GPU, model, dtype, batch, prompt length) measured at --new-tokens with EOS off and the default
allocator: the fastest preset measured there (variants such as `nocheck` are not presets: they are not offered as
an answer), its ms/token and MBU, its speed-up over the fastest Hugging Face peer measured at the same
configuration, the presets that were measured at all (a preset missing from that list was not measured, not
beaten), and the folders the figures come from, as numbered links defined under the table (every line within 120
characters). Figures of one line may come from different folders (a peer measured in another run); the line names
each. The other figures (TTFT, ms/step, the per-layer toll, kernels per step) are in each folder's report.md.

With --readme the table replaces the lines between BEGIN and END in that file (the markers stay); without it the
table is printed. A results file the report cannot read is refused with one line naming it.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap

from ...strategy import PRESETS
from . import results_index
from .results import RESULTS, ResultsError, load

BEGIN = (
    "<!-- results table: made by python -m overlapdecode.bench.report.results_table; edit results/, not this table -->"
)
END = "<!-- end of results table -->"
HEADER = (
    "model",
    "dtype",
    "batch",
    "fastest preset",
    "ms/token",
    "MBU",
    "vs Hugging Face",
    "presets measured",
    "results",
)
WIDTH = 120  # the longest line the table and its text may have


def runs(results_dir: str) -> list[tuple[str, dict]]:
    """(folder, checked results) of every folder under `results_dir` holding a results.json, in name order;
    folders of other tools (tensor-parallel probes, profiles) are not bench runs and are skipped."""
    if not os.path.isdir(results_dir):
        raise ResultsError(f"{results_dir}: not a directory of results folders")
    found = []
    for name in sorted(os.listdir(results_dir)):
        folder = os.path.join(results_dir, name)
        if os.path.isfile(os.path.join(folder, RESULTS)):
            found.append((folder, load(folder)))
    if not found:
        raise ResultsError(f"{results_dir}: no folder in it holds a {RESULTS}")
    return found


def _comparable(row: dict, new_tokens: int) -> bool:
    """A measured row of the table's kind: timed, not an error, EOS off, default allocator, one process."""
    return (
        "seq_s" in row
        and "error" not in row
        and row["workload"] == "fixed"
        and row["allocator"] == "default"
        and row["max_new_tokens"] == new_tokens
        and row.get("tp", 1) == 1
    )


def mbu(row: dict) -> float | None:
    """Weight bytes / the device's measured bandwidth / ms per token (None without both figures)."""
    if not row.get("weight_bytes") or not row.get("bandwidth_gbs"):
        return None
    return row["weight_bytes"] / (row["bandwidth_gbs"] * 1e9) / (row["ms_per_token"] / 1e3)


def weights(row: dict, config: dict) -> str:
    """The dtype cell: the activations' dtype, and the weights' quantization where there is one (`bfloat16 int4
    g128`): quantized and 16-bit weights are separate lines, never each other's fastest."""
    scheme = row.get("quantize", config.get("quantize"))
    if not scheme:
        return row["dtype"]
    group = row.get("group_size", config.get("group_size"))
    return f"{row['dtype']} {scheme}" + (f" g{group}" if scheme == "int4" and group else "")


def lines(found: list[tuple[str, dict]], new_tokens: int) -> list[dict]:
    """One dict per configuration: key, the fastest preset's row and folder, the fastest peer's, the presets seen."""
    groups: dict = {}
    for folder, results in found:
        gpu = results["environment"].get("gpu") or "CPU"
        for row in results["rows"]:
            if not _comparable(row, new_tokens):
                continue
            key = (
                gpu,
                row.get("model", results["config"]["model"]),
                weights(row, results["config"]),
                row["batch"],
                row.get("prompt_len", results["config"]["prompt_len"]),
            )
            g = groups.setdefault(key, {"key": key, "preset": None, "peer": None, "presets": set()})
            if row.get("kind") == "peer":
                slot = "peer"
            elif row["strategy"] in PRESETS:
                slot = "preset"
                g["presets"].add(row["strategy"])
            else:  # a variant or a lagged check: measured, but not a preset to recommend
                continue
            if g[slot] is None or row["ms_per_token"] < g[slot][1]["ms_per_token"]:
                g[slot] = (folder, row)
    return [groups[k] for k in sorted(groups) if groups[k]["preset"] is not None]


def measured(presets: set) -> str:
    """The presets measured at a configuration, short: `all`, `all but fused`, or the list."""
    order = list(PRESETS)
    missing = [p for p in order if p not in presets]
    if not missing:
        return "all"
    if len(missing) < len(presets):
        return "all but " + ", ".join(missing)
    return ", ".join(sorted(presets, key=order.index))


def render(results_dir: str, new_tokens: int = 200, relative_to: str = ".") -> str:
    """The table (markdown, with lines saying what it shows, and the numbered links to the folders its figures
    come from) of the folders under `results_dir`; links are relative to the directory `relative_to` (the
    README's)."""
    found = runs(results_dir)
    table = lines(found, new_tokens)
    if not table:
        raise ResultsError(
            f"{results_dir}: no folder measured a preset at {new_tokens} new tokens (EOS off, default allocator)"
        )
    numbers: dict[str, int] = {}  # folder -> its link's number, in the order of first use

    def link(folder: str) -> str:
        numbers.setdefault(folder, len(numbers) + 1)
        return f"[{numbers[folder]}]"

    prompts = sorted({g["key"][4] for g in table})
    intro = (
        f"Measured by `overlapdecode bench` on {', '.join(sorted({g['key'][0] for g in table}))}: prompt "
        f"{'/'.join(map(str, prompts))} tokens, {new_tokens} new tokens, EOS off, medians of the timed calls. "
        "ms/token = the whole call / new tokens; MBU = weight bytes / the measured copy bandwidth / ms per token; "
        "vs Hugging Face: the fastest Hugging Face generate() peer's ms/token over the preset's; a preset missing "
        'from "presets measured" was not measured there, not beaten; results: the runs the figures come from.'
    )
    out = textwrap.wrap(intro, WIDTH, break_on_hyphens=False) + [
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for g in table:
        _gpu, model, dtype, batch, _prompt = g["key"]
        folder, row = g["preset"]
        m = mbu(row)
        if g["peer"] is None:
            peer, folders = "not measured", [folder]
        else:
            peer_folder, peer_row = g["peer"]
            peer = f"{peer_row['ms_per_token'] / row['ms_per_token']:.2f}x `{peer_row['strategy']}`"
            folders = [folder] + ([peer_folder] if peer_folder != folder else [])
        cells = [
            f"`{model}`",
            dtype,
            str(batch),
            f"`{row['strategy']}`",
            f"{row['ms_per_token']:.3f}",
            "-" if m is None else f"{m * 100:.0f}%",
            peer,
            measured(g["presets"]),
            ", ".join(link(f) for f in folders),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for folder, number in numbers.items():
        out.append(f"[{number}]: {os.path.relpath(os.path.join(folder, 'report.md'), relative_to)}")
    return "\n".join(out) + "\n"


def replace_region(text: str, table: str, path: str) -> str:
    """`text` with the lines between BEGIN and END replaced by `table`."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ResultsError(f"{path}: needs one line {BEGIN!r} and, after it, one line {END!r} around the table")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table}{END}{tail}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m overlapdecode.bench.report.results_table", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("results_dir", help="a folder of results folders, e.g. results/h200")
    ap.add_argument("--readme", help="rewrite the table between the markers of this markdown file (default: print it)")
    ap.add_argument("--new-tokens", type=int, default=200, help="the length the table compares (default: %(default)s)")
    ap.add_argument(
        "--index",
        help="write the index of every results folder (results_index.py) to this file, e.g. results/README.md; "
        "a file that is not such an index is left alone",
    )
    args = ap.parse_args(argv)
    try:
        if args.index is not None:
            write_index(args.index, os.path.dirname(os.path.abspath(args.results_dir)))
        if args.readme is None:
            if args.index is None:
                sys.stdout.write(render(args.results_dir, args.new_tokens))
            return 0
        with open(args.readme) as f:
            text = f.read()
        table = render(args.results_dir, args.new_tokens, relative_to=os.path.dirname(os.path.abspath(args.readme)))
        new = replace_region(text, table, args.readme)
    except (ResultsError, OSError) as err:
        print(f"results_table: {err}", file=sys.stderr)
        return 2
    if new != text:
        with open(args.readme, "w") as f:
            f.write(new)
    print(f"{args.readme}: results table {'rewritten' if new != text else 'already up to date'}")
    return 0


def write_index(path: str, results_root: str) -> None:
    """results_index.render(results_root) into `path`: a new file, or one whose first line is the index's title
    (anything else there is the user's, and is refused)."""
    if os.path.exists(path):
        with open(path) as f:
            if f.readline().rstrip("\n") != results_index.TITLE:
                raise ResultsError(
                    f"{path}: not an index this command made (its first line is not {results_index.TITLE!r})"
                )
    with open(path, "w") as f:
        f.write(results_index.render(results_root))
    print(f"{path}: index written")


if __name__ == "__main__":
    sys.exit(main())
