"""The speculative round loop of the eager presets (`kv`, `static`): the reference that every faster form of it
must give the tokens of.

Step 0 is the prefill, as without speculation (the same token, the same draw). Then each round, for every row at
once: draft K tokens (candidates.py), verify them with one forward of the model over K + 1 positions against its
cache, accept (accept.py), write the accepted tokens and the next one, cut the caches back (cache.py). Rows advance
by different counts: each keeps its own position, count of tokens and finished flag on the device, and writes its
tokens at its own columns of the output. A row stops at its first EOS, also inside an accepted run, and has pad
after it; no row drafts past its last allowed token. The host reads one small tensor per round: the counts, for
the stop and the cut (and a streamer's tokens).

A seed draws, in this order: step 0's exponential noise (B, V); then per round the draft model's noise (B, V) per
draft when it samples, a uniform (B, K) for the acceptances, an exponential (B, V) for each row's last token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..inputs import position_ids_for_prompt
from ..sampling import draw_noise, make_generator, mark_finished, pick_next, seen_tokens
from .accept import greedy_accept, greedy_choices, speculative_accept, stop_at_eos, warped_probs
from .cache import RowCache, spec_cache_len
from .candidates import Assistant, PromptLookup


@dataclass
class SpecStats:
    """What the rounds of the last speculative call did, per round and row: `drafted` the drafts a row offered,
    `accepted` how many it accepted, `active` whether it was still generating (else both are 0)."""

    k: int
    drafted: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    active: list = field(default_factory=list)

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafts offered, all rounds and rows (0.0 when none were offered)."""
        offered = sum(map(sum, self.drafted))
        return sum(map(sum, self.accepted)) / offered if offered else 0.0


@dataclass
class RowState:
    """Each row's state on the device: `last` its last token (not yet in the caches) at position `pos`, `count`
    tokens generated, `finished`, `cap` the drafts it may offer this round; `hist`/`hlen` its tokens without left
    padding (prompt lookup); `seen` the repetition penalty's (B, V) mask."""

    last: torch.Tensor
    pos: torch.Tensor
    count: torch.Tensor
    finished: torch.Tensor
    cap: torch.Tensor
    hist: torch.Tensor | None
    hlen: torch.Tensor | None
    seen: torch.Tensor | None


def write_rows(buf: torch.Tensor, start: torch.Tensor, tokens: torch.Tensor, m: torch.Tensor) -> None:
    """Row i's first m[i] `tokens` (B, T) into `buf` (B, L + 1) at columns start[i]..; its last column takes the
    rest (a dump column: one scatter, no host read)."""
    T = tokens.shape[1]
    ahead = torch.arange(T, device=tokens.device)[None, :]
    idx = torch.where(ahead < m[:, None], start[:, None] + ahead, buf.shape[1] - 1)
    buf.scatter_(1, idx, tokens)


