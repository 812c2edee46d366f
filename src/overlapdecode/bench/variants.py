"""Sampled variants of a strategy in the benchmark: `NAME+key=value+...`, measured beside NAME in one run.

`fused+top_p=0.9` is the `fused` preset sampling with top-p 0.9 (seeded by the run's seed), `fused+sample`
plain sampling, `kv+repetition_penalty=1.2` greedy decoding with a penalty. The keys are od.generate's:
temperature, top_k, top_p, min_p, repetition_penalty; any key but the penalty turns sampling on. A sampled
variant applies the warpers it names and no other: the others are passed their neutral values, not left to the
model's generation config or Hugging Face's default top-k of 50.
"""

from __future__ import annotations

SAMPLE_KEYS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float}


def split_variant(name: str) -> tuple[str, dict]:
    """'fused+top_p=0.9' -> ('fused', {'do_sample': True, 'top_p': 0.9}); 'fused' -> ('fused', {}).
    ValueError naming the part that is not understood."""
    base, *parts = name.split("+")
    kwargs: dict = {}
    for part in parts:
        if part == "sample":
            kwargs["do_sample"] = True
            continue
        key, eq, value = part.partition("=")
        if key not in SAMPLE_KEYS or not eq:
            raise ValueError(
                f"{name}: {part!r} is not a sampling setting; use +sample or +KEY=VALUE with KEY one of "
                f"{', '.join(SAMPLE_KEYS)}"
            )
        try:
            kwargs[key] = SAMPLE_KEYS[key](value)
        except ValueError:
            raise ValueError(f"{name}: {key} takes a number, got {value!r}") from None
        if key != "repetition_penalty":
            kwargs["do_sample"] = True
    return base, kwargs


# the warpers' values that change nothing, given where a sampled variant does not name the warper
NEUTRAL = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}


def generate_kwargs(name: str, seed: int) -> dict:
    """The sampling keywords of od.generate for the variant `name` (a seed, and the neutral value of each warper
    it does not name, when it samples; do_sample=False otherwise, whatever the model's generation config says)."""
    _, kwargs = split_variant(name)
    return dict(NEUTRAL, **kwargs, seed=seed) if kwargs.get("do_sample") else dict(kwargs, do_sample=False)
