"""The benchmark end to end on tiny-gpt2 (CPU): JSON schema, every requested row, report and plots.

A benchmark is never a timed test: nothing here asserts a speed, only that the figures exist and are sane.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from overlapdecode.bench.report.figures import fit_exponent, row_decode_ms
from overlapdecode.cli import main

STRATEGIES = ["baseline", "kv", "static", "interleaved", "nocheck"]
PEERS = ["hf-dynamic", "hf-static", "hf-compiled"]
LENGTHS = [8, 24]


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bench"))
    rc = main(
        [
            "bench",
            "--model",
            "tiny-gpt2",
            "--strategies",
            ",".join(STRATEGIES),
            "--peers",
            ",".join(PEERS),
            "--lengths",
            ",".join(map(str, LENGTHS)),
            "--batch",
            "1,2",
            "--prompt-len",
            "8",
            "--workloads",
            "fixed,eos",
            "--warmup",
            "0",
            "--repeats",
            "2",
            "--out",
            out,
            "--device",
            "cpu",
        ]
    )
    assert rc == 0
    return out


def test_results_json_schema_and_rows(bench_dir):
    with open(os.path.join(bench_dir, "results.json")) as f:
        res = json.load(f)
    assert res["commands"][0].startswith("overlapdecode bench")
    env = res["environment"]
    for key in ("torch", "transformers", "git_commit", "gpu", "python"):
        assert key in env
    rows = res["rows"]
    fixed = {(r["strategy"], r["batch"], r["max_new_tokens"]) for r in rows if r["workload"] == "fixed"}
    assert fixed == {(s, b, n) for s in STRATEGIES + PEERS for b in (1, 2) for n in LENGTHS}
    for r in rows:
        assert "error" not in r, r
        assert r["allocator"] == "default" and r["dtype"] == "float32" and r["model"] == "tiny-gpt2"
        if r["workload"] in ("fixed", "eos"):
            assert r["seq_s"] > 0 and r["ms_per_token"] > 0 and r["tokens_per_s"] > 0 and r["ttft_ms"] > 0
            assert len(r["seq_s_all"]) == 2 and min(r["seq_s_all"]) <= r["seq_s"] <= max(r["seq_s_all"])
            assert r["peak_reserved_mb"] is None  # no CUDA: not faked
            # the decode step with the prefill left out, from this row's own call and TTFT; no toll and no kernel
            # count without CUDA (no measured bandwidth, no profiled kernels)
            assert r["layers"] == 2 and r["decode_ms_per_step"] == pytest.approx(row_decode_ms(r))
            assert r["toll_us_per_layer"] is None and r.get("kernels_per_step") is None
        if r["workload"] == "fixed":
            assert r["new_tokens"] == r["max_new_tokens"]
    eos = [r for r in rows if r["workload"] == "eos"]
    assert {(r["strategy"], r["batch"]) for r in eos} == {(s, b) for s in STRATEGIES + PEERS for b in (1, 2)}
    for r in eos:  # the forced EOS really stopped every row where asked, for every strategy and peer
        assert r["new_tokens"] == max(r["eos_steps"]) + 1
    busy = [r for r in rows if r["workload"] == "profile"]
    assert len(busy) == len(STRATEGIES + PEERS) * 2
    assert all(r["busy"]["available"] is False for r in busy)


def test_report_and_plots_written_and_rebuilt(bench_dir):
    for name in ("report.md", "time_vs_length.png", "speedup.png", "compile.png"):
        assert os.path.getsize(os.path.join(bench_dir, name)) > 0, name
    assert not os.path.exists(os.path.join(bench_dir, "busy.png"))  # CPU: no empty busy chart
    os.remove(os.path.join(bench_dir, "report.md"))
    assert main(["report", bench_dir]) == 0
    text = open(os.path.join(bench_dir, "report.md")).read()
    assert "## The progression, checked against this run" in text
    assert "| interleaved |" in text and "| hf-dynamic |" in text
    assert "EOS forced per row" in text
    assert "This run is on CPU" in text and "not stated: measured on CPU" in text
    assert "First-call overhead (compile" in text and "first call s" not in text
    assert "Hugging Face peers ran transformers" in text
    # the report talks about the code and its measurements only
    assert not re.search(r"\b(brief|session|round)s?\b", text, flags=re.I), re.findall(
        r".*\b(?:brief|session|round).*", text
    )


def test_fit_exponent():
    assert fit_exponent([(10, 1.0), (20, 2.0), (40, 4.0)]) == pytest.approx(1.0)
    assert fit_exponent([(10, 1.0), (20, 4.0), (40, 16.0)]) == pytest.approx(2.0)
    assert fit_exponent([(10, 1.0)]) is None


@pytest.mark.parametrize(
    "argv, words",
    [
        (["bench", "--lengths", "10,x"], "--lengths takes comma-separated integers"),
        (["bench", "--lengths", "0"], "--lengths values must be >= 1"),
        (["bench", "--strategies", "fast"], "--strategies: unknown strategy 'fast'"),
        (
            ["bench", "--strategies", "kv:2"],
            "takes K >= 1, and only for the strategies that read the stop flag late: interleaved, fused and deferred",
        ),
        (["bench", "--peers", "vllm"], "--peers: unknown vllm"),
        (["bench", "--dtype", "float8"], "--dtype: dtype must be one of"),
        (["bench", "--allocator", "expandable", "--device", "cpu"], "--allocator expandable needs CUDA"),
        (["bench", "--dtype-batch", "float32"], "--dtype-batch takes dtype:batch pairs"),
        (["bench", "--lengths", "1000", "--device", "cpu"], "exceeds tiny-gpt2's 256 positions"),
        (["bench", "--gpus", "0"], "--gpus needs CUDA devices"),
        (["bench", "--gpus", "0,0", "--device", "cpu"], "--gpus and --device exclude each other"),
        (["report", "/nonexistent/dir"], "results.json not found"),
        (["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,2", "--strategy", "warp"], "unknown strategy 'warp'"),
        (["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,5000"], "outside the vocabulary"),
        (["profile", "--strategies", "nope"], "--strategies: unknown strategy 'nope'"),
    ],
)
def test_bad_flags_get_one_line(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_interrupted_run_is_kept_and_gathered(bench_dir, tmp_path):
    """A run stopped early (rows.jsonl, no results.json) is turned into a report marked interrupted."""
    import shutil

    d = tmp_path / "cut"
    d.mkdir()
    shutil.copy(os.path.join(bench_dir, "config.json"), d / "config.json")
    res = json.load(open(os.path.join(bench_dir, "results.json")))
    with open(d / "rows.jsonl", "w") as f:
        f.write(json.dumps({"meta": res["environment"]}) + "\n")
        for r in res["rows"][:5]:
            f.write(json.dumps(r) + "\n")
    assert main(["report", str(d)]) == 2  # says how to keep the rows, does not guess
    assert main(["report", str(d), "--interrupted", "overlapdecode bench --lengths 8,24"]) == 0
    kept = json.load(open(d / "results.json"))
    assert kept["interrupted"] and len(kept["rows"]) == 5 and kept["environment"] == res["environment"]
    assert "Interrupted run" in open(d / "report.md").read()
    md = tmp_path / "ALL.md"
    assert main(["report", bench_dir, str(d), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert text.count("### The progression, checked") == 2 and "(cut/time_vs_length.png)" in text


def test_units_split_over_gpus_and_merged(tmp_path):
    """--gpus: one worker per allocator x dtype:batch unit, pinned by CUDA_VISIBLE_DEVICES, rows merged.

    On CPU the pinning is inert, but the split, the scheduling over two slots and the merge are the real ones."""
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.runner import run_bench, work_units

    cfg = BenchConfig(
        model="tiny-gpt2",
        strategies=("kv", "static"),  # no compile: each unit's worker would compile its own
        peers=("hf-dynamic",),
        lengths=(6,),
        pairs=("float32:1", "float32:2", "bfloat16:1"),
        prompt_len=4,
        warmup=0,
        repeats=1,
        profile=False,
        device="cpu",
        gpus=(0, 1),
    )
    units = work_units(cfg)
    assert [label for label, _ in units] == ["default-float32-b1", "default-float32-b2", "default-bfloat16-b1"]
    assert all(u.gpus == () and len(u.pairs) == 1 for _, u in units)
    assert [label for label, _ in work_units(BenchConfig(allocators=("default", "expandable")))] == [
        "default",
        "expandable",
    ]
    res = run_bench(cfg, str(tmp_path), "overlapdecode bench --gpus 0,1", progress=False)
    got = sorted((r["dtype"], r["batch"], r["strategy"], r["visible_devices"]) for r in res["rows"])
    want = [
        (d, b, s) for d, b in (("bfloat16", 1), ("float32", 1), ("float32", 2)) for s in ("hf-dynamic", "kv", "static")
    ]
    assert [g[:3] for g in got] == want and all("error" not in r for r in res["rows"])
    assert {g[3] for g in got} <= {"0", "1"} and res["environment"]["gpus_used"]
    assert res["config"]["gpus"] == [0, 1]
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:  # each GPU's worker ran on its own half of the cores
        halves = [set(map(int, s.split(","))) for s in res["environment"]["cpu_shares"]]
        assert len(halves) == 2 and not halves[0] & halves[1] and halves[0] | halves[1] <= set(cores)
    left = sorted(os.listdir(tmp_path))
    assert not [f for f in left if f.startswith("rows") or f.startswith("config-")], left
    assert {f"worker-{label}.log" for label, _ in units} <= set(left) and "report.md" in left


@pytest.mark.parametrize("argv", [["bench", "--bogus"], ["bench", "--repeats", "x"], ["frobnicate"], []])
def test_argparse_errors_are_one_line_too(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "error:" in err, err


def _claim_row(
    strategy, n, seq_s, allocator="default", reserved=None, allocated=None, spread=0.01, calls=3, device="cuda:0"
):
    frag = None if reserved is None else (reserved - allocated) / reserved
    times = [seq_s * (1 - spread / 2), seq_s, seq_s * (1 + spread / 2)][:calls] if calls > 1 else [seq_s]
    return dict(
        workload="fixed",
        allocator=allocator,
        dtype="float32",
        batch=1,
        strategy=strategy,
        max_new_tokens=n,
        seq_s=seq_s,
        seq_s_all=times,
        ms_per_token=seq_s * 1e3 / n,
        peak_reserved_mb=reserved,
        peak_allocated_mb=allocated,
        fragmentation=frag,
        device=device,
        first_call_s=seq_s * 2,
    )


def _claim_rows(**kw):
    rows = [_claim_row("baseline", n, (n / 100) ** 2, **kw) for n in (100, 200, 400)]
    rows += [_claim_row("kv", n, n / 100, **kw) for n in (100, 200, 400)]
    rows += [
        _claim_row("interleaved", 400, 0.5, **kw),
        _claim_row("nocheck", 400, 0.49, **kw),
        _claim_row("compiled", 400, 0.7, **kw),
    ]
    return rows


def test_claims_are_stated_where_the_figures_carry_them():
    """GPU rows, 3 calls each, 1% spread: exponents, ratios and fragmentation are stated."""
    from overlapdecode.bench.report.claims import claims

    rows = _claim_rows()
    rows += [_claim_row("kv", 400, 4.0, "default", 800, 600), _claim_row("kv", 400, 4.0, "expandable", 640, 600)]
    rows += [_claim_row(name, 400, t) for name, t in (("static", 3.0), ("hf-static", 2.0), ("hf-compiled", 0.8))]
    text = "\n".join(claims({"rows": rows}))
    assert "static vs dynamic cache, no compile (float32, batch 1, 400 tokens): static/kv time = 0.75 (< 1" in text
    assert "compile (float32, batch 1, 400 tokens): compiled is 4.29x static" in text
    assert "Hugging Face auto-compile (float32, batch 1, 400 tokens): hf-compiled is 2.50x hf-static" in text
    assert "- O(N^2) vs O(N) (float32, batch 1): time-vs-N exponent over 100-400 tokens: baseline 2.00" in text
    assert "interleaved (float32, batch 1, 400 tokens, 1.250 ms/token) vs baseline: 32.00x baseline." in text
    assert "vs compiled: 1.40x compiled (sync check)." in text
    assert "+2.0% vs the no-check upper bound." in text and "not stated" not in text
    assert "default: reserved 800 MB vs allocated 600 MB (25.0%); expandable: reserved 640 MB" in text


def test_claims_are_not_stated_from_noise_few_calls_or_a_cpu():
    from overlapdecode.bench.report.claims import claims

    noisy = "\n".join(claims({"rows": _claim_rows(spread=0.9)}))  # calls 90% apart: 1.40x may be noise
    assert "vs compiled: not stated: the difference (+40.0%) is within the spread of the timed calls (90%)" in noisy
    # exponents 2.0 and 1.0, but calls 90% apart at 100 and 400 tokens allow 1.30-2.70 and 0.30-1.70
    assert "O(N^2) vs O(N) (float32, batch 1): not stated: the exponents' ranges overlap" in noisy
    assert "+2.0% vs the no-check upper bound, within the spread of the timed calls (90%)" in noisy
    tight = "\n".join(claims({"rows": _claim_rows(spread=0.1)}))  # 1.93-2.07 vs 0.93-1.07: stated
    assert "O(N^2) vs O(N) (float32, batch 1): time-vs-N exponent" in tight
    few = "\n".join(claims({"rows": _claim_rows(calls=2)}))
    assert "vs baseline: not stated: 2 timed call(s) per figure, fewer than the 3 needed" in few
    cpu = "\n".join(claims({"rows": _claim_rows(device="cpu")}))
    assert "vs compiled: not stated: measured on CPU, and the claim is about a GPU (1.40x compiled" in cpu
    assert "O(N^2) vs O(N) (float32, batch 1): time-vs-N" in cpu  # not a GPU claim: stated from CPU figures


def test_plots_tick_at_the_lengths_and_show_the_spread(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from overlapdecode.bench.report.plots import _err, _log_ticks_at, plots

    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.plot([16, 48], [1, 2])
    _log_ticks_at(ax, [16, 48])
    assert list(ax.get_xticks()) == [16, 48] and [t.get_text() for t in ax.get_xticklabels()] == ["16", "48"]
    plt.close(fig)
    row = _claim_row("kv", 16, 1.0, spread=0.2)
    assert _err([row]) == [[pytest.approx(0.1)], [pytest.approx(0.1)]]
    profiled = [
        dict(
            workload="profile",
            allocator="default",
            dtype="float32",
            batch=1,
            strategy="kv",
            max_new_tokens=100,
            busy=dict(available=False, reason="no CUDA"),
        )
    ]
    names = [p for p, _ in plots({"rows": _claim_rows(device="cpu") + profiled}, str(tmp_path))]
    assert names == ["time_vs_length.png", "speedup.png", "compile.png"]  # no memory, no busy chart on CPU
    profiled[0]["busy"] = dict(available=True, busy_fraction=0.5)
    assert "busy.png" in [p for p, _ in plots({"rows": _claim_rows() + profiled}, str(tmp_path))]


def test_latest_rows_measured_beats_not_run():
    """An --append run's measured row replaces the earlier "not run" one; a "not run" never hides a figure."""
    from overlapdecode.bench.report.results import latest_rows

    def row(strategy, n, **kw):
        return dict(
            model="m",
            allocator="default",
            dtype="float32",
            batch=1,
            prompt_len=32,
            workload="eos",
            max_new_tokens=n,
            strategy=strategy,
            **kw,
        )

    rows = [
        row("kv", 200, error="not run: time budget of 490 s spent"),
        row("static", 200, seq_s=1.0),
        row("kv", 400, seq_s=2.0),
        row("kv", 200, seq_s=0.5),
        row("static", 200, error="not run: budget"),
        row("kv", 400, seq_s=3.0),
    ]
    got = latest_rows(rows)
    assert [(r["strategy"], r["max_new_tokens"], r.get("seq_s")) for r in got] == [
        ("kv", 200, 0.5),
        ("static", 200, 1.0),
        ("kv", 400, 3.0),
    ]


