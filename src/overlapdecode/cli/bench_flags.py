"""The flags of `overlapdecode bench` and `profile` checked and turned into a BenchConfig (bench/config.py) before
any work: every mistake is one line naming its flag (args.CliError), never a worker's traceback. The defaults of
a run without flags (the main job) are here too.

Like every module of cli/, it imports no torch at the top: what a check needs is imported inside it.
"""

from __future__ import annotations

import os

from ..bench.config import BenchConfig, split_pair
from .args import (
    DTYPE_NAMES,
    CliError,
    check_model_flag,
    check_quantize_flags,
    ints,
    lag_beyond,
    lag_of,
    names,
    writable_dir,
)

ALLOCATOR_NAMES = ("default", "expandable")  # bench.runner.ALLOCATORS (a test keeps them equal)
BASE_STRATEGIES = ("baseline", "kv", "static", "compiled", "interleaved")  # + fused on CUDA where it applies

# `overlapdecode bench` with no arguments (the main job). On CUDA: gpt2-random in float32 at batch 16, where
# the baseline's per-step work (the whole sequence) outgrows the launch-bound floor of an eager step within the
# first tens of tokens, so its O(N^2) growth shows between 48 and 192 new tokens; batch 16 is one row tile of the
# fused kernels; the busy-fraction profile is left to `overlapdecode profile`. Beside it, the bfloat16
# configuration `fused` is built for: gpt2-random in bfloat16 at batch 1, `fused` and `interleaved` alone at the
# longest length, so that the whole run stays within a few minutes (docs/BENCHMARKING.md). On CPU the quick sweep
# of tiny-gpt2. Other models on CUDA keep batch 1 and 64,96 tokens: a real-size baseline at batch 16 would take
# many minutes.
MAIN_MODEL_CUDA = "gpt2-random"
MAIN_LENGTHS_CUDA, MAIN_BATCH_CUDA = (48, 192), 16
MAIN_BF16_PAIR, MAIN_BF16_STRATEGIES = "bfloat16:1", ("interleaved", "fused")
OTHER_LENGTHS_CUDA, LENGTHS_CPU = (64, 96), (16, 48)
PEER_NAMES = ("hf-dynamic", "hf-static", "hf-compiled")  # bench.peers.PEERS (likewise)
WORKLOAD_NAMES = ("fixed", "eos")  # bench.workloads.WORKLOADS (likewise)


def check_device(text: str | None, flag: str = "--device"):
    """The torch device a --device flag names, or a CliError naming the flag."""
    from ..models.loading import check_device as library_check  # torch: imported when a command runs, not for --help

    try:
        return library_check(text)
    except (ValueError, TypeError) as err:
        raise CliError(f"{flag}: {err}") from None


def _positive(values, flag):
    if not values:
        raise CliError(f"{flag} needs at least one value")
    bad = [v for v in values if v < 1]
    if bad:
        raise CliError(f"{flag} values must be >= 1, got {bad}")
    return tuple(values)


def _check_names(values, known, flag):
    bad = [n for n in values if n not in known]
    if bad:
        raise CliError(f"{flag}: unknown {', '.join(bad)}; choose from {', '.join(known)}")
    return tuple(values)


def check_strategies(text: str, flag: str, max_new_tokens: int) -> tuple[str, ...]:
    """Preset or variant names, `NAME:K` for a lag of K (interleaved:2); a lag beyond the shortest run is
    refused here, before a worker starts (it would only allocate K + 1 pinned slots for nothing)."""
    from ..bench.variants import split_variant
    from ..sampling import check_sampling
    from ..strategy import resolve_strategy

    found = names(text)
    for n in found:
        try:
            base, sampling = split_variant(n)
            resolve_strategy(base)
            check_sampling(
                sampling.get("do_sample", False),
                sampling.get("temperature", 1.0),
                sampling.get("top_k"),
                sampling.get("top_p"),
                0,
                sampling.get("min_p"),
                sampling.get("repetition_penalty"),
            )
        except (ValueError, TypeError) as err:
            raise CliError(f"{flag}: {err}") from None
        if lag_of(base) > max_new_tokens:
            raise lag_beyond(flag, n, f"the {max_new_tokens} new tokens of the shortest run")
    return tuple(found)


