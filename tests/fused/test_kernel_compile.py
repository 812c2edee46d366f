"""Every Triton kernel of the fused step compiles for an H100/H200 (sm_90) on this CPU machine, by Triton's
own compiler and the ptxas its wheel ships, with PDL on and off: so a kernel that only the interpreter has run
(CI has no GPU) cannot reach a GPU with an error that only the GPU compiler finds (an unsupported op, a type
that does not lower). The programmatic-dependent-launch instructions are where pdl.py says: with PDL on,
`gdc_wait` (griddepcontrol.wait) before any load and `gdc_launch_dependents` after the main loop's loads; with it
off, neither."""

from __future__ import annotations

import re

import pytest

triton = pytest.importorskip("triton")

import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

# Under Triton's interpreter (conftest.py chooses it on CPU) the kernels are not JITFunctions and cannot compile:
# there test_kernel_compile_child.py runs this file in a child process with TRITON_INTERPRET=0.
pytestmark = pytest.mark.skipif(
    not isinstance(tl.cdiv, JITFunction), reason="Triton's interpreter: run by test_kernel_compile_child.py"
)
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from overlapdecode.fused.kernels.decode_attention import _split_kernel  # noqa: E402
from overlapdecode.fused.kernels.embed import _embed_kernel  # noqa: E402
from overlapdecode.fused.kernels.greedy import _greedy_kernel  # noqa: E402
from overlapdecode.fused.kernels.linear_residual import _linear_split_kernel  # noqa: E402
from overlapdecode.fused.kernels.moe import _down_kernel, _gate_up_kernel  # noqa: E402
from overlapdecode.fused.kernels.norm_linear import _norm_linear_kernel  # noqa: E402
from overlapdecode.fused.kernels.norm_prologue import NORM_NONE, _norm_rows_kernel  # noqa: E402
from overlapdecode.fused.kernels.norm_qkv import _norm_qkv_kernel, swapped_qkv_tiles  # noqa: E402
from overlapdecode.fused.kernels.residual_norm import _residual_norm_kernel  # noqa: E402
from overlapdecode.fused.kernels.rope import _rope_table_kernel  # noqa: E402
from overlapdecode.fused.kernels.swap_ab import swap_tiles, use_prenorm  # noqa: E402
from overlapdecode.fused.model import TILES  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
PLAIN = dict(s_ptr=None, z_ptr=None, QUANT=0, GROUP=0)  # the projections' 16-bit weights (packed_weights.py)


def ptx(kernel, types: dict, constants: dict, aligned: bool = False, **options) -> str:
    """PTX for sm_90; `options`: num_warps, num_stages. `aligned`: every pointer 16-byte aligned, as a launch
    specialises tensors that are (the loads may then be vectors)."""
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    missing = [n for n, t in signature.items() if t == "constexpr" and n not in constants]
    assert not missing, missing
    attrs = None
    if aligned:
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if signature[n][0] == "*"}
    src = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(src, target=SM90, options=options).asm["ptx"]


def bf16(*names):
    return {n: "*bf16" for n in names}


