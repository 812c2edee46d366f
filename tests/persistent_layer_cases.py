"""The persistent layer kernel against the five kernels of the same layer (and their torch references), on odd
shapes, in Triton's interpreter. Not collected by itself: the interpreter must be chosen before Triton is first
imported, so test_persistent_layer.py runs this file in a fresh process with TRITON_INTERPRET=1 (on CPU). On a GPU
it can be run directly (`pytest tests/persistent_layer_cases.py`; there the waits are real spins across programs).

The interpreter runs programs one after another, so there one program (or several with the claim ticket: the
first claims every task) runs the whole schedule in order; a static hand-out to two programs makes the first
wait for the second, which has not run: the bounded spin gives up and the wrapper raises.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from overlapdecode.fused import forward
from overlapdecode.fused.kernels.norm_linear import NormSums
from overlapdecode.fused.kernels.persistent_layer import PersistentLayer, matching_ops
from overlapdecode.fused.kernels.persistent_schedule import final_counters, make_plan
from overlapdecode.fused.layout import fuse_weights
from overlapdecode.fused.model import REFERENCE_OPS
from triton_interpreter import INTERPRETING, interpreter_patches  # noqa: F401 (autouse fixture)

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# small tiles and large split targets, so that every phase is split (and its tickets used) at these sizes
SMALL = dict(
    qkv_block_k=16,
    o_block_k=16,
    up_block_k=16,
    down_block_k=16,
    o_block_n=16,
    down_block_n=16,
    up_block_n=16,
    att_block_n=16,
    qkv_programs=10**4,
    o_programs=10**4,
    down_programs=10**4,
    att_programs=2 * 132,  # the attention's splits of an H200 (make_plan's default for sms=132)
)


def _model(family: str, H: int, Hq: int, Hkv: int, D: int, I: int, dtype=torch.float32, layers: int = 1):
    """`layers` layers of `family` with random biases and norm weights too (Hugging Face's 0 and 1 would hide a
    dropped bias or norm weight), in `dtype`; its FusedWeights."""
    torch.manual_seed(H + Hq + Hkv + D + I)
    if family == "gpt2":  # LayerNorm, biases everywhere, tanh GELU, no RoPE
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=50,
                n_positions=64,
                n_embd=H,
                n_layer=layers,
                n_head=Hq,
                n_inner=I,
                activation_function="gelu_pytorch_tanh",
            )
        )
    else:
        cls, cfg = (Qwen2ForCausalLM, Qwen2Config) if family == "qwen2" else (LlamaForCausalLM, LlamaConfig)
        model = cls(
            cfg(
                vocab_size=50,
                hidden_size=H,
                intermediate_size=I,
                num_hidden_layers=layers,
                num_attention_heads=Hq,
                num_key_value_heads=Hkv,
                head_dim=D,
                max_position_embeddings=64,
            )
        )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif "norm" in name or ".ln_" in name:
                p.normal_(1.0, 0.1)
    return fuse_weights(model.eval().to(DEV, dtype))


def _inputs(W, B: int, S: int, dtype, seed: int):
    """h, the caches, and each row's position, slot, start (its left padding) and length (slot + 1): rows of
    different lengths, so that some attention pieces are empty."""
    g = torch.Generator().manual_seed(seed)
    H, Hkv, D = W.hidden, W.n_kv_heads, W.head_dim
    h = (torch.randn(B, H, generator=g) + 0.3).to(DEV, dtype)
    kc = torch.randn(B, Hkv, S, D, generator=g).to(DEV, dtype)
    vc = torch.randn(B, Hkv, S, D, generator=g).to(DEV, dtype)
    pad = torch.randint(0, 4, (B,), generator=g)
    pos = torch.randint(0, S - 4, (B,), generator=g)
    pos[0] = S - 4  # the longest row fills the cache: every piece of it is live
    state = torch.randint(100, 200, (B, 3), generator=g)
    state[:, 1] = pos  # the decode loop's positions are a strided column of its (B, 3) state
    slot = pos + pad
    return h, kc, vc, state[:, 1].to(DEV), slot.to(DEV), pad.to(DEV), (slot + 1).to(DEV)


def _layer(fn, W, h, kc, vc, pos, slot, start, length):
    """fn's layer output and the caches it leaves (on copies)."""
    k, v = kc.clone(), vc.clone()
    return fn(W, W.layers[0], h, k, v, pos, slot, start, length), k, v


def _five(ops):
    return lambda W, layer, *a: forward.decode_layer(W, layer, *a, ops)


