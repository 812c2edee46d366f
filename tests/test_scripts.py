"""The contributor tools in scripts/: every one that writes output takes --out and refuses to overwrite an earlier
run before any GPU work; what they can check without a GPU, checked here."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPTS = os.path.join(ROOT, "scripts")


def _script(name: str):
    """scripts/NAME.py as a module, with scripts/ on the path as when it runs as a script."""
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    spec = importlib.util.spec_from_file_location(f"script_{name}", os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# subcommand -> the file it writes under --out (and its extra required arguments)
AB_OUTPUTS = {
    "lm-head": ("lm-head-b1.json", []),
    "step-tiles": ("step-tiles-b1.json", []),
    "tile-confirm": ("tile-confirm.json", []),
    "attention-pieces": ("attention-pieces.json", []),
    "step-gap": ("step-gap.json", []),
    "stop-check-pairs": ("stop-check-pairs.json", []),
}


def test_every_ab_subcommand_needs_out_and_refuses_an_earlier_result(tmp_path, capsys):
    ab = _script("ab")
    sub = next(a for a in ab.build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(sub.choices) == set(AB_OUTPUTS)
    for name, (filename, extra) in AB_OUTPUTS.items():
        with pytest.raises(SystemExit) as exit_:
            ab.main([name, *extra])
        assert exit_.value.code == 2 and "--out" in capsys.readouterr().err, name
        out = tmp_path / name
        out.mkdir()
        (out / filename).write_text("{}")
        with pytest.raises(SystemExit) as exit_:  # before any model is loaded: this machine has no GPU
            ab.main([name, *extra, "--out", str(out)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and f"{filename} exists" in err and len(err.splitlines()) == 1, (name, err)
        assert (out / filename).read_text() == "{}"


def test_ab_refuses_a_bad_number_in_one_line(capsys):
    ab = _script("ab")
    with pytest.raises(SystemExit) as exit_:
        ab.main(["lm-head", "--out", "x", "--batch", "0"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--batch: expected a positive integer, got '0'" in err


def test_every_step_tile_candidate_passes_the_fused_models_check():
    ab = _script("ab")
    tables = ab.tile_tables(8)
    assert len(tables) == 1 + sum(len(c) for c in ab.CANDIDATES.values())
    key, cfg = next(iter(ab.CANDIDATES.items()))
    assert tables[f"{key[0]} {key[1]}x{key[2]} {cfg[0]}"][(*key, 8)] == cfg[0]  # a batch-8 entry, the rest kept
    assert ab.check_tables() == 2 * len(tables)


def test_with_entry_replaces_only_the_entry_of_that_min_batch():
    ab = _script("ab")
    key = ("norm_linear", 10, 20)
    tiles = {key: {"block_n": 1}, (*key, 4): {"block_n": 2}}
    assert ab.with_entry(tiles, key, {"block_n": 3}, 1) == {key: {"block_n": 3}, (*key, 4): {"block_n": 2}}
    assert ab.with_entry(tiles, key, {"block_n": 3}, 4) == {key: {"block_n": 1}, (*key, 4): {"block_n": 3}}
    assert ab.with_entry(tiles, key, {"block_n": 3}, 8) == {**tiles, (*key, 8): {"block_n": 3}}


def _trace(steps: int) -> dict:
    """A profiler trace of `steps` decode steps of two kernels and the greedy choice, 10 us apart."""
    events, t = [], 0.0
    for _ in range(steps):
        for name, dur in (("norm_qkv_kernel", 3.0), ("linear_kernel", 4.0), ("greedy_choice_kernel", 1.0)):
            events.append({"cat": "kernel", "name": name, "ts": t, "dur": dur})
            t += dur + 2.0
    return {"traceEvents": events}


def test_call_timeline_analyses_a_saved_trace_into_out(tmp_path):
    trace = tmp_path / "trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump(_trace(160), f)
    timeline = _script("call_timeline")
    timeline.main(["--analyse", str(trace), "--out", str(tmp_path / "analysis")])
    result = json.loads((tmp_path / "analysis" / "step-kernels.json").read_text())
    assert result["steps analysed"] == 100 and result["kernels per step"] == 3
    assert [k["median us"] for k in result["kernels"]] == [3.0, 4.0, 1.0]
    assert [k["median gap before it us"] for k in result["kernels"]] == [2.0, 2.0, 2.0]
    assert result["step span us (first kernel start to last kernel end), median"] == 12.0
    with pytest.raises(SystemExit):  # the directory now holds a result
        timeline.main(["--analyse", str(trace), "--out", str(tmp_path / "analysis")])


LAYER = (("_norm_rows_kernel", 1.0), ("_norm_qkv_kernel", 4.0), ("_split_kernel", 2.0), ("_linear_split_kernel", 3.0))
LAYER += (("_norm_linear_kernel", 10.0), ("_linear_split_kernel", 6.0))
STEP = (("_embed_kernel", 1.0),) + 2 * LAYER + (("_norm_rows_kernel", 1.0), ("_norm_linear_kernel", 50.0))
STEP += (("_greedy_kernel", 2.0),)


def test_call_timeline_reads_each_kernels_role_bytes_and_floor(tmp_path):
    """Two layers a step: each kernel takes its role in launch order (linear_residual O then down; norm_linear
    gate/up, then the LM head after the last layer), and with the bytes and copy bandwidth of the run's
    timeline.json its bandwidth, floor and what it adds over that floor; a layer's row sums its roles."""
    events, t = [], 0.0
    for _ in range(160):
        for name, dur in STEP:
            events.append({"cat": "kernel", "name": name, "ts": t, "dur": dur})
            t += dur + 1.0  # 1 us before each kernel
    run = tmp_path / "run"
    run.mkdir()
    with gzip.open(run / "trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    qkv, o, up, down, head = (
        "norm + QKV + RoPE + cache write",
        "O + residual",
        "norm + gate/up",
        "down + residual",
        ("norm + LM head"),
    )
    nbytes = {qkv: 8e6, "attention": 1e6, o: 6e6, up: 40e6, down: 20e6, head: 200e6, "embedding": 4e3}
    (run / "timeline.json").write_text(json.dumps({"role bytes": nbytes, "copy bandwidth GB/s": 4000.0}))
    _script("call_timeline").main(["--analyse", str(run / "trace.json.gz"), "--out", str(tmp_path / "a")])
    result = json.loads((tmp_path / "a" / "step-kernels.json").read_text())
    assert result["layers"] == 2 and result["kernels per step"] == len(STEP)
    assert [k["role"] for k in result["kernels"][2:7]] == [qkv, "attention", o, up, down]
    got = {r["role"]: r for r in result["roles"]}
    assert got[head]["launches per step"] == 1 and got[o]["launches per step"] == 2
    assert got[up] == {
        "role": up, "launches per step": 2, "median us": 10.0, "adds us": 11.0, "MB": 40.0, "TB/s": 4.0,
        "floor us": 10.0, "over floor us": 1.0,
    }  # fmt: skip
    assert got[down]["floor us"] == 5.0 and got[down]["over floor us"] == 2.0
    layer = got["a layer"]  # its normalising launch in it, the head's not
    assert layer["launches per step"] == 6 and layer["adds us"] == 32.0 and layer["floor us"] == 18.75
    assert layer["over floor us"] == 13.25 and got["_norm_rows_kernel"]["launches per step"] == 3
    assert (
        "| norm + gate/up | 2 | 10.0 | 11.0 | 40.0 | 4.0 | 10.0 | 1.0 |"
        in (tmp_path / "a" / "step-table.md").read_text()
    )
    # a kernel whose bytes are not counted (a mixture of experts' own) leaves the layer without a floor, not a low one
    rows = [dict(k, role="_gate_up_kernel") if k["role"] == up else k for k in result["kernels"]]
    layer = _script("call_timeline").by_role(rows, 2, nbytes, 4000.0)[-1]
    assert layer["adds us"] == 32.0 and "floor us" not in layer and "MB" not in layer