def test_mbu_is_weight_bytes_over_bandwidth_over_time():
    from overlapdecode.bench.report.figures import mbu

    row = dict(weight_bytes=2.0e9, bandwidth_gbs=4000.0, ms_per_token=1.0)  # 2 GB at 4 TB/s = 0.5 ms floor
    assert mbu(row) == pytest.approx(0.5)
    assert mbu(dict(row, bandwidth_gbs=None)) is None  # CPU: no figure, not a made-up one


def test_weight_bytes_counts_each_storage_once():
    """After the fused re-layout q/k/v (and gate/up) are views of one tensor each: the bytes a step reads
    must still be counted once, not once per view."""
    import overlapdecode as od
    from overlapdecode.facts import weight_bytes

    model = od.load_model("tiny-llama", device="cpu")
    before = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes(model) == before
    od.Decoder(model).fused_model()  # re-lays the weights out; the parameters become views
    assert weight_bytes(model) == before


def test_tp_probe_results_are_gathered_with_their_command(tmp_path):
    """A directory of scripts/tp_probe.py JSON (no bench results) goes into the gathered markdown as tables
    made from its JSON: the big model's ms/token and MBU, the speed ratio, the token equality."""
    d = tmp_path / "tp"
    d.mkdir()
    env = {
        "argv": ["scripts/tp_probe.py", "x.json", "--parts", "equal,speed,big"],
        "commit": "abc1234",
        "torch": "2.11",
        "gpu": "NVIDIA H200",
        "nccl": "2.28",
    }
    run = {"strategy": "fused", "ms_per_token": 4.0, "decode_ms_per_token": 3.9, "weight_bytes_per_gpu": 16e9}
    parts = {
        "equal": {
            "model": "m1",
            "dtype": "float32",
            "new_tokens": 200,
            "fused": {"equal_tp1": True, "ranks_agree": True},
        },
        "speed": {
            "model": "m8",
            "dtype": "bfloat16",
            "batch": 1,
            "tp1": run,
            "tp2": dict(run, ms_per_token=3.0, weight_bytes_per_gpu=8e9),
            "ratio_ms_per_token": 0.75,
            "ratio_decode_ms_per_token": 0.74,
        },
        "big": {
            "model": "m70",
            "dtype": "bfloat16",
            "batch": 1,
            "tp": 2,
            "strategy": "fused",
            "new_tokens": 200,
            "ms_per_token": 24.28,
            "weight_bytes_per_gpu": 72.66e9,
            "mbu_ms_per_token": 0.6052,
            "mbu_vs_copy_ms_per_token": 0.689,
            "first_call_s": 60.8,
        },
    }
    (d / "tp.json").write_text(json.dumps({"env": env, "parts": parts}))
    md = tmp_path / "ALL.md"
    assert main(["report", str(d), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| fused | 2 | 200 | 24.28 | 72.7 | 61% | 69% | 61 |" in text
    assert "tp=2 / tp=1 = 0.75 (decode 0.74)" in text and "| tp2 | fused | 3.000 |" in text
    assert "| fused | True | True |" in text and "commit abc1234" in text


def test_a_hub_name_that_cannot_be_looked_up_is_one_line_at_once(tmp_path, capsys):
    """`bench --model no-such-model` started its workers, which ended after ~33 s (the hub client's retries
    while offline) in traceback frames, and left a directory that could neither be reused nor reported."""
    import time

    start = time.perf_counter()
    assert main(["bench", "--model", "no-such-model", "--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    assert time.perf_counter() - start < 15  # offline: the hub is found unreachable at once; online: a 404
    err = capsys.readouterr().err.strip()
    assert err.startswith("overlapdecode bench: error: --model no-such-model: cannot load this hub name (")
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_is_named_without_waiting_for_retries(monkeypatch):
    import overlapdecode.models.loading as models

    asked = []
    monkeypatch.setattr(models, "_hub_unreachable", lambda: "huggingface.co: Name or service not known")
    monkeypatch.setattr(
        models.AutoConfig,
        "from_pretrained",
        lambda *a, **k: asked.append(k) or (_ for _ in ()).throw(OSError("not in the cache")),
    )
    with pytest.raises(
        OSError,
        match="nobody/x is neither a directory nor in the local Hugging Face cache, and the "
        r"hub cannot be reached to look it up \(huggingface.co: Name or service",
    ):
        models.load_model("nobody/x", device="cpu")
    assert asked == [dict(local_files_only=True)]  # the network lookup (and its ~30 s of retries) never started


def test_a_failed_worker_is_one_line_and_leaves_the_directory_reusable(tmp_path, capsys):
    """A model whose config loads but whose weights do not: the worker fails after starting. One line (its
    exception and its log's path), and --out holds no rows or config of the run, so that it takes a new one."""
    import overlapdecode as od

    od.load_model("tiny-gpt2", device="cpu").save_pretrained(tmp_path / "broken")
    (tmp_path / "broken" / "model.safetensors").write_bytes(b"not a safetensors file")
    capsys.readouterr()  # save_pretrained's progress bar
    out = tmp_path / "out"
    flags = [
        "--strategies",
        "kv",
        "--peers",
        "none",
        "--lengths",
        "4",
        "--prompt-len",
        "4",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--no-profile",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    assert main(["bench", "--model", str(tmp_path / "broken")] + flags) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and 'File "' not in err, err
    assert "the default worker failed (exit 1): " in err and f"(its log: {out / 'worker-default.log'})" in err
    assert err.endswith(f"nothing was measured; {out} can take a new run")
    assert sorted(os.listdir(out)) == ["overlapdecode-files.json", "worker-default.log"]
    assert main(["bench", "--model", "tiny-gpt2"] + flags) == 0  # the same --out takes the next run
    assert os.path.exists(out / "results.json")


@pytest.mark.parametrize("whom", ["process group", "parent only", "SIGTERM"])
def test_ctrl_c_is_one_line_and_keeps_what_was_measured(whom, tmp_path):
    """Ctrl-C (SIGINT to the terminal's process group, or to the bench process alone, whose workers then
    go on unless it stops them) printed a 16-20 frame traceback, and the interrupted report gave "a time
    limit" as its reason. Now: one line, the rows measured so far in results.json and the report, marked
    interrupted by Ctrl-C, and a directory that takes an --append run. SIGTERM to the bench alone (`timeout`, a
    job scheduler) ended it at once, its measured rows never in results.json: now it ends the run as Ctrl-C does,
    exit status 143, and no worker outlives it."""
    import signal
    import subprocess
    import sys
    import time

    from overlapdecode.bench.config import config_from_json
    from overlapdecode.bench.runner import _check_out_dir

    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmd = [
        sys.executable,
        "-m",
        "overlapdecode",
        "bench",
        "--model",
        "tiny-gpt2",
        "--strategies",
        "baseline,kv",
        "--peers",
        "none",
        "--lengths",
        "8,16,32,64,96,128,160,192",
        "--batch",
        "1,2",
        "--no-profile",
        "--device",
        "cpu",
        "--out",
        str(out),
    ]
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # as a terminal's foreground job has it: a test run started in the background (a non-interactive shell's
        # `&`) hands its children SIGINT ignored, and the bench would never see the Ctrl-C
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    rows = out / "rows-default.jsonl"
    deadline = time.monotonic() + 240
    while not (rows.exists() and len(rows.read_text().splitlines()) >= 2):  # the meta line and a measured row
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    if whom == "process group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM if whom == "SIGTERM" else signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    err = stderr.strip()
    reason, by, status = ("SIGTERM", " by SIGTERM", 143) if whom == "SIGTERM" else ("Ctrl-C", "", 130)
    assert proc.returncode == status, (stdout, stderr)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"overlapdecode bench: interrupted{by}; the ") and "measured rows are kept in" in err, err
    res = json.load(open(out / "results.json"))
    assert res["interrupted"] is True and res["interrupted_reason"] == reason
    assert 1 <= len(res["rows"]) < 2 * 8 * 2 and all("error" not in r for r in res["rows"])
    report = (out / "report.md").read_text()
    assert f"stopped before the end ({reason})" in report and "time limit" not in report
    with pytest.raises(ProcessLookupError):  # no worker left in the bench's process group
        os.killpg(proc.pid, 0)
    assert not [f for f in os.listdir(out) if f.startswith("rows") or f.startswith("config-")]
    assert _check_out_dir(config_from_json((out / "config.json").read_text()), str(out), append=True)


def test_the_terminal_table_shows_the_spread_and_warns_where_it_hides_the_effect():
    """On a busy host the table printed "compiled 36.09x" from calls spread 57-248%, with no spread column.
    Now each row has its spread, and a speed-up inside the spread (the row's or the baseline's) is flagged."""
    from rich.console import Console

    from overlapdecode.cli.bench import summary_tables

    rows = [
        _claim_row("baseline", 400, 1.0, spread=0.1),
        _claim_row("compiled", 400, 0.8, spread=0.5),
        _claim_row("interleaved", 400, 0.1, spread=0.05),
        _claim_row("kv", 400, 0.9, calls=1),
    ]
    for r in rows:
        r.update(tokens_per_s=400 / r["seq_s"], ttft_ms=1.0)
    ((table, warnings),) = summary_tables(rows, "m")
    console = Console(record=True, width=200)
    console.print(table)
    lines = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in console.export_text().replace("┃", "│").splitlines()
        if line.count("│") > 3
    }
    assert lines["strategy"][1:3] == ["vs baseline", "spread"]
    assert lines["baseline"][1:3] == ["1.00x", "10%"]
    assert lines["compiled"][1:3] == ["1.25x !", "50%"]  # 25% faster, calls 50% apart: not resolved
    assert lines["interleaved"][1:3] == ["10.00x", "5%"]
    assert lines["kv"][2] == "-"  # one timed call: no spread to show
    assert warnings == [
        "! compiled: 1.25x the baseline is within the spread of its own timed calls (50%): not resolved on this run"
    ]


def test_hf_compiled_on_cpu_is_labelled_eager(bench_dir):
    """Hugging Face compiles only on CUDA: on CPU `hf-compiled` runs like `hf-static`, and the table and the
    report's rows said `hf-compiled` all the same."""
    from rich.console import Console

    from overlapdecode.cli.bench import summary_tables

    res = json.load(open(os.path.join(bench_dir, "results.json")))
    assert {r["compiled"] for r in res["rows"] if r["strategy"] == "hf-compiled"} == {False}
    console = Console(record=True, width=200)
    for table, _ in summary_tables(res["rows"], "tiny-gpt2"):
        console.print(table)
    shown = console.export_text()
    assert shown.count("hf-compiled (eager on CPU)") == 2 and shown.count("hf-compiled") == 2  # batch 1 and 2
    report = open(os.path.join(bench_dir, "report.md")).read()
    rows = [line for line in report.splitlines() if line.startswith("|") and "hf-compiled" in line]
    assert rows and all("| hf-compiled (eager on CPU) |" in line for line in rows), rows


def _config_of(argv, tmp_path, monkeypatch=None, cuda=False):
    import torch

    import overlapdecode.cli.bench_flags as bench_flags
    from overlapdecode.cli import build_parser

    if cuda:  # the choice a CUDA machine makes; nothing runs
        monkeypatch.setattr(bench_flags, "_default_device", lambda: torch.device("cuda"))
    return bench_flags.bench_config(build_parser().parse_args(["bench"] + argv + ["--out", str(tmp_path / "o")]))


def test_the_main_job_on_cuda_shows_fused_and_the_baselines_growth(tmp_path, monkeypatch):
    """`overlapdecode bench` on a CUDA machine measured neither `fused` nor lengths where the baseline's
    O(N^2) growth shows (batch 1, 64 and 96 tokens: the report said 'not stated'). On CPU it stays as it was."""
    cpu = _config_of([], tmp_path)
    assert (cpu.model, cpu.lengths, cpu.batches, cpu.dtypes) == ("tiny-gpt2", (16, 48), (1,), ("float32",))
    assert cpu.strategies == ("baseline", "kv", "static", "compiled", "interleaved")
    main_job = _config_of([], tmp_path, monkeypatch, cuda=True)
    assert (main_job.model, main_job.lengths, main_job.pairs) == (
        "gpt2-random",
        (48, 192),
        ("float32:16", "bfloat16:1"),
    )
    assert main_job.strategies == ("baseline", "kv", "static", "compiled", "interleaved", "fused")
    assert main_job.peers == ("hf-dynamic", "hf-static", "hf-compiled") and main_job.prompt_len == 32
    # within about 4 minutes on an H200: no profile workload (`overlapdecode profile` makes it)
    from overlapdecode.bench.config import plan

    assert not main_job.profile and {row[2] for row in plan(main_job)[1]} == {"fixed"}
    assert len(plan(main_job)[1]) == 2 * 9 + 2
    other = _config_of(["--model", "tiny-llama"], tmp_path, monkeypatch, cuda=True)  # a Llama: fused applies
    assert (other.lengths, other.batches, other.strategies[-1]) == ((64, 96), (1,), "fused")
    assert other.profile  # any other run profiles what it measures
    asked = _config_of(["--strategies", "kv", "--batch", "2", "--lengths", "8"], tmp_path, monkeypatch, cuda=True)
    assert (asked.strategies, asked.batches, asked.lengths) == (("kv",), (2,), (8,))
    assert [row[-1] for row in plan(asked)[1] if row[2] == "profile"] == [
        "kv",
        "hf-dynamic",
        "hf-static",
        "hf-compiled",
    ]


def test_the_main_job_on_cuda_adds_the_bfloat16_rows_fused_is_built_for(tmp_path, monkeypatch):
    """On an H200 the main job's one configuration (float32, batch 16) showed `fused` behind `interleaved`: a
    newcomer's first table said the best path is no faster. Beside it now, bfloat16 at batch 1, `fused` and
    `interleaved` alone at the longest length: 2 rows, each a compile of its own, within the run's 4 minutes."""
    from overlapdecode.bench.config import config_from_json, config_json, plan

    assert not _config_of([], tmp_path).narrowed  # CPU: as it was
    main_job = _config_of([], tmp_path, monkeypatch, cuda=True)
    assert main_job.narrowed == (("bfloat16:1", ("interleaved", "fused"), (192,)),)
    rows = plan(main_job)[1]
    assert [r for r in rows if r[0] == "bfloat16"] == [
        ("bfloat16", 1, "fixed", 192, "interleaved"),
        ("bfloat16", 1, "fixed", 192, "fused"),
    ]
    assert rows[-2:] == [r for r in rows if r[0] == "bfloat16"]  # after every float32 row: one model load each
    assert {(r[1], r[3], r[4]) for r in rows if r[0] == "float32"} == {
        (16, n, s) for n in (48, 192) for s in main_job.strategies + main_job.peers
    }
    assert config_from_json(config_json(main_job)) == main_job  # as the worker reads it back
    for argv in (["--batch", "8"], ["--dtype", "float32"], ["--dtype-batch", "float32:16"], ["--strategies", "kv"]):
        asked = _config_of(argv, tmp_path, monkeypatch, cuda=True)  # a run that names its configuration
        assert not asked.narrowed and not [r for r in plan(asked)[1] if r[0] == "bfloat16"], argv
    longer = _config_of(["--lengths", "64,256"], tmp_path, monkeypatch, cuda=True)
    assert longer.narrowed == (("bfloat16:1", ("interleaved", "fused"), (256,)),)
    assert not _config_of(["--model", "tiny-llama"], tmp_path, monkeypatch, cuda=True).narrowed


def test_the_cuda_default_leaves_fused_out_where_the_family_has_none(tmp_path, monkeypatch):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

    small = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    GPTNeoXForCausalLM(GPTNeoXConfig(**small)).save_pretrained(tmp_path / "neox")  # a family fused has not
    # Llama whose config marks a sliding layer (its modeling has no window for it)
    LlamaForCausalLM(LlamaConfig(**small, layer_types=["sliding_attention"])).save_pretrained(tmp_path / "sliding")
    for name in ("neox", "sliding"):
        cfg = _config_of(["--model", str(tmp_path / name)], tmp_path, monkeypatch, cuda=True)
        assert cfg.strategies == ("baseline", "kv", "static", "compiled", "interleaved"), name


def test_a_run_that_stops_after_measuring_keeps_its_rows_with_the_reason(bench_dir, tmp_path):
    """What a failed worker (or Ctrl-C) leaves: rows files and the units' config files. The measured rows go
    into results.json and the report, marked interrupted with the reason; nothing of the run is left over."""
    import shutil

    from overlapdecode.bench.runner import _keep_or_clear

    d = tmp_path / "stopped"
    d.mkdir()
    shutil.copy(os.path.join(bench_dir, "config.json"), d / "config.json")
    shutil.copy(os.path.join(bench_dir, "config.json"), d / "config-default.json")  # its worker never removed it
    res = json.load(open(os.path.join(bench_dir, "results.json")))
    with open(d / "rows-default.jsonl", "w") as f:
        f.write(json.dumps({"meta": res["environment"]}) + "\n")
        for r in res["rows"][:3]:
            f.write(json.dumps(r) + "\n")
        f.write('{"strategy": "kv", "cut sho')  # the worker died mid-line
    said = _keep_or_clear(str(d), "overlapdecode bench", None, "a worker failed: RuntimeError: boom")
    assert said == (
        f"the 3 measured rows are kept in {d / 'results.json'} and {d / 'report.md'} (add to them with --append)"
    )
    kept = json.load(open(d / "results.json"))
    assert kept["interrupted"] and kept["interrupted_reason"] == "a worker failed: RuntimeError: boom"
    assert "stopped before the end (a worker failed: RuntimeError: boom)" in (d / "report.md").read_text()
    assert not [f for f in os.listdir(d) if f.startswith("rows") or f.startswith("config-")]


# --out: nothing a user owns is lost (bench/report/outdir.py)

QUICK = ["--strategies", "kv", "--peers", "none", "--lengths", "4", "--prompt-len", "4", "--repeats", "1"]
QUICK += ["--warmup", "0", "--no-profile", "--device", "cpu"]
QUICK_PROFILE = ["--strategies", "kv", "--new-tokens", "3", "--prompt-len", "4", "--device", "cpu"]


def _files(d) -> dict:
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def _refused(capsys, *words) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and all(w in err for w in words), err
    return err


@pytest.fixture
def no_work(monkeypatch):
    """Any measurement or model load fails the test: a refused --out is refused before any work."""
    import overlapdecode as od
    import overlapdecode.bench.profile as profile
    import overlapdecode.bench.runner as runner

    def work(*a, **k):
        raise AssertionError("work started")

    monkeypatch.setattr(runner, "_run_units", work)
    monkeypatch.setattr(od, "load_model", work)
    monkeypatch.setattr(profile.od, "load_model", work)


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_a_saved_model_directory_as_out_is_refused_and_still_loads(command, tmp_path, capsys, no_work):
    """`bench --model m2 --out m2` failed and left m2 without its config.json: the model no longer loaded."""
    import torch

    import overlapdecode as od
    from overlapdecode.models.loading import load_model

    m2 = tmp_path / "m2"
    load_model("tiny-gpt2", device="cpu").save_pretrained(m2)
    before = _files(m2)
    capsys.readouterr()  # save_pretrained's progress bar
    flags = QUICK if command == "bench" else QUICK_PROFILE
    assert main([command, "--model", str(m2), "--out", str(m2)] + flags) == 2
    _refused(capsys, f"--out {m2}: holds files overlapdecode {command} did not write (config.json")
    assert _files(m2) == before
    assert isinstance(load_model(str(m2), device="cpu"), torch.nn.Module) and od  # loads as it did


def test_the_library_functions_refuse_a_foreign_directory_before_loading(tmp_path, no_work):
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.profile import profile_strategies
    from overlapdecode.bench.report.outdir import OutDirError
    from overlapdecode.bench.runner import BenchError, run_bench

    d = tmp_path / "mine"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(BenchError, match=f"--out {d}: holds files overlapdecode bench did not write"):
        run_bench(BenchConfig(model="tiny-gpt2", device="cpu"), str(d), "x", progress=False)
    with pytest.raises(OutDirError, match=f"--out {d}: holds files overlapdecode profile did not write"):
        profile_strategies("tiny-gpt2", ["kv"], 1, 3, str(d), device="cpu")
    assert _files(d) == {"config.json": b"{}"}


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_a_users_report_md_is_left_alone(command, tmp_path, capsys, no_work):
    d = tmp_path / "notes"
    d.mkdir()
    (d / "report.md").write_text("my own notes\n")
    flags = QUICK if command == "bench" else QUICK_PROFILE
    assert main([command, "--model", "tiny-gpt2", "--out", str(d)] + flags) == 2
    _refused(capsys, f"--out {d}: holds files overlapdecode {command} did not write (report.md)")
    assert _files(d) == {"report.md": b"my own notes\n"}


def test_report_replaces_no_markdown_it_did_not_write(tmp_path):
    """A results.json beside a report.md of the user's (no manifest): `report` refuses to write over it,
    and writes no plot either; its own report (its title on the first line) is rebuilt as before."""
    from overlapdecode.bench.report.outdir import OutDirError
    from overlapdecode.bench.report.report import build
    from support.results_rows import CONFIG, result_row, write_results

    d = str(tmp_path / "d")
    write_results(d, dict(commands=["x"], config=CONFIG, rows=[result_row(), result_row("static")]))
    with open(os.path.join(d, "report.md"), "w") as f:
        f.write("my own notes\n")
    before = _files(d)
    with pytest.raises(OutDirError, match="report.md: not written by overlapdecode bench"):
        build(d)
    assert _files(d) == before
    os.remove(os.path.join(d, "report.md"))
    build(d)
    assert open(os.path.join(d, "report.md")).readline().startswith("# overlapdecode benchmark report")
    os.remove(os.path.join(d, "speedup.png"))
    build(d)  # its own report: rebuilt
    assert os.path.exists(os.path.join(d, "speedup.png"))


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_a_read_only_out_is_one_line(command, tmp_path, capsys, no_work):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        if os.access(d, os.W_OK):
            pytest.skip("this user writes into a read-only directory all the same (root)")
        flags = QUICK if command == "bench" else QUICK_PROFILE
        assert main([command, "--model", "tiny-gpt2", "--out", str(d)] + flags) == 2
        _refused(capsys, f"--out {d}: not a writable directory")
        assert os.listdir(d) == []
    finally:
        d.chmod(0o755)


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_an_out_the_probe_cannot_write_is_one_line(command, tmp_path, capsys, no_work, monkeypatch):
    """As the read-only directory, where the user (root) would write into it all the same: the probe file's
    refusal is what decides, not the permission bits."""
    import errno
    import tempfile

    def refused(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    flags = QUICK if command == "bench" else QUICK_PROFILE
    assert main([command, "--model", "tiny-gpt2", "--out", str(tmp_path)] + flags) == 2
    _refused(capsys, f"--out {tmp_path}: not a writable directory (Permission denied)")
    assert os.listdir(tmp_path) == []


def test_an_empty_out_takes_a_run_and_append_adds_to_it(tmp_path, capsys):
    """An empty directory takes a run, whose manifest lists every file it wrote; --append adds to its own
    earlier run; a file of the user's put there afterwards makes it refused, and the file stays as it was."""
    from overlapdecode.bench.report.outdir import MANIFEST

    d = tmp_path / "empty"
    d.mkdir()
    assert main(["bench", "--model", "tiny-gpt2", "--out", str(d)] + QUICK) == 0
    # stdout is no terminal here, as in a log file: a line per configuration as it starts (the bar is drawn once,
    # at the end; a long run showed nothing in its log until then)
    assert re.search(r"^\[default\] 1/1 float32 b1 fixed n4 kv \(\d+ s\)$", capsys.readouterr().out, re.M)
    listed = json.load(open(d / MANIFEST))
    assert listed["written_by"] == "overlapdecode bench"
    assert set(os.listdir(d)) - {MANIFEST} <= set(listed["files"]) and "results.json" in listed["files"]
    appended = [f if f != "kv" else "static" for f in QUICK]
    assert main(["bench", "--model", "tiny-gpt2", "--out", str(d), "--append"] + appended) == 0
    res = json.load(open(d / "results.json"))
    assert [r["strategy"] for r in res["rows"]] == ["kv", "static"] and len(res["commands"]) == 2
    assert not [n for n in os.listdir(d) if n.startswith(".")]  # no temporary file left
    (d / "notes.txt").write_text("mine")
    before = _files(d)
    capsys.readouterr()
    assert main(["bench", "--model", "tiny-gpt2", "--out", str(d), "--append"] + appended) == 2
    _refused(capsys, f"--out {d}: holds files overlapdecode bench did not write (notes.txt)")
    assert _files(d) == before


def test_a_results_json_alone_takes_an_append(tmp_path, capsys):
    """A results.json copied into a new directory (no manifest) is the one file an --append run may read."""
    import shutil

    d = tmp_path / "copied"
    d.mkdir()
    src = tmp_path / "first"
    assert main(["bench", "--model", "tiny-gpt2", "--out", str(src)] + QUICK) == 0
    shutil.copy(src / "results.json", d / "results.json")
    appended = [f if f != "kv" else "static" for f in QUICK]
    assert main(["bench", "--model", "tiny-gpt2", "--out", str(d), "--append"] + appended) == 0
    assert [r["strategy"] for r in json.load(open(d / "results.json"))["rows"]] == ["kv", "static"]


def test_a_file_is_written_whole_or_not_at_all(tmp_path):
    """Every file goes to a temporary name beside it, then is renamed: a writer that fails half-way leaves the
    earlier file as it was and no temporary file."""
    from overlapdecode.bench.report import outdir

    d = str(tmp_path)
    outdir.prepare(d, "bench")
    outdir.write_text(d, "report.md", "# overlapdecode benchmark report\nfirst\n", "bench")

    def half(path):
        with open(path, "w") as f:
            f.write("# overlapdecode benchmark report\ncut sh")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        outdir.write_file(d, "report.md", half, "bench")
    assert open(os.path.join(d, "report.md")).read() == "# overlapdecode benchmark report\nfirst\n"
    assert sorted(os.listdir(d)) == [outdir.MANIFEST, "report.md"]
