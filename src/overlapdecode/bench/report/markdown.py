"""Markdown pieces the reports share: a number, "-" or words such as "within noise", a row's strategy as the
tables name it, and a table."""

from __future__ import annotations


def fmt(v, form="{:.2f}", none="-") -> str:
    """`v` formatted, `none` for a missing figure, or `v` itself where it is words (figures.WITHIN_NOISE)."""
    return none if v is None else v if isinstance(v, str) else form.format(v)


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def label(row: dict) -> str:
    """A row's strategy as a table shows it: an `hf-compiled` row that did not compile says it ran eager."""
    name = row["strategy"]
    return f"{name} (eager on CPU)" if name == "hf-compiled" and row.get("compiled") is False else name
