"""Time the fused step on a GPU: each kernel alone, replayed from a CUDA graph (achieved GB/s of the bytes
it must read: weights, or the cache for attention) at the Llama-1B and Llama-8B shapes; and the whole step
of llama-1b-random and gpt2-random (bfloat16) at batch 1 and 8, as one manually captured CUDA graph and
through `generate` (preset `fused`, and `interleaved` for comparison).

    python3 scripts/fused_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import traceback

import torch
import triton.testing

import overlapdecode as od
from overlapdecode.fused import reference
from overlapdecode.fused.kernels.linear_residual import linear_residual
from overlapdecode.fused.kernels.norm_linear import norm_linear
from overlapdecode.fused.kernels.norm_qkv import norm_qkv
from overlapdecode.fused.model import FusedModel

DEV = "cuda"
SHAPES = {"llama-1b": (2048, 32, 8, 64, 8192, 128256), "llama-8b": (4096, 32, 8, 128, 14336, 128256)}


def kernel_times(shape: str, B: int, ctx: int = 512) -> dict:
    H, Hq, Hkv, D, I, V = SHAPES[shape]
    dt = torch.bfloat16
    r = lambda *s: torch.randn(*s, device=DEV, dtype=dt) * 0.02  # noqa: E731
    x, nw = r(B, H), r(H) + 1
    w_qkv, w_o, w_gu, w_d, w_lm = r((Hq + 2 * Hkv) * D, H), r(H, Hq * D), r(2 * I, H), r(H, I), r(V, H)
    inv = 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    kc, vc = r(B, Hkv, ctx + 64, D), r(B, Hkv, ctx + 64, D)
    pos = torch.full((B,), ctx, device=DEV)
    start = torch.zeros(B, dtype=torch.int32, device=DEV)
    length = torch.full((B,), ctx + 1, dtype=torch.int32, device=DEV)
    q = r(B, Hq, D)
    a, m = r(B, Hq * D), r(B, I)
    programs = 4 * torch.cuda.get_device_properties(DEV).multi_processor_count  # as the fused step uses
    attention = reference.decode_attention_torch
    try:
        from overlapdecode.fused.kernels.decode_attention import decode_attention as attention  # noqa: F811
    except ImportError:
        pass
    cases = {
        "norm_qkv": (lambda: norm_qkv(x, nw, None, 1e-5, w_qkv, None, inv, 1.0, pos, pos, kc, vc, Hq, Hkv, D,
                                      programs=programs), w_qkv.nbytes),
        "norm_qkv_unsplit": (lambda: norm_qkv(x, nw, None, 1e-5, w_qkv, None, inv, 1.0, pos, pos, kc, vc, Hq, Hkv,
                                              D), w_qkv.nbytes),
        "attention": (lambda: attention(q, kc, vc, start, length, D**-0.5), 2 * B * Hkv * (ctx + 1) * D * 2),
        "o_proj_residual": (lambda: linear_residual(a, w_o, None, x), w_o.nbytes),
        "norm_gate_up": (lambda: norm_linear(x, nw, None, 1e-5, w_gu, None, "silu_mul"), w_gu.nbytes),
        "down_residual": (lambda: linear_residual(m, w_d, None, x), w_d.nbytes),
        "norm_lm_head": (lambda: norm_linear(x, nw, None, 1e-5, w_lm, None, "none", torch.float32), w_lm.nbytes),
    }
    out = {"attention_impl": attention.__module__ + "." + attention.__name__}
    for name, (fn, nbytes) in cases.items():
        # replayed from a CUDA graph, as in the step: a plain do_bench of a ~10 us kernel would time the
        # Python launch, not the kernel
        ms = triton.testing.do_bench_cudagraph(fn, rep=50)
        out[name] = {"us": round(ms * 1e3, 2), "GB/s": round(nbytes / ms / 1e6, 1)}
    return out


def graph_step_ms(model, B: int, ctx: int = 64, iters: int = 200) -> float:
    """ms per decode step of the fused step captured in one CUDA graph (manual capture)."""
    fm = FusedModel(model)
    cache = fm.cache_for(B, ctx + iters + 64)
    ids = torch.randint(0, 1000, (B, 1), device=DEV)
    pos = torch.full((B, 1), ctx, device=DEV)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(3):
            fm(input_ids=ids, position_ids=pos, past_key_values=cache)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g), torch.no_grad():
        fm(input_ids=ids, position_ids=pos, past_key_values=cache)
    g.replay()
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(iters):
        g.replay()
    t1.record()
    torch.cuda.synchronize()
    return t0.elapsed_time(t1) / iters


def generate_ms_per_token(model, B: int, strategy: str, short: int = 16, long: int = 144) -> float:
    """(time of a long call - time of a short call) / extra tokens: the decode steps only, prefill excluded."""
    ids = torch.randint(0, 1000, (B, 32), device=DEV)
    times = {}
    for n in (short, long, short, long):  # first round compiles
        torch.cuda.synchronize()
        t = time.perf_counter()
        od.generate(model, ids, max_new_tokens=n, strategy=strategy, eos_token_id=[])
        torch.cuda.synchronize()
        times[n] = time.perf_counter() - t
    return (times[long] - times[short]) / (long - short) * 1e3


def main(path: str) -> None:
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "kernels": {}, "step": {}}

    def attempt(key, fn):
        try:
            res["step"][key] = fn()
        except Exception:  # a probe records what failed and goes on with the rest
            res["step"][key] = {"error": traceback.format_exc(limit=6)[-3000:]}
        print(key, res["step"][key] if not isinstance(res["step"][key], dict) else "ERROR", flush=True)
        json.dump(res, open(path, "w"), indent=1)

    for shape in SHAPES:
        for B in (1, 8):
            res["kernels"][f"{shape} B={B}"] = kernel_times(shape, B)
            print(shape, B, res["kernels"][f"{shape} B={B}"], flush=True)
            json.dump(res, open(path, "w"), indent=1)
    for name in ("llama-1b-random", "gpt2-random"):
        model = od.load_model(name, dtype="bfloat16", device=DEV)
        for B in (1, 8):
            attempt(f"{name} B={B} graph ms/step", lambda: graph_step_ms(model, B))
        for B in (1, 8):
            attempt(f"{name} B={B} generate fused ms/token", lambda: generate_ms_per_token(model, B, "fused"))
        attempt(f"{name} B=1 generate interleaved ms/token", lambda: generate_ms_per_token(model, 1, "interleaved"))
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: fused_probe.py OUT.json")
    main(sys.argv[1])
