"""Command line: `overlapdecode bench | profile | generate | report`.

Flags map by keyword onto the library's arguments; a bad flag or value ends in one line on stderr and
exit status 2, never a traceback. Building the parser imports no torch (args.py and bench.py import
it inside the command functions), so `overlapdecode --help` answers at once.
"""

from __future__ import annotations

import sys
import warnings

from ..models.embedded import EMBEDDED, embedded_list
from . import bench as bench_cli
from .args import (
    DTYPE_NAMES,
    STRATEGY_HELP,
    CliError,
    Interrupted,
    OneLineParser,
    add_quantize_flags,
    cannot_load,
    check_model_flag,
    check_quantize_flags,
    ints,
    lag_beyond,
    lag_of,
)

DEFAULT_MODEL = "gpt2-random"
# generate's strategy without --strategy, by the device's type (the library's own default is interleaved)
DEFAULT_STRATEGY = {"cuda": "interleaved", "cpu": "kv"}
# the same with --prompt-lookup or --assistant (every preset but baseline speculates: spec/options.py SPEC_PRESETS)
DEFAULT_SPEC_STRATEGY = {"cuda": "static", "cpu": "kv"}


def _add_generate(sub):
    p = sub.add_parser("generate", help="generate tokens (or text) from a prompt, printed as they come")
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"hub name, local directory, or an embedded random-weight model: {embedded_list()}",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt",
        help="prompt text (through the model's tokenizer; embedded models use a byte-level "
        "one, and their random weights give random text); this or --prompt-ids is "
        "required",
    )
    src.add_argument(
        "--prompt-ids", help="prompt token ids, comma-separated, e.g. 464,2068,7586; this or --prompt is required"
    )
    p.add_argument(
        "--strategy",
        default=None,
        help=f"{STRATEGY_HELP} (default: {DEFAULT_STRATEGY['cuda']} on CUDA, {DEFAULT_STRATEGY['cpu']} on CPU, "
        f"where compiling the step, as {DEFAULT_STRATEGY['cuda']} does, costs more time than it saves)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="the most tokens to generate after the prompt")
    p.add_argument("--dtype", default="float32", help=f"weights dtype: {', '.join(DTYPE_NAMES)}")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if available, else cpu)")
    p.add_argument(
        "--eos", default=None, help="EOS ids, comma-separated, or 'none' to never stop early (default: the model's)"
    )
    choice = p.add_mutually_exclusive_group()
    choice.add_argument(
        "--do-sample",
        action="store_true",
        default=None,
        help="sample instead of greedy (default: as the model's generation config says, else greedy)",
    )
    choice.add_argument(
        "--greedy",
        dest="do_sample",
        action="store_false",
        help="greedy, whatever the model's generation config says (default: off, the config decides)",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (> 0; default: the model's generation config's, else 1)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="sample among the k most likely tokens (0: all tokens; default: the model's generation config's, "
        "else 50, as Hugging Face does)",
    )
    p.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample among the most likely tokens of total probability p (default: the model's generation "
        "config's, else 1, all)",
    )
    p.add_argument(
        "--min-p",
        type=float,
        default=None,
        help="sample among the tokens at least p times as likely as the most likely one (default: the model's "
        "generation config's, else all)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=None,
        help="divide (or, if negative, multiply) the logit of every token already in the row by this "
        "factor, greedy or sampled, as Hugging Face does (default: none)",
    )
    p.add_argument("--seed", type=int, default=None, help="sampling seed, 0 <= seed < 2**64 (default: random)")
    spec = p.add_mutually_exclusive_group()
    spec.add_argument(
        "--prompt-lookup",
        type=int,
        default=None,
        metavar="K",
        help="speculative decoding: draft K tokens a round by n-gram lookup in the row's own tokens, verify them in "
        "one step (the same greedy tokens, the same sampling distribution; every strategy but baseline; "
        "docs/SPECULATIVE.md) (default: off)",
    )
    spec.add_argument(
        "--assistant",
        default=None,
        metavar="MODEL",
        help="speculative decoding with this draft model (as --model; the same vocabulary), loaded with --dtype "
        "and --device (default: none)",
    )
    p.add_argument(
        "--num-assistant-tokens",
        type=int,
        default=None,
        metavar="K",
        help="tokens the --assistant drafts a round (default: the model's generation config's, else 20, as "
        "Hugging Face does)",
    )
    add_quantize_flags(p)


