"""What one benchmark run measures (`BenchConfig`) and in which order (`plan`).

A leaf module, free of torch: the command line builds a config, the runner cuts it into worker units and
writes it as JSON, and each worker reads it back and walks its plan, all from this one definition.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class BenchConfig:
    model: str = "tiny-gpt2"
    strategies: tuple[str, ...] = ("baseline", "kv", "static", "compiled", "interleaved")
    peers: tuple[str, ...] = ("hf-dynamic", "hf-static", "hf-compiled")
    lengths: tuple[int, ...] = (16, 48)
    batches: tuple[int, ...] = (1,)
    dtypes: tuple[str, ...] = ("float32",)
    allocators: tuple[str, ...] = ("default",)
    workloads: tuple[str, ...] = ("fixed",)
    eos_lengths: tuple[int, ...] = ()  # lengths of the eos workload; empty = the longest length
    pairs: tuple[str, ...] = ()  # "dtype:batch" pairs measured instead of dtypes x batches, e.g. bfloat16:8
    # (pair, names, lengths): a pair of `pairs` measured with these strategies and peers at these lengths instead
    # of the run's, e.g. ("bfloat16:1", ("interleaved", "fused"), (192,)): the main job's bfloat16 rows
    narrowed: tuple[tuple[str, tuple[str, ...], tuple[int, ...]], ...] = ()
    time_budget_s: float | None = None  # stop starting new configurations after this long (rest: "not run")
    gpus: tuple[int, ...] = ()  # CUDA devices to spread the units over (runner.work_units); empty: one device
    tp: int = 1  # tensor-parallel processes (under torchrun); every row carries it
    prompt_len: int = 32
    warmup: int = 1
    repeats: int = 3
    profile: bool = True
    device: str | None = None
    seed: int = 0
    quantize: str | None = None  # "int4", "int8" or "fp8": load_model(quantize=...); None: the weights as loaded
    group_size: int = 128  # int4's input features per scale and zero point
    # speculative decoding (bench/speculative.py): the K of prompt lookup's rows, the draft of the assistant's
    # rows ("self", "random", or a model name or directory) and their K, and the strategies that speculate (those
    # of `strategies` whose preset runs it, sampled variants included; the command line finds them)
    prompt_lookup: tuple[int, ...] = ()
    prompt_lookup_loop: tuple[int, ...] = ()  # prompt lookup's K on a prompt whose continuation repeats it
    assistant: str | None = None
    num_assistant_tokens: tuple[int, ...] = ()
    speculating: tuple[str, ...] = ()


def config_json(cfg: BenchConfig) -> str:
    return json.dumps(asdict(cfg))


def config_from_json(text: str) -> BenchConfig:
    raw = json.loads(text)
    raw["narrowed"] = [(pair, tuple(names), tuple(lengths)) for pair, names, lengths in raw.get("narrowed", [])]
    return BenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})


def combos(cfg: BenchConfig) -> list[tuple[str, int]]:
    """The (dtype, batch) pairs of a run: `pairs` if given, else every dtype x batch."""
    return [split_pair(p) for p in cfg.pairs] or [(d, b) for d in cfg.dtypes for b in cfg.batches]


def _lengths(lengths, eos_lengths) -> dict:
    return {
        "fixed": list(lengths),
        "verify": [0],  # one forward, no new tokens: see speculative_names
        "speculative": list(lengths),
        "profile": [min(lengths)],
        "eos": list(eos_lengths) or [max(lengths)],
    }


def speculative_names(cfg: BenchConfig, workload: str, names) -> list:
    """What a workload measures of `names` (a configuration's strategies and peers): the names themselves, but for
    the speculative workloads: `verify`, the distinct presets among those of `names` that speculate (the verify
    step's cost is the preset's, whatever it samples); `speculative`, a (strategy, kind, K) per strategy that
    speculates and K of prompt lookup ("prompt_lookup"; "prompt_lookup_loop" on a looping prompt) and of the draft
    model ("assistant"; with a looping prompt asked for, "assistant_loop" on it too)."""
    spec = [n for n in names if n in cfg.speculating]
    if workload == "verify":
        return list(dict.fromkeys(n.split("+")[0] for n in spec))
    if workload == "speculative":
        kinds = [("prompt_lookup", k) for k in cfg.prompt_lookup]
        kinds += [("prompt_lookup_loop", k) for k in cfg.prompt_lookup_loop]
        kinds += [("assistant", k) for k in cfg.num_assistant_tokens] if cfg.assistant else []
        if cfg.assistant and cfg.prompt_lookup_loop:  # the draft model on the looping prompt too
            kinds += [("assistant_loop", k) for k in cfg.num_assistant_tokens]
        # a looping prompt is the greedy output's: a sampled variant (NAME+...) does not follow it
        return [(n, kind, k) for n in spec for kind, k in kinds if not (kind.endswith("_loop") and "+" in n)]
    return list(names)


def plan(cfg: BenchConfig) -> tuple[list[tuple[str, int]], list[tuple]]:
    """(dtype, batch) pairs, and the (dtype, batch, workload, length, strategy) rows to measure, in order.

    Per dtype (one model load): the fixed workload, then with speculation the verify step's cost and the
    speculative rows (after the fixed rows, whose times their speed-up divides), then the profiles, then the eos
    rows last, since the forced-EOS hook stays registered until that dtype's model is dropped. A pair of
    `narrowed` is measured with its own names and lengths. A speculative row's name is (strategy, kind, K).
    """
    pairs = combos(cfg)
    whole = (list(cfg.strategies) + list(cfg.peers), _lengths(cfg.lengths, cfg.eos_lengths))
    own = {split_pair(p): (list(names), _lengths(ns, cfg.eos_lengths)) for p, names, ns in cfg.narrowed}
    speculates = bool(cfg.speculating and (cfg.prompt_lookup or cfg.prompt_lookup_loop or cfg.assistant))
    workloads = [
        w
        for w in ("fixed", "verify", "speculative", "profile", "eos")
        if w in cfg.workloads or (w == "profile" and cfg.profile) or (w in ("verify", "speculative") and speculates)
    ]
    rows = [
        (dtype, batch, workload, n, name)
        for dtype in dict.fromkeys(d for d, _ in pairs)
        for workload in workloads
        for batch in [b for d, b in pairs if d == dtype]
        for n in own.get((dtype, batch), whole)[1][workload]
        for name in speculative_names(cfg, workload, own.get((dtype, batch), whole)[0])
    ]
    return pairs, rows


def split_pair(pair: str) -> tuple[str, int]:
    """'bfloat16:8' -> ('bfloat16', 8): the one parser of a dtype:batch pair (the command line and the worker's
    plan); a ValueError naming --dtype-batch otherwise."""
    dtype, _, batch = pair.partition(":")
    if not dtype or not batch.isdigit() or int(batch) < 1:
        raise ValueError(f"--dtype-batch takes dtype:batch pairs such as bfloat16:8, got {pair!r}")
    return dtype, int(batch)
