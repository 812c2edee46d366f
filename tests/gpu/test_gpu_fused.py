"""On a real GPU: the fused step's Triton kernels equal their torch references at real shapes (float32);
`fused` gives Hugging Face's greedy tokens for 200 steps (float32), a divergence accepted only after a step
whose top-two Hugging Face logits were within 1e-4 (such steps are printed); in bfloat16 its logit error
against a float32 Hugging Face run is at most 1.25x Hugging Face bfloat16's own."""

from __future__ import annotations

import copy

import pytest
import torch

import overlapdecode as od
from overlapdecode.fused.kernels.linear_residual import linear_residual, linear_residual_ref
from overlapdecode.fused.kernels.norm_linear import norm_linear, norm_linear_ref
from overlapdecode.fused.kernels.norm_qkv import norm_qkv, norm_qkv_ref
from overlapdecode.fused.model import TILES, FusedModel, pdl_supported
from overlapdecode.inputs import position_ids_for_prompt
from support.fused_families import FAMILIES, real_model
from support.fused_steps import fused_logits
from support.greedy_checks import assert_hf_greedy_tokens, close, prompts

DEV = "cuda"
needs_pdl = pytest.mark.skipif(
    not torch.cuda.is_available() or not pdl_supported(torch.device(DEV)),
    reason="programmatic dependent launch needs sm_90 or later",
)
# (hidden, heads, kv heads, head dim, intermediate, vocab): Llama-3.2-1B, Llama-3-8B, GPT-2
SHAPES = {
    "llama-1b": (2048, 32, 8, 64, 8192, 128256),
    "llama-8b": (4096, 32, 8, 128, 14336, 128256),
    "gpt2": (768, 12, 12, 64, 3072, 50257),
}


def tiles_of(kernel: str, N: int, K: int, B: int) -> list[dict]:
    """Every TILES entry of this kernel and weight shape that a call of B rows may take (min_batch <= B)."""
    return [cfg for key, cfg in TILES.items() if key[:3] == (kernel, N, K) and (key[3] if len(key) == 4 else 1) <= B]


@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("shape", list(SHAPES))
@torch.no_grad()
def test_kernels_match_references_at_real_shapes(shape, B):
    H, Hq, Hkv, D, I, V = SHAPES[shape]
    layer = shape == "gpt2"
    torch.manual_seed(0)
    r = lambda *s, sc=1.0: torch.randn(*s, device=DEV) * sc  # noqa: E731
    x, nw = r(B, H), r(H, sc=0.1) + 1
    nb = r(H, sc=0.1) if layer else None
    # norm + QKV + RoPE + cache write
    w, b = r((Hq + 2 * Hkv) * D, H, sc=H**-0.5), (r((Hq + 2 * Hkv) * D, sc=0.1) if layer else None)
    inv = None if layer else 1.0 / (500000.0 ** (torch.arange(0, D, 2, device=DEV).float() / D))
    pos = torch.randint(0, 4000, (B,), device=DEV)
    slot = torch.randint(0, 300, (B,), device=DEV)
    c = [torch.zeros(B, Hkv, 300, D, device=DEV) for _ in range(4)]
    q_ref = norm_qkv_ref(x, nw, nb, 1e-5, w, b, inv, 1.0, pos, slot, c[0], c[1], Hq, Hkv, D)
    q = norm_qkv(x, nw, nb, 1e-5, w, b, inv, 1.0, pos, slot, c[2], c[3], Hq, Hkv, D, programs=528)  # split-K at 1B/8B
    close(q, q_ref)
    close(c[2], c[0])  # K and V written at the slot, nothing else touched
    close(c[3], c[1])
    # output projection + residual (split-K), and the MLP down-projection
    for K in (Hq * D, I):
        xk, wk, res = r(B, K), r(H, K, sc=K**-0.5), r(B, H)
        ref = linear_residual_ref(xk, wk, None, res)
        close(linear_residual(xk, wk, None, res, programs=528), ref)
        for cfg in tiles_of("linear_residual", H, K, B):  # the shape's measured tiles
            close(linear_residual(xk, wk, None, res, **cfg), ref)
    # norm + gate/up (SiLU) or fc (GELU), and final norm + LM head
    act = "gelu_tanh" if layer else "silu_mul"
    wu = r(I if layer else 2 * I, H, sc=H**-0.5)
    close(norm_linear(x, nw, nb, 1e-5, wu, None, act), norm_linear_ref(x, nw, nb, 1e-5, wu, None, act))
    wv = r(V, H, sc=H**-0.5)
    got = norm_linear(x, nw, nb, 1e-5, wv, None, "none", torch.float32)
    head_ref = norm_linear_ref(x, nw, nb, 1e-5, wv, None, "none", torch.float32)
    close(got, head_ref)
    for cfg in tiles_of("norm_linear", V, H, B):  # the shape's measured tiles
        close(norm_linear(x, nw, nb, 1e-5, wv, None, "none", torch.float32, **cfg), head_ref)


