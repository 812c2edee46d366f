"""The bench's per-layer toll and kernels per step (bench/report/figures.py, bench/report/results.py): the arithmetic against
numbers worked by hand, the kernel count of a profile row given to the fixed row of its own configuration only,
and both figures in results.json and report.md, with `-` for rows recorded without them."""

from __future__ import annotations

import json
import os

import pytest

from overlapdecode.bench import scale
from overlapdecode.bench.report import figures
from overlapdecode.bench.report.results import finalize, with_kernel_counts


def test_decode_ms_per_step_leaves_the_one_token_call_out():
    # 200 tokens in 200 ms, the one-token call 2 ms: 198 ms over the 199 decode steps
    assert figures.decode_ms_per_step(200.0, 2.0, 200) == pytest.approx(198 / 199)
    assert figures.decode_ms_per_step(5.0, 2.0, 1) is None  # one token: no decode step
    row = dict(seq_s=0.2, ttft_ms=2.0, new_tokens=200)
    assert figures.row_decode_ms(row) == pytest.approx(198 / 199)


def test_toll_is_the_step_beyond_its_bytes_per_layer():
    # Llama-1B batch 1 on an H200: 0.910 ms/step, 2.472 GB of weights at 4236 GB/s = 0.5836 ms; over 16 layers
    # (0.910 - 0.5836) / 16 = 20.40 us
    assert figures.toll_us_per_layer(0.910, 2.472e9, 4236.0, 16) == pytest.approx(20.40, abs=0.01)
    assert figures.toll_us_per_layer(0.910, 2.472e9, None, 16) is None  # CPU: no measured bandwidth
    assert figures.toll_us_per_layer(None, 2.472e9, 4236.0, 16) is None
    assert figures.toll_us_per_layer(0.910, 2.472e9, 4236.0, None) is None


def test_the_scale_sweep_and_the_bench_share_one_toll():
    assert scale.toll_us_per_layer is figures.toll_us_per_layer
    assert scale.decode_ms_per_step is figures.decode_ms_per_step
    got = scale.step_figures(1.0, 8, 2.5e9, 0.5e9, 5000.0, 16)
    assert got["toll_us_per_layer"] == pytest.approx(figures.toll_us_per_layer(1.0, 3.0e9, 5000.0, 16))


def test_step_toll_of_a_row_uses_its_weights_and_measured_bandwidth():
    row = dict(seq_s=0.2, ttft_ms=2.0, new_tokens=200, weight_bytes=1e9, bandwidth_gbs=2000.0)
    got = figures.step_toll(row, 2)
    assert got["layers"] == 2 and got["decode_ms_per_step"] == pytest.approx(198 / 199)
    assert got["toll_us_per_layer"] == pytest.approx((198 / 199 - 0.5) / 2 * 1e3)
    cpu = figures.step_toll(dict(row, bandwidth_gbs=None), 2)
    assert cpu["toll_us_per_layer"] is None and cpu["decode_ms_per_step"] == pytest.approx(198 / 199)
    assert figures.step_toll(dict(row, weight_bytes=None), 2)["toll_us_per_layer"] is None
    assert figures.step_toll(row, None)["toll_us_per_layer"] is None  # layers unknown: no made-up figure


def _row(strategy="fused", workload="fixed", n=200, allocator="default", **kw):
    row = dict(
        model="m",
        tp=1,
        allocator=allocator,
        dtype="bfloat16",
        batch=1,
        prompt_len=32,
        max_new_tokens=n,
        strategy=strategy,
        workload=workload,
        device="cuda",
    )
    if workload != "profile":
        row.update(
            seq_s=n * 1e-3,
            seq_s_all=[n * 1e-3] * 3,
            ms_per_token=1.0,
            tokens_per_s=1000.0,
            ttft_ms=2.0,
            first_call_s=1.0,
            new_tokens=n,
            kind="peer" if strategy.startswith("hf-") else "overlapdecode",
            compiled=True,
        )
    row.update(kw)
    return row


def _profile(kernels, **kw):
    busy = dict(
        available=True,
        busy_fraction=0.9,
        decode_steps=199,
        median_idle_gap_us=2.0,
        host_sync_ms=0.0,
        launches_per_step=2.0,
        kernels_per_step=kernels,
    )
    if kernels is None:  # a peer's profile: the whole call, no decode steps to count per
        busy = dict(available=True, busy_fraction=0.9, decode_steps=None, host_sync_ms=0.0)
    return _row(workload="profile", busy=busy, **kw)


