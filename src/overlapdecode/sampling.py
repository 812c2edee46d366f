"""Choosing the next token without a host sync: greedy argmax, or sampling with Hugging Face's processors, then
the stop bookkeeping of the finished rows (`choose_next`, the decode loop's choice and the fused kernels' reference).

The processors and their order are Hugging Face `generate()`'s: the repetition penalty on the raw logits (also
when greedy), then temperature, top-k, top-p and min-p. The sampler sorts nothing and its shapes never depend
on the data, so that no compiler path for sorts or long scans is taken (inductor's split-scan code generation
fails on a `cumsum` over a long row on CUDA, pytorch/pytorch#180221) and nothing here reads a device value on
the host:

- top-k keeps every score >= the k-th largest (ties with it kept, as Hugging Face does), from `torch.topk`;
- top-p keeps a token when the probability of every token scored at or below it exceeds `1 - top_p` (Hugging
  Face's rule on its ascending sort: the cumulative probability <= 1 - top_p is removed). The boundary score
  is found by a fixed number of bisection rounds over the scores' bits, each one masked sum. Ties: a group of
  equal scores across the boundary is kept whole, where Hugging Face keeps the part its sort places last; that
  order is unspecified (`torch.sort` with stable=False does not keep index order on CPU), so the kept set is
  Hugging Face's plus, at most, the rest of that one group;
- min-p keeps the tokens whose probability is at least `min_p` times the largest.

The draw is the exponential race: each step draws `noise ~ Exponential(1)` of shape (B, V) from a seeded
generator and picks the kept token with the largest `p / noise`, which samples exactly from the kept,
renormalised probabilities (as in gpt-fast). Every preset draws the same noise for the same step, so a seed gives
the same tokens under every preset. The fused path's Triton sampler (fused/kernels/sample.py) computes the same
choice with this module as its reference.

A small temperature sharpens towards greedy: the logits are shifted by their maximum before the division,
so that `logit / temperature` can only overflow to -inf (probability 0), never to +inf (inf - inf = NaN
probabilities). A temperature below float32's smallest normal number is refused: it cannot be divided by.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch


class IgnoredSamplingWarning(UserWarning):
    """Greedy decoding given sampling values, which it ignores (as Hugging Face warns); `ignored` holds their
    argument names, so that the command line can name its own flags."""

    def __init__(self, ignored):
        self.ignored = tuple(ignored)
        super().__init__(
            f"do_sample=False: {', '.join(self.ignored)} ignored, the decoding is greedy; pass do_sample=True to sample"
        )


# torch.Generator.manual_seed takes a 64-bit unsigned seed.
SEED_LIMIT = 2**64
# The smallest normal float32: below it a temperature is a subnormal or rounds to 0 on the device.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny
# Bisection rounds over a score's order-preserving int32 key: the keys span less than 2**32.
KEY_ROUNDS = 33


def check_seed(seed, allow_none: bool = True) -> None:
    """`seed` must be an int a torch.Generator takes, 0 <= seed < 2**64 (or None where allowed)."""
    if seed is None and allow_none:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int{' or None' if allow_none else ''}, got {type(seed).__name__}")
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64) (what a torch.Generator takes), got {seed}")


@dataclass(frozen=True)
class SamplingParams:
    """How a step picks its token. `repetition_penalty` applies to greedy decoding too (a processor in Hugging
    Face, not a warper); the other fields only when `do_sample`."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    @property
    def uses_seen(self) -> bool:
        """Whether a step needs the (B, V) mask of the tokens each row has seen (prompt and generated)."""
        return self.repetition_penalty is not None


def _number(name: str, value, kind=(int, float), what: str = "a number") -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        raise TypeError(f"{name} must be {what} or None, got {type(value).__name__}")


