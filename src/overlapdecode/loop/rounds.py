"""The speculative rounds of `compiled`, `interleaved` and `fused`: one round captured in a CUDA graph, with no host
read inside it, and the host reading each round's counts late, as the stop checks read a step's flag.

A round is spec/state.py's `play_round` (the reference loop's, spec/rounds.py: the same math and the same draws
in the same order), then each cache's cut on the device (spec/cache.py StaticRows; the fused cache needs none:
fused/speculation.py), then the round's report written into one small device tensor: whether every row has stopped,
each row's count of tokens, finished flag, activity, drafts offered and drafts accepted. Rows advance by different
counts; their counts, positions and flags live on the device. The host enqueues round after round, copies each
report into pinned memory without blocking, and reads the report of the round `lag` rounds back (the plan's lag:
0 for `compiled`, 1 for `interleaved` and `fused`, as their stop checks; every round on the caller's stream). The
rounds it enqueued past the one after which every row had stopped change nothing: no row is active, and their
caches keep no slot (loop/stopping.py's late steps, whose tokens are dropped).

On CUDA the round's first run is eager (its Hugging Face forwards compile there: `compiled_call`, and so does
the work around the forwards: `compiled_bookkeeping`) and the next is captured (step_graph.GraphCapture), every
later one a replay. On a CPU nothing is captured nor compiled (unless COMPILED_ON says so): the same round runs
eagerly. A `Round` (the buffers and the captured round) made for the fused cache stays with it, and the next call
of its shape replays it.
"""

from __future__ import annotations

import functools

import torch

from ..inputs import position_ids_for_prompt
from ..sampling import draw_noise, eos_tensor, eos_width, make_generator, seen_tokens
from ..spec.cache import call_model
from ..spec.candidates import Assistant, PromptLookup, prompt_lookup
from ..spec.state import EAGER_ROUND, RoundOps, SpecStats, begin, end_greedy_round, play_round, round_start, verify_feed
from .compiling import recompile_limits
from .step_graph import GraphCapture, kept_graph

# device types on which a compiled plan's Hugging Face forwards are compiled in the rounds (a CPU compile of every
# K and batch would take the CPU tests minutes; the round runs eagerly there)
COMPILED_ON = ("cuda",)


@functools.cache
def compiled_call():
    """spec/cache.py's call_model compiled once per process (no CUDA graphs of its own: the round is captured by
    hand around it); dynamo specialises per model and shape."""
    return torch.compile(call_model, fullgraph=True, dynamic=False)


@functools.cache
def compiled_bookkeeping():
    """A round's work around its forwards, compiled once per process (specialised per shape by dynamo): prompt
    lookup, the round's start (the rows still generating, the drafts each may offer), what the verify forward is
    fed, the end of a greedy round and the round's report, from a few to about a hundred small torch operations
    each, a kernel each when eager, fused by inductor into a few -> (prompt lookup, spec/state.py RoundOps, the
    report). Sampling's end stays eager: the same draws and probabilities as the reference loop, bit for bit."""
    compile_ = functools.partial(torch.compile, fullgraph=True, dynamic=False)
    ops = RoundOps(compile_(round_start), compile_(verify_feed), compile_(end_greedy_round))
    return compile_(prompt_lookup), ops, compile_(report_values)


def report_values(report, finished, count, n_max: int, active, offered, accepted) -> None:
    """A round's report into `report` (1 + 5B,) long, in place: whether every row has stopped, then each row's
    count, finished flag, activity, drafts offered and drafts accepted."""
    stopped = (finished | (count >= n_max)).all()
    rows = [count, finished.long(), active.long(), offered, accepted]
    report.copy_(torch.cat([stopped.long()[None], *rows]))


def forward_for(plan, device: torch.device):
    """The forward of the Hugging Face caches in `plan`'s rounds: compiled for a compiled plan on COMPILED_ON."""
    return compiled_call() if plan.step != "eager" and device.type in COMPILED_ON else call_model


