"""The routed experts of a mixture-of-experts MLP (Qwen3-MoE, Mixtral, gpt-oss) at decode: each row's top-k experts
chosen on the device from its router logits, and only those experts' weights read.

Why: a mixture of experts is sparse per token (Qwen3-30B-A3B reads 8 of its 128 experts, 3B of its 30B
parameters), and a decode step that ran every expert, or copied the chosen ones' weights, would read all or twice
of them. The step is captured in a CUDA graph, so the choice cannot leave the device nor change a shape: the
router logits (B, E) come from norm_linear (the norm + router GEMV), and both kernels here choose the experts
again from them (softmax, top-k, renormalise: a few hundred floats per row, cheaper than a launch and a buffer
of indices), then load the chosen expert's weight tiles through that device index.

- `_gate_up_kernel`, programs (row, slot, column tile): the slot-th choice of the row, its gate and up tiles of
  the normalised row, SiLU(gate) * up, stored (B, k, I) in the model dtype.
- `_down_kernel`, programs (row, column tile): each slot's down projection tile of its activations, times the
  slot's routing weight, summed over the slots in float32 in slot order, plus the residual.
The rows are independent GEMVs (elementwise products and sums, no MMA): rows choosing the same expert read its
tiles again, mostly from L2.

gpt-oss's experts differ in four ways, each a constexpr of the same kernels (off: the code above, unchanged PTX):
TOPK_FIRST (the top k of the logits, then a softmax over those k), the experts' biases (b_up, b_down: None
pointers where absent), INTERLEAVED (gate and up rows alternate: rows 2n and 2n + 1, as gpt-oss ships them) and
ALPHA/LIMIT (its clamped activation: gate clamped above at LIMIT, up to [-LIMIT, LIMIT], then
(up + 1) * gate * sigmoid(ALPHA * gate)).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .linear_residual import require_32bit
from .norm_prologue import STYLES, norm_ref
from .pdl import pdl_launch, pdl_release, pdl_start


def route_ref(logits, top_k: int, renorm: bool, topk_first: bool = False):
    """Hugging Face's router on (B, E) logits: softmax in float32, the top_k largest probabilities and their
    experts, divided by their sum where `renorm` (Mixtral always, Qwen3-MoE where config.norm_topk_prob) ->
    weights (B, k) float32, experts (B, k) long. `topk_first` (gpt-oss): the top_k largest logits, then a softmax
    over those k (`renorm` has no effect: they sum to 1)."""
    if topk_first:
        top, experts = logits.float().topk(top_k, dim=-1)
        return top.softmax(-1), experts
    probs = logits.float().softmax(-1)
    weights, experts = probs.topk(top_k, dim=-1)
    if renorm:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, experts


def glu_ref(gate_up, interleaved: bool = False, swiglu: tuple[float, float] | None = None):
    """The experts' activation of their (..., 2I) gate/up outputs -> (..., I): SiLU(gate) * up, gate the first I
    and up the last I; `interleaved` (gpt-oss): gate at even and up at odd positions; `swiglu` (alpha, limit)
    (gpt-oss): gate clamped above at limit, up to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate)."""
    gate, up = (gate_up[..., ::2], gate_up[..., 1::2]) if interleaved else gate_up.chunk(2, dim=-1)
    if swiglu is None:
        return F.silu(gate) * up
    alpha, limit = swiglu
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_experts_ref(
    h,
    norm_w,
    eps: float,
    logits,
    w_up,
    w_down,
    top_k: int,
    renorm: bool,
    norm_style: str = "rms",
    *,
    b_up=None,
    b_down=None,
    topk_first: bool = False,
    interleaved: bool = False,
    swiglu: tuple[float, float] | None = None,
):
    """h + the routed experts' sum, one token per row: h (B, H); logits (B, E), the router's on norm(h);
    w_up (E, 2I, H) gate rows then up rows per expert; w_down (E, H, I). Each expert's output rounded to h's dtype
    as Hugging Face's linear rounds it, times its routing weight and summed over the slots in float32, added to
    the residual, rounded once. Reads only the chosen experts' weights (an index, not a mask). gpt-oss's options:
    b_up (E, 2I) and b_down (E, H) biases, added to the rounded products; `topk_first`, as route_ref;
    `interleaved` and `swiglu`, as glu_ref."""
    x = norm_ref(h, norm_w, None, eps, norm_style)
    weights, experts = route_ref(logits, top_k, renorm, topk_first)
    out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
    for j in range(top_k):
        e = experts[:, j]
        gu = torch.einsum("bnh,bh->bn", w_up[e], x)
        if b_up is not None:
            gu = gu + b_up[e]
        y = torch.einsum("bhi,bi->bh", w_down[e], glu_ref(gu, interleaved, swiglu))
        if b_down is not None:
            y = y + b_down[e]
        out += weights[:, j, None] * y.float()
    return (h.float() + out).to(h.dtype)


# The prefill's dense form holds (tokens, E, width) intermediates: it runs this many elements at a time at most
# (Qwen3-30B-A3B, 128 experts of 768 x 2048: 256 tokens at a time, intermediates of about 130 MB each in bfloat16).
DENSE_CHUNK_ELEMENTS = 1 << 26


def moe_dense_ref(
    x, logits, w_up, w_down, top_k: int, renorm: bool, chunk_elements: int = DENSE_CHUNK_ELEMENTS, **options
):
    """The prefill's form of the experts' sum (no residual), x (N, H) already normalised: every expert on every
    token, weighted by a (N, E) matrix zero outside each token's top k. Static shapes for the compiled prefill,
    E / k times the experts' work of the routed sum (the prompt is one pass; the decode steps read only the chosen
    experts); the tokens in chunks of at most `chunk_elements` / (E x the wider of 2I and H), so that a long prompt's
    intermediates stay bounded. `options`: moe_experts_ref's gpt-oss keywords."""
    E, width = w_up.shape[0], max(w_up.shape[1], w_up.shape[2])
    chunk = max(1, chunk_elements // (E * width))
    if x.shape[0] > chunk:
        parts = [
            moe_dense_ref(
                x[i : i + chunk], logits[i : i + chunk], w_up, w_down, top_k, renorm, chunk_elements, **options
            )
            for i in range(0, x.shape[0], chunk)
        ]
        return torch.cat(parts)
    b_up, b_down = options.get("b_up"), options.get("b_down")
    weights, experts = route_ref(logits, top_k, renorm, options.get("topk_first", False))
    dense = torch.zeros(logits.shape, dtype=torch.float32, device=x.device).scatter(1, experts, weights)
    gu = torch.einsum("nh,eoh->neo", x, w_up)
    if b_up is not None:
        gu = gu + b_up
    y = torch.einsum("nei,ehi->neh", glu_ref(gu, options.get("interleaved", False), options.get("swiglu")), w_down)
    if b_down is not None:
        y = y + b_down
    # an unchosen expert's output is dropped, not multiplied by 0: a 16-bit one that overflowed would give inf * 0
    y = torch.where((dense != 0)[..., None], y.float(), 0.0)
    return torch.einsum("ne,neh->nh", dense, y).to(x.dtype)


@triton.jit
def _probs(logits_ptr, row, E, BLOCK_E: tl.constexpr):
    """The row's softmax over its E logits in float32 (lanes past E: -1, below every probability), lane ids."""
    ids = tl.arange(0, BLOCK_E)
    lg = tl.load(logits_ptr + row * E + ids, mask=ids < E, other=float("-inf")).to(tl.float32)
    ex = tl.exp(lg - tl.max(lg, 0))
    p = ex / tl.sum(ex, 0)
    return tl.where(ids < E, p, -1.0), ids


@triton.jit
def _scores(logits_ptr, row, E, BLOCK_E: tl.constexpr, TOPK_FIRST: tl.constexpr):
    """What the top k is taken of: the row's probabilities (_probs), or with TOPK_FIRST its float32 logits (lanes
    past E: -inf); lane ids."""
    if TOPK_FIRST:
        ids = tl.arange(0, BLOCK_E)
        lg = tl.load(logits_ptr + row * E + ids, mask=ids < E, other=float("-inf")).to(tl.float32)
        return lg, ids
    else:
        return _probs(logits_ptr, row, E, BLOCK_E)


@triton.jit
def _pick(p, ids, BLOCK_E: tl.constexpr, TOPK_FIRST: tl.constexpr = False):
    """The largest remaining score and its expert (the lowest among equals); p with that lane removed (-1 below
    every probability; -inf below every logit with TOPK_FIRST)."""
    m = tl.max(p, 0)
    e = tl.min(tl.where(p == m, ids, BLOCK_E), 0)
    if TOPK_FIRST:
        return e, m, tl.where(ids == e, float("-inf"), p)
    else:
        return e, m, tl.where(ids == e, -1.0, p)


@triton.jit
def _gate_up_kernel(
    h_ptr,
    nw_ptr,
    logits_ptr,
    w_ptr,
    act_ptr,
    bu_ptr,
    H,
    I,
    E,
    w_se,
    w_sn,
    w_sk,
    eps,
    TOPK: tl.constexpr,
    STYLE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    TOPK_FIRST: tl.constexpr = False,
    INTERLEAVED: tl.constexpr = False,
    ALPHA: tl.constexpr = None,
    LIMIT: tl.constexpr = None,
):
    pdl_start(PDL)
    pid = tl.program_id(0)
    row = (pid // TOPK).to(tl.int64)
    slot = pid % TOPK
    p, ids = _scores(logits_ptr, row, E, BLOCK_E, TOPK_FIRST)
    expert = 0
    for j in tl.static_range(TOPK):
        e, m, p = _pick(p, ids, BLOCK_E, TOPK_FIRST)
        expert = tl.where(slot == j, e, expert)
    dtype = act_ptr.dtype.element_ty
    ks = tl.arange(0, BLOCK_K)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        xv = tl.load(h_ptr + row * H + k0 + ks, mask=k0 + ks < H, other=0.0).to(tl.float32)
        ss += xv * xv
    rstd = 1.0 / tl.sqrt(tl.sum(ss, 0) / H + eps)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < I
    base = w_ptr + expert.to(tl.int64) * w_se  # the chosen expert's (2I, H) block, at its strides
    gate = tl.zeros((BLOCK_N,), dtype=tl.float32)
    up = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        k_ok = k0 + ks < H
        xv = tl.load(h_ptr + row * H + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
        g = tl.load(nw_ptr + k0 + ks, mask=k_ok, other=0.0)
        if STYLE == 1:  # Gemma's (1 + w), one rounding
            xn = (xv * rstd * (g.to(tl.float32) + 1.0)).to(dtype)
        elif STYLE == 2:  # OLMo2's w times the float32 normalised x, one rounding
            xn = (xv * rstd * g.to(tl.float32)).to(dtype)
        else:  # Llama's: w times the normalised x rounded to the dtype
            xn = (g * (xv * rstd).to(dtype)).to(dtype)
        xn = xn.to(tl.float32)[None, :]
        ok = n_ok[:, None] & k_ok[None, :]
        cols = (k0 + ks[None, :]) * w_sk
        if INTERLEAVED:  # gate row 2n, up row 2n + 1
            offs = (2 * ns)[:, None] * w_sn + cols
            wg = tl.load(base + offs, mask=ok, other=0.0).to(tl.float32)
            wu = tl.load(base + w_sn + offs, mask=ok, other=0.0).to(tl.float32)
        else:
            offs = ns[:, None] * w_sn + cols
            wg = tl.load(base + offs, mask=ok, other=0.0).to(tl.float32)
            wu = tl.load(base + I * w_sn + offs, mask=ok, other=0.0).to(tl.float32)
        gate += tl.sum(wg * xn, 1)
        up += tl.sum(wu * xn, 1)
    pdl_release(PDL)
    gate = gate.to(dtype).to(tl.float32)  # rounded as Hugging Face's linear rounds its outputs
    up = up.to(dtype).to(tl.float32)
    if bu_ptr is not None:  # the expert's bias, in w's row order, added to the rounded products
        b_base = bu_ptr + expert.to(tl.int64) * (2 * I)
        if INTERLEAVED:
            bg = tl.load(b_base + 2 * ns, mask=n_ok, other=0.0).to(tl.float32)
            bu = tl.load(b_base + 2 * ns + 1, mask=n_ok, other=0.0).to(tl.float32)
        else:
            bg = tl.load(b_base + ns, mask=n_ok, other=0.0).to(tl.float32)
            bu = tl.load(b_base + I + ns, mask=n_ok, other=0.0).to(tl.float32)
        gate = (gate + bg).to(dtype).to(tl.float32)
        up = (up + bu).to(dtype).to(tl.float32)
    if ALPHA is not None:  # gpt-oss: clamped, (up + 1) * gate * sigmoid(ALPHA * gate), rounded per op
        gate = tl.minimum(gate, LIMIT)
        up = tl.minimum(tl.maximum(up, -LIMIT), LIMIT)
        sig = (1.0 / (1.0 + tl.exp(-(gate * ALPHA).to(dtype).to(tl.float32)))).to(dtype).to(tl.float32)
        glu = (gate * sig).to(dtype).to(tl.float32)
        tl.store(
            act_ptr + (row * TOPK + slot) * I + ns, ((up + 1.0).to(dtype).to(tl.float32) * glu).to(dtype), mask=n_ok
        )
    else:
        silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        tl.store(act_ptr + (row * TOPK + slot) * I + ns, (silu * up).to(dtype), mask=n_ok)


@triton.jit
def _down_kernel(
    act_ptr,
    logits_ptr,
    w_ptr,
    res_ptr,
    out_ptr,
    bd_ptr,
    H,
    I,
    E,
    w_se,
    w_sn,
    w_sk,
    TOPK: tl.constexpr,
    RENORM: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
    TOPK_FIRST: tl.constexpr = False,
):
    pdl_start(PDL)
    row = tl.program_id(0).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    p, ids = _scores(logits_ptr, row, E, BLOCK_E, TOPK_FIRST)
    total = 1.0
    top = 0.0
    if TOPK_FIRST:  # the softmax's denominator over the top k logits, less the largest, before any is used
        q = p
        top = tl.max(p, 0)
        total = 0.0
        for _j in tl.static_range(TOPK):
            e, m, q = _pick(q, ids, BLOCK_E, TOPK_FIRST)
            total += tl.exp(m - top)
    elif RENORM:  # the sum of the top k, in their order, before any is used
        q = p
        total = 0.0
        for _j in tl.static_range(TOPK):
            e, m, q = _pick(q, ids, BLOCK_E)
            total += m
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < H
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e, m, p = _pick(p, ids, BLOCK_E, TOPK_FIRST)
        base = w_ptr + e.to(tl.int64) * w_se  # the chosen expert's (H, I) block, at its strides
        y = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k_ok = k0 + ks < I
            a = tl.load(act_ptr + (row * TOPK + j) * I + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
            offs = ns[:, None] * w_sn + (k0 + ks[None, :]) * w_sk
            w = tl.load(base + offs, mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            y += tl.sum(w.to(tl.float32) * a[None, :], 1)
        y = y.to(dtype).to(tl.float32)
        if bd_ptr is not None:  # the expert's bias, added to the rounded product
            y = (y + tl.load(bd_ptr + e.to(tl.int64) * H + ns, mask=n_ok, other=0.0).to(tl.float32)).to(dtype)
            y = y.to(tl.float32)
        if TOPK_FIRST:
            weight = tl.exp(m - top) / total
        else:
            weight = m / total if RENORM else m
        acc += weight * y
    pdl_release(PDL)
    res = tl.load(res_ptr + row * H + ns, mask=n_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + ns, (res + acc).to(dtype), mask=n_ok)


def require_expert_offsets(**experts) -> None:
    """The (E, N, K) expert tensors the kernels index at their strides (any order of their dimensions, as shipped:
    gpt-oss's are transposed views, never copied): each expert's offset is 64-bit, the offsets within an expert
    32-bit, and no stride negative or zero; else a ValueError naming the tensor."""
    for name, w in experts.items():
        if min(w.stride()) < 1:
            raise ValueError(f"{name} must have positive strides, got {w.stride()}")
        span = sum((n - 1) * st for n, st in zip(w.shape[1:], w.stride()[1:])) + 1
        if span >= 2**31:
            raise ValueError(f"{name}: one expert spans {span} elements: the kernels' 32-bit offsets reach 2**31 - 1")


def check_routing(logits, w_up, w_down, top_k: int) -> None:
    """The experts' shapes against the logits' and top_k, else a ValueError naming the argument."""
    E = logits.shape[1]
    if w_up.dim() != 3 or w_up.shape[0] != E or w_up.shape[1] % 2:
        raise ValueError(f"w_up must be (E={E}, 2I, H), gate rows then up rows per expert; got {tuple(w_up.shape)}")
    I = w_up.shape[1] // 2
    if tuple(w_down.shape) != (E, w_up.shape[2], I):
        raise ValueError(f"w_down must be (E, H, I) = {(E, w_up.shape[2], I)}; got {tuple(w_down.shape)}")
    if not (isinstance(top_k, int) and 1 <= top_k <= E):
        raise ValueError(f"top_k must be an int in 1 .. {E} (the experts), got {top_k!r}")


def check_expert_options(w_up, w_down, b_up, b_down, swiglu) -> None:
    """gpt-oss's expert biases and activation against the experts' shapes, else a ValueError naming the argument."""
    E, I2, H = w_up.shape
    for name, b, want in (("b_up", b_up, (E, I2)), ("b_down", b_down, (E, H))):
        if b is not None and (not isinstance(b, torch.Tensor) or tuple(b.shape) != want or not b.is_contiguous()):
            got = tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__
            raise ValueError(f"{name} must be a contiguous {want} tensor (one bias row per expert), got {got}")
    if swiglu is not None and not (
        isinstance(swiglu, tuple) and len(swiglu) == 2 and all(isinstance(v, (int, float)) for v in swiglu)
    ):
        raise ValueError(f"swiglu must be None or (alpha, limit) numbers, got {swiglu!r}")


def moe_experts(
    h,
    norm_w,
    eps: float,
    logits,
    w_up,
    w_down,
    top_k: int,
    renorm: bool,
    norm_style: str = "rms",
    block_n: int = 16,
    block_k: int = 128,
    pdl: bool = False,
    *,
    b_up=None,
    b_down=None,
    topk_first: bool = False,
    interleaved: bool = False,
    swiglu: tuple[float, float] | None = None,
):
    """The Triton kernels of `moe_experts_ref`: h (B, H) contiguous, norm_w (H,), logits (B, E) (the router's, any
    float dtype), w_up (E, 2I, H), w_down (E, H, I) at any strides (require_expert_offsets); two launches, no host
    sync, shapes fixed by the arguments'.
    gpt-oss's keywords as moe_experts_ref's (constexprs of the launch; b_up (E, 2I), b_down (E, H) contiguous)."""
    check_routing(logits, w_up, w_down, top_k)
    check_expert_options(w_up, w_down, b_up, b_down, swiglu)
    require_32bit(h=h, norm_w=norm_w, logits=logits)
    require_expert_offsets(w_up=w_up, w_down=w_down)
    B, H = h.shape
    E, I = logits.shape[1], w_down.shape[2]
    act = torch.empty((B, top_k, I), dtype=h.dtype, device=h.device)
    out = torch.empty_like(h)
    common = dict(BLOCK_E=triton.next_power_of_2(E), BLOCK_N=block_n, PDL=bool(pdl), num_warps=4, **pdl_launch(pdl))
    _gate_up_kernel[(B * top_k, triton.cdiv(I, block_n))](
        h,
        norm_w,
        logits,
        w_up,
        act,
        b_up,
        H,
        I,
        E,
        *w_up.stride(),
        eps,
        TOPK=top_k,
        STYLE=STYLES.index(norm_style),
        BLOCK_K=min(block_k, triton.next_power_of_2(H)),
        TOPK_FIRST=bool(topk_first),
        INTERLEAVED=bool(interleaved),
        ALPHA=None if swiglu is None else float(swiglu[0]),
        LIMIT=None if swiglu is None else float(swiglu[1]),
        **common,
    )
    _down_kernel[(B, triton.cdiv(H, block_n))](
        act,
        logits,
        w_down,
        h,
        out,
        b_down,
        H,
        I,
        E,
        *w_down.stride(),
        TOPK=top_k,
        RENORM=bool(renorm),
        BLOCK_K=min(block_k, triton.next_power_of_2(I)),
        TOPK_FIRST=bool(topk_first),
        **common,
    )
    return out