# (kernel, run-time argument types, constexprs) at the Llama-1B shape, split where the step splits; GPT2 below
# changes the constexprs that differ at GPT-2 (LayerNorm, biases, no RoPE, GELU)
CASES = {
    "embed": (
        _embed_kernel,
        {
            **{n: "*i64" for n in ("ids_ptr", "pos_ptr", "pad_ptr", "slot_ptr", "len_ptr")},
            **bf16("wte_ptr", "wpe_ptr", "h_ptr"),
            "ss_ptr": "*fp32",
            **{n: "i32" for n in ("B", "V", "H", "ids_stride", "pos_stride", "pad_stride")},
        },
        dict(HAS_POS=False, SUMS=True, BLOCK=1024, SCALE=None),
    ),
    "norm_qkv": (
        _norm_qkv_kernel,
        {
            **bf16("x_ptr", "nw_ptr", "nb_ptr", "w_ptr", "b_ptr", "q_ptr", "k_ptr", "v_ptr"),
            "inv_freq_ptr": "*fp32",
            "pos_ptr": "*i64",
            "slot_ptr": "*i64",
            "part_ptr": "*fp32",
            "ticket_ptr": "*i32",
            "ss_ptr": "*fp32",
            **{n: "i32" for n in ("B", "S", "n_heads", "n_kv", "pos_stride", "slot_stride", "NB")},
            "eps": "fp32",
            "rope_scale": "fp32",
        },
        dict(
            K=2048,
            K_CHUNK=1024,
            SPLIT=2,
            LAYER=False,
            HAS_BIAS=False,
            ROPE=True,
            D=64,
            HALF=32,
            BLOCK_M=16,
            BLOCK_K=256,
            NB_PAD=64,
            SWAP=False,
            qn_ptr=None,
            kn_ptr=None,
            QK_NORM=False,
            NORM_OFFSET=False,
            ROT=64,
            rt_ptr=None,
            TABLE=False,
            PRODUCT=0,
            CACHE_GROUP=1,
            **PLAIN,
        ),
    ),
    "rope_table": (
        _rope_table_kernel,
        {
            "inv_ptr": "*fp32",
            "pos_ptr": "*i64",
            "out_ptr": "*fp32",
            "B": "i32",
            "pos_stride": "i32",
            "rope_scale": "fp32",
        },
        dict(R2=32, BLOCK_B=16, BLOCK_R=32, DT=tl.bfloat16),
    ),
    "attention": (
        _split_kernel,
        {
            **bf16("q_ptr", "k_ptr", "v_ptr", "out_ptr"),
            "start_ptr": "*i64",
            "length_ptr": "*i64",
            "part_acc_ptr": "*fp32",
            "part_m_ptr": "*fp32",
            "part_l_ptr": "*fp32",
            "ticket_ptr": "*i32",
            "qk_scale": "fp32",
            "S": "i32",
        },
        dict(
            HQ=32,
            HKV=8,
            G=4,
            GROUP_PAD=16,
            D=64,
            BLOCK_N=64,
            BLOCK_D=64,
            NUM_SPLITS=8,
            SPLIT_PAD=8,
            DIRECT=False,
            IEEE=False,
            SOFTCAP=None,
            sinks_ptr=None,
            CACHE_GROUP=1,
            T=1,
        ),
    ),
    "linear_residual": (
        _linear_split_kernel,
        {
            **bf16("x_ptr", "w_ptr", "b_ptr", "res_ptr", "out_ptr"),
            "part_ptr": "*fp32",
            "ticket_ptr": "*i32",
            "ss_ptr": "*fp32",
            "B": "i32",
            "N": "i32",
        },
        dict(
            K=8192,
            K_CHUNK=2048,
            SPLIT=4,
            HAS_BIAS=False,
            SUMS=True,
            BLOCK_M=16,
            BLOCK_N=32,
            BLOCK_K=128,
            SWAP=False,
            HAS_RES=True,
            RES_SCALE=None,
            PRODUCT=0,
            **PLAIN,
        ),
    ),
    "residual_norm": (
        _residual_norm_kernel,
        {
            **bf16("b_ptr", "res_ptr", "out_ptr", "nw_ptr", "nb_ptr", "xn_ptr"),
            "part_ptr": "*fp32",
            "ss_ptr": "*fp32",
            "B": "i32",
            "N": "i32",
            "eps": "fp32",
        },
        dict(N_PAD=2048, HAS_BIAS=False, RES_SCALE=None, LAYER=0, SUMS=True, PIECES=2),
    ),
    "norm_linear": (
        _norm_linear_kernel,
        {
            **bf16("x_ptr", "nw_ptr", "nb_ptr", "w_ptr", "b_ptr", "out_ptr"),
            "ss_ptr": "*fp32",
            "part_ptr": "*fp32",
            "ticket_ptr": "*i32",
            "B": "i32",
            "N": "i32",
            "NB": "i32",
            "eps": "fp32",
        },
        dict(
            K=2048,
            K_CHUNK=2048,
            SPLIT=1,
            LAYER=False,
            HAS_BIAS=False,
            ACT=2,
            ROUND_OUT=True,
            BLOCK_M=16,
            BLOCK_N=32,
            BLOCK_K=256,
            NB_PAD=64,
            SWAP=False,
            LOGIT_DIV=None,
            SOFTCAP=None,
            **PLAIN,
        ),
    ),
    "norm_rows": (
        _norm_rows_kernel,
        {**bf16("x_ptr", "nw_ptr", "nb_ptr", "out_ptr"), "ss_ptr": "*fp32", "B": "i32", "NB": "i32", "eps": "fp32"},
        dict(K=2048, LAYER=0, BLOCK_M=4, BLOCK_K=1024, NB_PAD=64),
    ),
    "greedy": (
        _greedy_kernel,
        {
            "logits_ptr": "*fp32",
            "val_ptr": "*fp32",
            "idx_ptr": "*i32",
            "ticket_ptr": "*i32",
            "state_ptr": "*i64",
            "eos_ptr": "*i64",
            "E": "i32",
            "pad_id": "i32",
            "done_ptr": "*u8",
            "tokens_ptr": "*i64",
            "flags_ptr": "*u8",
            "count_ptr": "*i32",
            "L": "i32",
            "B": "i32",
            "V": "i32",
            "row_stride": "i32",
        },
        dict(BLOCK_M=1, BLOCK_V=2048, LOG=True),
    ),
    # the routed experts at Qwen3-30B-A3B's shape (128 experts, 8 per token)
    "moe_gate_up": (
        _gate_up_kernel,
        {
            **bf16("h_ptr", "nw_ptr", "logits_ptr", "w_ptr", "act_ptr"),
            **{n: "i32" for n in ("H", "I", "E", "w_se", "w_sn", "w_sk")},
            "eps": "fp32",
        },
        dict(TOPK=8, STYLE=0, BLOCK_E=128, BLOCK_N=16, BLOCK_K=128, bu_ptr=None, TOPK_FIRST=False, INTERLEAVED=False)
        | dict(ALPHA=None, LIMIT=None),
    ),
    "moe_down": (
        _down_kernel,
        {
            **bf16("act_ptr", "logits_ptr", "w_ptr", "res_ptr", "out_ptr"),
            **{n: "i32" for n in ("H", "I", "E", "w_se", "w_sn", "w_sk")},
        },
        dict(TOPK=8, RENORM=True, BLOCK_E=128, BLOCK_N=16, BLOCK_K=128, bd_ptr=None, TOPK_FIRST=False),
    ),
}


GPT2 = {
    "embed": dict(HAS_POS=True, SUMS=False),
    "norm_qkv": dict(K=768, K_CHUNK=768, SPLIT=1, LAYER=True, HAS_BIAS=True, ROPE=False, NB_PAD=0),
    "linear_residual": dict(K=3072, K_CHUNK=768, HAS_BIAS=True, SUMS=False),
    "norm_linear": dict(K=768, K_CHUNK=768, LAYER=True, HAS_BIAS=True, ACT=1, NB_PAD=0),
    "residual_norm": dict(N_PAD=1024, HAS_BIAS=True, LAYER=1, SUMS=False),
    "attention": dict(HQ=12, HKV=12, G=1),
    # (the batch, not GPT-2, sets BLOCK_M: 16 rows, as from batch 16 on)
    "greedy": dict(BLOCK_M=16),
}


