"""What the speculative decoding tests share: a call's output with its round counts, and the checks of those counts
(every draft accepted when the model drafts for itself; the drafts a row offers near its last allowed token)."""

from __future__ import annotations

import overlapdecode as od


def spec_generate(model, ids, mask, preset, eos, n, **kw):
    """od.generate's greedy or sampled output (pad 0) and the decoder's SpecStats of the call (None without one)."""
    out = od.generate(
        model, ids, attention_mask=mask, max_new_tokens=n, strategy=preset, eos_token_id=eos, pad_token_id=0, **kw
    )
    return out, od.decoder_for(model).last_speculation


def all_accepted_but_past_eos(stats) -> bool:
    """Every draft offered was accepted, but those after an EOS accepted in a row's last round."""
    for r, (offered, accepted) in enumerate(zip(stats.drafted, stats.accepted)):
        for i, (d, a) in enumerate(zip(offered, accepted)):
            last = r + 1 == stats.rounds or not stats.active[r + 1][i]
            if a != d and not (last and a < d):
                return False
    return True


def expected_drafts(k: int, n: int) -> list[int]:
    """The drafts a row offers each round when every draft is accepted: K, but none past its last allowed token."""
    count, out = 1, []
    while count < n:
        out.append(min(k, n - 1 - count))
        count += out[-1] + 1
    return out
