"""The bench's speculative rows, worker side: the draft model, a call's speculation arguments, the figures of its
rounds, and the cost of the verify step.

Random weights make an acceptance rate meaningless as a forecast, so the bench measures the mechanism at rates
set by construction: the model as its own draft (`self`: every draft accepted), a draft of the same shape with
unrelated random weights (`random`: about none), or a named draft; prompt lookup accepts whatever the model's
greedy output gives (a random model that falls into a loop repeats itself, and lookup finds it; one whose output
wanders is given one token repeated that it continues with itself: looping_prompt). Each row
records what happened (drafts offered and accepted, rounds) beside its times, so that a point's acceptance rate
is measured, never assumed.

The verify step's cost: one forward of T = K + 1 tokens against a cache holding the prompt, as the round loop
runs it, for T = 1..9; the median of at least 5 forwards after at least 2 untimed ones, CUDA events on a GPU (the
host clock on CPU, where it is no speed claim). The eager presets' (`kv`, `static`: spec/rounds.py) is a Hugging
Face forward on a spec/cache.py RowCache, cut back to the prompt after each. The captured presets' (`compiled`,
`interleaved` and the other compiled static variants, `fused`: loop/rounds.py) runs on the cache their rounds make
(a StaticRows whose forward is compiled on CUDA, or the fused model's FusedRows, where T = 1 is the fused decode
step and T > 1 forward.verify_step) and, on CUDA, is captured in one CUDA graph per T (its first run eager, then
captured: loop/step_graph.py GraphCapture) whose replays are timed; the StaticRows is cut back on the device after
each replay, the FusedRows needs no cut (a rejected slot is written again before it is read).
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
import transformers

import overlapdecode as od

from ..fused.path import spec_rows
from ..hf.graph_experts import graph_safe_experts
from ..inputs import model_device, position_ids_for_prompt
from ..loop.compiling import recompile_limits
from ..loop.rounds import COMPILED_ON, compiled_call
from ..loop.step_graph import GraphCapture
from ..models.embedded import EMBEDDED
from ..models.loading import parse_dtype
from ..plan import STATIC_ROUND, static_cache_len
from ..spec.cache import RowCache, StaticRows, call_model, spec_cache_len
from ..spec.options import MAX_MATCHING_NGRAM, captured_rounds
from .oracle import oracle_acceptance, oracle_draft, oracle_spec
from .workloads import prompt

# the verify step's token counts: K + 1 for K = 0 (a one-token step, the reference) .. 8
VERIFY_TOKENS = tuple(range(1, 10))
# forwards per T: at least these many untimed, then timed (one forward is short: more than the calls' repeats)
VERIFY_WARMUP, VERIFY_REPEATS = 2, 5
# the drafts built to be accepted (the model itself) and rejected (unrelated random weights of its shape); the
# oracle's drafts are the model's own greedy tokens, a share of them accepted by construction (oracle.py)
SELF, RANDOM = "self", "random"


def load_draft(spec: str, model_name: str, model, dtype: str, device, seed: int, quantize=None, group_size=128):
    """The draft model `spec` names: `self` the model itself; `random` the model's shape with unrelated random
    weights (another seed for an embedded name; a directory's config drawn anew); None for `oracle[:A]`, whose
    draft each configuration makes (oracle_draft: the worker's rows, verify_row), and for `oracle[:A]@MODEL` MODEL
    loaded as a named draft is, the decoder of the drafts it makes; else a model name or directory, loaded as the
    model is (dtype, device)."""
    if spec == SELF:
        return model
    oracle = oracle_spec(spec)
    if oracle is not None:
        return None if oracle[1] is None else od.load_model(oracle[1], dtype=dtype, device=device, seed=seed + 1)
    if spec != RANDOM:
        return od.load_model(spec, dtype=dtype, device=device, seed=seed + 1)
    if model_name in EMBEDDED:
        return od.load_model(
            model_name, dtype=dtype, device=device, seed=seed + 1, quantize=quantize, group_size=group_size
        )
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed + 1)
        draft = transformers.AutoModelForCausalLM.from_config(model.config, dtype=parse_dtype(dtype))
    draft = draft.to(device).eval()
    return od.quantize(draft, quantize, group_size) if quantize is not None else draft


def generate_kwargs(kind: str, k: int, draft) -> dict:
    """od.generate's speculation arguments for a row of `kind` (prompt_lookup | prompt_lookup_loop | assistant)
    and K."""
    if kind.startswith("prompt_lookup"):
        return dict(prompt_lookup_num_tokens=k)
    return dict(assistant_model=draft, num_assistant_tokens=k)


# the looping prompt (`--prompt-lookup-loop`): greedy tokens searched for a loop, this many times the row's new
# tokens but at least LOOP_SEARCH_MIN; loops of periods up to LOOP_PERIOD, seen at least three times over
LOOP_SEARCH, LOOP_SEARCH_MIN, LOOP_PERIOD = 4, 256, 64


def loop_start(tokens: list, max_period: int = LOOP_PERIOD) -> tuple[int, int] | None:
    """(t, p): the earliest t from which `tokens` repeat with a period p <= max_period to their end, over at least
    three periods (the shortest such p at that t), or None."""
    best = None
    for p in range(1, max_period + 1):
        if len(tokens) < 3 * p:
            break
        t = len(tokens) - p
        while t > 0 and tokens[t - 1] == tokens[t - 1 + p]:
            t -= 1
        if len(tokens) - t >= 3 * p and (best is None or t < best[0]):
            best = (t, p)
    return best


def looping_prompt(
    generate,
    ids: torch.Tensor,
    new_tokens: int,
    k: int,
    max_positions: int | None = None,
    successor=None,
    vocab: int | None = None,
) -> tuple[torch.Tensor, str]:
    """A prompt whose greedy continuation repeats it, and how it was found. First `ids` (B, P) and each row's greedy
    tokens (`generate(ids, n)` -> (B, P + n)) into the loop every row has fallen into by then: two periods, and at
    least K + the n-gram prompt lookup matches by default (room for a match and drafts after it), as far as the
    search went. Prompt lookup's drafts are then the loop's tokens, the model's own greedy choices, unless an earlier
    match in the run's prompt wins. The search leaves `new_tokens` of the model's `max_positions` for the call on it.

    A random model's greedy output often wanders for thousands of tokens without a loop; then, given `successor`
    and `vocab`, a prompt of one token repeated that the model continues with itself for `new_tokens` tokens
    (fixed_point_prompt). ValueError where neither is found."""
    search = max(LOOP_SEARCH * new_tokens, LOOP_SEARCH_MIN)
    if max_positions is not None:
        search = min(search, max_positions - ids.shape[1] - new_tokens)
    if search < 3:
        raise ValueError(f"no room for a looping prompt: the model has {max_positions} positions")
    out = generate(ids, search)
    P = ids.shape[1]
    cuts, periods = [], []
    for r, row in enumerate(out[:, P:].tolist()):
        found = loop_start(row)
        if found is None:
            why = (
                f"row {r}: the model's greedy output does not repeat itself within {search} tokens (periods up to "
                f"{LOOP_PERIOD})"
            )
            if successor is None:
                raise ValueError(f"{why}: no looping prompt for prompt lookup")
            return fixed_point_prompt(generate, successor, vocab, ids, new_tokens, why)
        t, p = found
        cuts.append(min(t + max(2 * p, k + MAX_MATCHING_NGRAM), search))
        periods.append(p)
    return out[:, : P + max(cuts)].contiguous(), f"greedy loop, period {max(periods)}"


# fixed points tried by generation, in groups of the batch's rows, at most this many groups
FIXED_POINT_GROUPS = 4


def fixed_points(successor, vocab: int, chunk: int = 1024) -> list[int]:
    """The tokens x < `vocab` whose greedy successor after the one-token prompt x is x itself (`successor`: (c, 1)
    token ids -> (c,) greedy next tokens). Where attention sees one token repeated, every position holds the same
    keys' values, so a model without position-dependent values (rotary embeddings, no learned positions) continues
    a prompt of x repeated as it continues x alone; fixed_point_prompt checks it by generation."""
    found = []
    for start in range(0, vocab, chunk):
        x = torch.arange(start, min(start + chunk, vocab))
        nxt = successor(x[:, None]).cpu()
        found += x[nxt == x].tolist()
    return found


def fixed_point_prompt(generate, successor, vocab: int, ids, new_tokens: int, why: str) -> tuple[torch.Tensor, str]:
    """A prompt of `ids`' shape (B, P) and device, each row one token repeated whose greedy continuation repeats it
    for `new_tokens` tokens: the fixed points of the model's one-token step (fixed_points), tried by generation in
    groups of B (the timed call's own shape), the first that holds in every row of its group. ValueError naming
    both searches where none holds."""
    B, P = ids.shape

    def repeated(tokens: list[int]) -> torch.Tensor:  # B rows, a short list repeated to fill them
        return torch.tensor((tokens * B)[:B], device=ids.device)[:, None].expand(B, P).contiguous()

    candidates = fixed_points(successor, vocab)
    for g in range(min(FIXED_POINT_GROUPS, -(-len(candidates) // B))):
        prompt_ids = repeated(candidates[g * B : (g + 1) * B])
        out = generate(prompt_ids, new_tokens)[:, P:].cpu()
        held = [x for x, row in zip(prompt_ids[:, 0].tolist(), out) if bool((row == x).all())]
        if held:
            return repeated(held), f"one token repeated (a fixed point of the greedy step: {held[0]})"
    tried = min(len(candidates), FIXED_POINT_GROUPS * B)
    raise ValueError(
        f"{why}, and no token repeated continues itself ({len(candidates)} fixed points of the one-token step, "
        f"{tried} tried by generation): no looping prompt for prompt lookup"
    )


def greedy_successor(model):
    """(c, 1) token ids -> (c,) the model's greedy next token after each one-token prompt (fixed_points)."""
    device = model_device(model)

    @torch.no_grad()
    def successor(x: torch.Tensor) -> torch.Tensor:
        return model(input_ids=x.to(device), use_cache=False).logits[:, -1].argmax(-1)

    return successor


def round_figures(stats) -> dict:
    """The figures of a speculative call's rounds (spec/rounds.py SpecStats): drafts offered and accepted over all
    rounds and rows, the acceptance rate (accepted / offered), the rounds, and the tokens per round of a row (each
    round of a row still generating emits its accepted drafts and one token more: (accepted + row-rounds) /
    row-rounds; no EOS stops the rows of these workloads).

    `draft_acceptance`: the probability that a draft the model checks is accepted, as the model of the curve has it
    (report/speculation.py: each draft accepted with probability a until the first rejection): accepted / (accepted
    + rejected), a round of a row rejecting one draft where it accepted fewer than it offered (the drafts after the
    first rejection are never checked). Accepted / offered counts those too: at a = 0.7 and K = 4 it is 0.44."""
    offered = sum(map(sum, stats.drafted))
    accepted = sum(map(sum, stats.accepted))
    row_rounds = sum(sum(map(bool, a)) for a in stats.active)
    rejected = sum(n < d for ds, ns in zip(stats.drafted, stats.accepted) for d, n in zip(ds, ns))
    return dict(
        drafts_offered=offered,
        drafts_accepted=accepted,
        acceptance_rate=accepted / offered if offered else None,
        draft_acceptance=accepted / (accepted + rejected) if accepted + rejected else None,
        rounds=stats.rounds,
        row_rounds=row_rounds,
        tokens_per_round=(accepted + row_rounds) / row_rounds if row_rounds else None,
    )


def speed_up(plain: dict | None, row: dict) -> dict:
    """The same preset's time without speculation, in the same run at the same configuration (`plain`: its fixed
    row, None where it was not measured), and the speed-up over it: its time per sequence / this row's. And the
    decode's: the same with each call's time to first token taken off (its prefill, which speculation does not
    shorten; `ttft_ms`: a call of one new token), the rounds' speed-up that the model of the curve describes."""
    if not plain or "seq_s" not in plain:
        return dict(plain_ms_per_token=None, speedup=None, decode_speedup=None)
    decode = None
    if plain.get("ttft_ms") is not None and row.get("ttft_ms") is not None:
        mine, theirs = row["seq_s"] - row["ttft_ms"] / 1e3, plain["seq_s"] - plain["ttft_ms"] / 1e3
        decode = theirs / mine if mine > 0 and theirs > 0 else None
    return dict(plain_ms_per_token=plain["ms_per_token"], speedup=plain["seq_s"] / row["seq_s"], decode_speedup=decode)


class _Clock:
    """Elapsed seconds of a call: CUDA events on a GPU (the stream's own time, the host's launches included
    where the GPU waits for them), the host clock on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> float:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()  # host sync: timing boundary
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t


def forward_ms(model, kind: str, ids, tokens: tuple, warmup: int, repeats: int, length: int, seed: int) -> list:
    """The median ms of one forward of T tokens (each T of `tokens`) against a `kind` cache (dynamic | static, of
    `length` slots) holding the prompt `ids` (B, P): T random ids at positions P..P + T - 1, logits over all T, the
    cache cut back to the prompt after each forward. `warmup` untimed forwards per T first."""
    B, P = ids.shape
    mask = torch.ones_like(ids)
    clock = _Clock(ids.device)
    cache = RowCache(model, kind, mask, length)
    vocab = model.get_output_embeddings().weight.shape[0]
    none_kept = torch.zeros((B, max(tokens)), dtype=torch.bool, device=ids.device)
    out = []
    with torch.inference_mode():
        cache.forward(ids, position_ids_for_prompt(mask), 1)
        for T in tokens:
            draft = prompt(B, T, vocab, ids.device, seed + T)
            positions = (P + torch.arange(T, device=ids.device)).expand(B, T)
            times = []
            for i in range(warmup + repeats):
                seconds = clock(lambda: cache.forward(draft, positions, T))
                cache.settle(P, none_kept[:, :T], 0)  # back to the prompt alone
                if i >= warmup:
                    times.append(seconds * 1e3)
            out.append(statistics.median(times))
    return out


def captured_rows(model, strategy, mask: torch.Tensor, length: int, tag: str = ""):
    """The cache that loop/rounds.py's captured rounds of `strategy` (a resolved Strategy) give `model`, as decode.py
    makes it for a (B, P) prompt `mask`: with the fused cache, the fused model's FusedRows of `length` slots (`tag`:
    a draft's, kept apart; a draft of a family the fused path lacks gets a static cache, as there); else a
    StaticRows of `length` slots whose forward is compiled where the rounds compile it (COMPILED_ON)."""
    if strategy.cache == "fused":
        try:
            return spec_rows(od.decoder_for(model).fused_model(), mask.shape[0], length, tag)
        except ValueError:
            if not tag:  # the model itself: the fused path refuses it, and the row says why
                raise
    forward = compiled_call() if strategy.compile and mask.device.type in COMPILED_ON else call_model
    return StaticRows(model, mask, length, forward)


def captured_ms(
    rows, ids, tokens: tuple, warmup: int, repeats: int, vocab: int, seed: int, feed: bool = False
) -> tuple[list, bool]:
    """A forward of T tokens (each T of `tokens`) as a captured round runs it on `rows` (captured_rows's: FusedRows
    or StaticRows), which first takes the prompt `ids` (B, P): T random ids at positions P..P + T - 1, logits over
    all T -> (the median ms per T, whether every timed run was a CUDA graph's replay). Per T one GraphCapture: its
    first run eager (it compiles and warms up what the forward launches) and captured where CUDA is, then `warmup`
    untimed and `repeats` timed runs, each a replay of that one graph on CUDA (an eager forward elsewhere). After
    each run the rows are cut back to the prompt on the device (settle_rows keeping no slot: a StaticRows' counter
    and mask; nothing for FusedRows, whose next run writes the same slots again). `feed`: `rows.feed` timed instead
    (the tokens written, no logits: a draft's last token of a round)."""
    B, P = ids.shape
    mask = torch.ones_like(ids)
    clock = _Clock(ids.device)
    none_kept = torch.zeros(B, dtype=torch.long, device=ids.device)
    out, replayed = [], True
    rows.prefill(ids, mask, position_ids_for_prompt(mask))
    for T in tokens:
        draft = prompt(B, T, vocab, ids.device, seed + T)
        positions = (P + torch.arange(T, device=ids.device)).expand(B, T)
        graph = GraphCapture(ids.device)
        forward = (
            functools.partial(rows.feed, draft, positions)
            if feed
            else functools.partial(rows.forward, draft, positions, T)
        )
        graph.run(forward, recompile_limits)  # eager (compiles, warms up), then captured where CUDA is
        rows.settle_rows(none_kept, T)
        times = []
        for i in range(warmup + repeats):
            seconds = clock(functools.partial(graph.run, forward))  # a replay where captured
            rows.settle_rows(none_kept, T)  # back to the prompt alone
            if i >= warmup:
                times.append(seconds * 1e3)
        out.append(statistics.median(times))
        replayed = replayed and graph.graph is not None and graph.eager_runs == 1
        del graph  # its memory pool goes before the next T's capture (the clock waited for its last replay)
    return out, replayed


def verify_row(cfg, strategy: str, model, draft, batch: int, vocab: int, device) -> dict:
    """A preset's verify-step costs: `verify_ms` for each T of `verify_tokens` (K + 1 = 1..max(9, the largest K
    + 1)) and `verify_ratio` = that / the one-token forward's; with a draft model, `draft_step_ms` (its one-token
    forward on the cache its rounds give it) and `draft_ratio` (that / the model's), on `fused` also
    `draft_feed_ms` and `draft_feed_ratio` (its last draft of a round fed, no LM head); `verify_graph`: whether each
    timed forward was the replay of a CUDA graph (the captured presets' on CUDA). The caches are sized as the round
    loop's of the run's longest call and largest K (and T)."""
    ks = cfg.prompt_lookup + cfg.prompt_lookup_loop + (cfg.num_assistant_tokens if cfg.assistant else ())
    tokens = tuple(range(1, max(VERIFY_TOKENS[-1], max(ks) + 1) + 1))
    s = od.resolve_strategy(strategy)
    ids = prompt(batch, cfg.prompt_len, vocab, device, cfg.seed)
    warmup, repeats = max(cfg.warmup, VERIFY_WARMUP), max(cfg.repeats, VERIFY_REPEATS)
    P, N = cfg.prompt_len, max(cfg.lengths)
    captured = captured_rounds(s)

    def timed(m, ts: tuple, tag: str, feed: bool = False) -> tuple[list, bool]:
        if not captured:
            length = max(spec_cache_len(P, N, max(ks), batch), P + tokens[-1])  # room for the largest T too
            return forward_ms(m, s.cache, ids, ts, warmup, repeats, length, cfg.seed), False
        # as decode.py sizes a captured call's caches (the fused: its plan's cache_len), for T tokens at most
        fused_len = static_cache_len(P, max(N, tokens[-1]))
        static_len = spec_cache_len(P, N, tokens[-1] - 1, batch, round_to=STATIC_ROUND)
        rows = captured_rows(m, s, torch.ones_like(ids), fused_len if s.cache == "fused" else static_len, tag)
        safe = graph_safe_experts(m, isinstance(rows, StaticRows), device.type)  # as decode.py runs the rounds
        with torch.no_grad(), safe:
            vocab_m = m.get_output_embeddings().weight.shape[0]
            return captured_ms(rows, ids, ts, warmup, repeats, vocab_m, cfg.seed, feed)

    ms, replayed = timed(model, tokens, "")
    row = dict(strategy=strategy, verify_tokens=list(tokens), verify_ms=ms, verify_ratio=[t / ms[0] for t in ms])
    row["verify_graph"] = replayed
    if oracle_acceptance(cfg.assistant) is not None:  # as wide as the oracle of a row of this batch and N
        draft = oracle_draft(model, None, None, 1.0, cfg.seed + 1, keys=batch * N, body=draft)
    if draft is not None:
        (draft_ms,), _ = timed(draft, (1,), "draft")
        row.update(draft_step_ms=draft_ms, draft_ratio=draft_ms / ms[0])
        if captured and s.cache == "fused":  # its last draft of a round fed without the LM head (FusedRows.feed)
            (feed_ms,), _ = timed(draft, (1,), "draft", feed=True)
            row.update(draft_feed_ms=feed_ms, draft_feed_ratio=feed_ms / ms[0])
    return row
