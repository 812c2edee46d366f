"""FusedModel: a Hugging Face causal LM of a supported family, run by the project's own decode step.

Called like the Hugging Face model by the decode loop (input_ids, position_ids, attention_mask,
past_key_values=<FusedCache>, ...) and answers an object with `.logits` (B, 1, V) float32. A call with an
attention mask is the prefill (ordinary torch ops, compiled per prompt-length bucket on CUDA); a call
without is one decode step: Triton kernels on CUDA, their torch twins elsewhere. The weights are re-laid
out once (layout.py) and shared with the Hugging Face model, which keeps working.
"""

from __future__ import annotations

import contextlib
import functools
from collections import OrderedDict
from typing import NamedTuple

import torch

from ..inputs import model_limits
from ..loop.compiling import recompile_limits
from ..tp.collectives import SymmetricAllReduce
from ..tp.shard import is_sharded
from . import forward
from .cache import FusedCache
from .kernels.embed import embed_ref
from .kernels.greedy import GreedyFinish, greedy_finish_ref
from .kernels.linear_residual import linear_residual_ref
from .kernels.moe import moe_experts_ref
from .kernels.norm_linear import norm_linear_ref
from .kernels.norm_qkv import norm_qkv_ref
from .kernels.norm_residual import norm_residual_ref
from .kernels.qk_norm_rope import qk_norm_rope_ref
from .kernels.swap_ab import ROW_TILE
from .layout import fuse_weights
from .weights import shard_vocab

# Caches (and so CUDA graphs, whose inputs they are) kept per shape; a few shapes are kept.
KEEP_CACHES = 4
# Tile keywords per (kernel, N, K) of the weight where a shape's best, timed in the whole step in one CUDA graph,
# differs from the kernels' defaults, for 16-bit weights (float32 keeps the defaults: twice the shared memory per
# stage): GPT-2's output and down projections (16 columns per program: more, shorter programs), GPT-2's LM head and
# Llama-3's LM head at the 1B shape from 4 rows on (docs/KERNELS.md, "Tiles: how they were chosen").
TILES: dict = {
    ("linear_residual", 768, 768): dict(block_n=16, block_k=256, num_warps=4, num_stages=4),
    ("linear_residual", 768, 3072): dict(block_n=16, block_k=64, num_warps=2, num_stages=4),
    ("norm_linear", 128256, 2048, 4): dict(block_n=128, block_k=128, num_warps=8, num_stages=3),
    ("norm_linear", 50257, 768): dict(block_n=128, block_k=64, num_warps=4, num_stages=4),
}
# Prompts are padded on the right to a multiple of this, so nearby prompt lengths share one compiled prefill.
PREFILL_BUCKET = 64


class FusedOutput(NamedTuple):
    logits: torch.Tensor  # (B, 1, V) float32


class StepOps(NamedTuple):
    """The operations of a decode step, as kernels or as their torch references."""

    norm_qkv: object
    attention: object
    linear_residual: object
    norm_linear: object
    embed: object  # token (+ position) embedding, the rows' slots and lengths
    greedy: object  # the greedy choice and stop bookkeeping on the logits, in place (kernels/greedy.py)
    symmetric: object = None  # tp.SymmetricAllReduce for a sharded model's all-reduces, or None
    norm_residual: object = None  # residual + RMSNorm(branch), for post-norm layers (kernels/norm_residual.py)
    qk_norm_rope: object = None  # whole-projection Q/K norms, then RoPE (kernels/qk_norm_rope.py), for OLMo2
    moe: object = None  # residual + the routed experts (kernels/moe.py), for Qwen3-MoE, Mixtral and gpt-oss
    rope_table: object = None  # the step's rotary cos/sin, once per table, for the QKV launches (kernels/rope.py)


