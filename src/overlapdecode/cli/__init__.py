"""The `overlapdecode` command: commands.py builds the parser and runs `generate`, bench.py the `bench`, `profile`
and `report` commands; args.py holds the flag helpers they share. None imports torch: `--help` stays fast."""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
