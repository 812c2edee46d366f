"""The `overlapdecode` command: commands.py builds the parser and runs `generate` (the bench's commands come
from bench/cli.py); args.py holds the flag helpers they share. Neither imports torch: `--help` stays fast."""

from .commands import build_parser, main

__all__ = ["build_parser", "main"]
