"""The README and the docs say what the code does: the Python example runs as written (here on CPU), the results
table is what bench/report/results_table.py makes of results/, the test commands are the ones CI and the skip reason use,
and every relative link of the markdown files points at a file that exists."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess

import pytest

from overlapdecode.bench.report import results_index, results_table

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
README = os.path.join(ROOT, "README.md")


def _readme() -> str:
    with open(README) as f:
        return f.read()


def test_the_readme_python_example_runs_as_written():
    blocks = re.findall(r"```python\n(.*?)```", _readme(), flags=re.S)
    assert len(blocks) == 1
    printed = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    out, batch, tokenizer = scope["out"], scope["batch"], scope["tokenizer"]
    assert out.shape[0] == 2 and out.shape[1] > batch.input_ids.shape[1]
    assert (batch.attention_mask[:, -1] == 1).all()  # left padding, as load_tokenizer promises
    texts = eval(printed.getvalue())  # noqa: S307 - the list the example printed
    assert texts == tokenizer.batch_decode(out[:, batch.input_ids.shape[1] :], skip_special_tokens=True)


def test_the_readme_results_table_is_the_one_results_table_makes():
    text = _readme()
    assert text.count(results_table.BEGIN) == 1 and text.count(results_table.END) == 1
    region = text.split(results_table.BEGIN, 1)[1].split(results_table.END, 1)[0]
    expected = results_table.render(os.path.join(ROOT, "results", "h200"), relative_to=ROOT)
    assert region == "\n" + expected, (
        "the README's table differs from results/h200: run python3 -m "
        "overlapdecode.bench.report.results_table results/h200 --readme README.md"
    )


def test_the_results_index_lists_every_results_folder_by_topic(tmp_path):
    with open(os.path.join(ROOT, "results", "README.md")) as f:
        assert f.read() == results_index.render(os.path.join(ROOT, "results")), (
            "results/README.md differs from results/: run python3 -m "
            "overlapdecode.bench.report.results_table results/h200 --index results/README.md"
        )
    assert results_index.topic("llama-8b-tp2-fused") == "Tensor parallelism (two GPUs)"
    assert results_index.topic("llama-1b-scale-rows") == "Many rows and long prompts"
    assert results_index.topic("gpt2-presets-sweep") == "Presets end to end"
    assert results_index.topic("qwen3-moe-fused-b1") == "Presets end to end"
    assert results_index.topic("olmo2-1b-unlike-any-rule") == results_index.OTHER
    # the command writes a new index, rewrites its own, and leaves a file it did not make alone
    gpu = tmp_path / "results" / "h200"
    (gpu / "gpt2-scale-rows").mkdir(parents=True)
    (gpu / "gpt2-scale-rows" / "README.md").write_text("# GPT-2 over rows\n")
    index = tmp_path / "results" / "README.md"
    results_table.write_index(str(index), str(tmp_path / "results"))
    assert "- [gpt2-scale-rows](h200/gpt2-scale-rows/): GPT-2 over rows" in index.read_text()
    results_table.write_index(str(index), str(tmp_path / "results"))
    index.write_text("# my notes\n")
    with pytest.raises(results_table.ResultsError, match="not an index"):
        results_table.write_index(str(index), str(tmp_path / "results"))
    assert index.read_text() == "# my notes\n"


def test_the_readme_names_the_test_commands_ci_and_the_skip_reason_run():
    text = " ".join(_readme().split())
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert "python3 -m pytest -q -n auto tests" in ci and "```bash python3 -m pytest -q -n auto tests ```" in text
    with open(os.path.join(ROOT, "tests", "conftest.py")) as f:
        reason = re.search(r'reason="needs a CUDA GPU \(on a CUDA machine: ([^)]*)\)"', f.read()).group(1)
    assert f"`{reason}`" in text
    assert "`bash scripts/gpu_tests.sh --out DIR`" in text


def _markdown_files() -> list[str]:
    found = []
    for top in ("README.md", "CHANGELOG.md", "docs", "results"):
        path = os.path.join(ROOT, top)
        if os.path.isfile(path):
            found.append(path)
        for base, _dirs, files in os.walk(path):
            found += [os.path.join(base, f) for f in files if f.endswith(".md")]
    return found


def test_every_relative_link_of_the_markdown_files_exists():
    files = _markdown_files()
    assert README in files and os.path.join(ROOT, "docs", "BENCHMARKING.md") in files
    broken = []
    for path in files:
        with open(path) as f:
            text = f.read()
        inline = re.findall(r"\]\(([^)\s]+)\)", text)
        for target in inline + re.findall(r"^\[[^\]]+\]: (\S+)", text, flags=re.M):  # and reference-style links
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            if not os.path.exists(os.path.join(os.path.dirname(path), target.split("#")[0])):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert broken == []


def _resolver(tmp_path, pip_says: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """.ci/run's newest-transformers lines, run alone with a stand-in `python3` whose `pip index` prints
    `pip_says` and whose `pip download` fails (no network in a test)."""
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    start = ci.index("newest_transformers() {")
    end = ci.index('echo "== the newest transformers 5.x: $NEWEST_TRANSFORMERS"')
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(f'#!/bin/sh\n[ "$3" = index ] && printf "%s\\n" {shlex.quote(pip_says)} && exit 0\nexit 1\n')
    fake.chmod(0o755)
    script = "set -euo pipefail\n" + ci[start:end] + 'echo "$NEWEST_TRANSFORMERS"\n'
    path = f"{fake.parent}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=dict(env or {}, PATH=path), timeout=60
    )


def test_ci_reads_the_newest_transformers_5_when_it_runs(tmp_path):
    """.ci/run called a fixed 5.24.0 "the newest" while 5.25.0 was out; now it reads PyPI's list when it runs."""
    listed = "transformers (6.0.0)\nAvailable versions: 6.0.0, 5.30.1, 5.30.0, 5.29.0, 5.17.0"
    done = _resolver(tmp_path, listed)
    assert done.returncode == 0 and done.stdout.strip() == "5.30.1", done
    named = _resolver(tmp_path, listed, {"NEWEST_TRANSFORMERS": "5.20.0"})  # named instead of read
    assert named.returncode == 0 and named.stdout.strip() == "5.20.0", named
    unread = _resolver(tmp_path, "ERROR: no network")
    assert unread.returncode == 1 and "set NEWEST_TRANSFORMERS=X.Y.Z" in unread.stderr, unread
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        ci = f.read()
    assert re.search(r'for version in .*5\.17\.0 "\$NEWEST_TRANSFORMERS"', ci)  # both are tested
    assert not re.search(r"NEWEST_TRANSFORMERS:-5\.", ci)  # no fixed "newest" version