def check_sampling(do_sample, temperature, top_k, top_p, seed, min_p=None, repetition_penalty=None) -> SamplingParams:
    """Validate the sampling arguments (ValueError/TypeError naming the argument). Greedy (do_sample=False)
    checks the warpers' types only and ignores their values, as Hugging Face generate() does: temperature=0 is a
    common way to ask for greedy decoding; any other value than the defaults (temperature 1, top_k, top_p and
    min_p None) gets a UserWarning that it is ignored, as Hugging Face warns. The repetition penalty applies to
    greedy decoding as well; 1.0 (no penalty) is the same as None."""
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool, got {type(do_sample).__name__}")
    _number("temperature", temperature)
    _number("top_k", top_k, (int,), "an int")
    _number("top_p", top_p)
    _number("min_p", min_p)
    _number("repetition_penalty", repetition_penalty)
    check_seed(seed)
    if repetition_penalty is not None:
        if not (repetition_penalty > 0 and math.isfinite(repetition_penalty)):  # also rejects NaN
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty}")
        repetition_penalty = None if repetition_penalty == 1 else float(repetition_penalty)
    if not do_sample:
        ignored = [
            name
            for name, value, unset in (
                ("temperature", temperature, (None, 0, 1)),
                ("top_k", top_k, (None,)),
                ("top_p", top_p, (None,)),
                ("min_p", min_p, (None,)),
            )
            if value not in unset
        ]
        if ignored:  # Hugging Face generate() says so too: a sampling value with greedy is usually a mistake
            warnings.warn(
                IgnoredSamplingWarning(ignored), stacklevel=4
            )  # <- make_plan <- Decoder.generate <- its caller
        return SamplingParams(False, repetition_penalty=repetition_penalty)
    if temperature is None:
        temperature = 1.0
    if not temperature > 0:  # also rejects NaN
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature < MIN_TEMPERATURE:
        raise ValueError(
            f"temperature {temperature} is too small to divide by in float32 (below "
            f"{MIN_TEMPERATURE:.3g}); use do_sample=False for greedy"
        )
    if temperature == float("inf"):
        raise ValueError("temperature must be finite, got inf")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: no top-k, as in Hugging Face), got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p}")
    return SamplingParams(
        do_sample,
        float(temperature),
        top_k=top_k or None,  # 0 is Hugging Face's "no top-k"
        top_p=None if top_p is None or top_p == 1 else float(top_p),  # 1 keeps every token: no warper
        min_p=None if min_p is None or min_p == 0 else float(min_p),  # 0 keeps every token: no warper
        repetition_penalty=repetition_penalty,
    )


def make_generator(params: SamplingParams, seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator on `device` seeded with `seed` (or from the global CPU RNG, so manual_seed governs it)."""
    if not params.do_sample:
        return None
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)).item())  # CPU tensor: no device sync
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def draw_noise(logits_shape, device, generator: torch.Generator | None, out: torch.Tensor | None = None):
    """This step's (B, V) exponential noise, or None for greedy. Drawn on the current stream, no sync;
    into `out` (float32, of that shape) when given: a captured step reads its noise from a fixed address."""
    if generator is None:
        return None
    if out is None:
        out = torch.empty(logits_shape, dtype=torch.float32, device=device)
    return out.exponential_(generator=generator)


def seen_tokens(input_ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, P) prompt ids -> the (B, V) bool mask of the tokens each row has seen. Every column counts, left
    padding included: Hugging Face's repetition penalty reads the whole `input_ids`, pad tokens too."""
    seen = torch.zeros((input_ids.shape[0], vocab), dtype=torch.bool, device=input_ids.device)
    return seen.scatter_(1, input_ids, True)


def mark_seen(seen: torch.Tensor, tokens: torch.Tensor) -> None:
    """Add this step's (B,) tokens to the seen mask, in place (a finished row's pad too, as Hugging Face
    appends it to `input_ids`)."""
    seen.scatter_(1, tokens[:, None], True)


def penalize(logits: torch.Tensor, seen: torch.Tensor | None, penalty: float | None) -> torch.Tensor:
    """Hugging Face's repetition penalty on float32 logits (B, V): a seen token's logit is divided by the
    penalty when positive, multiplied by it when negative."""
    if penalty is None:
        return logits
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


ARGMAX_CHUNK = 1024


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,): `x.argmax(-1)` (the first index of the row maximum, NaN counting as the maximum), in
    two stages over chunks of ARGMAX_CHUNK: the maximum of each chunk, then the first chunk holding the row's.
    Why: compiled, a one-stage argmax over a 128K vocabulary at batch 1 is one program per row, longer than a
    layer of the fused step (docs/DESIGN.md, the sampler); the chunked form spreads it over the GPU."""
    B, V = x.shape
    if V <= 4 * ARGMAX_CHUNK:
        return x.argmax(dim=-1)
    n = -(-V // ARGMAX_CHUNK)
    padded = torch.nn.functional.pad(x, (0, n * ARGMAX_CHUNK - V), value=float("-inf"))
    best, within = padded.view(B, n, ARGMAX_CHUNK).max(dim=-1)  # first index of each chunk's maximum
    chunk = best.argmax(dim=-1)  # first chunk holding the row maximum
    return chunk * ARGMAX_CHUNK + within.gather(1, chunk[:, None])[:, 0]


def scaled_scores(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """(B, V) logits -> float32 scores after the repetition penalty and temperature, shifted so that each row's
    maximum is 0 (then exp(score) is the unnormalised probability, at most 1)."""
    x = penalize(logits.float(), seen, params.repetition_penalty)
    # shifted by the row maximum first: the division can then only overflow to -inf (see the docstring); + 0.0
    # turns -0.0 into 0.0, so that equal scores have equal keys
    return (x - x.amax(dim=-1, keepdim=True)) / params.temperature + 0.0


def score_keys(scores: torch.Tensor) -> torch.Tensor:
    """(B, V) float32 -> int64 keys in the scores' order: the float bits as an order-preserving int32 (the
    magnitude bits of negative floats flipped), so that a bisection over keys finds a score exactly."""
    bits = scores.view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()


def kept_tokens(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None):
    """The tokens Hugging Face's warpers keep at this step: (scores (B, V) float32, kept (B, V) bool)."""
    scores = scaled_scores(logits, params, seen)
    B, V = scores.shape
    kept = scores > float("-inf")
    if params.top_k is not None and params.top_k < V:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]  # (B, 1)
        kept = kept & (scores >= kth)  # ties with the k-th kept, as Hugging Face does
    if params.top_p is not None:
        e = torch.where(kept, scores.exp(), 0.0)
        probs = e / e.sum(dim=-1, keepdim=True)  # the softmax over the top-k set
        keys = score_keys(scores)
        limit = 1.0 - params.top_p
        # bisection for the smallest score key whose mass at or below it exceeds 1 - top_p: `hi` always
        # satisfies it (all the mass is at or below the largest key), `lo` never does (none is below the least)
        hi = keys.amax(dim=-1)  # (B,)
        lo = keys.amin(dim=-1) - 1
        for _ in range(KEY_ROUNDS):
            mid = lo + (hi - lo) // 2
            over = torch.where(keys <= mid[:, None], probs, 0.0).sum(dim=-1) > limit
            hi = torch.where(over, mid, hi)
            lo = torch.where(over, lo, mid)
        kept = kept & (keys >= hi[:, None])
    if params.min_p is not None:
        # probability >= min_p x the largest; the largest score is 0, so its unnormalised probability is 1
        kept = kept & (scores.exp() >= params.min_p)
    return scores, kept


