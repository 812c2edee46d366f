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

import torch

from ..inputs import position_ids_for_prompt
from ..sampling import draw_noise, eos_tensor, make_generator, seen_tokens
from .cache import RowCache, spec_cache_len
from .candidates import Assistant, PromptLookup
from .state import SpecStats, begin, play_round


def speculate(model, plan, device: torch.device, on_tokens=None) -> tuple[torch.Tensor, SpecStats]:
    """Run one call's plan (plan.Plan with `spec`) -> ((B, P + n) ids as generate returns them, its SpecStats).
    `on_tokens`: called with each step's (B,) host tokens in order, once every row's token of that step is known."""
    req, params, spec = plan.request, plan.sampling, plan.spec
    B, P = req.input_ids.shape
    N, K = req.max_new_tokens, spec.k
    eos_ids = eos_tensor(req.eos_ids, device)
    generator = make_generator(params, plan.seed, device)
    V = model.get_output_embeddings().weight.shape[0]
    length = spec_cache_len(P, N, K, B)
    positions = position_ids_for_prompt(req.attention_mask)
    target = RowCache(model, plan.cache, req.attention_mask, length)
    if spec.kind == "assistant":
        drafter = Assistant(RowCache(spec.assistant, plan.cache, req.attention_mask, length), K)
    else:
        drafter = PromptLookup(K, spec.ngram, eos_ids)

    # step 0: the prompt, as without speculation
    seen = seen_tokens(req.input_ids, V) if params.uses_seen else None
    logits = target.prefill(req.input_ids, req.attention_mask, positions)
    noise = draw_noise((B, V), device, generator)
    state, out = begin(req, logits, noise, params, eos_ids, positions, seen, isinstance(drafter, PromptLookup))
    drafter.prefill(req.input_ids, req.attention_mask, positions)
    stats = SpecStats(K)
    streamed = 0
    counts, done = state.count.tolist(), state.finished.tolist()  # host read: the stop after step 0
    ahead = torch.arange(K + 1, device=device)[None, :]
    while any(not d and c < N for c, d in zip(counts, done)):
        start = target.used
        active, dlen, n, kept_slots = play_round(state, out, drafter, target, params, generator, eos_ids, N)
        read = torch.stack([active.long(), dlen, n, kept_slots, state.count, state.finished.long()]).tolist()
        act, offered, accepted, slots, counts, done = read  # host read: one per round
        keep = max(slots)
        target.settle(start, ahead < kept_slots[:, None], keep)
        drafter.settle(start, ahead < kept_slots[:, None], keep)
        stats.add(act, offered, accepted)
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