def default_strategy(device: str | None, speculative: bool = False) -> str:
    """The strategy of `generate` without --strategy on `device` (the --device flag; None: CUDA if available);
    `speculative`: with --prompt-lookup or --assistant."""
    from ..models.loading import check_device  # torch: imported when the command runs, not for --help

    try:
        kind = check_device(device).type
    except (ValueError, TypeError) as err:
        raise CliError(f"--device: {err}") from None
    return (DEFAULT_SPEC_STRATEGY if speculative else DEFAULT_STRATEGY)["cuda" if kind == "cuda" else "cpu"]


def _check_speculation_flags(args) -> None:
    """--prompt-lookup, --assistant and --num-assistant-tokens, and the strategy they need, before any loading."""
    from ..spec.options import check_spec_strategy
    from ..strategy import resolve_strategy

    for flag, value in (("--prompt-lookup", args.prompt_lookup), ("--num-assistant-tokens", args.num_assistant_tokens)):
        if value is not None and value < 1:
            raise CliError(f"{flag} must be >= 1 (the tokens drafted each round), got {value}")
    if args.num_assistant_tokens is not None and args.assistant is None:
        raise CliError("--num-assistant-tokens is given without --assistant: it counts the draft model's tokens")
    if args.prompt_lookup is not None or args.assistant is not None:
        what = "prompt_lookup_num_tokens" if args.assistant is None else "assistant_model"
        try:
            check_spec_strategy(resolve_strategy(args.strategy), repr(args.strategy), what)
        except ValueError as err:
            raise _as_flag_error(err, args) from None


def _check_before_loading(args) -> None:
    """The strategy and sampling flags, named by flag, before the model is loaded: a real-size model takes a
    minute and gigabytes to build, which a misspelt strategy or a zero temperature must not cost."""
    from ..sampling import check_sampling
    from ..strategy import resolve_strategy

    try:
        resolve_strategy(args.strategy)
    except ValueError as err:
        raise CliError(f"--strategy: {err}") from None
    try:
        with warnings.catch_warnings():  # greedy's "ignored" warning: generate() itself gives it, once
            warnings.simplefilter("ignore", UserWarning)
            check_sampling(
                bool(args.do_sample),  # unset: checked as greedy here; generate() checks what the model's config says
                args.temperature,
                args.top_k,
                args.top_p,
                args.seed,
                args.min_p,
                args.repetition_penalty,
            )
    except (ValueError, TypeError) as err:  # each message starts with the argument's name, e.g. "top_k must..."
        raise CliError(f"--{str(err).split()[0].replace('_', '-')}: {err}") from None


def _as_flag_error(err: Exception, args) -> CliError:
    """A library error of generate() as one line naming the flag: every message starts with the argument's
    name ("input_ids holds...", "strategy: ..."), which maps onto the flag it came from."""
    text = " ".join(str(err).split())
    prompt = "--prompt-ids" if args.prompt_ids is not None else "--prompt"
    flags = (
        ("prompt length", f"{prompt} and --max-new-tokens"),
        ("input_ids", prompt),
        ("attention_mask", prompt),
        ("eos_token_id", "--eos"),
        ("pad_token_id", "--eos"),
        ("max_new_tokens", "--max-new-tokens"),
        ("strategy", "--strategy"),
        ("model", "--model"),
        ("do_sample", "--do-sample"),
        ("temperature", "--temperature"),
        ("top_k", "--top-k"),
        ("top_p", "--top-p"),
        ("min_p", "--min-p"),
        ("repetition_penalty", "--repetition-penalty"),
        ("seed", "--seed"),
        ("prompt_lookup_num_tokens", "--prompt-lookup"),
        ("num_assistant_tokens", "--num-assistant-tokens"),
        ("assistant_model", "--assistant"),
    )
    for name, flag in flags:
        if text.startswith(name):
            return CliError(f"{flag}: {text.removeprefix(name + ': ')}")
    return CliError(text)


def _check_fused_family(args, config) -> None:
    """--strategy fused for a model family the fused path lacks, from the config (`config`: None for an embedded
    name), before the weights are loaded; its other checks need the weights, and generate makes them."""
    from types import SimpleNamespace

    from ..fused.layout import model_family  # no Triton: the family names and the re-layout only
    from ..models.loading import embedded_config
    from ..strategy import resolve_strategy

    if resolve_strategy(args.strategy).cache != "fused":
        return
    config = embedded_config(args.model) if config is None else config
    try:
        model_family(SimpleNamespace(config=config), name=(getattr(config, "architectures", None) or ["its config"])[0])
    except ValueError as err:
        raise _as_flag_error(err, args) from None