def check_dtype(d: str, flag: str) -> str:
    from ..models.loading import parse_dtype  # torch: imported when a command runs, not for --help

    try:
        parse_dtype(d)
    except ValueError as err:
        raise CliError(f"{flag}: {err}") from None
    return d


def bench_config(args):
    device = check_device(args.device) if args.device is not None else None
    cuda = (device.type if device is not None else _default_device().type) == "cuda"
    model = args.model or (MAIN_MODEL_CUDA if cuda else "tiny-gpt2")
    main_job = cuda and model == MAIN_MODEL_CUDA
    default_lengths = MAIN_LENGTHS_CUDA if main_job else OTHER_LENGTHS_CUDA if cuda else LENGTHS_CPU
    lengths = _positive(ints(args.lengths, "--lengths") if args.lengths else list(default_lengths), "--lengths")
    eos_lengths = _positive(ints(args.eos_lengths, "--eos-lengths"), "--eos-lengths") if args.eos_lengths else ()
    strategies = None  # by default, chosen once the model's config is known (fused where its family has it)
    if args.strategies is not None:
        strategies = check_strategies(args.strategies, "--strategies", min(lengths + eos_lengths))
    peers = () if args.peers.strip() == "none" else _check_names(names(args.peers), PEER_NAMES, "--peers")
    if strategies == () and not peers:
        raise CliError("--strategies and --peers are both empty: nothing to measure")
    batches = _positive(
        ints(args.batch, "--batch") if args.batch is not None else [MAIN_BATCH_CUDA if main_job else 1], "--batch"
    )
    dtypes = tuple(check_dtype(d, "--dtype") for d in names("float32" if args.dtype is None else args.dtype))
    if not dtypes and not args.dtype_batch:
        raise CliError(
            f"--dtype names no dtype ({args.dtype!r}): nothing to measure; choose from {', '.join(DTYPE_NAMES)}"
        )
    pairs, narrowed = (), ()
    if args.dtype_batch is not None:
        pairs = tuple(names(args.dtype_batch))
        if not pairs:
            raise CliError(f"--dtype-batch names no pair ({args.dtype_batch!r}): nothing to measure")
        try:
            parsed = [split_pair(p) for p in pairs]
        except ValueError as err:
            raise CliError(str(err)) from None
        for d, _ in parsed:
            check_dtype(d, "--dtype-batch")
        dtypes = tuple(dict.fromkeys(d for d, _ in parsed))
        batches = tuple(dict.fromkeys(b for _, b in parsed))
    if args.time_budget is not None and not args.time_budget > 0:
        raise CliError("--time-budget must be > 0 seconds")
    allocators = _check_names(names(args.allocator), ALLOCATOR_NAMES, "--allocator")
    if not allocators:
        raise CliError("--allocator names no allocator: nothing to measure")
    if "expandable" in allocators and not cuda:
        raise CliError("--allocator expandable needs CUDA (it configures the CUDA caching allocator)")
    workloads = _check_names(names(args.workloads), WORKLOAD_NAMES, "--workloads")
    if not workloads:
        raise CliError("--workloads names no workload: nothing to measure")
    prompt_len = args.prompt_len if args.prompt_len is not None else (32 if cuda else 16)
    if prompt_len < 1:
        raise CliError(f"--prompt-len must be >= 1, got {prompt_len}")
    if args.warmup < 0 or args.repeats < 1:
        raise CliError("--warmup must be >= 0 and --repeats >= 1")
    config = check_model_name(model)
    group_size = check_quantize_flags(dict_args(args, model=model), config)
    if args.quantize is not None and args.tp > 1:
        raise CliError("--quantize: tensor-parallel shards are not quantized yet; bench it with --tp 1")
    if strategies is None:
        strategies = default_strategies(model, config, cuda)
        if main_job and args.batch is None and args.dtype is None and args.dtype_batch is None:
            pairs = (f"float32:{MAIN_BATCH_CUDA}", MAIN_BF16_PAIR)
            dtypes, batches = tuple(split_pair(p)[0] for p in pairs), tuple(split_pair(p)[1] for p in pairs)
            own = tuple(s for s in MAIN_BF16_STRATEGIES if s in strategies)
            narrowed = ((MAIN_BF16_PAIR, own, (max(lengths),)),)
    check_positions(model, prompt_len, max(lengths + eos_lengths))
    gpus = _check_gpus(args.gpus, args.device) if args.gpus else ()
    _check_tp(args)
    if args.tp > 1:
        _check_tp_model(model, args.tp, config)
    speculation = check_speculation(args, strategies, model, config, prompt_len, max(lengths), workloads)
    check_out(args.out, "bench", args.append)
    return BenchConfig(
        tp=args.tp,
        gpus=gpus,
        model=model,
        strategies=strategies,
        peers=peers,
        lengths=lengths,
        batches=batches,
        dtypes=dtypes,
        pairs=pairs,
        narrowed=narrowed,
        time_budget_s=args.time_budget,
        allocators=allocators,
        workloads=workloads,
        eos_lengths=eos_lengths,
        prompt_len=prompt_len,
        warmup=args.warmup,
        repeats=args.repeats,
        # the main job without --strategies skips the busy-fraction profile (`overlapdecode profile` makes it)
        profile=not args.no_profile and not (main_job and args.strategies is None),
        device=args.device,
        quantize=args.quantize,
        group_size=group_size,
        **speculation,
    )


