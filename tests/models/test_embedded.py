"""One list of embedded models (embedded.py): `od.EMBEDDED`, what models.py builds, `generate --help` and the
errors that list them all say the same names. The README's list is checked in test_readme.py."""

from __future__ import annotations

import re

import pytest

import overlapdecode as od
from overlapdecode.models.embedded import EMBEDDED, EMBEDDED_MODELS

NAME = re.compile(r"\b(?:[a-z0-9.]+-)+random\b|\btiny-[a-z0-9]+\b")


def _model_help(columns: int, monkeypatch) -> str:
    from overlapdecode.cli import build_parser

    monkeypatch.setenv("COLUMNS", str(columns))
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    text = sub.choices["generate"].format_help()
    return text.split("\n  --model MODEL", 1)[1].split("\n  --", 1)[0]


def test_the_library_and_models_py_use_the_one_list():
    assert od.EMBEDDED is EMBEDDED and tuple(EMBEDDED_MODELS) == EMBEDDED and len(set(EMBEDDED)) == len(EMBEDDED)
    from overlapdecode.models.loading import embedded_config

    for name in EMBEDDED:  # every listed name is built...
        assert embedded_config(name) is not None, name
    with pytest.raises(ValueError) as err:  # ...and the error for another one lists them all
        embedded_config("gpt3-random")
    assert NAME.findall(str(err.value).split("embedded models are", 1)[1]) == list(EMBEDDED)


@pytest.mark.parametrize("columns", [60, 80, 200])
def test_generate_help_lists_every_embedded_model_whole(columns, monkeypatch):
    """The help named 10 of 20 models; a wrap at a hyphen would cut a name such as gemma3-1b-random."""
    found = NAME.findall(_model_help(columns, monkeypatch).split("(default:", 1)[0])
    assert found == list(EMBEDDED)


def test_a_missing_path_names_every_embedded_model():
    from overlapdecode.models.loading import check_model_path

    with pytest.raises(ValueError, match="does not exist") as err:
        check_model_path("./no-such-model-dir")
    assert NAME.findall(str(err.value).split("one of", 1)[1]) == list(EMBEDDED)
