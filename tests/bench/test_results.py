"""results.json is a user's measurements: never overwritten by a run that measured nothing or was not asked
to, and a malformed one is refused in one line naming the file."""

from __future__ import annotations

import json
import os

import pytest

from overlapdecode.bench.report.results import ResultsError, finalize, load
from overlapdecode.cli import main
from support.results_rows import CONFIG, result_row, write_results


def _one_line(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert all(w in err for w in words) and "Traceback" not in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "content, words",
    [
        ({}, "missing commands, config, rows"),
        ([], "expected a JSON object with commands, config and rows, got list"),
        (None, "got null"),
        ('{"rows": [', "not valid JSON"),
        ("", "not valid JSON"),
        (dict(commands=[], config=CONFIG, rows=[{"strategy": "kv"}]), "row 0 lacks workload"),
        (
            dict(commands=[], config=CONFIG, rows=[dict(result_row(), seq_s_all=None) | {"seq_s": 1}]),
            "row 0 has seq_s_all of the wrong kind",
        ),
        (
            dict(commands=[], config=CONFIG, rows=[dict(result_row(), ttft_ms="fast", seq_s_all=[])]),
            "row 0 has ttft_ms, seq_s_all of the wrong kind",
        ),
        (
            dict(commands=[], config=CONFIG, rows=[{k: v for k, v in result_row().items() if k != "ttft_ms"}]),
            "row 0 lacks ttft_ms",
        ),
        (dict(commands=[], config={}, rows=[]), "config must be an object with model"),
        (dict(commands="x", config=CONFIG, rows=[]), "commands must be a list"),
        (dict(commands=[], config=CONFIG, rows=[1, 2]), "rows must be a list of objects"),
    ],
)
def test_report_on_a_malformed_results_json_is_one_line_naming_the_file(tmp_path, capsys, content, words):
    path = write_results(str(tmp_path / "d"), content)
    assert main(["report", str(tmp_path / "d")]) == 2
    _one_line(capsys, path, words)


def test_rows_without_environment_still_make_a_report(tmp_path, capsys):
    d = str(tmp_path / "d")
    write_results(
        d,
        dict(commands=["overlapdecode bench"], config=CONFIG, rows=[result_row("kv"), result_row("static", seq_s=0.2)]),
    )
    assert main(["report", d]) == 0
    assert (
        "Machine: not recorded in the JSON (results.json has no environment record)"
        in open(os.path.join(d, "report.md")).read()
    )


def test_report_markdown_into_a_missing_directory_is_one_line(tmp_path, capsys):
    d = str(tmp_path / "d")
    write_results(d, dict(commands=["x"], config=CONFIG, rows=[result_row()]))
    assert main(["report", d, "--markdown", "/nonexistent/dir/B.md"]) == 2
    _one_line(capsys, "--markdown /nonexistent/dir/B.md: directory /nonexistent/dir does not exist")
    assert main(["report", d, "--markdown", d]) == 2
    _one_line(capsys, f"--markdown {d}: is a directory")


def test_bench_refuses_to_overwrite_an_earlier_results_json(tmp_path, capsys):
    d = str(tmp_path / "d")
    path = write_results(d, dict(commands=["earlier"], config=CONFIG, rows=[result_row()]))
    before = open(path).read()
    assert main(["bench", "--device", "cpu", "--out", d]) == 2
    _one_line(capsys, f"--out {d} already holds results.json: add to it with --append")
    assert main(["bench", "--device", "cpu", "--append", "--out", str(tmp_path / "fresh")]) == 2
    _one_line(capsys, "--append:", "not found (nothing to add to)")
    assert not os.path.exists(tmp_path / "fresh")  # refused before making anything
    assert open(path).read() == before


def _rows_file(d, rows):
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(CONFIG, f)
    with open(os.path.join(d, "rows-default.jsonl"), "w") as f:
        f.write(json.dumps(dict(meta=dict(torch="x", transformers="y"))) + "\n")
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_a_run_that_measured_nothing_leaves_results_json_alone(tmp_path):
    d = str(tmp_path)
    path = write_results(d, dict(commands=["earlier"], config=CONFIG, rows=[result_row()]))
    before = open(path).read()
    _rows_file(d, [dict(result_row(), error="not run: time budget of 0 s spent")])
    with pytest.raises(ResultsError, match="the run measured nothing .* results.json left as it was"):
        finalize(d, "overlapdecode bench --append", earlier=load(d))
    assert open(path).read() == before
    _rows_file(d, [])
    with pytest.raises(ResultsError, match="measured nothing"):
        finalize(d, "overlapdecode bench --append", earlier=load(d))
    assert open(path).read() == before


