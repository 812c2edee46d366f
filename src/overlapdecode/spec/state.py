"""What a speculative call keeps on the device, and one round over it: shared by the reference loop (rounds.py,
which reads the host once a round) and the captured rounds of the compiled presets (loop/rounds.py), so that both
draw the same numbers in the same order and take the same tokens.

Every update is in place: a round captured in a CUDA graph is replayed over the same tensors, so it must write
its results where the next replay reads them. Nothing here reads a device value on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..sampling import draw_noise, mark_finished, pick_next
from .accept import greedy_accept, greedy_choices, is_eos, speculative_accept, stop_at_eos, warped_probs


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

    def add(self, active: list, offered: list, accepted: list) -> None:
        """One round's host values (one per row; an inactive row's counts become 0)."""
        self.active.append([bool(a) for a in active])
        self.drafted.append([d if a else 0 for d, a in zip(offered, active)])
        self.accepted.append([n if a else 0 for n, a in zip(accepted, active)])


@dataclass
class RowState:
    """Each row's state on the device: `last` its last token (not yet in the caches) at position `pos`, `count`
    tokens generated, `finished`; `hist`/`hlen` its tokens without left padding (prompt lookup); `seen` the
    repetition penalty's (B, V) mask. A round sets `active` (the rows still generating) and `cap` (the drafts each
    may offer) before it drafts."""

    last: torch.Tensor
    pos: torch.Tensor
    count: torch.Tensor
    finished: torch.Tensor
    hist: torch.Tensor | None
    hlen: torch.Tensor | None
    seen: torch.Tensor | None
    active: torch.Tensor | None = None
    cap: torch.Tensor | None = None


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


def feed_positions(pos: torch.Tensor, active: torch.Tensor, dlen: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """(B, T) the position of each token a round feeds a row (`steps` the (T,) range 0..T-1: its last token, then its
    drafts), from the rows' (B,) positions, activity and drafts offered: its own up to the row's last draft, then one
    past it for every token beyond, which no row keeps (so that where the slot is the position, as in the fused
    cache, they never overwrite a kept slot), and the row's last position alone on a row that has stopped (never
    past the model's positions)."""
    limit = dlen + active.long()
    return pos[:, None] + torch.minimum(steps[None, :], limit[:, None])


def round_start(finished: torch.Tensor, count: torch.Tensor, n_max: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A round's first work -> ((B,) the rows still generating, (B,) the drafts each may offer: its tokens left but
    the one the round adds, at most k). Tensors in, tensors out (torch.compile fuses it: loop/rounds.py)."""
    active = ~finished & (count < n_max)
    return active, torch.where(active, (n_max - 1 - count).clamp(max=k), 0)


def verify_feed(last, pos, active, drafts, dlen, cap) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the verify forward is fed -> ((B, K + 1) the rows' last tokens and drafts, their positions
    (feed_positions), (B,) the drafts offered: `dlen` capped at `cap`). Tensors in, tensors out."""
    dlen = torch.minimum(dlen, cap)
    steps = torch.arange(drafts.shape[1] + 1, device=drafts.device)
    return torch.cat([last[:, None], drafts], dim=1), feed_positions(pos, active, dlen, steps), dlen


class RoundOps(NamedTuple):
    """The work of a round around its forwards: these functions, or them compiled (loop/rounds.py)."""

    start: Callable = round_start
    feed: Callable = verify_feed
    greedy_end: Callable | None = None  # end_greedy_round (None: the eager one)


EAGER_ROUND = RoundOps()


def begin(req, logits, noise, params, eos_ids, positions, seen, lookup: bool):
    """Step 0 from the prefill's (B, V) logits, as without speculation (the same token from the same draw) ->
    (the RowState, the (B, P + N + 1) output: the prompt, the first token, pad, and a dump column)."""
    B, P = req.input_ids.shape
    N, device = req.max_new_tokens, logits.device
    first = pick_next(logits, noise, params, seen)
    first, finished, _ = mark_finished(first, torch.zeros(B, dtype=torch.bool, device=device), eos_ids, req.pad_id)
    out = torch.full((B, P + N + 1), req.pad_id, dtype=torch.long, device=device)
    out[:, :P] = req.input_ids
    out[:, P] = first
    hist = hlen = None
    if lookup:  # each row's tokens without its left padding, then what it generates
        hlen = req.attention_mask.sum(dim=1)
        hist = torch.zeros((B, P + N + 1), dtype=torch.long, device=device)
        shift = (torch.arange(P, device=device)[None, :] + (P - hlen)[:, None]).clamp(max=P - 1)
        hist[:, :P] = req.input_ids.gather(1, shift)
        hist.scatter_(1, hlen[:, None], first[:, None])
        hlen = hlen + 1
    if seen is not None:
        seen.scatter_(1, first[:, None], True)
    count = torch.ones(B, dtype=torch.long, device=device)
    return RowState(first, positions[:, -1] + 1, count, finished, hist, hlen, seen), out