def test_the_readme_says_how_to_install_on_cpu_and_which_transformers_ci_tests():
    """The literal install on a CPU machine fetched the 5.8 GB CUDA build of torch: the README gives the CPU line,
    the CPU build first, then the package."""
    install = _readme().split("## Install", 1)[1].split("\n## ", 1)[0]
    commands = [
        line.split("#")[0].strip() for line in re.findall(r"```bash\n(.*?)```", install, flags=re.S)[0].split("\n")
    ]
    cpu = commands.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert "pip install -e ." in commands[:cpu] and "pip install -e ." in commands[cpu + 1 :]  # CUDA line; CPU line
    assert "transformers 5.17.0 and the newest 5.x release" in " ".join(install.split())


def test_the_readme_is_at_most_200_lines_of_at_most_120_characters():
    """It was 251 lines, with lines of up to 377 characters (the table's among them)."""
    lines = _readme().split("\n")
    assert len(_readme().splitlines()) <= 200
    assert [(i + 1, len(line)) for i, line in enumerate(lines) if len(line) > 120] == []


EMBEDDED_NAME = re.compile(r"`((?:[a-z0-9.]+-)+random|tiny-[a-z0-9]+)`")


def test_the_readme_lists_the_embedded_models_of_the_code():
    """The README once named 16 embedded models, `generate --help` 10 and od.EMBEDDED 20: one list now."""
    from overlapdecode.models.embedded import EMBEDDED, EMBEDDED_MODELS

    text = _readme()
    paragraph = " ".join(text.split("Embedded models (", 1)[1].split("\n\n", 1)[0].split())
    assert EMBEDDED_NAME.findall(paragraph) == list(EMBEDDED)
    for name, what in EMBEDDED_MODELS.items():
        assert f"`{name}` ({what})" in paragraph or name.startswith("tiny-"), name
    assert set(EMBEDDED_NAME.findall(text)) <= set(EMBEDDED)  # no name elsewhere that the code does not have


# developer terms the README once used before saying what they are: now each is explained where first used, or
# left to docs/
UNEXPLAINED = ("toll", "ping-pong", "epilogue", "flash-decoding", "MMA", "TTFT")
EXPLAINED = {"MBU": "MBU (model-bandwidth utilisation", "CUDA graph": "CUDA graph (a recorded sequence of GPU kernels"}


def test_the_readme_explains_each_term_where_it_first_uses_it():
    text = " ".join(_readme().split())
    for term in UNEXPLAINED:
        assert not re.search(rf"\b{re.escape(term)}\b", text), term
    for term, explained in EXPLAINED.items():
        assert text.index(term) == text.index(explained), term


def test_the_readme_says_which_preset_to_use_before_its_table():
    text = _readme()
    advice = text.split("## Which preset to use", 1)[1]
    assert advice.index("- **CPU**: `kv`") < advice.index(results_table.BEGIN)  # it sat below a 13-column table
    assert "## Install" in text and text.index("## Install") < text.index("## Quick start") < text.index("## Tests")