@pytest.mark.parametrize("pdl", [False, True])
@pytest.mark.parametrize("name,shape", [(n, "llama") for n in CASES] + [(n, "gpt2") for n in GPT2])
def test_kernel_compiles_for_sm90_with_its_pdl_instructions(name, shape, pdl):
    kernel, types, constants = CASES[name]
    if shape == "gpt2":
        constants = dict(constants, **GPT2[name])
    lines = ptx(kernel, types, dict(constants, PDL=pdl)).splitlines()
    waits = [i for i, line in enumerate(lines) if "griddepcontrol.wait" in line]
    launches = [i for i, line in enumerate(lines) if "griddepcontrol.launch_dependents" in line]
    assert len(waits) == pdl and bool(launches) == pdl
    if pdl:  # pdl.py: nothing is read before the kernel ahead has finished; the next one released after the loads
        assert not [line for line in lines[: waits[0]] if "ld.global" in line]
        assert [line for line in lines[waits[0] : launches[0]] if "ld.global" in line]


@pytest.mark.parametrize("key", sorted(TILES))
def test_the_tiles_of_the_table_compile_for_sm90(key):
    """Each configuration of fused/model.py's TILES (bfloat16, PDL on, as the step runs it) compiles."""
    fn, N, K = key[:3]
    cfg = TILES[key]
    kernel, types, constants = CASES[fn]
    tile = {"block_n": "BLOCK_N", "half": "HALF", "block_k": "BLOCK_K"}
    constants = dict(constants, PDL=True, K=K, **{tile[k]: v for k, v in cfg.items() if k in tile})
    if "K_CHUNK" in constants:
        constants["K_CHUNK"] = K
        constants["SPLIT"] = 1
    text = ptx(kernel, types, constants, num_warps=cfg.get("num_warps", 4), num_stages=cfg.get("num_stages", 3))
    assert "griddepcontrol.wait" in text


# (kernel, N per accumulator, K, accumulators, the kernel's constexprs) of the swapped tiles at the Llama-1B and
# Llama-8B shapes (the 8B's gate/up: 128 weight rows per program, 8 warps)
SWAPPED = {
    "qkv": ("norm_qkv", 1536, 2048, 2, dict(D=64)),
    "o": ("linear_residual", 2048, 2048, 1, {}),
    "gate/up": ("norm_linear", 8192, 2048, 2, dict(ACT=2)),
    "down": ("linear_residual", 2048, 8192, 1, {}),
    "head": ("norm_linear", 128256, 2048, 1, dict(ACT=0, ROUND_OUT=False)),
    "8b qkv": ("norm_qkv", 3072, 4096, 2, dict(D=128, ROT=128)),
    "8b down": ("linear_residual", 4096, 14336, 1, {}),
    "8b gate/up": ("norm_linear", 14336, 4096, 2, dict(ACT=2)),
}


def spill_bytes(text: str) -> int:
    """The bytes of spill stores ptxas reports for `text` (PTX for sm_90)."""
    import os
    import re
    import subprocess
    import tempfile

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(text)
        report = subprocess.run(
            [ptxas, "-arch=sm_90a", "-v", path, "-o", os.devnull], capture_output=True, text=True, check=True
        ).stderr
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", report))


@pytest.mark.parametrize(
    "name,rows,table",
    [(n, r, False) for n in sorted(SWAPPED) for r in (32, 64, 128)]
    + [(n, r, True) for n in sorted(SWAPPED) if SWAPPED[n][0] == "norm_qkv" for r in (32, 64, 128)],
)
def test_swapped_tiles_compile_to_tensor_core_mmas_without_spills(name, rows, table):
    """The swapped tiles swap_ab.swap_tiles picks (bfloat16, 132 SMs, split, PDL on) compile for sm_90 to
    tensor-core MMAs with the weight rows as M (warpgroup MMAs, wgmma, from 64 weight rows per program; mma.sync
    below), one MMA chain per K tile where a program pairs two accumulators' rows (swap_ab.pair_rows: a single
    `wgmma.wait_group` in the loop, not one wait for all groups after each), and spill at most a few dozen
    bytes; QKV with its tiles (swapped_qkv_tiles) and also reading the step's rotary table (`table`)."""
    fn, N, K, accs, extra = SWAPPED[name]
    tiles = swapped_qkv_tiles(rows, N, K, 2, 132) if fn == "norm_qkv" else swap_tiles(rows, N, K, 2, accs, 132)
    kernel, types, constants = CASES[fn]
    if table:  # QKV as the step runs it from 17 rows: cos and sin from the step's table
        constants = {k: v for k, v in constants.items() if k != "rt_ptr"}
        types, extra = dict(types, rt_ptr="*fp32"), dict(extra, TABLE=True)
    constants = dict(
        constants,
        **extra,
        PDL=True,
        SWAP=True,
        BLOCK_M=tiles["block_m"],
        BLOCK_K=tiles["block_k"],
        K=K,
        K_CHUNK=K // 2,
        SPLIT=2,
    )
    constants["HALF" if fn == "norm_qkv" else "BLOCK_N"] = tiles["block_n"]
    if fn != "linear_residual" and use_prenorm(rows):  # rows normalised beforehand (norm_prologue.normalized_rows)
        constants.update(LAYER=NORM_NONE, NB_PAD=0)
    text = ptx(kernel, types, constants, num_warps=tiles["num_warps"], num_stages=tiles["num_stages"])
    if tiles["block_n"] * accs >= 64:
        assert "wgmma.mma_async" in text
        waits = [line.split()[-1] for line in text.splitlines() if "wgmma.wait_group" in line]
        assert waits.count("0;") <= 1, waits  # at most the one after the loop
    else:
        assert "mma.sync.aligned" in text
    assert spill_bytes(text) <= 192  # the LM head at 128 x 128 spills 168 bytes in its epilogue