@pytest.mark.parametrize(
    "name,B,strategy",
    [
        ("gpt2-random", 1, "fused"),
        ("gpt2-random", 4, "fused"),
        ("llama-1b-random", 1, "fused"),
        ("llama-1b-random", 4, "fused"),
        ("llama-1b-random", 1, od.Strategy(cache="fused")),
        ("gpt2-random", 4, "fused+tiles"),
    ],
)
@torch.no_grad()
def test_float32_tokens_equal_hf_for_200_steps(name, B, strategy):
    """ "fused+tiles": the tiles TILES gives 16-bit weights, forced on float32 (which keeps the defaults) so
    that they too are checked against Hugging Face's tokens. Llama at batch 4: RoPE reads each row's position
    from a column of the decode loop's state (a strided view; read as if contiguous until fa7a714)."""
    model = od.load_model(name, dtype="float32", device=DEV)
    if strategy == "fused+tiles":
        assert any(k[1:] == (model.config.n_embd, model.config.n_embd) for k in TILES)
        dec = od.Decoder(model, fused_options=dict(tiles=TILES))
        strategy = "fused"
    else:
        dec = od.Decoder(model)
    ids, mask = prompts(model, B)

    def run(n):
        return dec.generate(ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=[])

    assert_hf_greedy_tokens(model, ids, mask, run, f"{name} B={B}")


@pytest.mark.parametrize("name", FAMILIES)
@torch.no_grad()
def test_each_decoder_family_float32_tokens_equal_hf_for_200_steps(name):
    """Each family of fused_families.FAMILIES at its real widths (REAL_SIZES, two layers, random, float32),
    the Triton kernels with its flags: Hugging Face's greedy tokens for 200 steps at batch 2 (row 1 left-padded),
    a divergence accepted only after a near tie, as above; and the per-step logits of the first 32 steps within
    1e-4 (relative to their scale) of Hugging Face's."""
    model = real_model(name)
    ids, mask = prompts(model, 2, seed=3)

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

    hf = assert_hf_greedy_tokens(model, ids, mask, run, name)
    P = ids.shape[1]
    ref = torch.stack(hf.logits[:32], 1).float()
    got = fused_logits(FusedModel(model), ids, mask, hf.sequences[:, P : P + 32])
    close(got, ref)


@pytest.mark.parametrize("name", FAMILIES)
@torch.no_grad()
def test_each_decoder_family_float32_tokens_equal_hf_at_40_rows(name):
    """The same at 40 rows of mixed left padding for 48 steps: QKV, O and down in dense form (dense.py: cuBLAS's
    product, in two pieces of K where the weight is narrow, and the kernels' epilogues, the O and down ones handing
    the next norm's rows over: residual_norm.py), gate/up and the LM head on swapped tiles (swap_ab.py), the
    attention on its direct tiles, the greedy choice over three row blocks."""
    model = real_model(name)
    ids, mask = prompts(model, 40, seed=5)

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

    assert_hf_greedy_tokens(model, ids, mask, run, f"{name} x 40", n=48)


