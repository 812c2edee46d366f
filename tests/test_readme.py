"""The README's Python example runs as written (here on CPU), and the README agrees with the test setup."""

from __future__ import annotations

import contextlib
import io
import os
import re

README = os.path.join(os.path.dirname(__file__), "..", "README.md")


def _python_blocks() -> list[str]:
    with open(README) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)


def test_the_readme_python_example_runs_as_written():
    blocks = _python_blocks()
    assert len(blocks) == 1
    printed = io.StringIO()
    scope: dict = {}
    with contextlib.redirect_stdout(printed):
        exec(compile(blocks[0], "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    out, batch, tokenizer = scope["out"], scope["batch"], scope["tokenizer"]
    assert out.shape[0] == 2 and out.shape[1] > batch.input_ids.shape[1]
    texts = eval(printed.getvalue())  # noqa: S307 - the list the example printed
    assert texts == tokenizer.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)


def test_the_readme_names_the_gpu_test_command_of_the_skip_reason():
    with open(os.path.join(os.path.dirname(__file__), "conftest.py")) as f:
        reason = re.search(r'reason="needs a CUDA GPU \(on a CUDA machine: ([^)]*)\)"', f.read()).group(1)
    with open(README) as f:
        text = " ".join(f.read().split())
    assert f"`{reason}`" in text
    assert "TESTS_TIME" not in text  # the measured duration is filled in
