"""What `overlapdecode bench` prints and what its report says a run is worth, from synthetic rows (no timing):
the table whole at 80 columns when piped, a `!` quoting the spread of the row it names, figures that the timed
calls do not resolve (negative exponents and first-call overheads) never printed as findings, and on CPU one line
that says what to take from the run."""

from __future__ import annotations

import io
import json
import re

import pytest

from overlapdecode.bench.report.report import CPU_TAKEAWAY, build
from overlapdecode.cli.bench import print_summary, summary_tables

ALL = ["baseline", "kv", "static", "compiled", "interleaved", "fused", "hf-dynamic", "hf-static", "hf-compiled"]


def _row(strategy, n, seq_s, times=None, device="cuda:0", first_call_s=None, **kw):
    times = times or [seq_s * 0.99, seq_s, seq_s * 1.01]
    row = dict(
        model="gpt2-random",
        tp=1,
        allocator="default",
        dtype="float32",
        batch=16,
        prompt_len=32,
        max_new_tokens=n,
        workload="fixed",
        strategy=strategy,
        kind="peer" if strategy.startswith("hf-") else "overlapdecode",
        compiled=not (device == "cpu" and strategy == "hf-compiled"),
        device=device,
        new_tokens=n,
        seq_s=seq_s,
        seq_s_all=times,
        ms_per_token=seq_s * 1e3 / n,
        tokens_per_s=16 * n / seq_s,
        ttft_ms=12.345,
        first_call_s=seq_s + 20.0 if first_call_s is None else first_call_s,
        peak_reserved_mb=None if device == "cpu" else 1606.0,
        peak_allocated_mb=None if device == "cpu" else 1266.0,
        fragmentation=None if device == "cpu" else 0.212,
        weight_bytes=None if device == "cpu" else 497.8e6,
        bandwidth_gbs=None if device == "cpu" else 4236.0,
    )
    row.update(kw)
    return row


def _results(rows, model="gpt2-random") -> dict:
    gpu = None if all(r["device"] == "cpu" for r in rows) else "NVIDIA H200"
    return dict(
        commands=["overlapdecode bench"],
        config=dict(model=model, prompt_len=32, repeats=3, warmup=1),
        rows=rows,
        environment=dict(torch="2", transformers="5", python="3.11", git_commit="abc", gpu=gpu),
    )