def pick_next(
    logits: torch.Tensor, noise: torch.Tensor | None, params: SamplingParams, seen: torch.Tensor | None = None
) -> torch.Tensor:
    """(B, V) logits -> (B,) token ids: greedy (after the repetition penalty), or the exponential race over the
    kept tokens (`noise` (B, V) float32, Exponential(1)). `seen`: the (B, V) mask of seen tokens, needed when
    params.uses_seen."""
    if params.uses_seen and seen is None:
        raise ValueError("seen: the repetition penalty needs the mask of the tokens each row has seen")
    if noise is None:
        return argmax_rows(penalize(logits.float(), seen, params.repetition_penalty) if params.uses_seen else logits)
    scores, kept = kept_tokens(logits, params, seen)
    race = torch.where(kept, scores.exp() / noise, -1.0)  # a kept token always beats a dropped one
    return argmax_rows(race)


# the stop ids a call's EOS tensor has room for, at least (Llama 3's generation config names 3)
EOS_WIDTH = 4


def eos_width(count: int) -> int:
    """The width of the EOS tensor of `count` stop ids: EOS_WIDTH, or the next power of two for more."""
    return max(EOS_WIDTH, 1 << max(count - 1, 0).bit_length())


def eos_tensor(ids, device) -> torch.Tensor:
    """A call's stop ids (token ids, checked to lie in the vocabulary) as the (W,) long tensor that its steps compare
    each token with, W = eos_width(len(ids)), the rest -1: no token is -1, so it never matches. A compiled step
    specialises on its inputs' shapes: at one width, calls of 0 to W stop ids share one graph (and one captured step)
    instead of compiling one per count."""
    ids = list(ids)
    return torch.tensor(ids + [-1] * (eos_width(len(ids)) - len(ids)), dtype=torch.long, device=device)


def mark_finished(tokens: torch.Tensor, finished: torch.Tensor, eos_ids: torch.Tensor, pad_id: int):
    """(B,) tokens, (B,) finished -> tokens with pad on finished rows, updated finished, 0-d "all done"."""
    tokens = torch.where(finished, pad_id, tokens)
    finished = finished | torch.isin(tokens, eos_ids)
    return tokens, finished, finished.all()


def choose_next(logits, position, state, eos_ids, pad_id: int, noise, params: SamplingParams, seen=None):
    """(B, V) logits of the tokens at `position` (B,) -> the new state (B, 3) long (token, its position + 1,
    finished: the decode loop's state) and the all-finished flag (0-d bool). `state` (B, 3): the rows' state before
    this step (its column 2, the finished flags, is read)."""
    tokens = pick_next(logits, noise, params, seen)
    tokens, finished, done = mark_finished(tokens, state[:, 2].bool(), eos_ids, pad_id)
    return torch.stack([tokens, position + 1, finished.long()], dim=1), done