@pytest.mark.parametrize("name", ["qwen3-moe", "mixtral", "gpt-oss"])
@torch.no_grad()
def test_moe_float32_tokens_equal_hf_for_200_steps_at_batch_8(name):
    """The mixtures of experts at their real widths (Qwen3-30B-A3B: 8 of 128 experts; Mixtral-8x7B: 2 of 8;
    gpt-oss-20b: 4 of 32, with its sinks, biases and clamped experts), two
    layers, float32, eight rows (left-padded every other row) routing to overlapping experts: the captured step's
    routed-expert kernels give Hugging Face's greedy tokens for 200 steps, a divergence accepted only after a near
    tie; the kernels' per-step logits of the first 16 steps within 1e-4 of their torch references'."""
    model = real_model(name)
    ids, mask = prompts(model, 8, seed=11)

    def run(n):
        return od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy="fused", eos_token_id=[])

    hf = assert_hf_greedy_tokens(model, ids, mask, run, f"{name} B=8")
    P = ids.shape[1]
    chosen = hf.sequences[:, P : P + 16]
    kernels = fused_logits(FusedModel(model, kernels="triton", compile_prefill=False), ids, mask, chosen)
    close(kernels, fused_logits(FusedModel(model, kernels="torch", compile_prefill=False), ids, mask, chosen))


@torch.no_grad()
def test_bfloat16_logit_error_within_hf_bfloat16s_own():
    model32 = od.load_model("llama-1b-random", dtype="float32", device=DEV)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    ids, mask = prompts(model32, 4, seed=5)
    n = 32
    seq = model32.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, eos_token_id=[], pad_token_id=0)
    P = ids.shape[1]
    full_mask = torch.cat([mask, torch.ones_like(seq[:, P:])], 1)
    pos = position_ids_for_prompt(full_mask)

    def hf_logits(m):  # the logits that chose tokens P .. P+n-1
        return m(input_ids=seq, attention_mask=full_mask, position_ids=pos).logits[:, P - 1 : P + n - 1].float()

    ref = hf_logits(model32)
    hf16 = hf_logits(model16)
    fused16 = fused_logits(FusedModel(model16), ids, mask, seq[:, P:])
    err_hf = (hf16 - ref).pow(2).mean().sqrt().item()
    err_fused = (fused16 - ref).pow(2).mean().sqrt().item()
    print(f"bf16 logit RMS error vs float32 HF: fused {err_fused:.4g}, HF bf16 {err_hf:.4g}")
    assert err_fused <= 1.25 * err_hf


def test_fused_compiles_once_per_shape():
    model = od.load_model("gpt2-random", dtype="bfloat16", device=DEV)
    ids, mask = prompts(model, 2, seed=7)
    od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy="fused", eos_token_id=[])
    before = od.compile_count()
    for seed in (8, 9):
        ids, mask = prompts(model, 2, seed=seed)
        od.generate(model, ids, attention_mask=mask, max_new_tokens=30, strategy="fused", eos_token_id=[])
    assert od.compile_count() == before


@needs_pdl
@pytest.mark.parametrize("sampling", [{}, dict(do_sample=True, top_k=50, seed=3)])
@torch.no_grad()
def test_fused_step_is_captured_once_and_replays_the_eager_tokens(sampling):
    """`fused` captures its step after one eager step (StepGraph) and replays it in later calls; its tokens
    equal the eager fused step's (same kernels, PDL on), greedy and seeded sampling alike."""
    model = od.load_model("gpt2-random", dtype="bfloat16", device=DEV)
    dec = od.Decoder(model)
    ids, mask = prompts(model, 2, seed=11)
    kw = dict(attention_mask=mask, max_new_tokens=40, eos_token_id=[], **sampling)
    eager = dec.generate(ids, strategy=od.Strategy(cache="fused", stop_check="pingpong"), **kw)
    outs = [dec.generate(ids, strategy="fused", **kw) for _ in range(2)]
    graphs = [k.graph for c in dec.fused_model()._caches.values() for k in c.graphs.values()]
    assert len(graphs) == 1 and graphs[0].graph is not None and graphs[0].eager_runs == 1
    assert dec.fused_model().pdl
    for out in outs:
        assert torch.equal(out, eager)