def _plan_ops(plan, sums: bool):
    """The five kernels the persistent layer equals: with the RMSNorm sums handed on as it hands them, or not."""
    return matching_ops(plan, norm_sums=NormSums(min_rows=1) if sums else None)


# (family, B, hidden, heads, kv heads, head size, MLP width): hidden not a power of two, GQA ratios 1, 4 and 8,
# two row blocks (17 rows)
SHAPES = [
    ("llama", 3, 136, 4, 4, 32, 200),
    ("llama", 2, 152, 8, 2, 24, 136),
    ("llama", 17, 136, 8, 1, 16, 264),
    ("qwen2", 1, 168, 4, 2, 32, 152),
    ("gpt2", 2, 144, 3, 3, 48, 288),
]


@pytest.mark.parametrize("family,B,H,Hq,Hkv,D,I", SHAPES)
def test_layer_equals_the_five_kernels_in_float32(family, B, H, Hq, Hkv, D, I):
    W = _model(family, H, Hq, Hkv, D, I)
    S = 40
    args = _inputs(W, B, S, torch.float32, seed=B + H)
    plan = make_plan(B, H, Hq, Hkv, D, I, S, torch.float32, sms=1, **SMALL)
    assert min(plan.qkv_split, plan.o_split, plan.down_split, plan.att_splits) > 1  # every ticket path runs
    ref, kr, vr = _layer(_five(REFERENCE_OPS), W, *args)
    runs = [(True, "dynamic", 1)]
    if (B, Hkv) == (2, 2):  # one shape with the rest: no sums, the static hand-out, three programs
        runs += [(False, "dynamic", 1), (True, "static", 1), (True, "dynamic", 3)]
    if not INTERPRETING:  # on a GPU: the default grid (the SMs' programs share the tasks)
        runs = [(True, "dynamic", None), (True, "static", None), (False, "dynamic", None)]
    fives = {}
    for sums, claim, programs in runs:
        if sums not in fives:
            fives[sums] = _layer(_five(_plan_ops(plan, sums)), W, *args)
            torch.testing.assert_close(fives[sums][0], ref, atol=1e-4, rtol=1e-4)
        five, k5, v5 = fives[sums]
        layer = PersistentLayer(plan, DEV, torch.float32, claim=claim, programs=programs, norm_sums=sums)
        out, k, v = _layer(layer, W, *args)
        assert torch.equal(out, five) and torch.equal(k, k5) and torch.equal(v, v5), (sums, claim, programs)
        assert not layer.counters.any()  # every counter back to 0 by the launch itself
        layer.check()  # no wait gave up
    if INTERPRETING and (B, Hkv) == (2, 2):  # the counters before that reset: every signal, ticket and claim made
        for claim in ("dynamic", "static"):
            layer = PersistentLayer(plan, DEV, torch.float32, claim=claim, keep_counters=True)
            _layer(layer, W, *args)
            spans = list(zip(args[5].tolist(), args[6].tolist()))
            assert layer.counters.tolist() == final_counters(layer.schedule, 1, claim, spans), claim