REFERENCE_OPS = StepOps(
    norm_qkv_ref,
    forward.decode_attention_torch,
    linear_residual_ref,
    norm_linear_ref,
    embed_ref,
    greedy_finish_ref,
    norm_residual=norm_residual_ref,
    qk_norm_rope=qk_norm_rope_ref,
    moe=moe_experts_ref,
)


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch needs a CUDA device of compute capability 9.0 (Hopper) or later."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (9, 0)


class Tiled:
    """A kernel whose tile keywords depend on its weight's shape and the batch: `tiles` maps (kernel name, N,
    K) of the weight (positional argument `w_arg`), or (kernel name, N, K, min_batch), to keywords (block sizes,
    warps, stages, split target). A call with B rows (its first argument's rows) takes the entry of its
    shape with the largest min_batch <= B (a 3-tuple key is min_batch 1); shapes not in it keep the kernel's
    defaults. Entries of min_batch <= ROW_TILE (16) serve calls of up to ROW_TILE rows only: past that the kernels
    swap their tiles (kernels/swap_ab.py), whose own rule chooses them unless an entry of a larger min_batch says
    otherwise. For norm_qkv and linear_residual an entry of min_batch > ROW_TILE never applies: from
    dense.DENSE_ROWS (17) rows they run the dense form (kernels/dense.py), which ignores tile keywords."""

    def __init__(self, fn, name: str, w_arg: int, tiles: dict, row_block: dict | None = None):
        self.fn, self.w_arg, self.row_block = fn, w_arg, row_block or {}
        self.tiles: dict = {}  # (N, K) -> [(min_batch, keywords)], min_batch descending
        for key, cfg in tiles.items():
            if key[0] == name:
                self.tiles.setdefault(tuple(key[1:3]), []).append((key[3] if len(key) == 4 else 1, cfg))
        for entries in self.tiles.values():
            entries.sort(key=lambda e: -e[0])

    def keywords(self, shape: tuple, batch: int) -> dict:
        """The tile keywords of a weight of `shape` (N, K) at `batch` rows: `row_block`'s up to ROW_TILE rows, under
        the table's entry for the shape."""
        entry = next(
            (
                cfg
                for min_batch, cfg in self.tiles.get(shape, ())
                if min_batch <= batch and (batch <= ROW_TILE or min_batch > ROW_TILE)
            ),
            {},
        )
        return {**self.row_block, **entry} if batch <= ROW_TILE else entry

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs, **self.keywords(tuple(args[self.w_arg].shape), args[0].shape[0]))


def triton_ops(device: torch.device, pdl: bool = False, tiles: dict | None = None, norm_sums: bool = False) -> StepOps:
    """The Triton kernels, with the split-K ticket counters of this model's steps (one stream at a time: the
    Decoder's lock), launched with programmatic dependent launch where `pdl` (kernels/pdl.py), with the
    tiles of `tiles` (FusedModel's; None: the kernels' defaults everywhere); `norm_sums`: the hidden states'
    writers hand their RMSNorm sums of squares to their readers (kernels/norm_linear.py NormSums; for an
    unsharded RMSNorm model). Imported here because Triton is an optional, heavy dependency of the CUDA path."""
    from .kernels.decode_attention import decode_attention
    from .kernels.embed import embed
    from .kernels.greedy import greedy_choice
    from .kernels.linear_residual import Tickets
    from .kernels.moe import moe_experts
    from .kernels.norm_linear import norm_linear
    from .kernels.norm_prologue import NormedRows, NormSums
    from .kernels.norm_qkv import norm_qkv
    from .kernels.norm_residual import norm_residual
    from .kernels.qk_norm_rope import qk_norm_rope
    from .kernels.residual_norm import linear_residual_norm
    from .kernels.rope import rope_table

    # grid targets of the row-block split-K kernels (programs= below; swapped launches take swap_ab.swap_tiles's):
    # measured by scripts/kernel_sweep.py (docs/KERNELS.md)
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    tickets = Tickets(device)
    tiles = {} if tiles is None else tiles
    sums = dict(norm_sums=NormSums()) if norm_sums else {}  # one, shared by the writers and readers of h
    # normalised rows handed from the dense O and down epilogues to the next projection (kernels/residual_norm.py)
    hand = dict(sums, normed_rows=NormedRows())
    return StepOps(
        Tiled(
            functools.partial(norm_qkv, tickets=tickets, pdl=pdl, **hand), "norm_qkv", 4, tiles, dict(programs=4 * sms)
        ),
        functools.partial(decode_attention, pdl=pdl, tickets=tickets),
        Tiled(
            functools.partial(linear_residual_norm, tickets=tickets, pdl=pdl, **hand),
            "linear_residual",
            1,
            tiles,
            dict(programs=2 * sms),
        ),
        Tiled(functools.partial(norm_linear, tickets=tickets, pdl=pdl, **hand), "norm_linear", 4, tiles),
        # one launch in the PDL chain instead of 3-5 torch ops (docs/KERNELS.md, "embed")
        functools.partial(embed, pdl=pdl, **sums),
        # one PDL launch instead of inductor's choice kernels and two copies (kernels/greedy.py)
        functools.partial(greedy_choice, tickets=tickets, pdl=pdl),
        norm_residual=functools.partial(norm_residual, pdl=pdl),
        qk_norm_rope=functools.partial(qk_norm_rope, pdl=pdl),
        moe=functools.partial(moe_experts, pdl=pdl),
        rope_table=functools.partial(rope_table, pdl=pdl),
    )