def test_swapped_qkv_tiles_take_8_warps_from_64_rows():
    """QKV's swapped tiles: swap_tiles's, with 8 warps from 64 batch rows (measured there), 4 below at the 1B shape."""
    warps = {rows: swapped_qkv_tiles(rows, 1536, 2048, 2, 132)["num_warps"] for rows in (17, 32, 40, 63, 64, 100, 128)}
    assert warps == {17: 4, 32: 4, 40: 4, 63: 4, 64: 8, 100: 8, 128: 8}
    assert {k: v for k, v in swapped_qkv_tiles(40, 1536, 2048, 2, 132).items() if k != "num_warps"} == {
        k: v for k, v in swap_tiles(40, 1536, 2048, 2, 2, 132).items() if k != "num_warps"
    }


# the decoder families' flags (layout.DECODERS), each on the Llama-1B case of its kernel: Qwen3's per-head Q/K
# norms, Gemma 3's with (1 + w) norms, Phi-4-mini's partial rotary (96 of 128 dims), OLMo2's missing prologue norm,
# Gemma's GeGLU, Granite's logit division and residual multiplier, Gemma 2's soft-caps, the branch without its
# residual, the scaled embedding
FAMILY_FLAGS = {
    "qwen3 q/k norm": ("norm_qkv", dict(QK_NORM=True), {"qn_ptr": "*bf16", "kn_ptr": "*bf16"}),
    "gemma3 q/k norm": (
        "norm_qkv",
        dict(QK_NORM=True, NORM_OFFSET=True, LAYER=2),
        {"qn_ptr": "*bf16", "kn_ptr": "*bf16"},
    ),
    "phi4 partial rotary": ("norm_qkv", dict(D=128, ROT=96, HALF=32), {}),
    "rotary table": ("norm_qkv", dict(TABLE=True), {"rt_ptr": "*fp32"}),
    "rotary table, partial rotary": ("norm_qkv", dict(D=128, ROT=96, HALF=32, TABLE=True), {"rt_ptr": "*fp32"}),
    "no prologue norm": ("norm_qkv", dict(LAYER=3, NB_PAD=0), {}),
    "gemma GeGLU": ("norm_linear", dict(ACT=3, LAYER=2), {}),
    "granite head": ("norm_linear", dict(ACT=0, ROUND_OUT=False, LOGIT_DIV=8.0), {}),
    "gemma2 head": ("norm_linear", dict(ACT=0, ROUND_OUT=False, SOFTCAP=30.0, LAYER=2), {}),
    "granite residual": ("linear_residual", dict(RES_SCALE=0.22), {}),
    "branch alone": ("linear_residual", dict(HAS_RES=False, SUMS=False), {}),
    "gemma2 attention": ("attention", dict(SOFTCAP=50.0), {}),
    "scaled embedding": ("embed", dict(SCALE=45.25), {}),
    # speculative decoding's verify step: the K + 1 = 5 tokens of a row read and write one cache row
    "verify rows' cache row": ("norm_qkv", dict(CACHE_GROUP=5), {}),
    "verify rows' cache row, dense": ("norm_qkv", dict(CACHE_GROUP=5, PRODUCT=2, SPLIT=1, K_CHUNK=2048), {}),
    "verify rows' attention": ("attention", dict(CACHE_GROUP=5, T=5, GROUP_PAD=32), {}),
    "verify rows' attention, direct": (
        "attention",
        dict(CACHE_GROUP=5, T=5, GROUP_PAD=32, NUM_SPLITS=1, SPLIT_PAD=1, DIRECT=True),
        {},
    ),
    "verify rows' attention, a program a row": ("attention", dict(CACHE_GROUP=5), {}),
}


@pytest.mark.parametrize("name", sorted(FAMILY_FLAGS))
def test_the_families_flags_compile_for_sm90(name):
    """Each family flag compiles for sm_90 (bfloat16, PDL on); the per-head Q/K norm with its head-sized tile."""
    fn, flags, types = FAMILY_FLAGS[name]
    kernel, base_types, constants = CASES[fn]
    constants = dict(constants, PDL=True, **flags)
    if flags.get("QK_NORM"):
        constants.pop("qn_ptr", None), constants.pop("kn_ptr", None)
    if flags.get("TABLE"):
        constants.pop("rt_ptr", None)
    text = ptx(kernel, dict(base_types, **types), constants)
    assert "griddepcontrol.wait" in text


@pytest.mark.parametrize("cache_group", [1, 5])
def test_the_whole_projection_qk_norm_kernel_compiles_for_sm90(cache_group):
    """OLMo2's Q/K norms then RoPE (kernels/qk_norm_rope.py) at OLMo-2-1B's shape (16 heads of 128), PDL on; with
    cache_group 5 (the verify step's rows of one cache row) too."""
    from overlapdecode.fused.kernels.qk_norm_rope import _qk_norm_rope_kernel

    types = {
        **bf16("q_ptr", "k_ptr", "qn_ptr", "kn_ptr"),
        "inv_freq_ptr": "*fp32",
        "pos_ptr": "*i64",
        "slot_ptr": "*i64",
        **{n: "i32" for n in ("pos_stride", "slot_stride", "S", "n_heads", "n_kv")},
        "eps": "fp32",
        "rope_scale": "fp32",
    }
    constants = dict(D=128, BLOCK=1024, ROPE=True, PDL=True, CACHE_GROUP=cache_group)
    assert "griddepcontrol.wait" in ptx(_qk_norm_rope_kernel, types, constants)


