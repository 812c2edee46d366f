"""The `overlapdecode` command: main.py builds the parser and runs `generate`; args.py holds the flag helpers
shared with `overlapdecode bench` (no torch: `--help` stays fast)."""
