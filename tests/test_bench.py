"""The benchmark end to end on tiny-gpt2 (CPU): JSON schema, every requested row, report and plots.

A benchmark is never a timed test: nothing here asserts a speed, only that the figures exist and are sane.
"""

from __future__ import annotations

import json
import os

import pytest

from overlapdecode.bench.report import fit_exponent
from overlapdecode.cli import main

STRATEGIES = ["baseline", "kv", "static", "interleaved", "nocheck"]
PEERS = ["hf-dynamic", "hf-static"]
LENGTHS = [8, 24]


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bench"))
    rc = main(["bench", "--model", "tiny-gpt2", "--strategies", ",".join(STRATEGIES), "--peers", ",".join(PEERS),
               "--lengths", ",".join(map(str, LENGTHS)), "--batch", "1,2", "--prompt-len", "8", "--workloads",
               "fixed,eos", "--warmup", "0", "--repeats", "2", "--out", out, "--device", "cpu"])
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
    for name in ("report.md", "time_vs_length.png", "speedup.png", "busy.png"):
        assert os.path.getsize(os.path.join(bench_dir, name)) > 0, name
    os.remove(os.path.join(bench_dir, "report.md"))
    assert main(["report", bench_dir]) == 0
    text = open(os.path.join(bench_dir, "report.md")).read()
    assert "## The brief's claims, checked against this run" in text
    assert "| interleaved |" in text and "| hf-dynamic |" in text
    assert "EOS forced per row" in text


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
        (["bench", "--strategies", "kv:2"], "applies to interleaved and deferred only"),
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
    assert text.count("### The brief's claims") == 2 and "(cut/time_vs_length.png)" in text


def test_units_split_over_gpus_and_merged(tmp_path):
    """--gpus: one worker per allocator x dtype:batch unit, pinned by CUDA_VISIBLE_DEVICES, rows merged.

    On CPU the pinning is inert, but the split, the scheduling over two slots and the merge are the real ones."""
    from overlapdecode.bench.runner import run_bench, work_units
    from overlapdecode.bench.config import BenchConfig

    cfg = BenchConfig(model="tiny-gpt2", strategies=("kv", "interleaved"), peers=("hf-dynamic",), lengths=(6,),
                      pairs=("float32:1", "float32:2", "bfloat16:1"), prompt_len=4, warmup=0, repeats=1,
                      profile=False, device="cpu", gpus=(0, 1))
    units = work_units(cfg)
    assert [label for label, _ in units] == ["default-float32-b1", "default-float32-b2", "default-bfloat16-b1"]
    assert all(u.gpus == () and len(u.pairs) == 1 for _, u in units)
    assert [label for label, _ in work_units(BenchConfig(allocators=("default", "expandable")))] == [
        "default", "expandable"]
    res = run_bench(cfg, str(tmp_path), "overlapdecode bench --gpus 0,1", progress=False)
    got = sorted((r["dtype"], r["batch"], r["strategy"], r["visible_devices"]) for r in res["rows"])
    want = [(d, b, s) for d, b in (("bfloat16", 1), ("float32", 1), ("float32", 2))
            for s in ("hf-dynamic", "interleaved", "kv")]
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


def test_claims_from_known_rows():
    """The claims section states what synthetic figures imply: exponents, ratios, fragmentation per allocator."""
    from overlapdecode.bench.report import claims

    def row(strategy, n, seq_s, allocator="default", reserved=None, allocated=None):
        frag = None if reserved is None else (reserved - allocated) / reserved
        return dict(workload="fixed", allocator=allocator, dtype="float32", batch=1, strategy=strategy,
                    max_new_tokens=n, seq_s=seq_s, ms_per_token=seq_s * 1e3 / n, peak_reserved_mb=reserved,
                    peak_allocated_mb=allocated, fragmentation=frag)

    rows = [row("baseline", n, (n / 100) ** 2) for n in (100, 200, 400)]
    rows += [row("kv", n, n / 100) for n in (100, 200, 400)]
    rows += [row("interleaved", 400, 0.5), row("nocheck", 400, 0.49), row("compiled", 400, 0.7)]
    rows += [row("kv", 400, 4.0, "default", 800, 600), row("kv", 400, 4.0, "expandable", 640, 600)]
    text = "\n".join(claims({"rows": rows}))
    assert "baseline 2.00 (last two lengths 2.00), kv 1.00" in text
    assert "interleaved (float32, batch 1, 400 tokens, 1.250 ms/token): 32.00x baseline, 1.40x compiled" in text
    assert "+2.0% vs the no-check upper bound." in text  # no spread recorded: stated as measured
    rows[-5]["seq_s_all"] = [0.45, 0.5, 0.6]  # interleaved's timed calls 30% apart: a 2% gap means nothing
    assert "+2.0% vs the no-check upper bound (within the spread of the timed calls, 30%" in "\n".join(
        claims({"rows": rows}))
    assert "default: reserved 800 MB vs allocated 600 MB (25.0%); expandable: reserved 640 MB" in text


def test_latest_rows_measured_beats_not_run():
    """An --append run's measured row replaces the earlier "not run" one; a "not run" never hides a figure."""
    from overlapdecode.bench.results import latest_rows

    def row(strategy, n, **kw):
        return dict(model="m", allocator="default", dtype="float32", batch=1, prompt_len=32, workload="eos",
                    max_new_tokens=n, strategy=strategy, **kw)

    rows = [row("kv", 200, error="not run: time budget of 490 s spent"), row("static", 200, seq_s=1.0),
            row("kv", 400, seq_s=2.0), row("kv", 200, seq_s=0.5), row("static", 200, error="not run: budget"),
            row("kv", 400, seq_s=3.0)]
    got = latest_rows(rows)
    assert [(r["strategy"], r["max_new_tokens"], r.get("seq_s")) for r in got] == [
        ("kv", 200, 0.5), ("static", 200, 1.0), ("kv", 400, 3.0)]