def test_the_post_norm_kernel_compiles_for_sm90():
    from overlapdecode.fused.kernels.norm_residual import _norm_residual_kernel

    types = {**bf16("x_ptr", "w_ptr", "res_ptr", "out_ptr"), "H": "i32", "eps": "fp32"}
    for style in (0, 1, 2):
        assert "griddepcontrol.wait" in ptx(_norm_residual_kernel, types, dict(STYLE=style, BLOCK=1024, PDL=True))


@pytest.mark.parametrize("D", [128, 256])
@pytest.mark.parametrize("dtype", ["*fp32", "*bf16"])
def test_per_head_qk_norm_tiles_fit_in_shared_memory(D, dtype):
    """With per-head Q/K norms a program owns a whole head (HALF = D/2: 64 at Qwen3's 128, 128 at Gemma 3's 256);
    norm_qkv then shrinks its K tiles so that the weight tiles keep the default's size: the shared memory of the
    compiled kernel stays within an H200's 227 KB per program, float32 included."""
    import torch

    from overlapdecode.fused.kernels import norm_qkv as nq

    seen = {}

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kw):
                seen.update(kw)

            return launch

    H, B = 2048, 2
    tdt = torch.float32 if dtype == "*fp32" else torch.bfloat16
    x, w = torch.zeros(B, H, dtype=tdt), torch.zeros(4 * D, H, dtype=tdt)
    cache = torch.zeros(B, 1, 8, D, dtype=tdt)
    pos = torch.zeros(B, dtype=torch.long)
    real, nq._norm_qkv_kernel = nq._norm_qkv_kernel, Spy()
    try:
        nq.norm_qkv(
            x,
            torch.ones(H, dtype=tdt),
            None,
            1e-6,
            w,
            None,
            None,
            1.0,
            pos,
            pos,
            cache,
            cache,
            2,
            1,
            D,
            q_norm=torch.ones(D, dtype=tdt),
            k_norm=torch.ones(D, dtype=tdt),
            dense=False,  # the row-block tile (float32 would take cuBLAS's product from 2 rows)
        )
    finally:
        nq._norm_qkv_kernel = real
    assert seen["HALF"] == D // 2 and seen["QK_NORM"]
    kernel, types, constants = CASES["norm_qkv"]
    types = {k: (dtype if v == "*bf16" else v) for k, v in types.items()}
    types.update(qn_ptr=dtype, kn_ptr=dtype)
    constants = {k: v for k, v in constants.items() if k not in ("qn_ptr", "kn_ptr")}
    constants.update(
        PDL=True, QK_NORM=True, D=D, ROT=D, HALF=seen["HALF"], BLOCK_K=seen["BLOCK_K"], SPLIT=1, K_CHUNK=2048
    )
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=constants),
        target=SM90,
        options=dict(num_warps=seen["num_warps"], num_stages=seen["num_stages"]),
    )
    assert compiled.metadata.shared <= 227 * 1024


@pytest.mark.parametrize("dtype", ["*fp32", "*bf16"])
def test_the_routed_experts_variants_compile_for_sm90(dtype):
    """The routed experts' other constexprs (top-2 without renormalising, Gemma's and OLMo2's norm roundings, an
    expert count not a power of two's block) in float32, as the GPU tests run them, and bfloat16."""
    for name, flags in (("moe_gate_up", dict(TOPK=2, STYLE=1, BLOCK_E=8)), ("moe_down", dict(TOPK=2, RENORM=False))):
        kernel, types, constants = CASES[name]
        types = {k: dtype if v == "*bf16" else v for k, v in types.items()}
        assert "griddepcontrol.wait" in ptx(kernel, types, dict(constants, PDL=True, **flags))
    kernel, types, constants = CASES["moe_gate_up"]
    types = {k: dtype if v == "*bf16" else v for k, v in types.items()}
    assert "griddepcontrol.wait" in ptx(kernel, types, dict(constants, PDL=True, STYLE=2))


@pytest.mark.parametrize("dtype", ["*fp32", "*bf16"])
def test_the_gpt_oss_variants_compile_for_sm90(dtype):
    """gpt-oss's flags at gpt-oss-20b's shape (4 of 32 experts, 64 query heads over 8): the attention's sinks, in
    one piece and split; the experts' top k of the logits, biases, interleaved gate/up and clamped SwiGLU."""
    to = {k: dtype for k in ("*bf16",)}
    kernel, types, constants = CASES["attention"]
    types = {k: to.get(v, v) for k, v in types.items()}
    for direct in (False, True):
        flags = dict(HQ=64, HKV=8, G=8, PDL=True, DIRECT=direct, IEEE=dtype == "*fp32")
        assert "griddepcontrol.wait" in ptx(
            kernel, dict(types, sinks_ptr=dtype), _without(constants, "sinks_ptr", flags)
        )
    kernel, types, constants = CASES["moe_gate_up"]
    types = {k: to.get(v, v) for k, v in types.items()}
    flags = dict(TOPK=4, BLOCK_E=32, PDL=True, TOPK_FIRST=True, INTERLEAVED=True, ALPHA=1.702, LIMIT=7.0)
    assert "griddepcontrol.wait" in ptx(kernel, dict(types, bu_ptr=dtype), _without(constants, "bu_ptr", flags))
    kernel, types, constants = CASES["moe_down"]
    types = {k: to.get(v, v) for k, v in types.items()}
    flags = dict(TOPK=4, BLOCK_E=32, RENORM=False, PDL=True, TOPK_FIRST=True)
    assert "griddepcontrol.wait" in ptx(kernel, dict(types, bd_ptr=dtype), _without(constants, "bd_ptr", flags))