def _load(args):
    """The model and its tokenizer (None if it has none or it does not load: args.no_tokenizer says why), every
    failure named by its flag."""
    from ..models.loading import check_device, load_model, load_tokenizer, parse_dtype  # imported here: fast --help

    config = check_model_flag(args.model)
    _check_fused_family(args, config)
    for flag, check, value in (("--dtype", parse_dtype, args.dtype), ("--device", check_device, args.device)):
        try:
            check(value)
        except (ValueError, TypeError) as err:
            raise CliError(f"{flag}: {err}") from None
    group_size = check_quantize_flags(args, config)
    try:
        model = load_model(
            args.model, dtype=args.dtype, device=args.device, quantize=args.quantize, group_size=group_size
        )
    except Exception as err:  # from_pretrained's own errors (no such hub name, offline, a broken directory...)
        raise CliError(cannot_load(args.model, err)) from None
    try:
        tokenizer = load_tokenizer(args.model)
    except Exception as err:  # a model loaded but its tokenizer did not: ids still work, --prompt says why not
        tokenizer = None
        args.no_tokenizer = " ".join(str(err).split("\n", 1)[0].split())
    return model, tokenizer


def cmd_generate(args) -> int:
    import torch  # imported here: fast --help

    from ..decode import generate
    from ..inputs import model_limits
    from ..models.tokenizer import readable

    if args.max_new_tokens < 1:
        raise CliError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.strategy is None:
        args.strategy = default_strategy(args.device, args.prompt_lookup is not None or args.assistant is not None)
    if lag_of(args.strategy) > args.max_new_tokens:
        raise lag_beyond("--strategy", args.strategy, f"--max-new-tokens {args.max_new_tokens}")
    prompt_ids = ints(args.prompt_ids, "--prompt-ids") if args.prompt_ids is not None else None
    if prompt_ids is not None and not prompt_ids:
        raise CliError("--prompt-ids needs at least one id")
    if args.prompt is not None and not args.prompt:
        raise CliError("--prompt is empty: give at least one character")
    eos = None if args.eos is None else ([] if args.eos == "none" else ints(args.eos, "--eos"))
    if eos == [] and args.eos != "none":  # an empty --eos "$EOS" must not silently mean "never stop early"
        raise CliError(f"--eos {args.eos!r} names no id: give ids such as 2,3, or 'none' to never stop early")
    _check_before_loading(args)
    _check_speculation_flags(args)
    model, tokenizer = _load(args)
    assistant = _load_assistant(args) if args.assistant is not None else None
    device = next(model.parameters()).device
    if args.prompt is not None:
        if tokenizer is None:
            why = getattr(args, "no_tokenizer", f"{args.model} has none")
            raise CliError(f"--prompt needs a tokenizer: {why}; use --prompt-ids")
        ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    else:
        vocab, _ = model_limits(model)
        if not all(0 <= i < vocab for i in prompt_ids):  # also those no int64 holds, which torch.tensor refuses
            raise CliError(
                f"--prompt-ids: input_ids holds ids in [{min(prompt_ids)}, {max(prompt_ids)}], outside the "
                f"vocabulary [0, {vocab})"
            )
        ids = torch.tensor([prompt_ids], dtype=torch.long)

    # Nothing is printed before the call is known to start: generate checks every argument first, and a
    # bad one must not leave a dangling partial line on stdout. The header goes out with the first token.
    out = sys.stdout
    started = [False]
    if args.prompt is None:
        header = "ids:"
        if args.model in EMBEDDED:
            header = f"note: {args.model} has random weights: the ids below are meaningless\n" + header
    else:
        header = args.prompt
        if args.model in EMBEDDED:
            header = (
                f"note: {args.model} has random weights: the text below is random bytes, <id> for an id that "
                f"is no byte\n" + header
            )
    prompt_list = ids[0].tolist()
    generated: list[int] = []
    shown = [readable(tokenizer, prompt_list) if tokenizer is not None else ""]

    def streamer(tokens):
        if not started[0]:
            out.write(header)
            started[0] = True
        token = int(tokens[0])
        if args.prompt is None:
            out.write(f" {token}")  # one space between ids
        else:
            # Decode prompt and tokens together and print what is new: the tokenizer decides the spacing
            # between the prompt and the first token (a word-level one puts a space there, bytes do not),
            # and a character cut over several tokens prints whole once complete. An id the tokenizer
            # cannot decode shows as <id>: a random model's text is mostly those, and none may vanish.
            generated.append(token)
            text = readable(tokenizer, prompt_list + generated)
            out.write(text[len(shown[0]) :] if text.startswith(shown[0]) else "")
            shown[0] = text if text.startswith(shown[0]) else shown[0]
        out.flush()

    try:
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
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            seed=args.seed,
            streamer=streamer,
            prompt_lookup_num_tokens=args.prompt_lookup,
            assistant_model=assistant,
            num_assistant_tokens=args.num_assistant_tokens,
        )
    except KeyboardInterrupt:
        if started[0]:
            out.write("\n")  # end the line being streamed before the one-line notice on stderr
            out.flush()
        raise
    except (ValueError, TypeError) as err:  # generate checks every argument before the first step
        raise _as_flag_error(err, args) from None
    print(f"\n[{result.shape[1] - ids.shape[1]} new tokens, strategy {args.strategy}{_spec_summary(args, model)}]")
    return 0


