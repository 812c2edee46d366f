"""The persistent layer kernel's schedule (kernels/persistent_schedule.py), checked without a GPU: every wait is on
tasks of smaller index, every counter's expected count is the number of tiles that signal it, and executions by
P programs under random interleavings complete; the kernel itself in Triton's interpreter (persistent_layer_cases.py,
in a fresh process) and compiled for sm_90."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from overlapdecode.fused.kernels.persistent_schedule import (
    ATTENTION,
    DOWN,
    GATE_UP,
    NEED,
    O_PROJ,
    OP,
    QKV,
    SIGNAL,
    TICKET,
    WAIT,
    Schedule,
    build_schedule,
    check_schedule,
    live_pieces,
    make_plan,
    simulate,
)

HERE = Path(__file__).parent
# (batch, hidden, heads, kv heads, head size, MLP width, cache length): Llama-3.2-1B at batch 1, 8 and 17 (two row
# blocks), Llama-3-8B, GPT-2, SmolLM2-360M (15 heads, 5 KV heads), and odd small ones (a K range of the O
# projection straddling KV groups, an MLP width not a multiple of the tiles)
PLANS = {
    "llama-1b-b1": (1, 2048, 32, 8, 64, 8192, 512),
    "llama-1b-b8": (8, 2048, 32, 8, 64, 8192, 300),
    "llama-1b-b17": (17, 2048, 32, 8, 64, 8192, 300),
    "llama-8b": (1, 4096, 32, 8, 128, 14336, 512),
    "gpt2": (1, 768, 12, 12, 64, 3072, 300),
    "smollm2-360m": (4, 960, 15, 5, 64, 2560, 300),
    "odd": (3, 136, 6, 2, 20, 200, 40),
}
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
)


def _schedule(name: str, **tiles) -> Schedule:
    return build_schedule(make_plan(*PLANS[name], torch.bfloat16, sms=132, **tiles))


def _sources(schedule: Schedule) -> dict:
    """counter -> the task indices that may signal it (every split task of a tile: whichever finishes it)."""
    out: dict = {}
    for i, t in enumerate(schedule.table.tolist()):
        for c in range(t[SIGNAL], t[SIGNAL] + t[7]):
            out.setdefault(c, set()).add(i)
    return out


@pytest.mark.parametrize("name,small", [(n, False) for n in PLANS] + [("gpt2", True), ("odd", True)])
def test_every_wait_is_on_earlier_tasks_and_every_count_is_met(name, small):
    """Checked here from the table itself (not only by check_schedule): the phases in order, each wait's
    signallers of smaller index, and each wait's count the number of distinct tiles (tickets) that signal it.
    Small tiles (odd and GPT-2 only) make K ranges that straddle KV groups and gate/up tiles."""
    schedule = _schedule(name, **(SMALL if small else {}))
    check_schedule(schedule)
    table = schedule.table.tolist()
    ops = [t[OP] for t in table]
    assert ops == sorted(ops)  # QKV, attention, O, gate/up, down
    assert set(ops) == {QKV, ATTENTION, O_PROJ, GATE_UP, DOWN}
    sources = _sources(schedule)
    waited = 0
    for i, t in enumerate(table):
        if t[WAIT] < 0:
            assert t[OP] == QKV or t[NEED] == 0
            continue
        srcs = sources[t[WAIT]]
        assert max(srcs) < i
        tiles = {table[j][TICKET] if table[j][TICKET] >= 0 else ("task", j) for j in srcs}
        assert t[NEED] == len(tiles)
        waited += 1
    assert waited == sum(op != QKV for op in ops)  # everything after QKV waits for something


@pytest.mark.parametrize("name", ["llama-1b-b1", "llama-1b-b17", "gpt2", "smollm2-360m", "odd"])
def test_simulated_executions_complete(name):
    """P programs under random interleavings, the claim ticket or the static hand-out, rows of different lengths
    (so that some attention pieces are empty and signal nothing): every task runs once, after all of its
    inputs' tasks."""
    for tiles in ({}, SMALL) if name in ("gpt2", "odd") else ({},):
        schedule = _schedule(name, **tiles)
        plan = schedule.plan
        table = schedule.table.tolist()
        sources = _sources(schedule)
        # row b attends to about (b + 1) / B of the cache: the first rows leave some pieces empty
        spans = [(b % 3, b % 3 + 1 + (plan.cache_len - 3) * (b + 1) // plan.batch) for b in range(plan.batch)]
        assert len({live_pieces(plan, *s) for s in spans}) > 1 or plan.batch == 1 or plan.att_splits == 1
        for programs in (1, 2, 7, 132):
            for claim in ("dynamic", "static"):
                order = simulate(schedule, programs, claim, seed=programs, spans=spans)
                assert sorted(order) == list(range(len(table)))
                at = {task: k for k, task in enumerate(order)}
                for i, t in enumerate(table):
                    if t[WAIT] >= 0:  # every task of every tile it waits for ran before it (empty pieces aside)
                        live = [
                            j
                            for j in sources[t[WAIT]]
                            if table[j][OP] != ATTENTION or table[j][2] < live_pieces(plan, *spans[table[j][3]])
                        ]
                        assert at[i] > max(at[j] for j in live)


def test_the_static_hand_out_needs_every_program_resident_and_the_claim_ticket_does_not():
    schedule = _schedule("llama-1b-b1")
    with pytest.raises(RuntimeError, match="deadlock"):
        simulate(schedule, 264, "static", resident=132)
    order = simulate(schedule, 264, "dynamic", resident=1)
    assert order == sorted(order)  # one program at a time: the tasks in index order


def test_a_wait_on_a_later_task_is_refused_and_deadlocks():
    """The checks can fail: a table with the last down task moved to the front (it waits on gate/up tasks that
    now come after it) is refused by check_schedule and deadlocks a single program; a wrong count is refused."""
    schedule = _schedule("odd", **SMALL)
    bad = Schedule(
        schedule.plan, torch.cat([schedule.table[-1:], schedule.table[:-1]]), schedule.bases, schedule.n_counters
    )
    with pytest.raises(ValueError, match="not of a smaller index"):
        check_schedule(bad)
    with pytest.raises(RuntimeError, match="deadlock"):
        simulate(bad, 1)
    for field, delta in ((NEED, 1), (NEED, -1)):
        table = schedule.table.clone()
        row = next(i for i, t in enumerate(table.tolist()) if t[OP] == O_PROJ)
        table[row, field] += delta
        with pytest.raises(ValueError, match="signals of counter"):
            check_schedule(Schedule(schedule.plan, table, schedule.bases, schedule.n_counters))
    table = schedule.table.clone()
    table[0, OP] = 7
    with pytest.raises(ValueError, match="op 7"):
        check_schedule(Schedule(schedule.plan, table, schedule.bases, schedule.n_counters))


def test_plans_take_the_five_kernels_splits():
    """At the Llama-1B shape on 132 SMs: norm_qkv splits K in 2 (48 tiles, 4 x SMs), the O projection in 4 and the
    down projection in 8 (64 column blocks, 2 x SMs), the attention in 8 pieces of 64 slots at a 512-slot cache."""
    p = make_plan(*PLANS["llama-1b-b1"], torch.bfloat16, sms=132)
    assert (p.qkv_tiles, p.qkv_split, p.o_split, p.o_chunk, p.down_split, p.down_chunk, p.att_splits) == (
        48,
        2,
        4,
        512,
        8,
        1024,
        8,
    )
    with pytest.raises(ValueError, match="n_heads .* must be a multiple of n_kv"):
        make_plan(1, 64, 6, 4, 16, 128, 32, torch.float32, sms=1)
    with pytest.raises(ValueError, match="hidden must be a positive int"):
        make_plan(1, 0, 4, 4, 16, 128, 32, torch.float32, sms=1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU run tests/persistent_layer_cases.py directly")
def test_kernel_matches_the_five_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-W",
            "ignore::RuntimeWarning",
            str(HERE / "persistent_layer_cases.py"),
        ],
        env=env,
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]


@pytest.mark.parametrize("claim_next,prefetch", [(True, 0), (False, 256)])
def test_kernel_compiles_for_sm90(claim_next, prefetch):
    """At the Llama-1B constexprs in bfloat16 under PDL LATE: nothing is loaded before griddepcontrol.wait, the
    waits are one thread's acquire loads, the signals release adds, the shared memory fits an SM; with the
    weight prefetch, L2 prefetches (and none without); with and without the RMSNorm sums."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from overlapdecode.fused.kernels.persistent_layer import _persistent_layer_kernel as kernel

    types = {
        n: "*bf16"
        for n in (
            "x_ptr",
            "out_ptr",
            "h1_ptr",
            "q_ptr",
            "a_ptr",
            "m_ptr",
            "nw1_ptr",
            "nb1_ptr",
            "wqkv_ptr",
            "bqkv_ptr",
            "wo_ptr",
            "bo_ptr",
            "nw2_ptr",
            "nb2_ptr",
            "wup_ptr",
            "bup_ptr",
            "wdn_ptr",
            "bdn_ptr",
            "k_ptr",
            "v_ptr",
        )
    }
    types.update(
        {
            n: "*fp32"
            for n in (
                "inv_ptr",
                "pqkv_ptr",
                "po_ptr",
                "pdn_ptr",
                "att_acc_ptr",
                "att_m_ptr",
                "att_l_ptr",
                "ss_in_ptr",
                "ss_mid_ptr",
                "ss_out_ptr",
            )
        }
    )
    types.update({n: "*i64" for n in ("pos_ptr", "slot_ptr", "start_ptr", "len_ptr")})
    types.update({n: "*i32" for n in ("table_ptr", "cnt_ptr", "err_ptr")})
    types.update({n: "i32" for n in ("B", "S", "n_tasks", "n_counters", "pos_stride", "slot_stride", "nb_in")})
    types.update({n: "fp32" for n in ("eps", "rope_scale", "qk_scale")})
    p = make_plan(*PLANS["llama-1b-b1"], torch.bfloat16, sms=132)
    consts = dict(
        H=p.hidden,
        I=p.inter,
        HQ=p.n_heads,
        HKV=p.n_kv,
        D=p.head_dim,
        G=p.group,
        LAYER=False,
        QKV_BIAS=False,
        ROPE=True,
        O_BIAS=False,
        UP_BIAS=False,
        DOWN_BIAS=False,
        ACT=2,
        HALF=p.half,
        BK_QKV=p.qkv_block_k,
        KC_QKV=p.qkv_chunk,
        SPLIT_QKV=p.qkv_split,
        GROUP_PAD=16,
        BN_ATT=p.att_block_n,
        BD_ATT=p.att_block_d,
        SPLIT_ATT=p.att_splits,
        IEEE=False,
        BN_O=p.o_block_n,
        BK_O=p.o_block_k,
        KC_O=p.o_chunk,
        SPLIT_O=p.o_split,
        BN_UP=p.up_block_n,
        BK_UP=p.up_block_k,
        BN_DN=p.down_block_n,
        BK_DN=p.down_block_k,
        KC_DN=p.down_chunk,
        SPLIT_DN=p.down_split,
        NF=9,
        CLAIM_NEXT=claim_next,
        SPIN_LIMIT=1 << 20,
        BLOCK_M=16,
        PREFETCH=prefetch,
        LINE=64,
        IN_SUMS=64 if prefetch else 0,
        MID_SUMS=64 if prefetch else 0,
        OUT_SUMS=bool(prefetch),
        RESET=True,
        PDL=3,
    )
    signature = {n: types.get(n, "constexpr") for n in kernel.arg_names}
    assert not [n for n, t in signature.items() if t == "constexpr" and n not in consts]
    compiled = triton.compile(
        ASTSource(fn=kernel, signature=signature, constexprs=consts),
        target=GPUTarget("cuda", 90, 32),
        options=dict(num_warps=4, num_stages=3),
    )
    lines = compiled.asm["ptx"].splitlines()
    wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    assert not [line for line in lines[:wait] if "ld.global" in line or "atom." in line]
    assert any("ld.global.gpu.acquire" in line for line in lines)  # the waits
    assert any("atom.global.gpu.release.add" in line for line in lines)  # the signals
    assert compiled.metadata.shared <= 227 * 1024
    assert any("prefetch.global.L2" in line for line in lines) == bool(prefetch)
    assert any("atom.global.gpu.relaxed.add" in line for line in lines) == claim_next  # the claim ticket


@pytest.mark.skipif(torch.cuda.is_available(), reason="the A/B script runs on a GPU here")
def test_the_ab_script_refuses_a_machine_without_cuda(tmp_path):
    out = tmp_path / "ab.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, str(HERE.parent / "scripts" / "persistent_layer_ab.py"), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE.parent / "scripts" / "persistent_layer_ab.py"),
            "--out",
            str(out),
            "--shapes",
            "llama-2b",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "llama-2b" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the A/B script runs on a GPU here")
def test_the_ab_script_runs_its_code_on_cpu_in_the_interpreter(tmp_path):
    """--dry-run: tiny-llama in Triton's interpreter, eager calls for the graphs; the JSON has the rows and the
    exactness checks (bitwise equal to the plan's five kernels, in float16 and float32)."""
    import json

    out = tmp_path / "ab.json"
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "ignore::RuntimeWarning",
            str(HERE.parent / "scripts" / "persistent_layer_ab.py"),
            "--out",
            str(out),
            "--dry-run",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and [(r["variant"], r["batch"]) for r in result["rows"]] == [("dynamic", 3)]
    assert [e["dtype"] for e in result["exactness"]] == ["float16", "float32"] and not result["skipped"]
    for e in result["exactness"]:
        assert e["persistent_vs_plan_kernels"]["equal"] and e["cache_vs_plan_kernels"]["equal"], e
        assert e["persistent_vs_torch"]["max_abs"] < 1e-2
    assert "speedup" in proc.stdout
