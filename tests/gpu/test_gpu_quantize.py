"""On a real GPU, quantized weights (overlapdecode.quant): the projections' kernels equal their torch twins at real
shapes (int4, int8 and fp8, float32 and bfloat16, 1 to 128 rows); float32 activations with quantized weights give the
eager reference's greedy tokens for 200 steps under `fused` (a divergence accepted only after a near tie, as in
test_gpu_fused.py); load_model(quantize=...) never holds the full-precision weights on the device twice, and leaves
the packed size there; AWQ and GPTQ checkpoints run under `fused` with the kernels."""

from __future__ import annotations

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused.kernels.linear_residual import linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.quant import Fp8Linear, Int4Linear, Int8Linear, PackedWeight, dequantize
from support.fused_families import real_model
from support.greedy_checks import assert_hf_greedy_tokens, close, prompts
from support.helpers import make_batch

DEV = "cuda"
# (hidden, heads, kv heads, head dim, intermediate, vocab): Llama-3.2-1B, Llama-3-8B
SHAPES = {"llama-1b": (2048, 32, 8, 64, 8192, 128256), "llama-8b": (4096, 32, 8, 128, 14336, 128256)}
SCHEMES = [("int4", 128), ("int4", 64), ("int8", None), ("fp8", None)]


def packed(N: int, K: int, scheme: str, group_size, dtype) -> PackedWeight:
    w = torch.randn(N, K, device=DEV, dtype=dtype) * K**-0.5
    layer = (
        Int4Linear(w, None, group_size) if scheme == "int4" else {"int8": Int8Linear, "fp8": Fp8Linear}[scheme](w, None)
    )
    return layer.packed()._replace(
        q=layer.weight.detach(),
        scales=layer.scales.detach(),
        zeros=None if layer.zeros is None else layer.zeros.detach(),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 8, 17, 64, 128])