def _without(constants: dict, pointer: str, flags: dict) -> dict:
    """`constants` with `flags`, less the pointer the case passes (a run-time argument there, not a None)."""
    return {k: v for k, v in dict(constants, **flags).items() if k != pointer}


@pytest.mark.parametrize("top_k,top_p", [(0, False), (50, True)])
def test_the_sampled_finish_compiles_for_sm90(top_k, top_p):
    """The sampled choice's finishing kernel (kernels/sample.py), with the stop bookkeeping it shares with the greedy
    choice (greedy.advance_rows), the repetition penalty and the step log, compiles for sm_90 and waits for the
    kernel ahead (PDL)."""
    from overlapdecode.fused.kernels.sample import _finish_kernel

    f32 = ("logits_ptr", "noise_ptr", "kth_ptr", "pmax_ptr", "pz_ptr", "pr_ptr", "pmass_ptr", "pr2_ptr", "pmass2_ptr")
    types = {n: "*fp32" for n in f32 + ("pr3_ptr",)}
    types.update({n: "*i32" for n in ("pi_ptr", "pi2_ptr", "pi3_ptr", "count_ptr")})
    types.update({n: "*u8" for n in ("seen_ptr", "done_ptr", "flags_ptr")})
    types.update({n: "*i64" for n in ("state_ptr", "eos_ptr", "tokens_ptr")})
    types.update({n: "i32" for n in ("NBLK", "B", "V", "row_stride", "E", "pad_id", "L", "limit")})
    types.update({n: "fp32" for n in ("rep", "temperature", "min_p")})
    constants = dict(BLOCK_M=16, CHAIN_V=64, PENALTY=True, TOP_K=top_k, TOP_P=top_p, LOG=True, PDL=True)
    assert "griddepcontrol.wait" in ptx(_finish_kernel, types, constants, num_warps=8)


@pytest.mark.parametrize("block_m,block_v,warps", [(1, 1024, 4), (8, 1024, 8), (16, 512, 8)])
def test_the_row_max_with_the_tiles_top_k_compiles_for_sm90_without_spills(block_m, block_v, warps):
    """The sampled choice's first launch with top-k (kernels/top_k.py: the tile's k largest keys by 32 masked
    counts and a prefix sum), at the tiles sample.default_block_v gives for 1, 8 and 16 rows, k up to 64: for
    sm_90, no spill, and it waits for the kernel ahead (PDL)."""
    from overlapdecode.fused.kernels.top_k import TOP_K_MAX, _max_kernel

    types = {"logits_ptr": "*fp32", "seen_ptr": "*u8", "pmax_ptr": "*fp32", "part_ptr": "*i32", "rep": "fp32"}
    types.update({n: "i32" for n in ("B", "V", "row_stride", "k")})
    constants = dict(BLOCK_M=block_m, BLOCK_V=block_v, PENALTY=True, TOP_K=True, W=TOP_K_MAX, PDL=True)
    text = ptx(_max_kernel, types, constants, num_warps=warps)
    assert "griddepcontrol.wait" in text
    assert spill_bytes(text) == 0


@pytest.mark.parametrize("chunk,resident,warps", [(8192, True, 8), (32768, True, 16), (8192, False, 8)])
def test_the_top_k_threshold_compiles_for_sm90_without_spills(chunk, resident, warps):
    """The threshold kernel (kernels/top_k.py) holding a row's candidates in registers (up to RESIDENT_KEYS, with
    the warps row_max_and_threshold gives) or reading them again per count: no spill for sm_90, and PDL's wait."""
    from overlapdecode.fused.kernels.top_k import RESIDENT_KEYS, _threshold_kernel

    assert chunk <= RESIDENT_KEYS
    types = {"part_ptr": "*i32", "kth_ptr": "*fp32", "NBLK": "i32", "k": "i32"}
    text = ptx(_threshold_kernel, types, dict(CHUNK=chunk, RESIDENT=resident, PDL=True), num_warps=warps)
    assert "griddepcontrol.wait" in text
    assert spill_bytes(text) == 0


@pytest.mark.parametrize("name", ["qkv", "o", "8b qkv", "8b down"])
def test_the_dense_epilogues_compile_without_a_k_loop_or_spills(name):
    """In dense form (kernels/dense.py, PRODUCT) a launch loads its tile of cuBLAS's float32 product and runs only
    its epilogue: for sm_90 no MMA is left in it, no spill, at the tiles norm_qkv and linear_residual give it."""
    fn, N, K, accs, extra = SWAPPED[name]
    kernel, types, constants = CASES[fn]
    if fn == "norm_qkv":  # as the step runs it from 17 rows: cos and sin from the step's table
        constants = {k: v for k, v in constants.items() if k != "rt_ptr"}
        types, extra = dict(types, rt_ptr="*fp32"), dict(extra, TABLE=True, HALF=32, LAYER=NORM_NONE, NB_PAD=0)
    else:
        extra = dict(extra, BLOCK_N=64)
    constants = dict(
        constants, **extra, PDL=True, SWAP=False, BLOCK_M=16, BLOCK_K=16, K=K, K_CHUNK=K, SPLIT=1, PRODUCT=2
    )
    text = ptx(kernel, types, constants, num_warps=4, num_stages=1)
    assert "mma" not in text
    assert spill_bytes(text) == 0


