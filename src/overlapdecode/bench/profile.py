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

import torch

import overlapdecode as od

from . import timeline
from .workloads import prompt


def profile_strategies(model_name: str, strategies, batch: int, new_tokens: int, out_dir: str, dtype="float32",
                       prompt_len: int = 32, warmup: int = 2, device=None) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    model = od.load_model(model_name, dtype=dtype, device=device)
    dev = next(model.parameters()).device
    vocab = model.config.get_text_config().vocab_size
    ids = prompt(batch, prompt_len, vocab, dev)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    summaries = {}
    for name in strategies:
        run = lambda: od.generate(model, ids, max_new_tokens=new_tokens, strategy=name, eos_token_id=[])  # noqa: E731
        for _ in range(warmup):
            run()
        if dev.type == "cuda":
            torch.cuda.synchronize()  # host sync: keep warm-up work out of the trace
        with torch.profiler.profile(activities=activities) as prof:
            run()
            if dev.type == "cuda":
                torch.cuda.synchronize()
        trace_path = os.path.join(out_dir, f"trace-{name}.json.gz")  # Perfetto and chrome://tracing read .gz
        prof.export_chrome_trace(trace_path)
        with gzip.open(trace_path, "rt") as f:
            trace = json.load(f)
        summary = timeline.analyze(trace)
        png = os.path.join(out_dir, f"timeline-{name}.png")
        busy = f"GPU busy {summary['busy_fraction'] * 100:.1f}%" if summary.get("available") else "no GPU trace"
        timeline.plot_timeline(trace, png, f"{name}: {model_name}, {dtype}, batch {batch} ({busy})")
        summary.update(trace=os.path.basename(trace_path), timeline=os.path.basename(png))
        summaries[name] = summary
    from .runner import environment

    result = dict(model=model_name, dtype=dtype, batch=batch, new_tokens=new_tokens, prompt_len=prompt_len,
                  environment=environment(), strategies=summaries)
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "summary.md"), "w") as f:
        f.write(summary_markdown(result))
    return result


def summary_markdown(result: dict) -> str:
    env = result["environment"]
    lines = [
        f"# Profile: {result['model']}, {result['dtype']}, batch {result['batch']}, {result['new_tokens']} new tokens",
        "",
        f"Machine: {env.get('gpu') or 'CPU only'}; torch {env['torch']}, transformers {env['transformers']}, "
        f"commit {env['git_commit']}.",
        "",
        "| strategy | GPU busy | median idle gap between steps (us) | host blocked in sync (ms) | launch calls/step "
        "| GPU kernels/step | trace | timeline |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in result["strategies"].items():
        if s.get("available"):
            busy, gap, kern = f"{s['busy_fraction'] * 100:.1f}%", f"{s['median_idle_gap_us']:.1f}", f"{s['kernels_per_step']:.1f}"
        else:
            busy, gap, kern = f"unavailable ({s['reason']})", "-", "-"
        lines.append(f"| {name} | {busy} | {gap} | {s['host_sync_ms']:.2f} | {s['launches_per_step']:.1f} | {kern} | "
                     f"{s['trace']} | ![]({s['timeline']}) |")
    return "\n".join(lines) + "\n"
