"""results/README.md: every results folder, grouped by topic, each with the title its own README or report gives.

Made by the command that makes the README's table (`results_table.py RESULTS_DIR --index results/README.md`),
so the index never lists a folder that is gone nor misses a new one (tests/test_readme.py checks it).

Folders are named `<model>-<topic>`: the embedded shape without `-random` (`llama-1b`, `gpt2`), the family when a
folder holds several of its sizes (`llama`), or `shapes` when it holds several families; then what was measured.
A folder's topic is read from the words of its name by the rules below, the first that matches.
"""

from __future__ import annotations

import json
import os
import re

from .results import RESULTS

TITLE = "# Results, by topic"
GENERIC_TITLE = "overlapdecode benchmark report"  # report.md's own first line: the index says what the run held

# (topic, words of a folder's name that put it there): the first rule that matches wins.
TOPICS = (
    ("Tensor parallelism (two GPUs)", ("tp2",)),
    ("Quantized weights", ("int4", "int8", "quant", "quality")),
    ("Speculative decoding", ("spec", "speculation", "lookup", "draft")),
    ("Designs measured against the step and dropped", ("persistent", "pdl")),
    ("Stop checks", ("stop-check", "stop-checks")),
    ("Presets end to end", ("main-job", "presets")),
    ("Where a step's time goes", ("timeline",)),
    ("Kernels alone: tiles and pieces", ("sweep", "tiles", "pieces")),
    ("Sampling", ("sample", "sampling")),
    ("Many rows and long prompts", ("rows", "scale", "prefill", "long")),
    ("Presets end to end", ("b1", "b8")),
)
OTHER = "Other runs"


def topic(name: str) -> str:
    """The topic of a folder named `name` (`llama-1b-scale-rows` -> many rows and long prompts)."""
    for title, words in TOPICS:
        if any(re.search(rf"(^|-){re.escape(word)}(-|$)", name) for word in words):
            return title
    return OTHER


def title(folder: str) -> str:
    """The first heading of the folder's README.md, else of its report.md; a bench report's generic heading is
    replaced by what its results.json measured (model, dtypes, batches, presets)."""
    for page in ("README.md", "report.md"):
        path = os.path.join(folder, page)
        if os.path.isfile(path):
            with open(path) as f:
                first = f.readline().strip().lstrip("#").strip()
            if first and first != GENERIC_TITLE:
                return first
            break
    results = os.path.join(folder, RESULTS)
    if os.path.isfile(results):
        with open(results) as f:
            config = json.load(f).get("config", {})
        return (
            f"`overlapdecode bench`: {config.get('model')}, {', '.join(config.get('dtypes', []))}, "
            f"batch {', '.join(str(b) for b in config.get('batches', []))}: "
            f"{', '.join(config.get('strategies', []) + config.get('peers', []))}"
        )
    return "(no README.md or report.md)"


def render(results_root: str) -> str:
    """The index of every folder under each GPU folder of `results_root` (results/ -> results/h200/...)."""
    lines = [
        TITLE,
        "",
        "Made by `python -m overlapdecode.bench.report.results_table results/h200 --index results/README.md`;",
        "edit the folders, not this page. Each folder's README.md or report.md gives the command and commit that",
        "made its figures. Folders are named `<model>-<topic>` (`shapes-` when one holds several families).",
    ]
    for gpu in sorted(os.listdir(results_root)):
        gpu_dir = os.path.join(results_root, gpu)
        if not os.path.isdir(gpu_dir):
            continue
        groups: dict[str, list[str]] = {}
        for name in sorted(os.listdir(gpu_dir)):
            folder = os.path.join(gpu_dir, name)
            if os.path.isdir(folder):
                groups.setdefault(topic(name), []).append(f"- [{name}]({gpu}/{name}/): {title(folder)}")
        order = [t for t, _ in TOPICS] + [OTHER]  # a topic named twice sorts at its first rule
        for t in sorted(groups, key=order.index):
            lines += ["", f"## {gpu}: {t}", ""] + groups[t]
    return "\n".join(lines) + "\n"