class Reports:
    """Pinned host slots of the last `n` rounds' reports (and, for a streamer, the tokens so far), each guarded by
    an event: report s goes to slot s % n, and is read before report s + n is enqueued."""

    def __init__(self, n: int, batch: int, device: torch.device, tokens: int):
        cuda = device.type == "cuda"
        self.n, self.batch = n, batch
        self.values = torch.zeros((n, 1 + 5 * batch), dtype=torch.long, pin_memory=cuda)
        self.tokens = torch.zeros((n, batch, tokens), dtype=torch.long, pin_memory=cuda) if tokens else None
        self.events = [torch.cuda.Event() if cuda else None for _ in range(n)]

    def publish(self, s: int, report: torch.Tensor, tokens: torch.Tensor) -> None:
        slot = s % self.n
        self.values[slot].copy_(report, non_blocking=True)  # device -> pinned host, no sync
        if self.tokens is not None:
            self.tokens[slot].copy_(tokens, non_blocking=True)
        if self.events[slot] is not None:
            self.events[slot].record()

    def read(self, s: int) -> tuple[bool, list, list, list, list, list, torch.Tensor | None]:
        """Host: wait for report s only -> (every row stopped, counts, finished, active, offered, accepted, the
        (B, N) tokens when streaming)."""
        slot = s % self.n
        if self.events[slot] is not None:
            self.events[slot].synchronize()  # host sync on this round only; later rounds stay queued
        B, values = self.batch, self.values[slot].tolist()
        rows = [values[1 + i * B : 1 + (i + 1) * B] for i in range(5)]
        return (bool(values[0]), *rows, None if self.tokens is None else self.tokens[slot].clone())


class Round:
    """The buffers a speculative call's rounds read and write, and one round captured over them. Kept (`kept`, the
    fused cache's graphs) where every cache it writes outlives the call, so that a later call of the same shape
    copies its prompt's state in and replays the round: no eager round and no capture per call, each a launch of
    every kernel of the round from the host. It keeps no reference to a call's plan or request (the draft module a
    plan names would live as long as the model's cache); a draft model's fused model and cache it does keep, and
    decode.py drops such a round once the draft module is collected or its cache dropped."""

    def __init__(self, plan, device: torch.device, target, draft):
        req, params, spec = plan.request, plan.sampling, plan.spec
        B = req.input_ids.shape[0]
        self.k, self.n, self.sampling = spec.k, req.max_new_tokens, params
        self.target, self.draft = target, draft
        self.eos_ids = eos_tensor(req.eos_ids, device)  # each call's ids copied in by start(): one width, one round
        self.graph = GraphCapture(device, sampled=params.do_sample)
        self.graph.capturable = self.graph.capturable and plan.step != "eager"
        lookup, self.ops, self.report_values = prompt_lookup, EAGER_ROUND, report_values
        if plan.step != "eager" and device.type in COMPILED_ON:
            lookup, self.ops, self.report_values = compiled_bookkeeping()
        self.drafter = (
            PromptLookup(spec.k, spec.ngram, self.eos_ids, lookup) if draft is None else Assistant(draft, spec.k)
        )
        self.report = torch.zeros(1 + 5 * B, dtype=torch.long, device=device)
        self.zeros = torch.zeros(B, dtype=torch.long, device=device)
        self.state = self.out = None

    @staticmethod
    def key(plan, draft) -> tuple:
        """What the captured round depends on, beyond the cache it is kept with: two calls of one key replay the
        same round."""
        req, spec = plan.request, plan.spec
        return (
            "round",
            *req.input_ids.shape,
            req.max_new_tokens,
            eos_width(len(req.eos_ids)),
            req.pad_id,
            plan.step,
            plan.sampling,
            spec.kind,
            spec.k,
            spec.ngram,
            None if draft is None else id(draft.cache),
        )

    def start(self, plan, generator) -> None:
        """Step 0 of a call (`plan`: one with this object's key): the prompt through the model (and the draft), its
        first token; the rows' state copied into the buffers a kept graph reads."""
        req, params = plan.request, plan.sampling
        self.eos_ids.copy_(eos_tensor(req.eos_ids, self.eos_ids.device))
        positions = position_ids_for_prompt(req.attention_mask)
        logits = self.target.prefill(req.input_ids, req.attention_mask, positions)
        seen = seen_tokens(req.input_ids, logits.shape[-1]) if params.uses_seen else None
        noise = draw_noise(logits.shape, logits.device, generator)
        state, out = begin(req, logits, noise, params, self.eos_ids, positions, seen, self.draft is None)
        self.drafter.prefill(req.input_ids, req.attention_mask, positions)
        if self.state is None:
            self.state, self.out = state, out
            return
        for name in ("last", "pos", "count", "finished", "hist", "hlen", "seen"):
            mine = getattr(self.state, name)
            if mine is not None:
                mine.copy_(getattr(state, name))
        self.out.copy_(out)

    def write_report(self, active, offered, accepted) -> None:
        self.report_values(self.report, self.state.finished, self.state.count, self.n, active, offered, accepted)

    def play(self, generator) -> None:
        """One round (no host read: what a CUDA graph captures)."""
        active, offered, accepted, kept = play_round(
            self.state, self.out, self.drafter, self.target, self.sampling, generator, self.eos_ids, self.n, self.ops
        )  # fmt: skip
        self.target.settle_rows(kept, self.k + 1)
        self.drafter.settle_rows(kept, self.k + 1)
        self.write_report(active, offered, accepted)


