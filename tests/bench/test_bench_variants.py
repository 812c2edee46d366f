"""Sampled variants of a strategy in the benchmark (`fused+top_p=0.9`): parsed, checked, and run as od.generate."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.bench.variants import generate_kwargs, split_variant
from overlapdecode.bench.worker import _runner
from overlapdecode.cli.args import CliError
from overlapdecode.cli.bench_flags import check_strategies
from support.helpers import make_batch


def test_split_variant():
    assert split_variant("fused") == ("fused", {})
    assert split_variant("fused+top_p=0.9+temperature=0.8") == (
        "fused",
        dict(do_sample=True, top_p=0.9, temperature=0.8),
    )
    assert split_variant("kv+repetition_penalty=1.2") == ("kv", dict(repetition_penalty=1.2))
    assert split_variant("interleaved:2+sample") == ("interleaved:2", dict(do_sample=True))
    neutral = dict(temperature=1.0, top_p=1.0, min_p=0.0)  # the warpers a variant does not name: none applied
    assert generate_kwargs("kv+top_k=5", 3) == dict(neutral, do_sample=True, top_k=5, seed=3)
    assert generate_kwargs("kv+sample", 3) == dict(neutral, do_sample=True, top_k=0, seed=3)
    # greedy, whatever the model's generation config says
    assert generate_kwargs("kv+repetition_penalty=1.2", 3) == dict(repetition_penalty=1.2, do_sample=False)
    assert generate_kwargs("fused", 3) == dict(do_sample=False)
    with pytest.raises(ValueError, match="top_q"):
        split_variant("kv+top_q=0.9")
    with pytest.raises(ValueError, match="top_k takes a number"):
        split_variant("kv+top_k=0.5")


def test_check_strategies_refuses_bad_variants_in_one_line():
    assert check_strategies("kv,fused+top_p=0.9", "--strategies", 8) == ("kv", "fused+top_p=0.9")
    for text, part in (("kv+top_p=1.5", "top_p"), ("nope+top_p=0.5", "nope"), ("kv+min_p=x", "min_p")):
        with pytest.raises(CliError, match=part):
            check_strategies(text, "--strategies", 8)


def test_a_variant_runs_od_generate_with_its_sampling(tiny_llama):
    ids, _ = make_batch(2, seed=3)
    ids = ids[:, 4:]  # no padding: the bench's prompts
    got = _runner("kv+top_p=0.8+temperature=0.7", tiny_llama, ids, 6, [], 0, seed=11)()
    want = od.generate(
        tiny_llama,
        ids,
        max_new_tokens=6,
        strategy="kv",
        eos_token_id=[],
        pad_token_id=0,
        do_sample=True,
        top_p=0.8,
        temperature=0.7,
        top_k=0,  # the variant names no top-k: Hugging Face's default of 50 is not applied
        seed=11,
    )
    greedy = od.generate(tiny_llama, ids, max_new_tokens=6, strategy="kv", eos_token_id=[], pad_token_id=0)
    assert torch.equal(got, want) and not torch.equal(got, greedy)
