"""Command-line helpers shared by `overlapdecode generate` (commands.py) and the bench commands (bench.py).

A leaf module that imports neither torch nor transformers, so that building the parser (and `--help`)
stays fast: the strategy names come from strategy.py (which imports nothing heavy), the dtype names are
spelled here and a test checks them against `models.parse_dtype` so that they cannot drift.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap

from ..strategy import LAGGED, LAGGED_TEXT, PRESETS, VARIANTS

PRESET_NAMES = tuple(PRESETS)
VARIANT_NAMES = tuple(VARIANTS)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
QUANT_NAMES = ("int4", "int8", "fp8")  # quant.SCHEMES (a test keeps them equal)
QUANTIZE_HELP = (
    "quantize the weights of every linear layer and the LM head: int4 (per row and group of --group-size input "
    "features, asymmetric), int8 or fp8 e4m3 (per row, symmetric); docs/QUANTIZATION.md (default: none, the weights as "
    "loaded)"
)
GROUP_SIZE_HELP = "input features per int4 scale and zero point, with --quantize int4 (default: 128)"

STRATEGY_HELP = (
    f"presets: {', '.join(PRESET_NAMES)}; variants: {', '.join(VARIANT_NAMES)}; "
    f"NAME:K reads the stop flag K steps late ({', '.join(LAGGED)} only, e.g. interleaved:2)"
)


class CliError(Exception):
    """A user error to print as one line (exit status 2)."""


class Interrupted(CliError):
    """Ctrl-C or SIGTERM, with what became of the work done so far: one line, exit status 130 or 143 (as a shell
    reports each: 128 + the signal's number)."""

    def __init__(self, message: str, reason: str = "Ctrl-C"):
        super().__init__(message)
        self.reason = reason
        self.status = 143 if reason == "SIGTERM" else 130


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help, unless the help already says its default (a None default
    means "chosen at run time", which the help text explains) or the flag is a switch; wraps lines between
    words, never inside a hyphenated name."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default is False and action.option_strings and "default" not in text:
            return f"{text} (default: off)"
        if (
            action.default is None
            or action.default is argparse.SUPPRESS
            or "default" in text
            or not action.option_strings
            or action.nargs == 0
        ):
            return text
        return f"{text} (default: %(default)s)"

    def _split_lines(self, text, width):
        # whole names only: a model or preset name such as gemma3-1b-random is never cut at its hyphens
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line (no usage block) and exit status 2; every flag's help shows
    its default."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def ints(text: str, flag: str) -> list[int]:
    """'1,2, 3' -> [1, 2, 3]; anything else is a CliError naming `flag`."""
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise CliError(f"{flag} takes comma-separated integers, got {text!r}") from None


def names(text: str) -> list[str]:
    """'a, b,,c' -> ['a', 'b', 'c']."""
    return [x.strip() for x in text.split(",") if x.strip()]


def lag_beyond(flag: str, strategy: str, limit: str) -> CliError:
    """The one line for a `NAME:K` whose lag K is beyond the new tokens (`limit` says which, as a phrase)."""
    return CliError(
        f"{flag} {strategy}: a lag of {lag_of(strategy)} is beyond {limit} (NAME:K, for {LAGGED_TEXT}, takes K "
        f"from 1 to the number of new tokens)"
    )


def lag_of(strategy: str) -> int:
    """The K of `NAME:K` (0 without one); the name itself is checked by decode.resolve_strategy."""
    _, _, k = strategy.partition(":")
    return int(k) if k.isdigit() else 0


def cannot_load(model: str, err: Exception, flag: str = "--model") -> str:
    """The one line for a --model (or `flag`) that from_pretrained could not load (no such hub name, offline, not a
    model directory...): its kind, and the first line of the error."""
    from ..models.embedded import EMBEDDED
    from ..models.loading import looks_like_path  # torch: imported when a command runs, not for --help

    what = (
        "directory"
        if looks_like_path(model) or os.path.isdir(os.path.expanduser(model))
        else ("embedded model" if model in EMBEDDED else "hub name")
    )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{flag} {model}: cannot load this {what} ({type(err).__name__}: {first})"


def check_model_flag(model: str, flag: str = "--model"):
    """--model (or `flag`) before any work: an embedded name (None), or a directory or hub name whose config loads
    and is a decoder-only causal LM (the config); anything else is a CliError naming the flag. A hub name that is
    not cached while the hub cannot be reached fails at once (models.pretrained_config)."""
    from ..inputs import NotCausalLM  # torch: imported when a command runs, not for --help
    from ..models.embedded import EMBEDDED
    from ..models.loading import check_model_path, pretrained_config

    try:
        check_model_path(model)
    except (ValueError, TypeError) as err:
        raise CliError(f"{flag}: {err}") from None
    if model in EMBEDDED:
        return None
    try:
        return pretrained_config(model, what=f"{flag} {model}")
    except NotCausalLM as err:
        raise CliError(str(err)) from None
    except Exception as err:  # from_pretrained's own errors: no such hub name, offline, not a model directory...
        raise CliError(cannot_load(model, err, flag)) from None


def add_quantize_flags(parser) -> None:
    """--quantize and --group-size, as generate and bench take them."""
    parser.add_argument("--quantize", choices=QUANT_NAMES, default=None, help=QUANTIZE_HELP)
    parser.add_argument("--group-size", type=int, default=None, help=GROUP_SIZE_HELP)


def check_quantize_flags(args, config) -> int:
    """--quantize and --group-size against each other and the model (`config`: check_model_flag's, None for an
    embedded name), before anything is loaded; the group size to load with."""
    if args.group_size is not None and args.quantize != "int4":
        raise CliError("--group-size applies to --quantize int4 only")
    group_size = 128 if args.group_size is None else args.group_size
    if args.quantize is None:
        return group_size
    if getattr(config, "quantization_config", None) is not None:
        raise CliError(
            f"--quantize: {args.model} is quantized already (its config has a quantization_config); load it "
            f"without --quantize"
        )
    from ..models.loading import embedded_config  # torch: imported when a command runs, not for --help
    from ..quant.model import check_config, check_scheme

    try:
        check_scheme(args.quantize, group_size, name="--quantize")
        check_config(config if config is not None else embedded_config(args.model), "--quantize")
    except ValueError as err:
        text = str(err)
        raise CliError(text if text.startswith("--") else f"--{text.replace('_', '-', 1)}") from None
    return group_size


def writable_dir(path: str, flag: str) -> str:
    """`path` as an output directory, made now if missing and probed with a file, so that a long run never
    fails at its end (and so that a check of permission bits, which root ignores, is not all we rely on)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"{flag} {path}: is a file, not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise CliError(f"{flag} {path}: not a writable directory ({err.strerror or err})") from None
    return path


def writable_file(path: str, flag: str) -> str:
    """`path` as an output file: its directory must exist and be writable, and it must not be a directory."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CliError(f"{flag} {path}: is a directory, not a file")
    if not os.path.isdir(parent):
        raise CliError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise CliError(f"{flag} {path}: not writable")
    return path