def seen_after(seen: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """(B, V) seen mask, (B, K) drafts -> (B, K + 1, V): what each verified position has seen (its drafts so far)."""
    steps = [seen]
    for j in range(drafts.shape[1]):
        steps.append(steps[-1].scatter(1, drafts[:, j : j + 1], True))
    return torch.stack(steps, dim=1)


def speculate(model, plan, device: torch.device, on_tokens=None) -> tuple[torch.Tensor, SpecStats]:
    """Run one call's plan (plan.Plan with `spec`) -> ((B, P + n) ids as generate returns them, its SpecStats).
    `on_tokens`: called with each step's (B,) host tokens in order, once every row's token of that step is known."""
    req, params, spec = plan.request, plan.sampling, plan.spec
    B, P = req.input_ids.shape
    N, K = req.max_new_tokens, spec.k
    eos_ids = torch.tensor(req.eos_ids, dtype=torch.long, device=device)
    generator = make_generator(params, plan.seed, device)
    V = model.get_output_embeddings().weight.shape[0]
    length = spec_cache_len(P, N, K, B)
    positions = position_ids_for_prompt(req.attention_mask)
    target = RowCache(model, plan.cache, req.attention_mask, length)
    if spec.kind == "assistant":
        drafter = Assistant(spec.assistant, plan.cache, req.attention_mask, length, K)
    else:
        drafter = PromptLookup(K, spec.ngram, eos_ids)

    # step 0: the prompt, as without speculation
    seen = seen_tokens(req.input_ids, V) if params.uses_seen else None
    logits = target.forward(req.input_ids, positions, 1)[:, -1]
    first = pick_next(logits, draw_noise((B, V), device, generator), params, seen)
    first, finished, _ = mark_finished(first, torch.zeros(B, dtype=torch.bool, device=device), eos_ids, req.pad_id)
    if isinstance(drafter, Assistant):
        drafter.prefill(req.input_ids, positions)
    out = torch.full((B, P + N + 1), req.pad_id, dtype=torch.long, device=device)  # + the dump column
    out[:, :P] = req.input_ids
    out[:, P] = first
    hist = hlen = None
    if isinstance(drafter, PromptLookup):  # each row's tokens without its left padding, then what it generates
        hlen = req.attention_mask.sum(dim=1)
        hist = torch.zeros((B, P + N + 1), dtype=torch.long, device=device)
        shift = (torch.arange(P, device=device)[None, :] + (P - hlen)[:, None]).clamp(max=P - 1)
        hist[:, :P] = req.input_ids.gather(1, shift)
        hist.scatter_(1, hlen[:, None], first[:, None])
        hlen = hlen + 1
    if seen is not None:
        seen.scatter_(1, first[:, None], True)
    count = torch.ones(B, dtype=torch.long, device=device)
    state = RowState(first, positions[:, -1] + 1, count, finished, torch.zeros_like(count), hist, hlen, seen)
    stats = SpecStats(K)
    streamed = 0
    counts, done = count.tolist(), finished.tolist()  # host read: the stop after step 0
    ahead = torch.arange(K + 1, device=device)[None, :]
    while any(not d and c < N for c, d in zip(counts, done)):
        active = ~state.finished & (state.count < N)
        state.cap = torch.where(active, (N - 1 - state.count).clamp(max=K), 0)
        drafts, dlen, q = drafter.propose(state, params, generator)
        dlen = torch.minimum(dlen, state.cap)
        # verify: the last token and the drafts in one forward; a row's slots past its drafts repeat its last position
        start = target.used
        tokens = torch.cat([state.last[:, None], drafts], dim=1)
        logits = target.forward(tokens, state.pos[:, None] + torch.minimum(ahead, dlen[:, None]), K + 1)
        steps_seen = None if state.seen is None else seen_after(state.seen, drafts)
        if params.do_sample:
            p = warped_probs(logits, params, steps_seen)
            u = torch.rand((B, K), generator=generator, device=device)
            n, nxt = speculative_accept(drafts, dlen, p, q, u, draw_noise((B, V), device, generator))
        else:
            n, nxt = greedy_accept(drafts, dlen, greedy_choices(logits, params, steps_seen))
        n, eos_hit = stop_at_eos(drafts, n, eos_ids)
        # the round's tokens: the accepted drafts, then the next token (none after an accepted EOS)
        emitted = torch.cat([drafts, drafts[:, :1]], dim=1).scatter(1, n[:, None], nxt[:, None])
        m = torch.where(active, n + (~eos_hit).long(), 0)
        write_rows(out, P + state.count, emitted, m)
        if state.hist is not None:
            write_rows(state.hist, state.hlen, emitted, m)
            state.hlen = state.hlen + m
        taken = ahead < m[:, None]
        if state.seen is not None:
            state.seen |= torch.zeros_like(state.seen, dtype=torch.long).scatter_add_(1, emitted, taken.long()) > 0
        state.finished = state.finished | (active & (torch.isin(emitted, eos_ids) & taken).any(dim=1))
        state.count = state.count + m
        state.pos = torch.where(active, state.pos + n + 1, state.pos)
        state.last = torch.where(active, nxt, state.last)
        kept_slots = torch.where(active, n + 1, 0)
        read = torch.stack([active.long(), dlen, n, kept_slots, state.count, state.finished.long()]).tolist()
        act, offered, accepted, slots, counts, done = read  # host read: one per round
        keep = max(slots)
        target.settle(start, ahead < kept_slots[:, None], keep)
        drafter.settle(start, ahead < kept_slots[:, None], keep)
        stats.active.append([bool(a) for a in act])
        stats.drafted.append([d if a else 0 for d, a in zip(offered, act)])
        stats.accepted.append([a_n if a else 0 for a_n, a in zip(accepted, act)])
        if on_tokens is not None:
            ready = min(max(counts), *(N if d else c for c, d in zip(counts, done)))
            for t in range(streamed, ready):
                on_tokens(out[:, P + t].cpu())
            streamed = ready
    n_steps = max(counts)
    if on_tokens is not None:
        for t in range(streamed, n_steps):
            on_tokens(out[:, P + t].cpu())
    return out[:, : P + n_steps].clone(), stats