NUM_ASSISTANT_TOKENS = (4,)  # --num-assistant-tokens with --assistant alone


def check_speculation(args, strategies, model: str, config, prompt_len: int, longest: int, workloads) -> dict:
    """--prompt-lookup, --prompt-lookup-loop, --assistant and --num-assistant-tokens -> BenchConfig's speculation
    fields, before any work: K values >= 1; the draft (self, random, or a model of the same vocabulary); at least
    one of `strategies` that speculates; the fixed workload, whose rows their speed-up divides; no tensor
    parallelism."""
    from ..bench.variants import split_variant
    from ..spec.options import SPEC_PRESETS, check_spec_strategy  # torch: imported when a command runs
    from ..strategy import resolve_strategy

    if args.num_assistant_tokens is not None and args.assistant is None:
        raise CliError("--num-assistant-tokens is given without --assistant: it counts the draft model's tokens")
    loop_k = args.prompt_lookup_loop
    if args.prompt_lookup is None and loop_k is None and args.assistant is None:
        return {}
    flag = (
        "--assistant" if args.assistant is not None else "--prompt-lookup" if loop_k is None else "--prompt-lookup-loop"
    )
    _check_round_loop(model, config, "--model", flag)
    lookup = _counts(args.prompt_lookup, "--prompt-lookup", ())
    looping = _counts(loop_k, "--prompt-lookup-loop", ())
    drafted = ()
    if args.assistant is not None:
        drafted = _counts(args.num_assistant_tokens, "--num-assistant-tokens", NUM_ASSISTANT_TOKENS)
        _check_assistant(args.assistant, model, config, prompt_len, longest)
    if args.tp > 1:
        raise CliError(f"{flag}: speculative decoding does not run on tensor-parallel shards yet; bench it with --tp 1")
    if "fixed" not in workloads:
        raise CliError(f"{flag} needs the fixed workload (--workloads fixed): its rows are what the speed-up divides")
    speculating = []
    for name in strategies:
        try:
            check_spec_strategy(resolve_strategy(split_variant(name)[0]), name, flag)
        except ValueError:
            continue
        speculating.append(name)
    if not speculating:
        raise CliError(
            f"{flag}: none of the strategies measured ({', '.join(strategies)}) runs speculative decoding; add "
            f"{' or '.join(SPEC_PRESETS)} to --strategies"
        )
    return dict(
        prompt_lookup=lookup,
        prompt_lookup_loop=looping,
        assistant=args.assistant,
        num_assistant_tokens=drafted,
        speculating=tuple(speculating),
    )