@needs_pdl
@pytest.mark.parametrize("B,V", [(1, 50257), (3, 4805), (8, 128256), (17, 128256)])
@torch.no_grad()
def test_greedy_choice_in_a_captured_graph_equals_the_loops_choice(B, V):
    """greedy_choice (kernels/greedy.py) captured in one CUDA graph with PDL behind a kernel that writes
    its logits, replayed over logits with ties, NaN and infinities placed anew before each replay: the state and
    flag of the decode loop's own choice (greedy_finish_ref: argmax_rows and mark_finished) every time, and the
    ticket back at 0."""
    from overlapdecode.fused.kernels.greedy import GreedyFinish, greedy_choice, greedy_finish_ref
    from overlapdecode.fused.kernels.linear_residual import Tickets

    torch.manual_seed(B + V)
    src = torch.randn(B, V, device=DEV)
    logits = torch.empty_like(src)
    eos = torch.tensor([5, 7], device=DEV)
    state = torch.zeros((B, 3), dtype=torch.long, device=DEV)
    done = torch.zeros((), dtype=torch.bool, device=DEV)
    tickets = Tickets(DEV)

    def step():
        logits.copy_(src)  # a kernel ahead of the PDL launch, as the LM head is in the step
        greedy_choice(logits, GreedyFinish(state, eos, 3, done), tickets=tickets, pdl=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiles
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for r in range(12):
        src.copy_(torch.randn(B, V, device=DEV))
        cols = torch.randint(0, V, (4,)).tolist()
        if r % 4 == 1:  # a tie, the earlier column to win
            src[0, cols[0]] = src[0, cols[1]] = 1e30
        elif r % 4 == 2:  # NaN beats +inf
            src[-1, cols[0]], src[-1, cols[1]] = float("inf"), float("nan")
        elif r % 4 == 3:
            src[0].fill_(float("-inf"))
        init = torch.stack([torch.randint(0, 9, (B,)), torch.randint(0, 99, (B,)), torch.randint(0, 2, (B,))], 1)
        state.copy_(init.to(DEV))
        ref = GreedyFinish(state.clone(), eos, 3, torch.zeros((), dtype=torch.bool, device=DEV))
        greedy_finish_ref(src, ref)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(state, ref.state) and bool(done) == bool(ref.done), r
        assert int(tickets.counters.abs().sum()) == 0


@needs_pdl
@pytest.mark.parametrize("name", ["gpt2-random", "llama-1b-random"])
@torch.no_grad()
def test_pdl_changes_no_logit(name):
    """Programmatic dependent launch only moves launches earlier: the logits are bit for bit those
    without it (the prefill is not compiled here: it is not what differs, and four compiled prefills of the 1B
    shape outlasted a GPU call's test budget)."""
    model = od.load_model(name, dtype="bfloat16", device=DEV)
    ids, mask = prompts(model, 2, seed=12)
    tokens = torch.randint(0, 1000, (2, 12), device=DEV)
    off = fused_logits(FusedModel(model, pdl=False, compile_prefill=False), ids, mask, tokens)
    assert torch.equal(fused_logits(FusedModel(model, pdl=True, compile_prefill=False), ids, mask, tokens), off)


@torch.no_grad()
def test_fused_second_call_on_another_stream_follows_a_late_stop():
    """A `fused` call that stops LAG steps late returns with its last steps still replaying the captured
    graph (float32 Llama-1B: over a millisecond each, so ~15 ms of queued work); the next call, from another
    stream, resets the same graph's buffers (state, EOS ids, step log) only after them, so its tokens are those
    of a call made on a quiet GPU, and the first call's output stays its own."""
    lag = 12
    model = od.load_model("llama-1b-random", dtype="float32", device=DEV)
    dec = od.Decoder(model)
    ids1, mask1 = prompts(model, 1, seed=21)
    ids2, mask2 = prompts(model, 1, seed=22)
    P, n = ids1.shape[1], 40
    free = dec.generate(ids1, attention_mask=mask1, max_new_tokens=n, strategy="fused", eos_token_id=[])
    k = next(k for k in range(3, n - lag) if int(free[0, P + k]) not in free[0, P : P + k].tolist())
    eos = int(free[0, P + k])  # first generated at step k: the first call stops after k + 1 tokens
    ref2 = dec.generate(ids2, attention_mask=mask2, max_new_tokens=n, strategy="fused", eos_token_id=eos)
    torch.cuda.synchronize()
    for _ in range(3):
        first = dec.generate(ids1, attention_mask=mask1, max_new_tokens=n, strategy=f"fused:{lag}", eos_token_id=eos)
        assert first.shape[1] == P + k + 1  # the stop was seen `lag` steps late: those steps may still run
        other = torch.cuda.Stream()
        with torch.cuda.stream(other):  # no synchronisation in between
            second = dec.generate(
                ids2, attention_mask=mask2, max_new_tokens=n, strategy=f"fused:{lag}", eos_token_id=eos
            )
        torch.cuda.current_stream().wait_stream(other)
        assert torch.equal(second, ref2)
        # the first call's output is a copy of its graph's step log made before its end event: the second call,
        # which writes that log again, left it alone
        assert torch.equal(first, free[:, : P + k + 1])


@pytest.mark.parametrize("late", ["fused", "fused:3", "eager-pingpong", "eager-deferred"])
@torch.no_grad()
def test_fused_late_stop_checks_equal_the_sync_check(late):
    """Every late stop check of the fused path (captured step: ping-pong at lag 1 and 3; eager step: ping-pong
    and deferred) returns the tokens of the sync check running the same step, with EOS met by the rows at
    different steps (left-padded batch of 4, GPT-2 float32, one EOS id per row). Run it under `TORCH_CUDA_SANITIZER=1` too
    (`-k late_stop_checks_equal`): the ping-pong's flag copies and the side streams' events are torch ops the
    sanitizer sees (it raises on any unordered cross-stream access; the captured step itself is one graph
    launch, opaque to it)."""
    model = od.load_model("gpt2-random", dtype="float32", device=DEV)
    ids, mask = prompts(model, 4, seed=31)
    P, n = ids.shape[1], 48
    captured = not late.startswith("eager")
    sync = od.Strategy(cache="fused", compile=captured, stop_check="sync")
    strategy = {
        "eager-pingpong": od.Strategy(cache="fused", stop_check="pingpong"),
        "eager-deferred": od.Strategy(cache="fused", stop_check="deferred", lag=1),
    }.get(late, late)
    free = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=sync, eos_token_id=[])
    # EOS: per row r the token it makes at step 4 + 8r (or earlier, if it or another row's EOS came before):
    # every row stops by step 28, most at different steps, and the call ends well before n
    eos = sorted({int(free[r, P + 4 + 8 * r]) for r in range(4)})
    stops = [next(j for j in range(n) if int(free[r, P + j]) in eos) for r in range(4)]
    ref = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=sync, eos_token_id=eos)
    assert ref.shape[1] == P + max(stops) + 1 < P + n
    for _ in range(2):  # the second call replays what the first captured
        got = od.generate(model, ids, attention_mask=mask, max_new_tokens=n, strategy=strategy, eos_token_id=eos)
        assert torch.equal(got, ref)
