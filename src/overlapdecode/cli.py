"""Command line: `overlapdecode bench | profile | generate | report`.

Flags map by keyword onto the library's arguments; a bad flag or value ends in one line on stderr and
exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_MODEL = "gpt2-random"


class CliError(Exception):
    """A user error to print as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag ends in one line (no usage block) and exit status 2."""

    def error(self, message):
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip() != ""]
    except ValueError:
        raise CliError(f"{flag} takes comma-separated integers, got {text!r}") from None


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate tokens, printed as they come")
    p.add_argument("--model", default=DEFAULT_MODEL, help="hub name, local directory, or gpt2-random|tiny-gpt2|tiny-llama")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs a model with a tokenizer)")
    src.add_argument("--prompt-ids", help="prompt token ids, e.g. 464,2068,7586")
    p.add_argument("--strategy", default="interleaved")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default=None)
    p.add_argument("--eos", default=None, help="EOS ids (comma-separated), 'none' to never stop early")
    p.add_argument("--do-sample", action="store_true")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)


def cmd_generate(args) -> int:
    import torch

    from .decode import generate
    from .models import load_model, load_tokenizer

    model = load_model(args.model, dtype=args.dtype, device=args.device)
    tokenizer = load_tokenizer(args.model) if not getattr(model, "_overlapdecode_random", False) else None
    device = next(model.parameters()).device
    if args.prompt is not None:
        if tokenizer is None:
            raise CliError(f"--prompt needs a tokenizer and {args.model} has none; use --prompt-ids")
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    else:
        ids = torch.tensor([_ints(args.prompt_ids, "--prompt-ids")], dtype=torch.long)
    eos = None if args.eos is None else ([] if args.eos == "none" else _ints(args.eos, "--eos"))

    out = sys.stdout
    if tokenizer is None:
        if getattr(model, "_overlapdecode_random", False):
            print(f"note: {args.model} has random weights and no tokenizer: the ids below are meaningless")
        print("ids:", end="", flush=True)

        def streamer(tokens):
            out.write(f" {int(tokens[0])}")
            out.flush()
    else:
        seen: list[int] = []
        printed = [""]

        def streamer(tokens):
            seen.append(int(tokens[0]))
            text = tokenizer.decode(seen, skip_special_tokens=True)
            out.write(text[len(printed[0]) :])  # decode the whole tail: multi-token characters print whole
            out.flush()
            printed[0] = text

        out.write(args.prompt or "")
    result = generate(
        model,
        ids.to(device),
        max_new_tokens=args.max_new_tokens,
        strategy=args.strategy,
        eos_token_id=eos,
        do_sample=args.do_sample,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        streamer=streamer,
    )
    print(f"\n[{result.shape[1] - ids.shape[1]} new tokens, strategy {args.strategy}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="overlapdecode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    from .bench import cli as bench_cli

    bench_cli.add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)  # a bad flag: one line on stderr, exit 2
    args.argv = argv
    handlers = {"generate": cmd_generate}
    from .bench import cli as bench_cli

    handlers.update(bench_cli.HANDLERS)
    try:
        return handlers[args.command](args)
    except (CliError, ValueError, TypeError) as err:
        print(f"overlapdecode {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
