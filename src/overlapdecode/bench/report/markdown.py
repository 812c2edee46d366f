"""Markdown pieces the reports share: a number or "-", and a table."""

from __future__ import annotations


def fmt(v, form="{:.2f}", none="-") -> str:
    """`v` formatted, or `none` for a missing figure."""
    return none if v is None else form.format(v)


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