@pytest.mark.parametrize("S, rule", [(16384 + 64, 32), (8192 + 64, 4), (96 + 64, 3), (96 + 64, 1)])
def test_attention_sweep_names_each_launch_by_its_splits_and_stages(S, rule):
    """Every candidate states its num_stages (the kernel's default is pipeline_stages, not 2): `rule` is the rule's
    own split and depth, the other depths of the rule are timed too, and no launch is timed twice."""
    from overlapdecode.fused.kernels.decode_attention import pipeline_stages

    sweep = _script("attention_sweep")
    cands = sweep.candidates(S, 64, rule)
    assert all("num_stages" in kw for _, kw in cands)
    labels = dict(cands)
    assert labels["rule"] == dict(block_n=64, num_splits=rule, num_stages=pipeline_stages(S, 64, rule))
    assert labels["direct"]["block_n"] is None  # the kernel's own choice (direct_tiles where they apply)
    own = [
        kw["num_stages"] for label, kw in cands if label == "rule" or (label.startswith("rule, ") and "stage" in label)
    ]
    assert set(own) >= set(sweep.STAGES)
    assert {"rule, 2 warps", "rule, 1 stage", "rule, keys of 32"} <= set(labels)  # many rows: more programs per SM
    launches = [tuple(sorted(kw.items())) for _, kw in cands]
    assert len(launches) == len(set(launches)) and len(labels) == len(cands)
    for label, kw in cands:
        assert "block_n" in kw  # every launch names its keys: none falls to direct_tiles unasked
        if label.startswith("splits ") and "stages" not in label:
            assert kw["num_stages"] == 2  # "splits N": 2 stages, as in results/h200/llama-attention-sweep
        assert kw["num_splits"] <= -(-S // 64)


@pytest.mark.parametrize("rows", ["64,abc", "0", ","])
def test_swap_sweep_refuses_bad_rows_before_it_needs_a_gpu(tmp_path, rows):
    with pytest.raises(SystemExit, match="--rows takes positive row counts"):
        _script("swap_sweep").main(["--out", str(tmp_path / "out"), "--rows", rows])
    assert not (tmp_path / "out").exists()


def test_the_python_scripts_take_out():
    code = (
        "import sys, contextlib, io\n"
        f"sys.path.insert(0, {SCRIPTS!r})\n"
        "import kernel_sweep, call_timeline, tp_probe, swap_sweep, attention_sweep\n"
        "for main in (kernel_sweep.parse_args, call_timeline.main, tp_probe.parse_args, swap_sweep.main,\n"
        "             attention_sweep.main):\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf), contextlib.suppress(SystemExit):\n"
        "        main(['--help'])\n"
        "    assert '--out' in buf.getvalue(), main.__module__\n"
        "    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.suppress(SystemExit):\n"
        "        main([])\n"
        "    assert 'required: --out' in err.getvalue(), (main.__module__, err.getvalue())\n"
        "print('ok')"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_every_script_gives_its_command_at_its_top_and_is_named_in_docs():
    """scripts/ holds what reproduces a figure the docs cite: each script's opening docstring or comment gives the
    command that runs it, and docs/ names it."""
    docs = "".join(open(os.path.join(ROOT, "docs", n)).read() for n in os.listdir(os.path.join(ROOT, "docs")))
    names = sorted(n for n in os.listdir(SCRIPTS) if n.endswith((".py", ".sh")))
    assert names
    for name in names:
        with open(os.path.join(SCRIPTS, name)) as f:
            top = f.read(4000)
        assert f"scripts/{name} " in top, name
        assert name in docs, name


def test_gpu_tests_sh_needs_out_and_writes_its_logs_there(tmp_path):
    script = os.path.join(SCRIPTS, "gpu_tests.sh")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(["bash", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "--out DIR is required" in done.stderr
    out = tmp_path / "gpu"
    # on this CPU machine every GPU test skips: the run shows the script's plumbing, not the GPU
    done = subprocess.run(
        [
            "bash",
            script,
            "--out",
            str(out),
            "--tests",
            "tests/gpu/test_gpu_tp_symmetric.py",
            "--sanitizer-k",
            "planted_race",
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert {p.name for p in out.iterdir()} == {"gpu.txt", "gpu-tests.log", "sanitizer.log", "junit-1.xml"}
    assert "torch" in (out / "gpu.txt").read_text()
    assert "skipped" in (out / "gpu-tests.log").read_text() and "skipped" in (out / "sanitizer.log").read_text()
    assert "created: 2/2 workers" in (out / "gpu-tests.log").read_text()  # --workers 2: two test processes
    done = subprocess.run(["bash", script, "--out", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "gpu-tests.log exists" in done.stderr
    done = subprocess.run(
        ["bash", script, "--out", str(tmp_path / "w"), "--workers", "0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "--workers takes a count >= 1" in done.stderr and not (tmp_path / "w").exists()


FAKE_GPU_TESTS = """
import os

import pytest

BESIDE_OTHERS = bool(os.environ.get("PYTEST_XDIST_WORKER"))  # one of gpu_tests.sh's --workers, not alone
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 35.00 GiB"


@pytest.mark.cuda
def test_big_alloc():
    if BESIDE_OTHERS:
        raise RuntimeError(OOM)


@pytest.mark.cuda
class TestGroup:
    @pytest.mark.parametrize("n", [1, 2])
    def test_big_in_a_class(self, n):
        if BESIDE_OTHERS:
            raise RuntimeError(OOM)


@pytest.mark.cuda
def test_small():
    pass
"""


def test_gpu_tests_sh_runs_the_tests_out_of_gpu_memory_again_alone(tmp_path):
    """With --workers, a test that ran out of GPU memory beside the other processes runs again alone and its outcome
    there counts; a file with another failure still fails, and the totals count each test's last outcome. The
    fake tests here raise the out-of-memory error only in an xdist worker (on this machine no GPU test runs)."""
    script = os.path.join(SCRIPTS, "gpu_tests.sh")
    fine = tmp_path / "test_fake_oom.py"
    fine.write_text(FAKE_GPU_TESTS)
    broken = tmp_path / "test_fake_broken.py"
    broken.write_text(FAKE_GPU_TESTS + "\n\n@pytest.mark.cuda\ndef test_wrong():\n    assert False\n")
    # pytest with xdist alone: the fake tests need no other plugin a machine may have installed; and not as one of
    # this suite's own xdist workers (-n auto), whose variables the fake tests would read as the script's
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(
        PYTHONPATH=os.pathsep.join(sys.path), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", PYTEST_ADDOPTS="-p xdist.plugin"
    )
    out = tmp_path / "gpu"
    args = ["bash", script, "--out", str(out), "--only", "tests", "--workers", "2", "--tests", f"{fine} {broken}"]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    log = (out / "gpu-tests.log").read_text()
    assert done.returncode == 1, done.stdout + done.stderr  # test_wrong
    assert f"== {fine}: 3 test(s) out of GPU memory beside other workers, run again alone" in log, log[-3000:]
    assert f"== {fine} rc=0 " in log and f"== {broken} rc=1 " in log, log[-3000:]
    assert "TestGroup::test_big_in_a_class[2] PASSED" in log  # the node id of a class's test, run alone
    assert "== totals: 8 passed, 1 failed, 0 skipped, 0 errors" in log, log[-3000:]
    failures = (out / "failures.log").read_text()  # each failure as it ended: the out-of-memory ones, test_wrong
    assert f"{broken.name}::test_wrong (call)" in failures and "assert False" in failures, failures[-3000:]
    assert failures.count("CUDA out of memory") == 6  # 3 a file beside the other worker, none alone
    # a run cut by its time limit writes no report: the totals say so rather than leave its tests out unsaid
    totals = _script("junit_outcomes").totals(
        [str(out / n) for n in ("junit-1.xml", "junit-1-alone.xml", "junit-9.xml")]
    )
    assert (
        totals
        == "4 passed, 0 failed, 0 skipped, 0 errors; 1 run(s) with no report (cut by their time limit: see the log)"
    )


def test_gpu_tests_sh_keeps_the_failures_of_a_run_its_time_limit_cuts(tmp_path):
    """A file whose run its --file-limit ends writes no junit report and no pytest summary: the failures.log still
    holds the traceback of the test that failed before the cut."""
    script = os.path.join(SCRIPTS, "gpu_tests.sh")
    cut = tmp_path / "test_fake_cut.py"
    cut.write_text(
        "import time\n\nimport pytest\n\n\n@pytest.mark.cuda\ndef test_a_fails():\n    assert 1 == 2, 'planted'\n\n\n"
        "@pytest.mark.cuda\ndef test_b_hangs():\n    time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.update(PYTHONPATH=os.pathsep.join(sys.path), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    out = tmp_path / "gpu"
    args = ["bash", script, "--out", str(out), "--only", "tests", "--file-limit", "10", "--tests", str(cut)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    log = (out / "gpu-tests.log").read_text()
    assert f"== {cut} rc=124 " in log and "planted" not in log, log[-3000:]  # cut before pytest's summary
    failures = (out / "failures.log").read_text()
    assert f"{cut.name}::test_a_fails (call)" in failures and "AssertionError: planted" in failures, failures


def test_scale_sweep_sh_takes_out_and_refuses_an_earlier_run(tmp_path):
    script = os.path.join(SCRIPTS, "scale_sweep.sh")
    done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--out DIR is required" in done.stderr
    done = subprocess.run(["bash", script, str(tmp_path / "x")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "unknown argument" in done.stderr and not (tmp_path / "x").exists()
    # the commands it runs, recorded by a python3 ahead of the real one on PATH: this machine has no GPU to run
    # the sweep on, and what is checked is where the script sends them and their output
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\necho "$(pwd) $*" >> "$SCALE_SWEEP_CALLS"\n')
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", SCALE_SWEEP_CALLS=str(calls))
    out = tmp_path / "sweep"
    done = subprocess.run(
        ["bash", script, "--out", "sweep"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    root = os.path.realpath(ROOT)
    sweep, test = calls.read_text().splitlines()
    assert sweep.startswith(f"{root} scripts/scale_sweep.py --out {out} --model llama-1b-random --dtype bfloat16 ")
    assert test.startswith(f"{root} -m pytest -m cuda tests/gpu/test_gpu_scale.py")
    assert (out / "sweep.log").read_text().endswith("sweep rc=0\n")
    assert (out / "gpu-test.log").read_text().endswith("gpu test rc=0\n")
    done = subprocess.run(["bash", script, "--out", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "sweep.log exists: choose a new --out" in done.stderr
    assert len(calls.read_text().splitlines()) == 2  # nothing ran the second time


def test_families_bench_sh_takes_out_and_refuses_an_earlier_run(tmp_path):
    script = os.path.join(SCRIPTS, "families_bench.sh")
    done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--out DIR is required" in done.stderr
    done = subprocess.run(
        ["bash", script, "--out", str(tmp_path / "x"), "--seconds", "0"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "--seconds" in done.stderr and not (tmp_path / "x").exists()
    # the commands it runs, recorded by a python3 ahead of the real one on PATH (no GPU here)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text('#!/bin/sh\necho "$*" >> "$FAMILIES_CALLS"\n')
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAMILIES_CALLS=str(calls))
    out = tmp_path / "rows"
    done = subprocess.run(["bash", script, "--out", str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = calls.read_text().splitlines()
    from overlapdecode.models.loading import EMBEDDED

    models = [line.split("--model ")[1].split()[0] for line in lines]
    assert all(m in EMBEDDED for m in models) and len(models) == 10
    assert all(
        f"--out {out}/{m.removesuffix('-random')}-fused-b1" in line and "--strategies fused" in line
        for m, line in zip(models, lines)
    )
    assert (out / "gemma3-1b.log").read_text().endswith("gemma3-1b-random rc=0\n")
    (out / "mixtral-fused-b1").mkdir()
    done = subprocess.run(
        ["bash", script, "--out", str(out), "mixtral-random"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and "mixtral-fused-b1 exists" in done.stderr
    assert len(calls.read_text().splitlines()) == 10  # nothing ran the second time


def test_dense_pieces_sweep_answers_a_bad_call_in_one_line(tmp_path):
    """scripts/dense_pieces_sweep.py: without its one argument, a usage line; without a GPU, says so; nothing
    written either way."""
    sweep = _script("dense_pieces_sweep")
    with pytest.raises(SystemExit, match="usage: dense_pieces_sweep.py OUT.json"):
        sweep.main([])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="needs a CUDA GPU"):
            sweep.main([str(tmp_path / "out.json")])
    assert not (tmp_path / "out.json").exists()


# nvdisasm's listing of a kernel, cut down: a block before the loop, the loop (label to the backward branch), a tail
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_CTAID.X ;
.L_x_0:
        /*0020*/                   LOP3.LUT R4, R2, 0xf, RZ, 0xc0, !PT ;
        /*0030*/                   PRMT R5, R4, 0x7604, R5 ;
        /*0040*/                   HMUL2.BF16_V2 R6, R5, R7 ;
        /*0050*/                   HMMA.16816.F32.BF16 R8, R12, R16, R8 ;
        /*0060*/              @!P0 BRA `(.L_x_0) ;
.L_x_1:
        /*0070*/                   STG.E [R2.64], R8 ;
        /*0080*/                   EXIT ;
"""


def test_sass_counts_reads_the_main_loop_and_refuses_an_existing_out(tmp_path, capsys):
    """scripts/sass_counts.py: the opcodes of the whole listing and of its loop (the longest block a backward branch
    closes), predicates and modifiers dropped; an --out that exists refused in one line before any compile. Its
    compile of the int4 kernels is test_kernel_compile.py's (no conversion of a byte to a float there)."""
    sass = _script("sass_counts")
    lines = SASS.splitlines()
    loop = sass.main_loop(lines)
    assert loop[0] == ".L_x_0:" and "BRA" in loop[-1]
    assert sass.opcodes(loop) == {"LOP3": 1, "PRMT": 1, "HMUL2": 1, "HMMA": 1, "BRA": 1}
    assert sass.opcodes(lines)["EXIT"] == 1 and sum(sass.opcodes(lines).values()) == 9
    kept = tmp_path / "kept.json"
    kept.write_text("mine")
    with pytest.raises(SystemExit) as exit_:
        sass.main(["--out", str(kept)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "exists: choose a new path" in err and len(err.strip().splitlines()) == 1
    assert kept.read_text() == "mine"


def test_sass_counts_takes_a_tile_of_powers_of_two_and_counts_its_weights(capsys):
    """--tile BLOCK_N:BLOCK_K:WARPS compiles another row-block tile; anything but three powers of two is one line.
    A K tile's weights double where two row blocks share it (gate/up, QKV)."""
    sass = _script("sass_counts")
    out = "/nonexistent/never-written.json"
    assert sass.parse_args(["--out", out, "--kernels", "o,down", "--tile", "128:128:8"]).tile == "128:128:8"
    assert sass.parse_args(["--out", out, "--tile", "32:256:4"]).tile == "32:256:4"  # qkv at its own HALF
    assert sass.parse_args(["--out", out]).tile is None
    for bad in ("128:128", "96:128:4", "128:128:0", "a:b:c", "128:128:4:1"):
        with pytest.raises(SystemExit) as exit_:
            sass.parse_args(["--out", out, "--tile", bad])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and err[-1].endswith(
            f"--tile: expected three powers of two BLOCK_N:BLOCK_K:WARPS, got {bad!r}"
        )
    with pytest.raises(SystemExit) as exit_:  # norm_qkv's HALF is at most half a head
        sass.parse_args(["--out", out, "--kernels", "qkv,down", "--tile", "64:128:4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1].endswith("--tile: qkv's BLOCK_N (HALF) is at most D / 2 = 32, got 64; leave qkv out")
    assert sass.parse_args(["--out", out, "--kernels", "down", "--tile", "64:128:4"]).tile == "64:128:4"
    assert sass.tile_weights("down", 32, 128) == 4096 and sass.tile_weights("gate/up", 32, 256) == 16384
    assert sass.tile_weights("qkv", 32, 256) == 16384 and sass.tile_weights("head", 128, 128) == 16384


def test_gemv_counters_answers_a_bad_keyword_in_one_line():
    """scripts/gemv_counters.py takes tile keywords as KEY=INTEGER; anything else is one line, before any GPU work."""
    script = os.path.join(SCRIPTS, "gemv_counters.py")
    for arg in ("block_k=x", "colour=3", "block_k", "programs=0", "block_n=96", "num_warps=3"):
        done = subprocess.run([sys.executable, script, arg], capture_output=True, text=True, timeout=120)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        key = arg.partition("=")[0]
        if arg in ("block_n=96", "num_warps=3"):
            assert done.stderr.strip() == f"gemv_counters.py: {arg!r}: {key} must be a power of two"
        else:
            assert done.stderr.strip() == (
                f"gemv_counters.py: {arg!r}: expected KEY=INTEGER >= 1 with KEY one of block_n, block_k, num_warps, "
                "num_stages, programs"
            )
