"""Compiled calls raise dynamo's recompile limits only while they may compile, and restore them: a sweep of
more specialisations than a low limit allows still compiles every one of them (never a silent eager fallback),
and the process's dynamo settings are what they were after every call."""

from __future__ import annotations

import torch

import overlapdecode as od
from overlapdecode.loop.compiling import RECOMPILE_LIMITS, recompile_limits
from support.helpers import hf_generate, make_batch

N = 3


def test_the_limits_are_raised_inside_and_restored_after():
    cfg = torch._dynamo.config
    before = (cfg.recompile_limit, cfg.accumulated_recompile_limit)
    with cfg.patch(recompile_limit=2, accumulated_recompile_limit=10_000):
        with recompile_limits():
            assert cfg.recompile_limit == RECOMPILE_LIMITS["recompile_limit"]
            assert cfg.accumulated_recompile_limit == 10_000  # a higher limit is kept
        assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == (2, 10_000)
    assert (cfg.recompile_limit, cfg.accumulated_recompile_limit) == before


def _specialisations_compile(run, batches) -> None:
    """Under a process limit of one specialisation per function, each batch size (a new shape) still compiles
    (the count rises), and the limit is 1 again after every call."""
    cfg = torch._dynamo.config
    # another test may have compiled the same graph (the decode step's shape is the batch and the cache length,
    # and dynamo reuses a graph across model objects of one class): start from no compiled code
    torch._dynamo.reset()
    with cfg.patch(recompile_limit=1):
        for batch in batches:
            before = od.compile_count()
            run(batch)
            assert od.compile_count() > before, f"batch {batch}: ran eagerly (the recompile limit was hit)"
            assert cfg.recompile_limit == 1  # restored: nothing process-wide is left changed


def test_a_compiled_sweep_compiles_every_shape_and_leaves_the_limits():
    model = od.load_model("tiny-gpt2", device="cpu")  # its own model: no other test compiled its shapes

    def run(batch):
        ids, mask = make_batch(batch, seed=batch)
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=N, strategy="compiled", eos_token_id=[])
        assert torch.equal(out, hf_generate(model, ids, mask, N, [], 0))

    _specialisations_compile(run, (1, 2))


def test_a_compiled_fused_prefill_compiles_every_shape_and_leaves_the_limits():
    model = od.load_model("tiny-llama", device="cpu")
    dec = od.Decoder(model, fused_options={"compile_prefill": True})  # compiled on CPU too (default: CUDA only)

    def run(batch):
        ids, mask = make_batch(batch, seed=batch)
        out = dec.generate(
            ids, attention_mask=mask, max_new_tokens=N, strategy="fused", eos_token_id=[], pad_token_id=0
        )
        assert torch.equal(out, hf_generate(model, ids, mask, N, [], 0))

    _specialisations_compile(run, (1, 2))