def test_a_run_that_measured_something_replaces_it_whole(tmp_path):
    d = str(tmp_path)
    write_results(d, dict(commands=["earlier"], config=CONFIG, rows=[result_row("kv")]))
    _rows_file(d, [result_row("static")])
    res = finalize(d, "later", earlier=load(d))
    assert [r["strategy"] for r in res["rows"]] == ["kv", "static"] and res["commands"] == ["earlier", "later"]
    assert load(d)["rows"] == res["rows"] and not os.path.exists(os.path.join(d, "results.json.partial"))


def test_the_runner_keeps_an_interrupted_runs_rows(tmp_path):
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.runner import BenchError, run_bench

    _rows_file(str(tmp_path), [result_row()])
    with pytest.raises(BenchError, match="holds the rows of an interrupted run"):
        run_bench(BenchConfig(device="cpu"), str(tmp_path), "x", progress=False)
    assert os.path.exists(tmp_path / "rows-default.jsonl")


def test_the_runner_refuses_an_empty_plan(tmp_path):
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.runner import BenchError, run_bench

    with pytest.raises(BenchError, match="nothing to measure"):
        run_bench(BenchConfig(dtypes=(), device="cpu"), str(tmp_path / "o"), "x", progress=False)
    assert not os.path.exists(tmp_path / "o")


def test_report_markdown_never_replaces_a_results_json(tmp_path, capsys):
    """`--markdown DIR/results.json` (a slip of the tab key) wrote the gathered markdown over the measurements."""
    d = str(tmp_path / "d")
    path = write_results(d, dict(commands=["x"], config=CONFIG, rows=[result_row()]))
    before = open(path).read()
    assert main(["report", d, "--markdown", path]) == 2
    _one_line(capsys, f"--markdown {path}: is a JSON file of measurements")
    assert open(path).read() == before
    assert main(["report", d, "--markdown", str(tmp_path / "B.md")]) == 0  # a markdown path still works


@pytest.mark.parametrize(
    "row, words",
    [
        (dict(batch="one"), "row 0 has batch of the wrong kind"),  # was: '<' not supported between str and int
        (dict(max_new_tokens=None), "row 0 has max_new_tokens of the wrong kind"),
        (dict(strategy=None), "row 0 has strategy of the wrong kind"),  # was a traceback (AttributeError)
        (dict(device=None), "row 0 has device of the wrong kind"),  # likewise
        (dict(seq_s=0), "row 0 has seq_s of the wrong kind"),  # was: matplotlib's "'yerr' must not contain..."
        (dict(peak_reserved_mb="x"), "row 0 has peak_reserved_mb of the wrong kind"),
    ],
)
def test_rows_of_the_wrong_kind_are_one_line_naming_the_file(tmp_path, capsys, row, words):
    path = write_results(
        str(tmp_path / "d"), dict(commands=["x"], config=CONFIG, rows=[result_row() | row, result_row("static")])
    )
    assert main(["report", str(tmp_path / "d")]) == 2
    _one_line(capsys, path, words)


def test_an_incomplete_environment_record_is_said_not_refused(tmp_path):
    """An environment without the versions the report prints was a traceback (KeyError: 'torch')."""
    d = str(tmp_path / "d")
    write_results(
        d, dict(commands=["x"], config=CONFIG, environment=dict(gpu=None), rows=[result_row(), result_row("static")])
    )
    assert main(["report", d]) == 0
    assert (
        "environment record lacks torch, transformers, python, git_commit" in open(os.path.join(d, "report.md")).read()
    )


@pytest.mark.parametrize("content", ['{"strategies": []}', '{"strategies": "x"}'])
def test_a_malformed_profile_summary_is_one_line_naming_the_file(tmp_path, capsys, content):
    """`strategies` not an object ended in a traceback (AttributeError: ... has no attribute 'items')."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "summary.json").write_text(content)
    assert main(["report", str(d)]) == 2
    _one_line(capsys, f"{d / 'summary.json'}: cannot be used (AttributeError")
