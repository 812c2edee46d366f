"""The README's results table tool (bench/report/results_table.py), on a small fixture: tests/data/results/test-gpu holds two
bench folders (run-a: presets, a variant, other lengths, workloads and allocators, an error row; run-b: Hugging Face
peers and a slower preset row) and a tensor-parallel probe's folder that is not a bench run."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from overlapdecode.bench.report import results_table as rt

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "data", "results", "test-gpu")

# the fused row: 1 GB of weights at 2000 GB/s = 0.5 ms against 1.000 ms/token, MBU 50%; hf-compiled (3.000
# ms/token, in run-b) is the faster peer; the kv row is an older row without the figures MBU needs: "-"
EXPECTED_ROWS = [
    "| `tiny-llama` | bfloat16 | 1 | `fused` | 1.000 | 50% | 3.00x `hf-compiled` | interleaved, fused | [1], [2] |",
    "| `tiny-llama` | bfloat16 | 4 | `kv` | 5.000 | - | not measured | kv | [1] |",
]


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_the_table_takes_the_fastest_preset_and_peer_of_each_configuration():
    text = rt.render(FIXTURE, relative_to=FIXTURE)
    intro = " ".join(text.split("\n\n", 1)[0].split())
    assert intro.startswith(
        "Measured by `overlapdecode bench` on Test GPU: prompt 32 tokens, 200 new tokens, EOS off, medians of the "
        "timed calls. ms/token = the whole call / new tokens; MBU = weight bytes / the measured copy bandwidth / ms "
        "per token;"
    )
    table = _table(text)
    assert table[0] == "| " + " | ".join(rt.HEADER) + " |"
    # nocheck (0.5) and interleaved:2 (0.6) are faster but not presets; the 100-token, EOS-forced and expandable
    # rows are other configurations; the error row and the peer-only batch 2 make no line
    assert table[1:] == EXPECTED_ROWS
    assert text.endswith("\n\n[1]: run-a/report.md\n[2]: run-b/report.md\n")  # the numbered links, defined


def test_every_line_of_the_table_and_its_text_is_within_120_characters():
    """The table had 13 columns, lines of up to 377 characters with two links inline."""
    for new_tokens in (200, 100):
        text = rt.render(FIXTURE, new_tokens=new_tokens, relative_to=FIXTURE)
        assert max(len(line) for line in text.splitlines()) <= rt.WIDTH


@pytest.mark.parametrize(
    "presets, shown",
    [
        ({"baseline", "kv", "static", "compiled", "interleaved", "fused"}, "all"),
        ({"baseline", "kv", "static", "compiled", "interleaved"}, "all but fused"),
        ({"kv", "interleaved", "fused"}, "kv, interleaved, fused"),
        ({"fused"}, "fused"),
    ],
)
def test_the_presets_measured_are_said_short(presets, shown):
    assert rt.measured(presets) == shown


def test_another_length_is_another_table():
    text = rt.render(FIXTURE, new_tokens=100, relative_to=FIXTURE)
    assert _table(text)[1:] == ["| `tiny-llama` | bfloat16 | 1 | `fused` | 0.100 | - | not measured | fused | [1] |"]
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
    assert "[1]: results/test-gpu/run-a/report.md" in region  # links relative to the README
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


def test_quantized_weights_are_their_own_line(tmp_path):
    """A run of int4 weights, faster than the 16-bit fused row, is a line of its own (`bfloat16 int4 g128`), never
    the 16-bit configuration's fastest; so is int8."""
    root = tmp_path / "test-gpu"
    shutil.copytree(FIXTURE, root)
    for scheme, ms in (("int4", 0.4), ("int8", 0.7)):
        run = root / f"run-{scheme}"
        shutil.copytree(root / "run-a", run)
        results = json.loads((run / "results.json").read_text())
        results["config"]["quantize"], results["config"]["group_size"] = scheme, 128
        for row in results["rows"]:
            row["quantize"], row["group_size"] = scheme, 128
            if "ms_per_token" in row:
                row["ms_per_token"] = ms
        (run / "results.json").write_text(json.dumps(results))
    table = _table(rt.render(str(root), relative_to=str(root)))
    assert table[1:3] == EXPECTED_ROWS
    lines = {line.split(" | ")[1] for line in table[3:]}
    assert lines == {"bfloat16 int4 g128", "bfloat16 int8"}, table