def test_a_fixed_row_gets_the_kernel_count_of_the_profile_of_its_own_configuration_only():
    rows = [
        _row(),
        _row(n=100),  # another length: the profile at 200 is not its step
        _row(allocator="expandable"),
        _row(workload="eos"),  # the forced-EOS hook adds kernels to the step
        _row("hf-compiled"),
        _row("interleaved", kernels_per_step=7.0),  # a count it carries already stays
        _profile(80.0),
        _profile(90.0, strategy="interleaved"),
        _profile(None, strategy="hf-compiled"),
    ]
    got = with_kernel_counts(rows)
    assert [r.get("kernels_per_step") for r in got[:6]] == [80.0, None, None, None, None, 7.0]


def test_finalize_writes_the_kernel_count_into_the_rows_of_results_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(model="m", prompt_len=32, repeats=3, warmup=1)))
    with open(tmp_path / "rows-default.jsonl", "w") as f:
        for r in (_row(layers=2, decode_ms_per_step=0.99, toll_us_per_layer=250.0), _profile(80.0)):
            f.write(json.dumps(r) + "\n")
    finalize(str(tmp_path), "overlapdecode bench")
    on_disk = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert on_disk[0]["kernels_per_step"] == 80.0 and on_disk[0]["toll_us_per_layer"] == 250.0


def _results_dir(tmp_path, rows) -> str:
    out = tmp_path / "run"
    out.mkdir()
    results = dict(
        commands=["overlapdecode bench"],
        config=dict(model="m", prompt_len=32, repeats=3, warmup=1),
        rows=rows,
        environment=dict(torch="2", transformers="5", python="3.11", git_commit="abc", gpu="Test GPU"),
    )
    (out / "results.json").write_text(json.dumps(results))
    return str(out)


def _table_cells(text: str, column: str, strategy: str) -> dict:
    """The cells of `strategy`'s line in the first markdown table with a column `column`, by column."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| ") and f"| {column} |" in line)
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] == strategy:
            return dict(zip(header, cells))
    raise AssertionError(f"no line for {strategy}")


def test_the_report_shows_the_toll_and_kernels_and_a_dash_for_older_rows(tmp_path):
    from overlapdecode.bench.report.report import build

    new = _row(weight_bytes=1e9, bandwidth_gbs=2000.0)
    new.update(figures.step_toll(new, 2))
    old = _row("interleaved", n=200, weight_bytes=1e9, bandwidth_gbs=2000.0)  # recorded before the toll was
    out = _results_dir(tmp_path, [new, old, _profile(80.0)])
    text = open(build(out)).read()
    fused = _table_cells(text, "toll us/layer", "fused")
    assert fused["ms/step"] == "0.995" and fused["toll us/layer"] == "247.5" and fused["kernels/step"] == "80"
    interleaved = _table_cells(text, "toll us/layer", "interleaved")
    # ms/step comes from any timed row's call and TTFT; the toll needs the layers the older row lacks
    assert [interleaved[k] for k in ("ms/step", "toll us/layer", "kernels/step")] == ["0.995", "-", "-"]
    assert "(the median call - the median one-token call, TTFT) / (new tokens - 1)" in text


def test_the_terminal_table_shows_mbu_and_leaves_the_toll_and_kernels_to_the_report(tmp_path):
    """The terminal table keeps to the figures that decide, whole at 80 columns: MBU among them; ms/step, the toll
    and the kernels per step are in report.md (above) and results.json."""
    from rich.console import Console

    from overlapdecode.cli.bench import summary_tables

    new = _row(weight_bytes=1e9, bandwidth_gbs=2000.0, kernels_per_step=80.0)
    new.update(figures.step_toll(new, 2))
    old = _row("interleaved", weight_bytes=None, bandwidth_gbs=None)
    ((table, _),) = summary_tables([new, old], "m")
    console = Console(record=True, width=250)
    console.print(table)
    lines = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in console.export_text().replace("┃", "│").splitlines()
        if line.count("│") > 3
    }
    header = lines["strategy"]
    assert not {"ms/step", "toll us/layer", "kernels/step"} & set(header)
    assert lines["fused"][header.index("MBU")] == "50%" and lines["interleaved"][header.index("MBU")] == "-"


def test_a_toll_that_is_not_a_number_is_refused(tmp_path):
    from overlapdecode.bench.report.results import ResultsError, load

    out = _results_dir(tmp_path, [_row(toll_us_per_layer="fast")])
    with pytest.raises(ResultsError, match="toll_us_per_layer of the wrong kind"):
        load(out)


def test_old_rows_without_the_fields_still_render(tmp_path):
    from overlapdecode.bench.report import results_table as rt

    folder = tmp_path / "h"
    os.makedirs(folder)
    _results_dir(folder, [_row(n=200)])
    line = next(x for x in rt.render(str(folder), relative_to=str(folder)).splitlines() if x.startswith("| `m`"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert dict(zip(rt.HEADER, cells))["MBU"] == "-" and dict(zip(rt.HEADER, cells))["ms/token"] == "1.000"