def _counts(text: str | None, flag: str, default: tuple) -> tuple[int, ...]:
    """A flag's K values: comma-separated integers >= 1, each once (`default` where the flag is not given)."""
    return default if text is None else tuple(dict.fromkeys(_positive(ints(text, flag), flag)))


def _check_assistant(spec: str, model: str, config, prompt_len: int, longest: int) -> None:
    """--assistant: self, random, oracle[:A][@MODEL], or a model name or directory that loads, is a causal LM and
    scores the model's token ids (its vocabulary as wide as the model's), with room for the run's positions (MODEL
    of an oracle too)."""
    from ..bench.oracle import oracle_spec  # torch: imported when a command runs
    from ..bench.speculative import RANDOM, SELF
    from ..models.loading import embedded_config

    if spec in (SELF, RANDOM):
        return
    try:
        oracle = oracle_spec(spec)
    except ValueError as err:
        raise CliError(str(err)) from None
    asked = spec
    if oracle is not None:
        if oracle[1] is None:
            return
        spec = oracle[1]  # the draft's shape: checked as a named draft is
    if not spec.strip():
        raise CliError(
            f"--assistant takes {SELF}, {RANDOM}, oracle[:A][@MODEL], or a model name or directory, got {spec!r}"
        )
    theirs = check_model_flag(spec, "--assistant")
    ours, theirs = (embedded_config(n) if c is None else c for n, c in ((model, config), (spec, theirs)))
    sizes = [c.get_text_config(decoder=True).vocab_size for c in (ours, theirs)]
    if sizes[0] != sizes[1]:
        raise CliError(
            f"--assistant {asked} scores {sizes[1]} token ids and --model {model} {sizes[0]}: the draft must share "
            f"the model's vocabulary (the same tokenizer)"
        )
    check_positions(spec, prompt_len, longest)
    _check_round_loop(spec, theirs, "--assistant", "--assistant")


def _check_round_loop(name: str, config, flag: str, asked: str) -> None:
    """A model whose tokens the speculative round loop cannot keep (spec/options.py spec_refusal: recurrent or local
    attention layers...), found from its config on the meta device (no weights): one line naming `flag`."""
    import torch  # imported when the command runs, not for --help
    from transformers import AutoModelForCausalLM

    from ..models.loading import embedded_config
    from ..spec.options import spec_refusal

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(embedded_config(name) if config is None else config)
    except Exception:  # a config Hugging Face cannot build alone: the worker's call refuses it, in that row
        return
    why = spec_refusal(model)
    if why is not None:
        raise CliError(f"{asked}: {flag} {name}: {why}; bench it without speculation")


def dict_args(args, **changes):
    """`args` with some attributes changed (the model a run without --model measures)."""
    from types import SimpleNamespace

    return SimpleNamespace(**dict(vars(args), **changes))


def default_strategies(model: str, config, cuda: bool) -> tuple[str, ...]:
    """The strategies of a run without --strategies: the presets, with `fused` on CUDA where the model's
    family has it (`config`: the model's, None for an embedded one). On CPU `fused` runs its kernels' torch
    twins, compiled: a slow start for no figure of its own, so the CPU default leaves it out."""
    return BASE_STRATEGIES + ("fused",) if cuda and _fused_applies(model, config) else BASE_STRATEGIES