def play_round(
    state: RowState, out, drafter, target, params, generator, eos_ids, n_max: int, ops: RoundOps = EAGER_ROUND
):
    """One round for every row at once, on the device: draft, verify the last token and the drafts in one forward of
    `target` (over K + 1 positions), accept, write the tokens into `out` (and `hist`), advance the state in place ->
    ((B,) bool active, (B,) drafts offered, (B,) accepted, (B,) slots each row keeps of the K + 1 written).
    Draws, in order: the draft model's noise (B, V) per draft when it samples, a uniform (B, K), an exponential
    (B, V). `ops`: the work around the forwards (the captured rounds pass it compiled: loop/rounds.py)."""
    P = out.shape[1] - 1 - n_max
    B, device = state.last.shape[0], state.last.device
    state.active, state.cap = active, cap = ops.start(state.finished, state.count, n_max, drafter.k)
    drafts, dlen, q = drafter.propose(state, params, generator)
    K = drafts.shape[1]
    tokens, positions, dlen = ops.feed(state.last, state.pos, active, drafts, dlen, cap)
    logits = target.forward(tokens, positions, K + 1)
    if not params.do_sample:
        n, kept = (ops.greedy_end or end_greedy_round)(state, out, drafts, dlen, logits, params, eos_ids, P)
        return active, dlen, n, kept
    steps_seen = None if state.seen is None else seen_after(state.seen, drafts)
    p = warped_probs(logits, params, steps_seen)
    u = torch.rand((B, K), generator=generator, device=device)
    n, nxt = speculative_accept(drafts, dlen, p, q, u, draw_noise((B, p.shape[-1]), device, generator))
    return active, dlen, *take_tokens(state, out, drafts, n, nxt, eos_ids, P)


def end_greedy_round(state: RowState, out, drafts, dlen, logits, params, eos_ids, P: int):
    """A greedy round after its forward: the model's choices, the drafts accepted, the tokens taken -> ((B,)
    accepted, (B,) slots kept). Tensors in, tensors out, every update in place: one function torch.compile can
    fuse into a few kernels."""
    steps_seen = None if state.seen is None else seen_after(state.seen, drafts)
    n, nxt = greedy_accept(drafts, dlen, greedy_choices(logits, params, steps_seen))
    return take_tokens(state, out, drafts, n, nxt, eos_ids, P)


def take_tokens(state: RowState, out, drafts, n, nxt, eos_ids, P: int):
    """Each active row takes its `n` accepted drafts, then `nxt` (none after an accepted EOS): written into `out`
    (and `hist`, `seen`), its count, position, last token and finished flag advanced -> ((B,) accepted, (B,) slots
    kept of the K + 1 written)."""
    active = state.active
    n, eos_hit = stop_at_eos(drafts, n, eos_ids)
    # the round's tokens: the accepted drafts, then the next token (none after an accepted EOS)
    emitted = torch.cat([drafts, drafts[:, :1]], dim=1).scatter(1, n[:, None], nxt[:, None])
    m = torch.where(active, n + (~eos_hit).long(), 0)
    write_rows(out, P + state.count, emitted, m)
    taken = torch.arange(emitted.shape[1], device=n.device)[None, :] < m[:, None]
    if state.hist is not None:
        write_rows(state.hist, state.hlen, emitted, m)
        state.hlen.add_(m)
    if state.seen is not None:
        state.seen |= torch.zeros_like(state.seen, dtype=torch.long).scatter_add_(1, emitted, taken.long()) > 0
    state.finished |= active & (is_eos(emitted, eos_ids) & taken).any(dim=1)
    state.count.add_(m)
    state.pos.copy_(torch.where(active, state.pos + n + 1, state.pos))
    state.last.copy_(torch.where(active, nxt, state.last))
    return n, torch.where(active, n + 1, 0)
