"""Decode speed over batch rows and prompt lengths in one run: ms per step, tok/s, MBU and the per-layer toll,
with the KV-cache bytes each step reads counted beside the weights.

Why beside the bench's own table: at long prompts a step reads the cache as well as the weights (1 row of 16K
tokens at Llama-1B: 0.5 GB of keys and values against 2.5 GB of weights), so an MBU or a toll computed from the
weights alone charges the cache's bytes to the kernels. Here, per point (rows, prompt length, strategy):

- decode ms/step = (the call of N new tokens - the call of 1) / (N - 1), medians of the timed calls;
- KV bytes per step = layers x rows x 2 (K and V) x KV heads x head size x element bytes x the mean length a
  step attends to (prompt + N / 2: the steps of the call attend to P + 1 .. P + N - 1 slots);
- MBU = (weight bytes + KV bytes) / measured bandwidth / decode time per step;
- toll (us per layer) = (decode ms/step - (weight bytes + KV bytes) / measured bandwidth) / layers: what a step
  costs beyond reading its bytes once at the copy bandwidth, spread over the layers (figures.toll_us_per_layer,
  the bench's own toll with the KV bytes added to the weights);
- tok/s = rows / decode time per step; time to first token = the call of 1 token;
- kernels per step from a profiler trace of one call (timeline.analyze), where CUDA is there.

scripts/scale_sweep.py runs it; the figures' arithmetic is tested on CPU (tests/bench/test_scale.py).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass

import torch

from .report.figures import decode_ms_per_step, read_ms, toll_us_per_layer


@dataclass(frozen=True)
class Shape:
    """What a decode step reads, from a model's config."""

    layers: int
    kv_heads: int
    head_dim: int
    elt_bytes: int


def model_shape(model) -> Shape:
    """The decoder's layers, KV heads and head size, and its parameters' element size."""
    cfg = model.config.get_text_config(decoder=True)
    layers = getattr(cfg, "num_hidden_layers", None) or cfg.n_layer
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return Shape(layers, kv, head_dim, next(model.parameters()).element_size())


def mean_context(prompt_len: int, new_tokens: int) -> float:
    """The mean number of cache slots the decode steps of a call of `new_tokens` attend to: step j (1 .. N-1)
    attends to the prompt and the j tokens before it, P + j; the mean is P + N / 2."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 (a call of 1 token has no decode step), got {new_tokens}")
    return prompt_len + new_tokens / 2


def kv_bytes_per_step(shape: Shape, rows: int, context: float) -> float:
    """Bytes of keys and values one decode step reads: every row's `context` slots, K and V, in every layer."""
    return shape.layers * rows * 2 * shape.kv_heads * shape.head_dim * shape.elt_bytes * context


def step_figures(
    ms_per_step: float, rows: int, weight_bytes: int, kv_bytes: float, bandwidth_gbs: float | None, layers: int
) -> dict:
    """tok/s, and, with a measured bandwidth, MBU (weights and KV) and the toll in us per layer."""
    out = dict(
        ms_per_step=ms_per_step,
        tok_s=rows / (ms_per_step / 1e3),
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
        mbu=None,
        mbu_weights_only=None,
        toll_us_per_layer=None,
    )
    if bandwidth_gbs:
        floor_ms = read_ms(weight_bytes + kv_bytes, bandwidth_gbs)
        out.update(
            floor_ms=floor_ms,
            mbu=floor_ms / ms_per_step,
            mbu_weights_only=read_ms(weight_bytes, bandwidth_gbs) / ms_per_step,
            toll_us_per_layer=toll_us_per_layer(ms_per_step, weight_bytes + kv_bytes, bandwidth_gbs, layers),
        )
    return out


def points(
    rows: list[int], prompts: list[int], long_rows: list[int], long_prompts: list[int], strategies: list[str]
) -> list[tuple[str, int, int]]:
    """(strategy, rows, prompt) in the order they run: the short prompts over `rows`, then the long prompts over
    `long_rows`, every strategy at a point before the next point, so that a time budget that cuts the run leaves
    whole comparisons."""
    grid = [(r, p) for p in prompts for r in rows] + [(r, p) for p in long_prompts for r in long_rows]
    return [(name, r, p) for r, p in grid for name in strategies]


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host sync: timing boundary