@pytest.mark.parametrize("n_pad,layer", [(2048, 0), (4096, 2), (8192, 1)])
def test_the_residual_norm_epilogue_holds_whole_rows_without_spills(n_pad, layer):
    """kernels/residual_norm.py holds a whole row of up to MAX_N in registers, with the warps its wrapper gives
    it (4 per 512 columns, 4 to 16): for sm_90 no spill at 2048, 4096 and 8192 columns, and no MMA."""
    from overlapdecode.fused.kernels.residual_norm import MAX_N, warps_for

    assert n_pad <= MAX_N
    kernel, types, constants = CASES["residual_norm"]
    constants = dict(constants, N_PAD=n_pad, LAYER=layer, HAS_BIAS=True, PDL=True)
    text = ptx(kernel, types, constants, num_warps=warps_for(n_pad), num_stages=1)
    assert "mma" not in text
    assert spill_bytes(text) == 0


def test_the_dense_rule_and_the_two_programs_per_sm_pipeline():
    """dense.use_dense: QKV, O and down in dense form from DENSE_ROWS (17) rows, never at 16 or fewer nor where the
    caller chose the GEMV's tile form (`swap`), `dense`
    overriding either way; swap_tiles: 4 stages, or 3 where a weight of more tiles than SMs would hold one 4-stage
    program per SM (the LM head at 128 rows), never below 2."""
    from overlapdecode.fused.kernels import dense

    assert [dense.use_dense(r, 2048, 2048) for r in (1, 16, 17, 32, 47, 48, 128, 300)] == [False] * 2 + [True] * 6
    assert dense.use_dense(3, 8, 8, True) and not dense.use_dense(128, 8, 8, False)
    assert not dense.use_dense(64, 8, 8, swap=True) and dense.use_dense(64, 8, 8, True, swap=True)
    # float32 weights: from 2 rows (the kernels' float32 product runs on CUDA cores; cuBLAS's is faster)
    assert [dense.use_dense(r, 768, 768, elt_bytes=4) for r in (1, 2, 16, 17)] == [False, True, True, True]
    assert not dense.use_dense(8, 768, 768, swap=False, elt_bytes=4)
    # the product in two pieces of K where the weight has at most 32 rows per SM and a piece is >= 1024 long
    pieces = {(n, k): dense.pieces_for(n, k, 132) for n, k in ((3072, 2048), (2048, 8192), (4096, 14336), (6144, 4096))}
    assert pieces == {(3072, 2048): 2, (2048, 8192): 2, (4096, 14336): 2, (6144, 4096): 1}
    assert dense.pieces_for(768, 768, 132) == dense.pieces_for(2048, 2047, 132) == 1
    stages = {r: swap_tiles(r, 128256, 2048, 2, 1, 132)["num_stages"] for r in (17, 64, 128)}
    assert stages == {17: 4, 64: 4, 128: 3}
    assert swap_tiles(128, 8192, 2048, 2, 2, 132)["num_stages"] == 4  # 128 tiles of 128: not more than the SMs
    assert swap_tiles(128, 128256, 2048, 2, 1, 16)["num_stages"] == 3


def test_the_dense_product_chooses_its_pieces_unless_given():
    """dense.dense_product: the pieces pieces_for gives on x's device (a CPU counts as one SM), the partial products
    over them summing to x @ w.T; an explicit `pieces` taken as given."""
    import torch

    from overlapdecode.fused.kernels import dense

    torch.manual_seed(0)
    x, w = torch.randn(3, 2048), torch.randn(24, 2048)
    part, pieces = dense.dense_product(x, w)
    assert pieces == dense.pieces_for(24, 2048, 1) == 2 and part.shape == (2, 3, 24)
    torch.testing.assert_close(part.sum(0), x @ w.T, rtol=1e-4, atol=1e-3)
    whole, one = dense.dense_product(x, w, pieces=1)
    assert one == 1 and whole.shape == (3, 24)
    torch.testing.assert_close(whole, x @ w.T, rtol=1e-4, atol=1e-3)
    assert dense.dense_product(x, torch.randn(40, 2048))[1] == 1  # more than 32 weight rows per SM: whole


def test_the_direct_attention_tiles_compile_without_spills():
    """decode_attention.direct_tiles's launch (one piece per row and kv head: NUM_SPLITS 1, DIRECT, 32 keys, 2
    warps) compiles for sm_90 with its PDL wait and no spill."""
    from overlapdecode.fused.kernels.decode_attention import direct_tiles

    block_n, warps = direct_tiles(64, 1, 512, 264)
    kernel, types, constants = CASES["attention"]
    constants = dict(constants, BLOCK_N=block_n, NUM_SPLITS=1, SPLIT_PAD=1, DIRECT=True, PDL=True)
    text = ptx(kernel, types, constants, num_warps=warps, num_stages=3)
    assert "griddepcontrol.wait" in text
    assert spill_bytes(text) == 0


@pytest.mark.parametrize("name", ["norm_qkv", "linear_residual", "norm_linear"])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_float32_row_blocks_under_16_rows_multiply_without_mmas_or_spills(name, rows):
    """float32 weights under 16 rows: the rows' own power-of-two tile (swap_ab.row_tile) and the broadcast product
    summed over K (acc_dot), at the K tile fit_k gives it, compile for sm_90 at GPT-2's shapes with no MMA (a
    float32 MMA would multiply 16 padded rows on the CUDA cores) and no spill."""
    from overlapdecode.fused.kernels.swap_ab import fit_k, row_tile

    kernel, types, constants = CASES[name]
    types = {k: ("*fp32" if v == "*bf16" else v) for k, v in types.items()}
    block_m = row_tile(rows, 4)
    block_n = constants.get("HALF", constants.get("BLOCK_N"))
    block_k = fit_k(block_m, block_n, constants["BLOCK_K"])
    constants = dict(constants, **GPT2[name], BLOCK_M=block_m, BLOCK_K=block_k, PDL=True)
    if name == "linear_residual":
        constants.update(K_CHUNK=3072, SPLIT=1)
    text = ptx(kernel, types, constants, num_warps=4, num_stages=3)
    assert "mma" not in text
    assert spill_bytes(text) == 0