@pytest.mark.parametrize("scheme,group_size", SCHEMES)
@pytest.mark.parametrize("shape", list(SHAPES))
@torch.no_grad()
def test_kernels_match_their_twins_at_real_shapes(shape, scheme, group_size, B, dtype):
    """QKV (+ RoPE and the cache write), O and down (+ residual), gate/up (SiLU) and the LM head on packed weights
    against their torch twins (dequantize, then multiply): row blocks up to 16 rows, swapped tiles from 17 (no dense
    form for packed weights). float32 within 1e-4 of the output's scale; bfloat16 within its rounding."""
    H, Hq, Hkv, D, I, V = SHAPES[shape]
    torch.manual_seed(0)
    r = lambda *s, sc=1.0: (torch.randn(*s, device=DEV) * sc).to(dtype)  # noqa: E731
    tol = (
        (lambda got, ref: close(got, ref))
        if dtype == torch.float32
        else (lambda got, ref: torch.testing.assert_close(got.float(), ref.float(), atol=3e-2, rtol=2e-2))
    )
    x, nw = r(B, H), r(H, sc=0.1) + 1
    w = packed((Hq + 2 * Hkv) * D, H, scheme, group_size, dtype)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.randint(0, 4000, (B,), device=DEV)
    slot = torch.randint(0, 300, (B,), device=DEV)
    c = [torch.zeros(B, Hkv, 300, D, device=DEV, dtype=dtype) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, None, 1e-5, w, None, inv, 1.0, pos, slot, c[0], c[1], Hq, Hkv, D)
    q = norm_qkv(x, nw, None, 1e-5, w, None, inv, 1.0, pos, slot, c[2], c[3], Hq, Hkv, D)
    tol(q, q_ref)
    tol(c[2], c[0])
    tol(c[3], c[1])
    for K in (Hq * D, I):
        xk, wk, res = r(B, K), packed(H, K, scheme, group_size, dtype), r(B, H)
        tol(linear_residual(xk, wk, None, res), linear_residual_ref(xk, wk, None, res))
    wu = packed(2 * I, H, scheme, group_size, dtype)
    tol(norm_linear(x, nw, None, 1e-5, wu, None, "silu_mul"), norm_linear_ref(x, nw, None, 1e-5, wu, None, "silu_mul"))
    head = packed(V, H, scheme, group_size, dtype)
    ref = norm_linear_ref(x, nw, None, 1e-5, head, None, "none", torch.float32)
    tol(norm_linear(x, nw, None, 1e-5, head, None, "none", torch.float32), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("scheme,group_size", SCHEMES + [("int4", 96)])
def test_the_kernels_dequantize_to_the_twins_bits(scheme, group_size, dtype):
    """x = 16 rows of the identity: output row k is weight column k, so the kernel's dequantized weights equal the
    twins' bit for bit (one product in the dtype: quant/schemes.py)."""
    K, N = 4096, 256
    w = packed(N, K, scheme, group_size, dtype)
    x = torch.eye(K, device=DEV, dtype=dtype)
    full = dequantize(w)
    for start in (0, 1024, K - 16):
        got = linear_residual(x[start : start + 16].contiguous(), w, None, None)
        assert torch.equal(got, full[:, start : start + 16].t().contiguous())


@pytest.mark.parametrize(
    "name,scheme,group_size,B",
    [
        ("llama-1b-random", "int4", 128, 1),
        ("llama-1b-random", "int4", 64, 4),
        ("llama-1b-random", "int8", 128, 1),
        ("gpt2-random", "int4", 128, 4),
        ("gpt2-random", "int8", 128, 1),
        ("llama-1b-random", "fp8", 128, 4),
    ],
)
@torch.no_grad()
def test_float32_activations_with_quantized_weights_give_the_eager_tokens_for_200_steps(name, scheme, group_size, B):
    """`fused` on a quantized model (float32 activations, the Triton kernels captured in the step's graph) gives
    Hugging Face's greedy tokens on the same quantized model (its eager dequantize-then-multiply) for 200 steps."""
    model = od.load_model(name, dtype="float32", device=DEV, quantize=scheme, group_size=group_size)
    ids, mask = prompts(model, B)

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

    assert_hf_greedy_tokens(model, ids, mask, run, f"{name} {scheme} B={B}")


@pytest.mark.parametrize("name", ["qwen3", "phi3", "granite", "smollm3", "olmo2", "gemma", "gemma2", "gemma3"])
@torch.no_grad()
def test_each_decoder_family_quantized_gives_the_eager_tokens_for_200_steps(name):
    """Each dense family of the fused path at its real widths (two layers, float32 activations), int4 group 128:
    Hugging Face's greedy tokens on the quantized model for 200 steps at batch 2, and at 40 rows for 48 steps (the
    swapped tiles that quantized launches take in place of the dense form)."""
    model = od.quantize(real_model(name), "int4", group_size=128)
    for rows, n in ((2, 200), (40, 48)):
        ids, mask = prompts(model, rows, seed=3)

        def run(steps, ids=ids, mask=mask):
            return od.generate(model, ids, attention_mask=mask, max_new_tokens=steps, strategy="fused", eos_token_id=[])

        assert_hf_greedy_tokens(model, ids, mask, run, f"{name} int4 x {rows}", n=n)


@torch.no_grad()
def test_bfloat16_quantized_fused_tokens_equal_the_eager_ones():
    """bfloat16 activations, int4 weights, Llama-1B shape: the fused step's greedy tokens follow Hugging Face's on
    the same quantized model for 64 steps at batch 4, a divergence accepted only after a near tie."""
    model = od.load_model("llama-1b-random", dtype="bfloat16", device=DEV, quantize="int4")
    ids, mask = make_batch(4, seed=1, device=DEV)

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

    assert_hf_greedy_tokens(model, ids, mask, run, "llama-1b bf16 int4", n=64)


@pytest.mark.parametrize("scheme", ["int4", "int8", "fp8"])
def test_load_model_quantize_keeps_the_device_at_the_packed_size(scheme, tmp_path):
    """A directory is read on the host and each matrix quantized as it moves: the device's peak stays below one
    full-precision copy of the model; an embedded model, made on the device, peaks at one full-precision copy plus
    one matrix's work. At rest the device holds the packed layers (codes, bfloat16 scales and zeros) and the rest."""
    od.load_model("llama-1b-random", dtype="bfloat16", device="cpu").save_pretrained(tmp_path)
    full = 1_235_814_400 * 2  # Llama-3.2-1B's parameters (tied embeddings) in bfloat16
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = od.load_model(str(tmp_path), dtype="bfloat16", device=DEV, quantize=scheme)
    held = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    layers = [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear, Fp8Linear))]
    assert len(layers) == 16 * 7 + 1  # every projection and the LM head

    def packed_bytes(m) -> int:
        if scheme in ("int8", "fp8"):
            return m.out_features * m.in_features + 2 * m.out_features
        return m.out_features * ((m.in_features + 1) // 2) + 2 * 2 * m.out_features * -(-m.in_features // 128)

    assert sum(p.untyped_storage().nbytes() for m in layers for p in m.parameters()) == sum(map(packed_bytes, layers))
    nbytes = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert held <= nbytes * 1.01 + 2**20
    assert peak < full, (peak, full)
    del model
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = od.load_model("llama-1b-random", dtype="bfloat16", device=DEV, quantize=scheme)
    assert torch.cuda.max_memory_allocated() - base < full * 1.5
    assert isinstance(model.lm_head, (Int4Linear, Int8Linear, Fp8Linear))


def test_the_kernel_cases_pass_on_the_gpu():
    """tests/fused/test_quant_kernels.py (odd shapes, rows 1-17, the families' calls) compiled and run on the GPU, its
    bfloat16 case included (the interpreter cannot hold bfloat16)."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(root, "src"), os.path.join(root, "tests"), env.get("PYTHONPATH", "")]
    )
    cases = os.path.join(root, "tests", "fused", "test_quant_kernels.py")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", cases],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0 and "skipped" not in proc.stdout, proc.stdout[-6000:] + proc.stderr[-2000:]


@pytest.mark.parametrize("method,act_order", [("awq", False), ("gptq", False), ("gptq", True)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@torch.no_grad()
def test_awq_and_gptq_checkpoints_give_the_eager_tokens(method, act_order, dtype, tmp_path):
    """AWQ and GPTQ checkpoints (support/int4_checkpoints.py: a tiny Llama) loaded on the GPU: `fused` with the
    Triton kernels gives Hugging Face's greedy tokens on the loaded model for 64 steps (act-order: refused by
    `fused`, `compiled` instead)."""
    from support.int4_checkpoints import write_checkpoint

    write_checkpoint(tmp_path, method=method, group_size=32, act_order=act_order)
    model = od.load_model(str(tmp_path), dtype=dtype, device=DEV)
    ids, mask = prompts(model, 4)
    strategy = "compiled" if act_order else "fused"

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[])

    assert_hf_greedy_tokens(model, ids, mask, run, f"{method} act_order={act_order} {dtype}", n=64)