def _printed(results, monkeypatch, columns=80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    out = io.StringIO()  # not a tty, as stdout piped into a file or `less`
    print_summary(results, "bench-out", file=out)
    return out.getvalue()


def _cells(text: str) -> dict[str, list[str]]:
    """Each table line's cells, by its first cell (the header's under "strategy")."""
    found = {}
    for line in text.replace("┃", "│").splitlines():
        if line.count("│") > 2:
            cells = [c.strip() for c in line.split("│")[1:-1]]
            found[cells[0]] = cells[1:]
    return found


# the main job on an H200 (results/h200/gpt2-main-job at 192 tokens: 11 columns, cut to `str…`, `ms/…` at 80)
GPU = {
    "baseline": 2.378,
    "kv": 1.154,
    "static": 1.701,
    "compiled": 0.413,
    "interleaved": 0.299,
    "fused": 0.479,
    "hf-dynamic": 1.333,
    "hf-static": 2.234,
    "hf-compiled": 0.540,
}


def test_the_table_is_whole_at_80_columns_when_piped(monkeypatch):
    rows = [_row(s, 192, GPU[s]) for s in ALL]
    text = _printed(_results(rows), monkeypatch)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    cells = _cells(text)
    assert cells["strategy"] == ["ms/token", "vs baseline", "spread", "MBU"]
    for s in ALL:
        ratio = GPU["baseline"] / GPU[s]
        mbu = 497.8e6 / 4236e9 / (GPU[s] / 192)
        assert cells[s] == [f"{GPU[s] * 1e3 / 192:.3f}", f"{ratio:.2f}x", "2%", f"{mbu:.0%}"], (s, text)
    assert "report: bench-out/report.md" in text and CPU_TAKEAWAY.split(".")[0] not in text


def test_on_cpu_the_columns_that_are_dashes_everywhere_are_dropped(monkeypatch):
    """On CPU 4 of 11 columns were `-` in every row; MBU needs a GPU's measured bandwidth. One timed call per row
    leaves no spread; a run without the baseline has no speed-up over it."""
    rows = [_row(s, 48, 0.1 + i / 100, device="cpu") for i, s in enumerate(ALL) if s != "fused"]
    cells = _cells(_printed(_results(rows, "tiny-gpt2"), monkeypatch))
    assert cells["strategy"] == ["ms/token", "vs baseline", "spread"]
    assert cells["hf-compiled (eager on CPU)"][0] == f"{0.18 * 1e3 / 48:.3f}"
    one = [_row(s, 48, 0.1, times=[0.1], device="cpu") for s in ("kv", "interleaved")]
    assert _cells(_printed(_results(one, "tiny-gpt2"), monkeypatch))["strategy"] == ["ms/token"]


def test_each_warning_quotes_the_spread_of_the_row_it_names(monkeypatch):
    """Every `!` quoted the baseline's spread (2577%) whatever the row's own was."""
    rows = [
        _row("baseline", 48, 1.0, times=[0.5, 1.0, 26.27], device="cpu"),  # 2577% apart
        _row("kv", 48, 0.95, times=[0.9, 0.95, 1.0], device="cpu"),  # 1.05x, its own calls 10.5% apart
        _row("static", 48, 0.5, times=[0.49, 0.5, 0.51], device="cpu"),  # 2.00x, 4%: hidden by the baseline's
        _row("compiled", 48, 0.01, times=[0.0099, 0.01, 0.0101], device="cpu"),  # 100x: beyond either
    ]
    text = _printed(_results(rows, "tiny-gpt2"), monkeypatch)
    cells = _cells(text)
    assert [cells[s][1] for s in ("kv", "static", "compiled")] == ["1.05x !", "2.00x !", "100.00x"]
    ((_, warnings),) = summary_tables(rows, "tiny-gpt2")
    assert [w.split(":")[0] for w in warnings] == ["! kv", "! baseline"]
    kv, base = warnings
    assert "within the spread of its own timed calls (11%)" in kv and "2577%" not in kv
    assert "own timed calls spread 2577%" in base and "static 2.00x" in base and "kv" not in base
    assert all(" ".join(w.split()) in " ".join(text.split()) for w in warnings)  # printed, wrapped or not


def test_the_report_marks_the_same_speed_ups(tmp_path):
    rows = [
        _row("baseline", 48, 1.0, times=[0.5, 1.0, 26.27], device="cpu"),
        _row("kv", 48, 0.95, times=[0.9, 0.95, 1.0], device="cpu"),
        _row("compiled", 48, 0.01, times=[0.0099, 0.01, 0.0101], device="cpu"),
    ]
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_results(rows, "tiny-gpt2")))
    text = open(build(str(out))).read()
    at = text.split("At N=48", 1)[1]
    assert "| kv | 0.950 |" in at and "| 1.05x ! |" in at and "| 100.00x |" in at and "| 1.00x |" in at


def test_on_cpu_one_line_says_what_to_take_from_the_run(monkeypatch, tmp_path):
    rows = [_row(s, 48, 0.1, device="cpu") for s in ("baseline", "kv", "interleaved")]
    text = _printed(_results(rows, "tiny-gpt2"), monkeypatch)
    flat = " ".join(text.split())
    assert flat.count(" ".join(CPU_TAKEAWAY.split())) == 1
    assert "use `kv`" in CPU_TAKEAWAY and "GPU" in CPU_TAKEAWAY
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_results(rows, "tiny-gpt2")))
    assert CPU_TAKEAWAY in open(build(str(out))).read()


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n\n## ", 1)[0]