def test_the_row_tile_follows_the_weights_bytes():
    """16-bit weights keep 16 rows a program (tensor cores: padding is free); 4-byte weights take the rows rounded
    up to a power of two under 16, with K tiles that keep a broadcast product within PRODUCT_ELEMENTS."""
    from overlapdecode.fused.kernels.swap_ab import PRODUCT_ELEMENTS, ROW_TILE, fit_k, row_tile

    assert [row_tile(r, 2) for r in (1, 3, 16)] == [ROW_TILE] * 3
    assert [row_tile(r, 4) for r in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    assert fit_k(1, 32, 256) == 256 and fit_k(8, 32, 256) == PRODUCT_ELEMENTS // (8 * 32)
    assert fit_k(ROW_TILE, 32, 256) == 256  # tl.dot's tiles are not a broadcast product's
    assert fit_k(8, 128, 64) == 16  # never under 16


# --- the kernels on packed weights compile for an H100/H200 (sm_90) -------------------------------------------------

# (kernel, N per accumulator, K, accumulators, constexprs) at the Llama-1B shape
PROJECTIONS = {
    "qkv": ("norm_qkv", 1536, 2048, 2, dict(D=64)),
    "o": ("linear_residual", 2048, 2048, 1, {}),
    "gate/up": ("norm_linear", 8192, 2048, 2, dict(ACT=2)),
    "down": ("linear_residual", 2048, 8192, 1, {}),
    "head": ("norm_linear", 128256, 2048, 1, dict(ACT=0, ROUND_OUT=False)),
}


@pytest.mark.parametrize("scheme,group_size", [("int4", 128), ("int8", None), ("int4", 96), ("fp8", None)])
@pytest.mark.parametrize("name", sorted(PROJECTIONS))
@pytest.mark.parametrize("rows", [1, 64])
def test_quantized_projections_compile_for_sm90(scheme, group_size, name, rows):
    """Each projection's kernel with int4, int8 or fp8 weights (bfloat16 activations, PDL LATE) compiles for sm_90: the
    row-block tiles (1 row) and the swapped tiles (64 rows) that quantized launches take from 17 rows, both over rows
    normalised beforehand (swap_ab.use_prenorm), the swapped ones on
    tensor cores (warpgroup MMAs from 64 weight rows per program), reading nothing before the PDL wait, with few
    spills; the codes arrive in 16-byte copies, never byte by byte (packed.py's layout). A group of 96 (no power of
    two) takes the per-weight group numbers."""
    from overlapdecode.fused.kernels.norm_prologue import NORM_NONE
    from overlapdecode.fused.kernels.norm_qkv import swapped_qkv_tiles
    from overlapdecode.fused.kernels.packed_weights import QUANT_CODES
    from overlapdecode.fused.kernels.swap_ab import swap_tiles

    fn, N, K, accs, extra = PROJECTIONS[name]
    kernel, types, constants = CASES[fn]
    types = dict(types, w_ptr="*i8" if scheme == "int8" else "*u8", s_ptr="*bf16")  # fp8: its bytes
    quant = dict(QUANT=QUANT_CODES[scheme], GROUP=group_size or K)
    if scheme == "int4":
        types["z_ptr"] = "*bf16"
    else:
        quant["z_ptr"] = None
    constants = {k: v for k, v in constants.items() if k not in ("s_ptr", "z_ptr", "QUANT", "GROUP")}
    constants = dict(constants, **extra, **quant, PDL=3, K=K)
    warps, stages = 4, 3
    if rows > 16:
        tiles = swapped_qkv_tiles(rows, N, K, 2, 132) if fn == "norm_qkv" else swap_tiles(rows, N, K, 2, accs, 132)
        constants.update(SWAP=True, BLOCK_M=tiles["block_m"], BLOCK_K=tiles["block_k"], K_CHUNK=K // 2, SPLIT=2)
        constants["HALF" if fn == "norm_qkv" else "BLOCK_N"] = tiles["block_n"]
        warps, stages = tiles["num_warps"], tiles["num_stages"]
    elif "K_CHUNK" in constants:
        constants.update(K_CHUNK=K, SPLIT=1)
    if fn != "linear_residual":  # rows normalised beforehand, as every quantized launch's (swap_ab.use_prenorm)
        constants.update(LAYER=NORM_NONE, NB_PAD=0)
    text = ptx(kernel, types, constants, aligned=True, num_warps=warps, num_stages=stages)
    lines = text.splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    assert not [line for line in lines[:wait] if "ld.global" in line]
    if rows > 16:
        assert "wgmma.mma_async" in text or "mma.sync.aligned" in text
    assert not re.search(r"ld\.global[.\w]*\.[bu]8\b", text)  # no byte loads: the codes in vectors
    if scheme == "int4":  # codes made floats by their bits: no integer-to-float conversion (packed_weights.py)
        assert not re.search(r"cvt\.rn\.(f32|f16|bf16)\.[su](8|16)\b", text)  # of a byte or a half-word
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", text)
    assert spill_bytes(text) <= 256
