"""The `fused` preset: exactly Hugging Face generate()'s greedy tokens (CPU, float32, the torch twins of the
kernels), per-step logits within 1e-4, the Hugging Face model unharmed by the re-layout, clear refusals."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

import overlapdecode as od
from overlapdecode.fused.layout import fuse_weights
from overlapdecode.fused.model import FusedModel
from support.fused_steps import SMALL, fused_logits, hf_greedy, tiny_fused_model
from support.helpers import eos_hit_midway, hf_generate, make_batch

N = 20


MODELS = ["tiny-gpt2", "tiny-llama", "qwen2", "mistral", "llama3-tied"]


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return tiny_fused_model(request.param)


@pytest.mark.parametrize("batch", [1, 4])
def test_fused_matches_hf_eos_midway_and_never(model, batch):
    ids, mask = make_batch(batch, seed=batch + 20)
    rows = [0] if batch == 1 else [0, 2]
    eos = eos_hit_midway(model, ids, mask, N, rows)
    assert eos is not None, "test batch has no usable EOS; change the seed"
    lengths = []
    for eos_ids in (eos, []):
        ref = hf_generate(model, ids, mask, N, eos_ids, 5)
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=N, strategy="fused", eos_token_id=eos_ids, pad_token_id=5
        )
        assert torch.equal(out, ref), eos_ids
        lengths.append(out.shape[1])
    if batch == 1:
        assert lengths[0] < lengths[1] == ids.shape[1] + N  # with EOS the row really stopped early


@pytest.mark.parametrize("batch", [128])
def test_fused_matches_hf_at_large_batches(model, batch):
    """128 rows, the most the fused kernels serve in one tile: mixed prompt lengths (left padding on every other
    row), EOS per row (a token row 0 emits mid-way: some rows stop, others run to the end), exactly Hugging Face's
    tokens. (The kernels themselves at these row counts: test_fused_kernels.py, in the interpreter.)"""
    ids, mask = make_batch(batch, seed=batch + 3, prompt_len=11)
    free = hf_generate(model, ids, mask, 12, [], 0)
    eos = [int(free[0, 11 + 4])]
    ref = hf_generate(model, ids, mask, 12, eos, 5)
    stopped = (ref[:, 11:-1] == eos[0]).any(1)
    assert 0 < int(stopped.sum()) < batch, "EOS must stop some rows early and not others; change the seed"
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=12, strategy="fused", eos_token_id=eos, pad_token_id=5
    )
    assert torch.equal(out, ref)


def test_the_cache_is_sized_to_the_call_but_never_past_the_models_positions():
    """The cache holds the call's length rounded up to 64 (nearby calls share it), at most the model's positions:
    a call of 91 tokens on a model of 100 positions gets 100 slots, not 128, and Hugging Face's tokens."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**dict(SMALL, max_position_embeddings=100))).eval()
    ids, mask = make_batch(3, seed=2, prompt_len=11)
    dec = od.Decoder(model)
    out = dec.generate(ids, attention_mask=mask, max_new_tokens=80, strategy="fused", eos_token_id=[])
    assert torch.equal(out, hf_generate(model, ids, mask, 80, [], 0))
    assert [c.length for c in dec.fused_model()._caches.values()] == [100]
    dec.generate(ids, attention_mask=mask, max_new_tokens=20, strategy="fused", eos_token_id=[])
    assert sorted(c.length for c in dec.fused_model()._caches.values()) == [64, 100]


def test_eager_fused_and_long_prompt_match_hf(model):
    """Uncompiled, and a prompt longer than one prefill bucket (the prefill pads it on the right)."""
    ids, mask = make_batch(2, seed=31, prompt_len=70)
    ref = hf_generate(model, ids, mask, 12, [], 0)
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=12, strategy=od.Strategy(cache="fused"), eos_token_id=[]
    )
    assert torch.equal(out, ref)


@torch.no_grad()
def test_per_step_logits_match_hf(model):
    ids, mask = make_batch(4, seed=33)
    hf = hf_greedy(model, ids, mask, N)
    ref = torch.stack(hf.logits, 1).float()  # (B, N, V)
    got = fused_logits(FusedModel(model), ids, mask, hf.sequences[:, ids.shape[1] :])
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() <= 1e-4


def _storage_bytes(model) -> int:
    seen = {}
    for p in model.parameters():
        seen[p.untyped_storage().data_ptr()] = p.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("name", ["tiny-gpt2", "qwen2"])
@torch.no_grad()
def test_relayout_keeps_hf_model_and_memory(name):
    model = tiny_fused_model(name)
    ids, mask = make_batch(2, seed=5)
    before = model(input_ids=ids, attention_mask=mask).logits
    bytes_before = _storage_bytes(model)
    W = FusedModel(model).weights
    after = model(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(before, after)
    extra = sum(
        t.untyped_storage().nbytes()
        for t in W.tensors()
        if t.untyped_storage().data_ptr() not in {p.untyped_storage().data_ptr() for p in model.parameters()}
    )
    assert _storage_bytes(model) + extra <= 1.05 * bytes_before
    # the Hugging Face parameters are views of the fused tensors, and a second re-layout copies nothing
    if name == "qwen2":
        attn = model.model.layers[0].self_attn
        assert attn.q_proj.weight.data_ptr() == W.layers[0].w_qkv.data_ptr()
        assert attn.k_proj.bias.data_ptr() == W.layers[0].b_qkv.data_ptr() + attn.q_proj.bias.nbytes
    else:
        assert model.transformer.h[0].attn.c_attn.weight.data_ptr() == W.layers[0].w_qkv.data_ptr()
    again = fuse_weights(model)
    assert all(
        a.w_qkv.data_ptr() == b.w_qkv.data_ptr() and a.w_up.data_ptr() == b.w_up.data_ptr()
        for a, b in zip(W.layers, again.layers)
    )
    assert _storage_bytes(model) == bytes_before


def test_relayout_under_inference_mode_leaves_ordinary_parameters():
    model = tiny_fused_model("tiny-llama")
    ids, mask = make_batch(2, seed=6)
    ref = hf_generate(model, ids, mask, 8, [], 0)
    with torch.inference_mode():
        out = od.generate(model, ids, attention_mask=mask, max_new_tokens=8, strategy="fused", eos_token_id=[])
    assert torch.equal(out, ref)
    assert not any(p.is_inference() for p in model.parameters())
    model(input_ids=ids).logits.sum().backward()  # the Hugging Face model still trains


def test_unsupported_architecture_is_a_clear_value_error():
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**SMALL)).eval()
    ids, _ = make_batch(1, seed=1)
    with pytest.raises(ValueError, match="Llama family.*GPT-2.*gpt_neox"):
        od.generate(model, ids, max_new_tokens=4, strategy="fused")