class FusedOptions(NamedTuple):
    kernels: str  # "triton" or "torch"
    compile_prefill: bool
    pdl: bool  # programmatic dependent launch (kernels/pdl.py)
    symmetric_all_reduce: bool
    tiles: dict | None  # None: TILES for 16-bit weights, none for float32
    vocab_parallel: bool  # under tp: each rank reads its rows of the LM head and the logits are gathered


OPTION_NAMES = FusedOptions._fields


# the tile keywords each kernel takes (FusedModel(tiles=...))
TILE_KEYWORDS = {
    "norm_qkv": ("half", "block_k", "programs", "num_warps", "num_stages"),
    "linear_residual": ("block_n", "block_k", "programs", "num_warps", "num_stages"),
    "norm_linear": ("block_n", "block_k", "programs", "num_warps", "num_stages"),
}


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_option_values(**options) -> None:
    """What can be checked of FusedModel's keywords without the model's device: names, types, ranges, the
    tiles table's form (od.Decoder checks this much when it is made: its model may still move to a GPU)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ValueError(
            f"unknown fused option(s) {', '.join(map(repr, unknown))}; the options are {', '.join(OPTION_NAMES)}"
        )
    if options.get("kernels") not in (None, "triton", "torch"):
        raise ValueError(f"kernels must be 'triton' or 'torch', got {options['kernels']!r}")
    for name in ("pdl", "compile_prefill", "symmetric_all_reduce", "vocab_parallel"):
        if options.get(name) is not None and not isinstance(options[name], bool):
            raise ValueError(f"{name} must be a bool or None, got {options[name]!r}")
    tiles = options.get("tiles")
    if tiles is None:
        return
    if not isinstance(tiles, dict):
        raise ValueError(f"tiles must map (kernel name, N, K[, min_batch]) to a dict of tile keywords; got {tiles!r}")
    for key, cfg in tiles.items():
        if not (
            isinstance(key, tuple)
            and len(key) in (3, 4)
            and key[0] in TILE_KEYWORDS
            and all(_int(v) and v >= 1 for v in key[1:])
        ):
            raise ValueError(
                "tiles must map (kernel name, N, K) or (kernel name, N, K, min_batch) to a dict of "
                f"tile keywords, the kernel name one of {', '.join(map(repr, TILE_KEYWORDS))} and N, "
                f"K, min_batch positive ints; got the key {key!r}"
            )
        allowed = TILE_KEYWORDS[key[0]]
        if not isinstance(cfg, dict) or any(k not in allowed or not _int(v) or v < 1 for k, v in cfg.items()):
            raise ValueError(
                f"tiles[{key!r}] must be a dict of positive ints with keys among {', '.join(allowed)}; got {cfg!r}"
            )
    seen: dict = {}
    for key in tiles:  # (kernel, N, K) is min_batch 1: the same entry twice would leave the choice to order
        full = key if len(key) == 4 else (*key, 1)
        if full in seen:
            raise ValueError(
                f"tiles must hold one entry per kernel, shape and min_batch; it has {seen[full]!r} and {key!r}"
            )
        seen[full] = key


def check_fp8(model, capability: tuple[int, int]) -> None:
    """fp8 weights (quant/modules.py Fp8Linear) in the Triton kernels need a GPU of compute capability 8.9 or later,
    where Triton converts float8_e4m3fn; a ValueError naming the strategy and the way out on an older one."""
    if tuple(capability) < (8, 9) and any(getattr(m, "scheme", None) == "fp8" for m in model.modules()):
        raise ValueError(
            f"strategy 'fused': fp8 weights need the Triton kernels on a CUDA GPU of compute capability 8.9 or later "
            f"(Triton converts float8_e4m3fn there only), this one is {capability[0]}.{capability[1]}; pass "
            f"fused_options=dict(kernels='torch') or use strategy 'static' or 'compiled'"
        )


def check_options(model, **options) -> FusedOptions:
    """FusedModel's keywords for `model`, checked and resolved before any weight is touched: ValueError
    naming the option otherwise."""
    check_option_values(**options)
    device = model.get_input_embeddings().weight.device
    kernels = options.get("kernels") or ("triton" if device.type == "cuda" else "torch")
    fast = kernels == "triton" and pdl_supported(device)
    pdl = options.get("pdl")
    if pdl is None:
        pdl = fast
    if pdl and not fast:
        raise ValueError("pdl needs the Triton kernels on a CUDA GPU of compute capability 9.0 or later")
    if kernels == "triton" and device.type == "cuda":
        check_fp8(model, torch.cuda.get_device_capability(device))
    compile_prefill = options.get("compile_prefill")
    if compile_prefill is None:
        compile_prefill = device.type == "cuda"
    symmetric = bool(options.get("symmetric_all_reduce"))
    if symmetric and (kernels != "triton" or not is_sharded(model)):
        raise ValueError("symmetric_all_reduce needs a tensor-parallel shard run by the Triton kernels")
    vocab_parallel = options.get("vocab_parallel")
    return FusedOptions(
        kernels,
        compile_prefill,
        pdl,
        symmetric,
        options.get("tiles"),
        True if vocab_parallel is None else vocab_parallel,
    )


class FusedModel:
    """The fused decode of `model` (a family of layout.SUPPORTED; anything else is a ValueError).

    `kernels`: "triton" or "torch"; default Triton on CUDA, torch elsewhere. `compile_prefill`: compile the
    prefill per prompt bucket (default on CUDA). `pdl`: launch the Triton kernels with programmatic dependent
    launch (kernels/pdl.py; default: where the GPU has it, sm_90+). `tiles`: {(kernel name, N, K[, min_batch]):
    tile keywords} for the Triton kernels (see Tiled; default: TILES for 16-bit weights, none for float32).
    `symmetric_all_reduce`: a tensor-parallel shard's decode step sums its partial products by a one-shot
    all-reduce over symmetric memory (tp.SymmetricAllReduce) instead of NCCL (default off; docs/TENSOR_PARALLEL.md
    has its speed).
    `vocab_parallel`: under tensor parallelism each rank reads only its rows of the LM head and the step gathers
    the logits (tp.VocabShard; default on; False keeps the head replicated, as the Hugging Face model has it).
    Every option is checked (check_options) before the weights are touched.
    """

    def __init__(
        self,
        model,
        kernels: str | None = None,
        compile_prefill: bool | None = None,
        pdl: bool | None = None,
        symmetric_all_reduce: bool | None = False,
        tiles: dict | None = None,
        vocab_parallel: bool | None = None,
    ):
        opts = check_options(
            model,
            kernels=kernels,
            compile_prefill=compile_prefill,
            pdl=pdl,
            symmetric_all_reduce=symmetric_all_reduce,
            tiles=tiles,
            vocab_parallel=vocab_parallel,
        )  # before any GPU work
        self.weights = fuse_weights(model)
        self.max_positions = model_limits(model)[1]  # the cache never holds more slots (None: no limit known)
        if opts.vocab_parallel:
            shard_vocab(self.weights)
        param = self.weights.embed
        self.device, self.dtype = param.device, param.dtype
        self.kernels, self.pdl = opts.kernels, opts.pdl
        tiles = opts.tiles
        if tiles is None:
            tiles = TILES if self.dtype in (torch.bfloat16, torch.float16) else {}
        # RMSNorm sums handed from writer to reader (NormSums) where the norms are RMSNorms and no all-reduce
        # comes between a writer and its reader (unsharded)
        sums = self.weights.norm != "layer" and self.weights.tp is None
        self.ops = (
            triton_ops(self.device, self.pdl, tiles, norm_sums=sums) if self.kernels == "triton" else REFERENCE_OPS
        )
        # whether greedy_step can write each step's tokens and flag into a StepLog (its flags in pinned host
        # memory): the Triton kernel can on any device; the torch twin only where host and device memory are one (CPU)
        self.writes_step_log = self.kernels == "triton" or self.device.type == "cpu"
        if opts.symmetric_all_reduce:
            self.ops = self.ops._replace(symmetric=SymmetricAllReduce(self.weights.tp.group, self.device))
        compile_prefill = opts.compile_prefill
        # on CUDA the compiled prefill of each bucket is also one CUDA graph (torch.compile's, reduce-overhead): its
        # few hundred launches otherwise cost milliseconds of host time before the first token (docs/KERNELS.md,
        # "Prefill"). Its guards and input checks run once per call, not per token; its logits are consumed before
        # the next call replays it. (Captured by hand instead, as the decode step is, it crashed: CHANGELOG.md.)
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self._prefill = torch.compile(forward.prefill, dynamic=False, mode=mode) if compile_prefill else forward.prefill
        self._compiled_prefill = compile_prefill
        for t in self.weights.tensors():
            torch._dynamo.mark_static_address(t)  # a CUDA graph reads the weights in place
        self._caches: OrderedDict = OrderedDict()

    def cache_for(self, batch: int, length: int, tag: str = "") -> FusedCache:
        """The cache of this shape, kept for later calls (its old contents are never read: the prefill
        overwrites slots 0 .. P-1 and each step writes its slot before attending to it). `tag`: another cache of
        the same shape (a model drafting for itself keeps its draft's apart)."""
        key = (batch, length, torch.is_inference_mode_enabled(), tag)  # inference tensors stay in inference mode
        cache = self._caches.pop(key, None)
        if cache is None:
            W = self.weights
            cache = FusedCache.empty(len(W.layers), batch, W.n_kv_heads, length, W.head_dim, self.dtype, self.device)
        self._caches[key] = cache
        while len(self._caches) > KEEP_CACHES:
            self._caches.popitem(last=False)[1].graphs.clear()  # see clear_caches
        return cache

    def kept_caches(self) -> list[FusedCache]:
        """The caches this model keeps now (cache_for drops the oldest beyond KEEP_CACHES)."""
        return list(self._caches.values())

    def clear_caches(self) -> None:
        """Free the kept caches (their CUDA graphs are recorded again for new ones). A cache's captured steps
        (steps.GraphStep) refer back to it and to this model: dropping them first breaks that cycle, so
        the cache's memory and the graphs' pools are freed now, not at Python's next cycle collection."""
        for cache in self._caches.values():
            cache.graphs.clear()
        self._caches.clear()

    def __call__(
        self, input_ids, position_ids, attention_mask=None, past_key_values=None, use_cache=True, logits_to_keep=1
    ) -> FusedOutput:
        if not isinstance(past_key_values, FusedCache):
            raise TypeError("past_key_values must be the FusedCache of this FusedModel (from cache_for)")
        cache = past_key_values
        if attention_mask is not None:
            return FusedOutput(self.prefill(cache, input_ids, attention_mask, position_ids)[:, None])
        logits = forward.decode_step(
            self.weights, cache.k, cache.v, cache.pad, input_ids[:, 0], position_ids[:, 0], self.ops
        )
        return FusedOutput(logits[:, None])

    def greedy_step(
        self, cache: FusedCache, state: torch.Tensor, eos_ids: torch.Tensor, pad_id: int, done: torch.Tensor, log=None
    ) -> None:
        """One greedy decode step over the loop's state: the token state[:, 0] at position state[:, 1] of each
        row through the model, then the greedy choice and stop bookkeeping of `sampling.choose_next`, written into
        `state` (B, 3) long and `done` (0-d bool) in place, by one kernel after the LM head with the Triton kernels
        (kernels/greedy.py). `log` (kernels/greedy.StepLog): also write the tokens and done into its next column (see
        `writes_step_log`)."""
        if log is not None and not self.writes_step_log:
            raise ValueError(
                "log: the torch operations on a GPU cannot write a step log (its flags are in host memory); pass None"
            )
        if not isinstance(cache, FusedCache):
            raise TypeError("cache must be a FusedCache of this FusedModel (from cache_for)")
        forward.decode_step(
            self.weights,
            cache.k,
            cache.v,
            cache.pad,
            state[:, 0],
            state[:, 1],
            self.ops,
            GreedyFinish(state, eos_ids, int(pad_id), done, log),
        )

    def greedy_prefill(
        self,
        cache: FusedCache,
        input_ids,
        attention_mask,
        position_ids,
        state: torch.Tensor,
        eos_ids: torch.Tensor,
        pad_id: int,
        done: torch.Tensor,
    ) -> None:
        """Step 0 of a greedy call: the prefill, then the greedy choice of `sampling.choose_next` on its logits by
        the step's own choice operation (kernels/greedy.py), written into `state` (B, 3) long, which must hold no
        finished row, and `done` in place. Why: the time to the first token is mostly host time, and this is
        two launches where the eager choice was a dozen."""
        logits = self.prefill(cache, input_ids, attention_mask, position_ids)
        state[:, 1].copy_(position_ids[:, -1])  # the choice writes the next position, this one + 1
        self.ops.greedy(logits, GreedyFinish(state, eos_ids, int(pad_id), done))

    def prefill(self, cache: FusedCache, input_ids, attention_mask, position_ids):
        """The prompt, padded on the right to its bucket (those slots are rewritten by the decode steps
        before any step reads them); -> float32 logits (B, V) of the last prompt token."""
        B, P = input_ids.shape
        cache.pad.copy_(P - attention_mask.long().sum(-1))
        T = min(-(-P // PREFILL_BUCKET) * PREFILL_BUCKET, cache.length)
        if T > P:
            input_ids = torch.cat([input_ids, input_ids[:, -1:].expand(B, T - P)], dim=1)
            position_ids = torch.cat([position_ids, position_ids[:, -1:].expand(B, T - P)], dim=1)
        last = torch.full((1,), P - 1, dtype=torch.long, device=input_ids.device)
        if self.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()  # the last replay's logits were consumed by its caller
        # a prompt length this cache has not met (or a new cache) may compile: under raised recompile limits
        seen = (input_ids.shape[1], torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        new = self._compiled_prefill and seen not in cache.prefilled
        with recompile_limits() if new else contextlib.nullcontext():
            logits = self._prefill(self.weights, cache.k, cache.v, cache.pad, input_ids, position_ids, last)
        cache.prefilled.add(seen)
        return logits