def _median_call(fn, device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure_point(
    decoder,
    model,
    strategy: str,
    rows: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    bandwidth_gbs,
    weight_bytes: int,
    trace_dir: str | None,
) -> dict:
    """One point's figures (module docstring); the calls generate `new_tokens` with EOS off."""
    from .timeline import analyze, trace_call
    from .workloads import prompt

    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = prompt(rows, prompt_len, vocab, device)

    mask = torch.ones_like(ids)  # unpadded rows, said so: a mask is never inferred from the pad id in random ids

    def call(n):
        return lambda: decoder.generate(
            ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[], do_sample=False
        )

    call(new_tokens)()  # warm-up: compiles and captures this shape
    call(1)()
    t_n = _median_call(call(new_tokens), device, repeats)
    t_1 = _median_call(call(1), device, repeats)
    ms = decode_ms_per_step(t_n * 1e3, t_1 * 1e3, new_tokens)
    shape = model_shape(model)
    kv = kv_bytes_per_step(shape, rows, mean_context(prompt_len, new_tokens))
    row = dict(
        strategy=strategy,
        rows=rows,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        call_s=t_n,
        ttft_ms=t_1 * 1e3,
        layers=shape.layers,
        bandwidth_gbs=bandwidth_gbs,
        **step_figures(ms, rows, weight_bytes, kv, bandwidth_gbs, shape.layers),
    )
    if trace_dir is not None and device.type == "cuda":
        path = os.path.join(trace_dir, f"{strategy}-r{rows}-p{prompt_len}.json.gz")
        summary = analyze(trace_call(call(new_tokens), device, path))
        row["kernels_per_step"] = summary.get("kernels_per_step")
    return row


def markdown(result: dict) -> str:
    """The sweep as a table, one line per point."""
    cfg = result["config"]
    lines = [
        f"# Decode over rows and prompt lengths: {cfg['model']}, {cfg['dtype']}",
        "",
        f"Measured bandwidth (device copy): {_f(result.get('bandwidth_gbs'), '{:.0f}')} GB/s. Weight bytes "
        f"{result['weight_bytes'] / 1e9:.3f} GB. Decode ms/step = (call of N - call of 1) / (N - 1); KV bytes per "
        "step at the mean attended length (prompt + N/2); MBU = (weights + KV) / bandwidth / ms per step; toll = "
        "(ms/step - (weights + KV) / bandwidth) / layers.",
        "",
        "| strategy | rows | prompt | ms/step | tok/s | KV MB/step | MBU | MBU (weights only) | toll us/layer "
        "| kernels/step | TTFT ms |",
        "|" + "---|" * 11,
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['strategy']} | {r['rows']} | {r['prompt_len']} | {r['error']} |" + " |" * 8)
            continue
        lines.append(
            " | ".join(
                [
                    "",
                    r["strategy"] + (f" [{r['variant']}]" if r.get("variant") else ""),
                    str(r["rows"]),
                    str(r["prompt_len"]),
                    f"{r['ms_per_step']:.3f}",
                    f"{r['tok_s']:.0f}",
                    f"{r['kv_bytes'] / 1e6:.1f}",
                    _f(r.get("mbu"), "{:.0%}"),
                    _f(r.get("mbu_weights_only"), "{:.0%}"),
                    _f(r.get("toll_us_per_layer"), "{:.1f}"),
                    _f(r.get("kernels_per_step"), "{:.0f}"),
                    f"{r['ttft_ms']:.1f}",
                    "",
                ]
            ).strip()
        )
    for s in result.get("not_run", []):
        lines.append(f"| {s[0]} | {s[1]} | {s[2]} | not run: time budget |" + " |" * 8)
    return "\n".join(lines) + "\n"


def _f(v, fmt: str) -> str:
    return "-" if v is None else fmt.format(v)


def write(out_dir: str, result: dict) -> None:
    with open(os.path.join(out_dir, "scale.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(out_dir, "scale.md"), "w") as f:
        f.write(markdown(result))