def _load_assistant(args):
    """The --assistant draft model, loaded as --model is (its --dtype and --device), every failure named by the flag."""
    from ..models.loading import load_model  # imported here: fast --help

    check_model_flag(args.assistant, "--assistant")
    try:
        return load_model(args.assistant, dtype=args.dtype, device=args.device)
    except Exception as err:  # from_pretrained's own errors
        raise CliError(cannot_load(args.assistant, err, "--assistant")) from None


def _spec_summary(args, model) -> str:
    """', prompt lookup K=4: 30 of 36 drafts accepted in 9 rounds' after a speculative call, else ''."""
    if args.prompt_lookup is None and args.assistant is None:
        return ""
    from ..decode import decoder_for

    stats = decoder_for(model).last_speculation
    offered, accepted = (sum(map(sum, rows)) for rows in (stats.drafted, stats.accepted))
    kind = "prompt lookup" if args.assistant is None else f"assistant {args.assistant}"
    return f", {kind} K={stats.k}: {accepted} of {offered} drafts accepted in {stats.rounds} rounds"


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="overlapdecode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    _add_generate(sub)
    bench_cli.add_commands(sub)
    parser.commands = sub.choices  # name -> its parser: a flag it does not know points at its own --help
    return parser


def _unrecognized(extra: list[str], parser) -> str:
    """argparse's "unrecognized arguments", with the subcommand's flag nearest to the first unknown one."""
    import difflib

    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    text = f"unrecognized arguments: {' '.join(extra)}"
    for e in extra:
        if e.startswith("--"):
            near = difflib.get_close_matches(e.split("=", 1)[0].replace("_", "-"), flags, n=1, cutoff=0.8)
            if near:
                return f"{text}; did you mean {near[0]}?"
    return text


def _one_line_warning(command: str):
    """A `warnings.showwarning` for the command line: one line on stderr, `overlapdecode COMMAND: warning: ...`,
    without Python's file, line number and source line; the ignored sampling values are named by their flags."""

    def show(message, category, filename, lineno, file=None, line=None):
        sampling = sys.modules.get("overlapdecode.sampling")  # not imported here: a bench warning needs no torch
        if sampling is not None and isinstance(message, sampling.IgnoredSamplingWarning):
            flags = ", ".join("--" + name.replace("_", "-") for name in message.ignored)
            text = f"{flags} ignored: the decoding is greedy; pass --do-sample to sample"
        else:
            text = " ".join(str(message).split())
        print(f"overlapdecode {command}: warning: {text}", file=sys.stderr)

    return show


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, extra = parser.parse_known_args(argv)  # a bad flag: one line on stderr, exit 2
    if extra:  # named by the subcommand's parser, so that the line points at `overlapdecode COMMAND --help`
        parser.commands[args.command].error(_unrecognized(extra, parser.commands[args.command]))
    args.argv = argv
    handlers = {"generate": cmd_generate, **bench_cli.HANDLERS}
    try:
        with warnings.catch_warnings():  # restores the hook on the way out
            warnings.showwarning = _one_line_warning(args.command)
            return handlers[args.command](args)
    except Interrupted as err:
        by = " by SIGTERM" if err.reason == "SIGTERM" else ""
        print(f"overlapdecode {args.command}: interrupted{by}; {err}", file=sys.stderr)
        return err.status
    except KeyboardInterrupt:  # Ctrl-C: one line, never the traceback of wherever it landed
        print(f"overlapdecode {args.command}: interrupted", file=sys.stderr)
        return 130
    except (CliError, ValueError, TypeError) as err:
        message = " ".join(str(err).split("\n", 1)[0].split()) if not isinstance(err, CliError) else str(err)
        print(f"overlapdecode {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
