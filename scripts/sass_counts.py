"""Count the sm_90 machine instructions of the projections' kernels, compiled on this machine with no GPU: what each
kernel's main loop spends per K tile, before a GPU times it.

    python3 scripts/sass_counts.py --out F.json [--quantize int4|int8|fp8|none] [--group-size G]
                                   [--kernels qkv,o,gate/up,down,head] [--prenorm] [--tile BLOCK_N:BLOCK_K:WARPS]

Each kernel is compiled by Triton for sm_90 (H100/H200) at the Llama-1B shape, one row (the row-block tiles, the
launch configuration tests/fused/test_kernel_compile.py checks there, whose case table this reads), and
disassembled with the nvdisasm that Triton's wheel ships. --prenorm: the norm kernels (QKV, gate/up, the head) as a
launch over rows normalised beforehand compiles them (no norm left to the kernel: norm_prologue.normalized_rows),
as quantized launches take them (swap_ab.use_prenorm). Per kernel: the opcodes of the whole kernel and of its
main loop (the longest block that a backward branch closes), by count, its warp instructions a weight (the loop's
count x warps / the tile's weights: a warp's x fragment is shared by more weights in wider tiles), and the
registers a thread (cuobjdump). --tile compiles another row-block tile (4 warps otherwise). Static counts, one K
tile's instructions: not a time (the GPU's issue rate, pipes and memory decide that), but what a change to the
loop removes or adds.
The JSON goes to --out (a new file: an earlier result is never overwritten) and a table to stdout.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
QKV_HALF_MOST = 32  # norm_qkv's HALF: half of the Llama-1B head's 64 dimensions at most (the case table's D)
OPS_SHOWN = ("I2F", "F2FP", "LOP3", "PRMT", "SHF", "IMAD", "FADD", "FMUL", "FFMA", "HADD2", "HMUL2", "HFMA2", "HMMA")


def fail(message: str):
    print(message, file=sys.stderr)
    raise SystemExit(2)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="sass_counts.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the JSON file to write (a new path; required)")
    ap.add_argument("--quantize", default="int4", choices=["int4", "int8", "fp8", "none"], help="default: int4")
    ap.add_argument("--group-size", type=int, default=128, help="int4 group (default: 128)")
    ap.add_argument("--kernels", default="qkv,o,gate/up,down,head", help="default: %(default)s")
    ap.add_argument("--prenorm", action="store_true", help="the norm kernels over rows normalised beforehand")
    ap.add_argument(
        "--tile",
        metavar="BLOCK_N:BLOCK_K:WARPS",
        help="compile this row-block tile instead of the case table's (BLOCK_N: norm_qkv's HALF), e.g. 128:128:4",
    )
    args = ap.parse_args(argv)
    if args.tile is not None:
        parts = args.tile.split(":")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 and int(p) & (int(p) - 1) == 0 for p in parts):
            ap.error(f"--tile: expected three powers of two BLOCK_N:BLOCK_K:WARPS, got {args.tile!r}")
        if "qkv" in args.kernels.split(",") and int(parts[0]) > QKV_HALF_MOST:
            ap.error(f"--tile: qkv's BLOCK_N (HALF) is at most D / 2 = {QKV_HALF_MOST}, got {parts[0]}; leave qkv out")
    return args


def _compile_cases():
    """tests/fused/test_kernel_compile.py as a module (its kernels' argument types and constexprs), compiled, not
    interpreted."""
    os.environ["TRITON_INTERPRET"] = "0"
    sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "tests")]
    path = os.path.join(ROOT, "tests", "fused", "test_kernel_compile.py")
    spec = importlib.util.spec_from_file_location("kernel_compile_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def opcodes(lines) -> collections.Counter:
    ops = collections.Counter()
    for line in lines:
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def main_loop(lines: list[str]) -> list[str]:
    """The longest block from a label to a backward branch to it: the kernel's K loop."""
    labels, best = {}, []
    for i, line in enumerate(lines):
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m:
            labels[m.group(1)] = i
        m = re.search(r"BRA\s+(?:`\()?(\.L_x_\d+)", line)
        if m and m.group(1) in labels and labels[m.group(1)] < i and i - labels[m.group(1)] > len(best):
            best = lines[labels[m.group(1)] : i + 1]
    return best


def tile_weights(name: str, block_n: int, block_k: int) -> int:
    """The weights of one K tile of kernel `name`: gate/up and QKV pair two row blocks in a tile (gate and up; the
    two halves of a head's dimensions)."""
    return block_n * block_k * (2 if name in ("qkv", "gate/up") else 1)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if os.path.exists(args.out):
        fail(f"sass_counts.py: --out {args.out} exists: choose a new path (no run overwrites an earlier one)")
    cases = _compile_cases()
    import triton
    from triton.compiler import ASTSource

    from overlapdecode.fused.kernels.norm_prologue import NORM_NONE
    from overlapdecode.fused.kernels.packed_weights import QUANT_CODES

    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    cuobjdump = os.path.join(os.path.dirname(nvdisasm), "cuobjdump")
    names = args.kernels.split(",")
    unknown = [n for n in names if n not in cases.PROJECTIONS]
    if unknown:
        fail(f"sass_counts.py: --kernels: unknown {unknown}; choose from {sorted(cases.PROJECTIONS)}")
    assert cases.PROJECTIONS["qkv"][4]["D"] // 2 == QKV_HALF_MOST, "the case table's head dimension changed"
    result = {"command": " ".join(["python3 scripts/sass_counts.py", *(argv or sys.argv[1:])]), "kernels": {}}
    for name in names:
        fn, N, K, accs, extra = cases.PROJECTIONS[name]
        kernel, types, constants = cases.CASES[fn]
        constants = {k: v for k, v in constants.items() if k not in ("s_ptr", "z_ptr", "QUANT", "GROUP")}
        if args.quantize == "none":
            constants.update(s_ptr=None, z_ptr=None, QUANT=0, GROUP=0)
        else:
            types = dict(types, w_ptr="*i8" if args.quantize == "int8" else "*u8", s_ptr="*bf16")
            if args.quantize == "int4":
                types["z_ptr"] = "*bf16"
            else:
                constants["z_ptr"] = None
            group = args.group_size if args.quantize == "int4" else K
            constants.update(QUANT=QUANT_CODES[args.quantize], GROUP=group)
        constants = dict(constants, **extra, PDL=3, K=K)
        if args.prenorm and fn != "linear_residual":
            constants.update(LAYER=NORM_NONE, NB_PAD=0)
        if "K_CHUNK" in constants:
            constants.update(K_CHUNK=K, SPLIT=1)
        warps = 4
        if args.tile is not None:
            block_n, block_k, warps = map(int, args.tile.split(":"))
            constants.update({"HALF" if fn == "norm_qkv" else "BLOCK_N": block_n, "BLOCK_K": block_k})
        signature = {n: types.get(n, "constexpr") for n in kernel.arg_names}
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names) if signature[n][0] == "*"}
        src = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
        compiled = triton.compile(src, target=cases.SM90, options=dict(num_warps=warps, num_stages=3))
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(compiled.asm["cubin"])
            f.flush()
            lines = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
            usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        lines = lines.splitlines()
        whole, loop = opcodes(lines), opcodes(main_loop(lines))
        block_n = constants.get("BLOCK_N", constants.get("HALF"))
        weights = tile_weights(name, block_n, constants["BLOCK_K"])
        registers = re.search(r"REG:(\d+)", usage)
        result["kernels"][name] = {
            "block_k": constants.get("BLOCK_K"),
            "block_n": block_n,
            "num_warps": warps,
            "registers": int(registers.group(1)) if registers else None,
            "total": sum(whole.values()),
            "loop": sum(loop.values()),
            "loop warp instructions a weight": round(sum(loop.values()) * warps / weights, 4),
            "loop opcodes": dict(loop.most_common()),
            "opcodes": dict(whole.most_common()),
        }
    print(
        "| kernel | BLOCK_N | BLOCK_K | warps | registers | total | loop | a weight | " + " | ".join(OPS_SHOWN) + " |"
    )
    print("|---|---|---|---|---|---|---|---|" + "---|" * len(OPS_SHOWN))
    for name, k in result["kernels"].items():
        ops = " | ".join(str(k["loop opcodes"].get(op, 0)) for op in OPS_SHOWN)
        print(
            f"| {name} | {k['block_n']} | {k['block_k']} | {k['num_warps']} | {k['registers']} | {k['total']} | "
            f"{k['loop']} | {k['loop warp instructions a weight']} | {ops} |"
        )
    with open(args.out, "x") as f:
        json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