def run_rounds(plan, device: torch.device, target, draft=None, on_tokens=None, kept: dict | None = None):
    """Run one speculative call's plan on the device -> ((B, P + n) ids as generate returns them, its SpecStats,
    whether rounds enqueued past the stop may still be running, the GraphCapture: kept by the caller until its next
    call has waited for them, so that freeing the graph's memory neither races nor waits for them). `target`: the
    model's cache (spec/cache.py StaticRows or fused/speculation.py FusedRows); `draft`: the draft model's, or None
    for prompt lookup. `on_tokens`: called with each step's (B,) host tokens in order, once every row's token of
    that step is read. `kept`: where the call's Round may be kept for the next call of its shape (None: made for this
    call alone); the caller has waited for the last call's rounds before this one writes their buffers."""
    req, params = plan.request, plan.sampling
    B, P = req.input_ids.shape
    N = req.max_new_tokens
    if kept is None:
        rnd = Round(plan, device, target, draft)
    else:
        rnd = kept_graph(kept, Round.key(plan, draft), lambda: Round(plan, device, target, draft))
    graph = rnd.graph
    generator = make_generator(params, plan.seed, device)
    if generator is not None:  # every draw of the call, the prefill's too, from the graph's generator
        graph.seed_from(generator)
        generator = graph.generator
    rnd.start(plan, generator)

    lag = min(plan.lag, N - 1)
    reports = Reports(lag + 1, B, device, N if on_tokens is not None else 0)
    stats, streamed, steps = SpecStats(plan.spec.k), 0, N
    read, stop, may_end = -1, None, False  # the last report read; the one that said every row stopped

    def stopped_at(k: int) -> bool:
        """Read report k (after round k - 1): its round's counts, a streamer's tokens; whether every row stopped.
        Sets `may_end`: whether the verify step enqueued next could stop every row (each row stopped or K + 1 tokens or
        fewer from its last)."""
        nonlocal streamed, steps, may_end
        done, counts, finished, active, offered, accepted, tokens = reports.read(k)
        if k > 0:
            stats.add(active, offered, accepted)
        if on_tokens is not None:
            ready = max(counts) if done else min(N if f else c for c, f in zip(counts, finished))
            for t in range(streamed, ready):
                on_tokens(tokens[:, t].clone())
            streamed = ready
        if done:
            steps = max(counts)
        may_end = all(f or N - c <= rnd.k + 1 for c, f in zip(counts, finished))
        return done

    def read_to(k: int) -> bool:
        """Read the reports up to k not read yet, in order; whether one said every row stopped (then `stop`)."""
        nonlocal read, stop
        while read < k:
            read += 1
            if stopped_at(read):
                stop = read
                return True
        return False

    out = rnd.out
    with recompile_limits():  # compiled per shape, as the round is (report_values)
        rnd.write_report(rnd.zeros, rnd.zeros, rnd.zeros)
    reports.publish(0, rnd.report, out[:, P : P + N])
    published = 0
    for s in range(N):  # report s follows round s - 1
        if s > 0:
            # host sync, at the end of a call only: where the rounds already enqueued could have stopped every row
            # (may_end, from the last report read), their last report is read before another round is enqueued, so
            # that a call whose every row stops where it could runs no round past its stop (a whole verify step); a
            # row that rejects a draft there costs the GPU one idle gap
            if may_end and read < s - 1 and read_to(s - 1):
                break
            graph.run(functools.partial(rnd.play, generator), recompile_limits)
            reports.publish(s, rnd.report, out[:, P : P + N])
            published = s
        if s >= lag and read_to(s - lag):
            break
    else:
        read_to(N - 1)  # report N - 1: every row has stopped
    late = published > stop
    return out[:, : P + steps].clone(), stats, late, graph
