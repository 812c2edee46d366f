"""The README's results table tool (bench/results_table.py), on a small fixture: tests/data/results/test-gpu holds two
bench folders (run-a: presets, a variant, other lengths, workloads and allocators, an error row; run-b: Hugging Face
peers and a slower preset row) and a tensor-parallel probe's folder that is not a bench run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from overlapdecode.bench.report import results_table as rt

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "results", "test-gpu")

# the fused row's toll: (0.995 ms/step - 1 GB / 2000 GB/s) / 2 layers = 247.5 us; its kernels per step are those
# of the profile row of its own length (25; the 100-token profile row counted 30); the kv row is an older row
# without a toll or a profile: "-"
EXPECTED_ROWS = [
    "| `tiny-llama` | bfloat16 | 1 | **`fused`** | 1.000 | 0.995 | 2.0 | 50% | 247.5 | 25 | `hf-compiled` 3.000 "
    "(3.00x) | interleaved, fused | [run-a](run-a/report.md), [run-b](run-b/report.md) |",
    "| `tiny-llama` | bfloat16 | 4 | **`kv`** | 5.000 | 5.015 | 2.0 | - | - | - | not measured | kv | "
    "[run-a](run-a/report.md) |",
]


def test_the_table_takes_the_fastest_preset_and_peer_of_each_configuration():
    text = rt.render(FIXTURE, relative_to=FIXTURE)
    lines = text.splitlines()
    assert lines[0] == (
        "Measured by `overlapdecode bench` on Test GPU: prompt 32 tokens, 200 new tokens, EOS off, "
        "medians of the timed calls. ms/step = (the call - TTFT) / (new tokens - 1); toll = (ms/step - weight "
        "bytes / the measured copy bandwidth) / layers; kernels/step counted by the profiler over one call of the "
        "same configuration (`-`: not measured)."
    )
    assert lines[2] == "| " + " | ".join(rt.HEADER) + " |"
    # nocheck (0.5) and interleaved:2 (0.6) are faster but not presets; the 100-token, EOS-forced and expandable
    # rows are other configurations; the error row and the peer-only batch 2 make no line
    assert lines[4:] == EXPECTED_ROWS


def test_another_length_is_another_table():
    text = rt.render(FIXTURE, new_tokens=100, relative_to=FIXTURE)
    assert text.splitlines()[4:] == [
        "| `tiny-llama` | bfloat16 | 1 | **`fused`** | 0.100 | 0.081 | 2.0 | - | - | 30 | not measured | fused | "
        "[run-a](run-a/report.md) |"
    ]
    with pytest.raises(rt.ResultsError, match="no folder measured a preset at 50 new tokens"):
        rt.render(FIXTURE, new_tokens=50)


def _readme(tmp_path, body: str) -> str:
    path = tmp_path / "README.md"
    path.write_text(body)
    return str(path)


def test_main_rewrites_only_the_marked_region_of_a_readme(tmp_path, capsys):
    results = tmp_path / "results" / "test-gpu"
    shutil.copytree(FIXTURE, results)
    before, after = "# Title\n\nSome text.\n\n", "\nMore text.\n"
    path = _readme(tmp_path, f"{before}{rt.BEGIN}\nan old table\n{rt.END}{after}")
    assert rt.main([str(results), "--readme", path]) == 0
    text = open(path).read()
    assert text.startswith(before + rt.BEGIN + "\n") and text.endswith(rt.END + after)
    region = text[len(before + rt.BEGIN + "\n") : -len(rt.END + after)]
    assert region == rt.render(str(results), relative_to=str(tmp_path))
    assert "[run-a](results/test-gpu/run-a/report.md)" in region  # links relative to the README
    assert "rewritten" in capsys.readouterr().out
    assert rt.main([str(results), "--readme", path]) == 0 and open(path).read() == text
    assert "already up to date" in capsys.readouterr().out


def test_main_refuses_in_one_line_a_readme_without_markers_and_a_bad_results_file(tmp_path, capsys):
    path = _readme(tmp_path, "no markers here\n")
    assert rt.main([FIXTURE, "--readme", path]) == 2
    err = capsys.readouterr().err
    assert "README.md: needs one line" in err and len(err.splitlines()) == 1
    assert open(path).read() == "no markers here\n"
    bad = tmp_path / "bad" / "run"
    bad.mkdir(parents=True)
    (bad / "results.json").write_text(json.dumps({"commands": [], "config": {}, "rows": []}))
    assert rt.main([str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "results.json: config must be an object with model" in err and len(err.splitlines()) == 1
    assert rt.main([str(tmp_path / "nothing-here")]) == 2
    assert "not a directory of results folders" in capsys.readouterr().err
