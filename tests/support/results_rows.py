"""A results.json of the bench's, written by hand: the config and rows the report and results tests read."""

from __future__ import annotations

import json
import os

CONFIG = dict(model="tiny-gpt2", prompt_len=8, repeats=2, warmup=0)


def result_row(strategy="kv", n=8, seq_s=0.1, **kw):
    return dict(
        model="tiny-gpt2",
        strategy=strategy,
        workload="fixed",
        allocator="default",
        dtype="float32",
        batch=1,
        max_new_tokens=n,
        prompt_len=8,
        seq_s=seq_s,
        seq_s_all=[seq_s, seq_s * 1.1],
        ms_per_token=seq_s * 1e3 / n,
        tokens_per_s=n / seq_s,
        ttft_ms=1.0,
        first_call_s=seq_s,
        new_tokens=n,
        device="cpu",
        **kw,
    )


def write_results(d, content):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "results.json"), "w") as f:
        f.write(content if isinstance(content, str) else json.dumps(content))
    return os.path.join(d, "results.json")