def test_negative_exponents_and_first_call_overheads_are_never_findings(tmp_path):
    """On a busy CPU 6 of 8 rows took longer at 16 tokens than at 48: the report printed exponents such as
    -1.78 and first-call overheads such as -1.13 s as figures."""
    rows = []
    for s in ("baseline", "kv", "static"):
        rows.append(_row(s, 16, 2.0, times=[1.9, 2.0, 2.1], device="cpu", first_call_s=0.87))  # 1.13 s below
        rows.append(_row(s, 48, 0.3, times=[0.29, 0.3, 0.31], device="cpu", first_call_s=0.32))  # within 0.02
    rows.append(_row("compiled", 16, 0.1, times=[0.05, 0.1, 0.4], device="cpu", first_call_s=20.1))  # resolved
    rows.append(_row("compiled", 48, 0.5, times=[0.1, 0.5, 0.9], device="cpu", first_call_s=0.6))  # allows < 0
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_results(rows, "tiny-gpt2")))
    text = open(build(str(out))).read()
    lengths = _section(text, "## ms per token, fixed length")
    table = lengths.split("\n\n")[1].splitlines()  # the first table: ms/token per length and the exponents
    table = [line for line in table if line.startswith("| ")]
    assert table[0].endswith("| exponent | exponent (last two) |")
    for line in table[1:]:  # baseline, kv, static shrink with length; compiled's calls allow no growth
        assert line.endswith("| within noise | within noise |"), line
    over = [line for line in lengths.split("First-call overhead", 1)[1].splitlines() if line.startswith("| ")]
    by = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in over[1:]}
    assert by["baseline"] == ["within noise", "within noise", "within noise"]
    assert by["compiled"] == ["20.00", "within noise", "20.00"]
    claims = _section(text, "## The progression, checked against this run")
    line = next(x for x in claims.splitlines() if x.startswith("- O(N^2) vs O(N)"))
    assert "not stated: the timed calls do not resolve how time grows with length" in line, line
    assert not re.search(r"(baseline|kv) -\d", line), line
    assert not re.search(r"\| -\d", lengths), lengths


@pytest.mark.parametrize("strategy", ["baseline", "kv"])
def test_an_exponent_that_the_calls_resolve_is_still_a_figure(strategy, tmp_path):
    from overlapdecode.bench.report.figures import WITHIN_NOISE, exponent

    points = [(48, _row(strategy, 48, 0.34)), (192, _row(strategy, 192, 0.34 * 4**1.4))]
    assert exponent(points) == pytest.approx(1.4) and exponent(points) != WITHIN_NOISE


def test_the_main_jobs_bfloat16_table_reads_without_a_baseline(monkeypatch, tmp_path):
    """The main job's bfloat16 rows measure `interleaved` and `fused` alone: no speed-up over a baseline to show."""
    rows = [_row(s, 192, GPU[s]) for s in ALL]
    rows += [_row(s, 192, t, dtype="bfloat16", batch=1) for s, t in (("interleaved", 0.183), ("fused", 0.057))]
    text = _printed(_results(rows), monkeypatch)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert text.index("bfloat16, batch 1") < text.index("float32, batch 16")  # the first table a user reads
    cells = _cells(text.split("float32, batch 16", 1)[0])
    assert cells["strategy"] == ["ms/token", "spread", "MBU"]
    assert cells["fused"][0] == "0.297" and cells["interleaved"][0] == "0.953"
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text(json.dumps(_results(rows)))
    assert "## ms per token, fixed length (EOS disabled): bfloat16, batch 1" in open(build(str(out))).read()


def test_a_float32_table_where_fused_trails_says_why():
    """The main job's float32 table showed `fused` behind `interleaved` with no word; bfloat16, or fused ahead,
    takes no such line."""
    from overlapdecode.cli.bench import FLOAT32_FUSED

    def warnings(dtype, fused_s):
        rows = [_row("interleaved", 48, 0.10, dtype=dtype), _row("fused", 48, fused_s, dtype=dtype)]
        ((_, lines),) = summary_tables(rows, "gpt2-random")
        return lines

    assert warnings("float32", 0.15) == [FLOAT32_FUSED]
    assert warnings("float32", 0.05) == [] and warnings("bfloat16", 0.15) == []