def test_mistral_sliding_window_shorter_than_the_call_is_hf():
    """A call past Mistral's window attends to its last 32 positions, as Hugging Face's (test_fused_families.py:
    windows of 6, left padding, sampling)."""
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=32)).eval()
    ids, mask = make_batch(1, seed=1)
    ref = hf_generate(model, ids, mask, 40, [], 0)
    assert torch.equal(od.generate(model, ids, max_new_tokens=40, strategy="fused", eos_token_id=[]), ref)


def test_pdl_is_refused_where_the_kernels_cannot_use_it():
    model = od.load_model("tiny-gpt2", device="cpu")
    with pytest.raises(ValueError, match="pdl needs the Triton kernels on a CUDA GPU"):
        FusedModel(model, pdl=True)
    with pytest.raises(ValueError, match="pdl must be a bool or None"):
        FusedModel(model, pdl=3)
    assert FusedModel(model).pdl is False  # CPU: no PDL by default


def test_tiles_choose_keywords_by_the_weights_shape():
    """FusedModel(tiles=...) gives a kernel its tile keywords by the (N, K) of its weight argument; other
    shapes and other kernels keep their defaults; a malformed table is refused naming the argument."""
    from overlapdecode.fused.model import Tiled

    calls = []

    def kernel(x, w, b, residual, block_n=32, block_k=128):
        calls.append((tuple(w.shape), block_n, block_k))

    tiles = {("linear_residual", 8, 4): dict(block_n=16, block_k=64), ("norm_linear", 8, 4): dict(block_n=64)}
    op = Tiled(kernel, "linear_residual", 1, tiles)
    op(torch.zeros(1, 4), torch.zeros(8, 4), None, None)
    op(torch.zeros(1, 6), torch.zeros(8, 6), None, None)
    assert calls == [((8, 4), 16, 64), ((8, 6), 32, 128)]
    # a min_batch entry serves calls of that many rows or more; the 3-tuple key the rest
    op = Tiled(
        kernel,
        "linear_residual",
        1,
        {**tiles, ("linear_residual", 8, 4, 8): dict(block_n=64), ("linear_residual", 8, 4, 4): dict(block_k=256)},
    )
    calls.clear()
    for rows in (1, 3, 4, 7, 8, 16):
        op(torch.zeros(rows, 4), torch.zeros(8, 4), None, None)
    assert calls == [((8, 4), 16, 64)] * 2 + [((8, 4), 32, 256)] * 2 + [((8, 4), 64, 128)] * 2
    # past 16 rows the kernels swap their tiles (kernels/swap_ab.py): the entries of up to 16 rows no longer
    # apply, one of a larger min_batch does
    op = Tiled(kernel, "linear_residual", 1, {**tiles, ("linear_residual", 8, 4, 32): dict(block_n=128)})
    calls.clear()
    for rows in (16, 17, 31, 32, 128):
        op(torch.zeros(rows, 4), torch.zeros(8, 4), None, None)
    assert calls == [((8, 4), 16, 64)] + [((8, 4), 32, 128)] * 2 + [((8, 4), 128, 128)] * 2
    model = od.load_model("tiny-gpt2", device="cpu")
    for bad in (
        {("norm_qkv", 8): {}},
        {("attention", 8, 4): {}},
        {("norm_qkv", 8, 4): 16},
        [1],
        {("norm_qkv", 8, 4, 0): {}},
        {("norm_qkv", 8, 4, 8, 1): {}},
        {("norm_qkv", 8, 4): {}, ("norm_qkv", 8, 4, 1): {}},
    ):
        with pytest.raises(ValueError, match=r"tiles(\[.*\])? must"):
            FusedModel(model, tiles=bad)
    from overlapdecode.fused.model import TILES, check_option_values

    check_option_values(tiles=TILES)  # the table itself is well formed


def test_kernel_operands_past_32_bit_offsets_are_refused():
    """The GEMV kernels index their operands with 32-bit offsets: a tensor of 2**31 elements or more is a
    ValueError naming it, not a silently wrapped address (a meta tensor: no memory is allocated)."""
    from overlapdecode.fused.kernels.linear_residual import require_32bit

    require_32bit(w=torch.empty(2**31 - 1, dtype=torch.int8, device="meta"))
    with pytest.raises(ValueError, match="w has 2147483648 elements"):
        require_32bit(w=torch.empty(2**31, dtype=torch.int8, device="meta"))
    with pytest.raises(ValueError, match="x must be contiguous"):
        require_32bit(x=torch.empty(4, 6, device="meta").t())