def _fused_applies(model: str, config) -> bool:
    """Whether the fused path takes this model, read from its config alone (facts.ModelFacts.fused)."""
    from ..facts import model_facts  # torch: imported when a command runs, not for --help

    return model_facts(model if config is None else config).fused


def _check_tp(args) -> None:
    """--tp N: N processes of torchrun, each measuring its shard in step with the others. Whatever could make
    the ranks decide differently (a time budget read on each host clock, units spread over GPUs) is refused."""
    if args.tp < 1:
        raise CliError(f"--tp must be >= 1, got {args.tp}")
    world = os.environ.get("WORLD_SIZE")
    if args.tp == 1:
        if world not in (None, "1"):
            raise CliError(
                f"WORLD_SIZE={world} (torchrun) without --tp: every process would write --out; run "
                f"torchrun --nproc-per-node {world} -m overlapdecode bench --tp {world} ..., or bench "
                f"without torchrun"
            )
        return
    if world != str(args.tp):
        raise CliError(
            f"--tp {args.tp} runs under torchrun: torchrun --nproc-per-node {args.tp} -m overlapdecode "
            f"bench --tp {args.tp} ... (this process has WORLD_SIZE={world})"
        )
    if args.gpus:
        raise CliError("--tp and --gpus exclude each other: with --tp every rank uses its own GPU (cuda:LOCAL_RANK)")
    if args.time_budget is not None:
        raise CliError("--tp and --time-budget exclude each other: the ranks must run the same configurations")


def _check_tp_model(model: str, tp: int, config) -> None:
    """--tp against the model's heads and sharding plan, before any worker starts: a worker would fail on every
    rank with a traceback and leave its rows file in --out. `config`: the model's, None for an embedded one."""
    from ..models.loading import embedded_config  # torch: imported when a command runs, not for --help
    from ..tp import check_config

    if config is None:
        config = embedded_config(model)
    try:
        check_config(config, tp)
    except ValueError as err:
        raise CliError(f"--tp: {err}") from None


def _default_device():
    from ..models.loading import check_device as library_check  # torch: imported when a command runs, not for --help

    return library_check(None)


def check_model_name(model: str):
    """An embedded name (None), or a directory or hub name whose config loads and is a causal LM (its config),
    checked here: a worker would only fail later, after starting, with its log's traceback."""
    return check_model_flag(model)


def check_out(out: str, command: str, append: bool = False) -> None:
    """--out before any work (bench/report/outdir.py check): a new or empty directory, or one an earlier run of the same
    command wrote (its manifest lists every file in it); made now, and probed with a file."""
    from ..bench.report.outdir import OutDirError, check  # light (no torch), but only the commands need it

    try:
        check(out, command, append)
    except OutDirError as err:
        raise CliError(str(err)) from None
    writable_dir(out, "--out")  # last: it makes the directory


def _check_gpus(text: str, device) -> tuple[int, ...]:
    import torch  # imported when the command runs, not for --help

    if device is not None:
        raise CliError("--gpus and --device exclude each other: --gpus pins each worker to one GPU itself")
    gpus = ints(text, "--gpus")
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise CliError(f"--gpus takes distinct CUDA device indices such as 0,1,2,3, got {text!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise CliError("--gpus needs CUDA devices; this machine has none")
    if max(gpus) >= count:
        raise CliError(f"--gpus {text}: this machine has {count} CUDA device(s), indices 0-{count - 1}")
    return tuple(gpus)


def check_positions(model: str, prompt_len: int, longest: int) -> None:
    from ..facts import model_facts  # torch: imported when a command runs, not for --help
    from ..models.embedded import EMBEDDED

    if model in EMBEDDED:
        limit = model_facts(model).positions
        if limit is not None and prompt_len + longest > limit:
            raise CliError(f"--prompt-len {prompt_len} + longest length {longest} exceeds {model}'s {limit} positions")