@pytest.mark.parametrize("family,B,H,Hq,Hkv,D,I", [SHAPES[1], SHAPES[4]])
def test_layer_in_float16_equals_the_five_kernels(family, B, H, Hq, Hkv, D, I):
    """float16 stands in for bfloat16 (the interpreter's bfloat16 conversions truncate); the persistent layer
    applies the five kernels' roundings, and both stay within 16-bit tolerances of the torch references."""
    W = _model(family, H, Hq, Hkv, D, I, torch.float16)
    S = 40
    args = _inputs(W, B, S, torch.float16, seed=5)
    plan = make_plan(B, H, Hq, Hkv, D, I, S, torch.float16, sms=1, **SMALL)
    five, k5, v5 = _layer(_five(_plan_ops(plan, True)), W, *args)
    ref, _, _ = _layer(_five(REFERENCE_OPS), W, *args)
    out, k, v = _layer(PersistentLayer(plan, DEV, torch.float16), W, *args)
    assert out.dtype == torch.float16
    assert torch.equal(out, five) and torch.equal(k, k5) and torch.equal(v, v5)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_layers_in_a_row_reuse_the_counters_and_hand_on_the_sums():
    """Two layers in a row through one PersistentLayer (the counters reset by the launch before; the second
    layer's QKV norm reads the sums the first layer's down projection left) equal the five kernels in a row with
    the same sums; then a new input (not a layer output: normalised from its row) too; and the default tiles
    (no split at these sizes)."""
    W = _model("llama", 136, 8, 2, 16, 200, layers=2)
    B, S = 2, 40
    plan = make_plan(B, 136, 8, 2, 16, 200, S, torch.float32, sms=1, **SMALL)
    layer = PersistentLayer(plan, DEV, torch.float32)
    h, kc, vc, pos, slot, start, length = _inputs(W, B, S, torch.float32, seed=1)
    ops = _plan_ops(plan, True)
    caches = [(kc.clone(), vc.clone()) for _ in range(4)]
    x5, x = h, h
    for i, L in enumerate(W.layers):
        x5 = forward.decode_layer(W, L, x5, *caches[i], pos, slot, start, length, ops)
        x = layer(W, L, x, *caches[2 + i], pos, slot, start, length)
        assert torch.equal(x, x5) and torch.equal(caches[2 + i][0], caches[i][0]), i
        assert not layer.counters.any()
    assert layer.sums.of(x) is not None  # the second call read the first call's sums: its output has its own
    args = _inputs(W, B, S, torch.float32, seed=2)
    five, _, _ = _layer(_five(_plan_ops(plan, True)), W, *args)
    assert torch.equal(_layer(layer, W, *args)[0], five)
    plan = make_plan(B, 136, 8, 2, 16, 200, S, torch.float32, sms=1)
    five, _, _ = _layer(_five(_plan_ops(plan, True)), W, *args)
    assert torch.equal(_layer(PersistentLayer(plan, DEV, torch.float32), W, *args)[0], five)


@pytest.mark.skipif(not INTERPRETING, reason="programs run one after another only in the interpreter")
def test_a_wait_that_cannot_be_met_ends_and_is_reported():
    """Static hand-out to two programs: program 0 reaches a task whose inputs program 1 computes, which has not
    run (the interpreter runs program 0 to its end first). The spin gives up after its limit, the launch ends,
    and the wrapper raises naming the task; the error flag is then cleared and a good launch passes."""
    W = _model("llama", 152, 8, 2, 24, 136)
    B, S = 2, 40
    args = _inputs(W, B, S, torch.float32, seed=7)
    plan = make_plan(B, 152, 8, 2, 24, 136, S, torch.float32, sms=1, **SMALL)
    layer = PersistentLayer(plan, DEV, torch.float32, claim="static", programs=2)
    with pytest.raises(RuntimeError, match=r"task \d+ .* waited past the spin limit"):
        _layer(layer, W, *args)
    assert not layer.error.any() and not layer.counters.any()
    five, _, _ = _layer(_five(_plan_ops(plan, True)), W, *args)
    good = PersistentLayer(plan, DEV, torch.float32, claim="static", programs=1)
    assert torch.equal(_layer(good, W, *args)[0], five)


def test_bad_arguments_are_named():
    W = _model("llama", 152, 8, 2, 24, 136)
    B, S = 2, 40
    h, kc, vc, pos, slot, start, length = _inputs(W, B, S, torch.float32, seed=8)
    plan = make_plan(B, 152, 8, 2, 24, 136, S, torch.float32, sms=1)
    layer = PersistentLayer(plan, DEV, torch.float32)
    L = W.layers[0]
    with pytest.raises(ValueError, match="batch: the plan was made for 2, got 1"):
        layer(W, L, h[:1], kc[:1], vc[:1], pos[:1], slot[:1], start[:1], length[:1])
    with pytest.raises(ValueError, match="cache_len: the plan was made for 40, got 20"):
        layer(W, L, h, kc[:, :, :20].contiguous(), vc[:, :, :20].contiguous(), pos, slot, start, length)
    with pytest.raises(ValueError, match="k_cache must be contiguous"):
        layer(W, L, h, kc.transpose(2, 3).contiguous().transpose(2, 3), vc, pos, slot, start, length)
    with pytest.raises(ValueError, match="out must be"):
        layer(W, L, h, kc, vc, pos, slot, start, length, out=h)
    with pytest.raises(ValueError, match="h must be torch.float16"):
        PersistentLayer(plan, DEV, torch.float16)(W, L, h, kc, vc, pos, slot, start, length)
    with pytest.raises(ValueError, match="claim must be one of"):
        PersistentLayer(plan, DEV, torch.float32, claim="cyclic")
    with pytest.raises(ValueError, match="programs must be a positive int"):
        PersistentLayer(plan, DEV, torch.float32, programs=0)
