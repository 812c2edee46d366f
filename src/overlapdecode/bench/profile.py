"""`overlapdecode profile`: a PyTorch-profiler trace per strategy, a timeline picture, and where the GPU waits.

After warm-up (compile and CUDA-graph recording out of the way) one `generate()` call per strategy runs
under `torch.profiler`; its Chrome/Perfetto trace is written as is, and timeline.py reads the decode loop
from it: GPU busy fraction, median idle gap between steps, host time blocked in synchronisation, launches
and kernels per step. Without CUDA the trace holds only host events and the GPU figures say so.
"""

from __future__ import annotations

import gzip
import json
import os

import overlapdecode as od

from . import timeline
from .report import outdir
from .report.results import environment
from .workloads import prompt


def profile_strategies(
    model_name: str,
    strategies,
    batch: int,
    new_tokens: int,
    out_dir: str,
    dtype="float32",
    prompt_len: int = 32,
    warmup: int = 2,
    device=None,
    command: str | None = None,
) -> dict:
    """Profile each of `strategies` into `out_dir`: a new or empty directory, or one an earlier profile left
    without a summary (outdir.check; an OutDirError before the model is loaded otherwise)."""
    outdir.prepare(out_dir, "profile")
    model = od.load_model(model_name, dtype=dtype, device=device)
    dev = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    ids = prompt(batch, prompt_len, vocab, dev)
    mask = ids.new_ones(ids.shape)  # unpadded rows, said so: a mask is never inferred from the pad id in random ids
    summaries = {}
    for name in strategies:
        run = lambda: od.generate(  # noqa: E731
            model, ids, attention_mask=mask, max_new_tokens=new_tokens, strategy=name, eos_token_id=[], do_sample=False
        )
        for _ in range(warmup):
            run()
        trace = f"trace-{name.replace(':', '-lag')}.json.gz"  # interleaved:2 -> trace-interleaved-lag2.json.gz
        outdir.write_file(out_dir, trace, lambda tmp: timeline.trace_call(run, dev, tmp), "profile")
        summaries[name] = dict(trace=trace)
    result = dict(
        model=model_name,
        dtype=dtype,
        batch=batch,
        new_tokens=new_tokens,
        prompt_len=prompt_len,
        environment=environment(),
        command=command,
        strategies=summaries,
    )
    return write_summary(out_dir, result)


def write_summary(out_dir: str, result: dict) -> dict:
    """Analyse each strategy's trace, draw its timeline, write summary.json and summary.md. The bench
    directory's `overlapdecode report` calls it again on the saved traces (a new analysis, same data)."""
    for name in ("summary.json", "summary.md"):  # before the timelines: a refused summary writes nothing
        outdir.may_write(out_dir, name, "profile")
    for name, entry in result["strategies"].items():
        with gzip.open(os.path.join(out_dir, entry["trace"]), "rt") as f:
            trace = json.load(f)
        summary = timeline.analyze(trace)
        png = f"timeline-{name.replace(':', '-lag')}.png"
        busy = (
            f"GPU busy {summary['busy_fraction'] * 100:.1f}%, fed {summary['fed_fraction'] * 100:.1f}%"
            if summary.get("available")
            else "no GPU trace"
        )
        title = f"{name}: {result['model']}, {result['dtype']}, batch {result['batch']} ({busy})"
        outdir.write_file(out_dir, png, lambda tmp: timeline.plot_timeline(trace, tmp, title), "profile")
        summary.update(trace=entry["trace"], timeline=png)
        result["strategies"][name] = summary
    outdir.write_json(out_dir, "summary.json", result, "profile")
    outdir.write_text(out_dir, "summary.md", summary_markdown(result), "profile")
    return result


def rebuild(out_dir: str) -> dict:
    with open(os.path.join(out_dir, "summary.json")) as f:
        return write_summary(out_dir, json.load(f))


def summary_markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# Profile: {result['model']}, {result['dtype']}, batch {result['batch']}, {result['new_tokens']} new tokens",
        "",
        f"Machine: {env.get('gpu') or 'CPU only'}; torch {env['torch']}, transformers {env['transformers']}, "
        f"commit {env['git_commit']}." + (f" Made by `{result['command']}`." if result.get("command") else ""),
        "",
        "`GPU busy`: time covered by GPU work over the decode loop's span. The idle rest splits into gaps between "
        "kernels of one launch (one CUDA graph: the GPU's own launch latency, the same whatever the stop check) "
        "and gaps before the next launch's work (nothing was queued: the GPU waited for the host, or a stream "
        "hand-off). `GPU fed` = "
        "1 - the latter / span: the share of the loop in which the GPU had work queued.",
        "",
        "| strategy | GPU busy | GPU fed | idle in a launch (ms) | idle waiting for a launch (ms) "
        "| median idle gap between steps (us) | host blocked in sync (ms) | launch calls/step | GPU kernels/step "
        "| trace | timeline |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["strategies"].items():
        if s.get("available"):
            cells = [
                f"{s['busy_fraction'] * 100:.1f}%",
                f"{s['fed_fraction'] * 100:.1f}%",
                f"{s['idle_in_launch_ms']:.1f}",
                f"{s['idle_between_launches_ms']:.1f}",
                f"{s['median_idle_gap_us']:.1f}",
            ]
            kern = f"{s['kernels_per_step']:.1f}"
        else:
            cells, kern = [f"unavailable ({s['reason']})", "-", "-", "-", "-"], "-"
        lines.append(
            f"| {name} | " + " | ".join(cells) + f" | {s['host_sync_ms']:.2f} | "
            f"{s['launches_per_step']:.1f} | {kern} | {s['trace']} | ![]({s['timeline']}) |"
        )
    return "\n".join(lines) + "\n"
