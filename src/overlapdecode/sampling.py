"""Choosing the next token without a host sync: greedy argmax, or temperature / top-k / top-p sampling.

`torch.multinomial` on CUDA is fine too, but its use with a seeded generator inside the step is awkward and
its draw depends on the kernel; instead each step draws `noise ~ Exponential(1)` of shape (B, V) from a
seeded generator and picks `argmax(probs / noise)`, which samples exactly from `probs` (the exponential race,
as in gpt-fast). Every strategy draws the same noise for the same step, so a seed gives the same tokens
whatever the strategy. Nothing here reads a device value on the host.

A small temperature sharpens towards greedy: the logits are shifted by their maximum before the division,
so that `logit / temperature` can only overflow to -inf (probability 0), never to +inf (inf - inf = NaN
probabilities). A temperature below float32's smallest normal number is refused: it cannot be divided by.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


# torch.Generator.manual_seed takes a 64-bit unsigned seed.
SEED_LIMIT = 2**64
# The smallest normal float32: below it a temperature is a subnormal or rounds to 0 on the device.
MIN_TEMPERATURE = torch.finfo(torch.float32).tiny


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
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


def check_sampling(do_sample, temperature, top_k, top_p, seed) -> SamplingParams:
    """Validate the sampling arguments (ValueError/TypeError naming the argument). Greedy (do_sample=False)
    checks their types only and ignores their values, as Hugging Face generate() does: temperature=0 is a
    common way to ask for greedy decoding; any other value than the defaults (temperature 1, top_k and top_p
    None) gets a UserWarning that it is ignored, as Hugging Face warns."""
    if not isinstance(do_sample, bool):
        raise TypeError(f"do_sample must be a bool, got {type(do_sample).__name__}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise TypeError(f"temperature must be a number, got {type(temperature).__name__}")
    for name, value, kind in (("top_k", top_k, (int,)), ("top_p", top_p, (int, float))):
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise TypeError(f"{name} must be {'an int' if kind == (int,) else 'a number'} or None, got "
                            f"{type(value).__name__}")
    check_seed(seed)
    if not do_sample:
        ignored = [name for name, value, unset in (("temperature", temperature, (0, 1)), ("top_k", top_k, (None,)),
                                                   ("top_p", top_p, (None,))) if value not in unset]
        if ignored:  # Hugging Face generate() says so too: a sampling value with greedy is usually a mistake
            warnings.warn(f"do_sample=False: {', '.join(ignored)} ignored, the decoding is greedy; pass "
                          f"do_sample=True to sample", UserWarning, stacklevel=3)
        return SamplingParams(False)
    if not temperature > 0:  # also rejects NaN
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if temperature < MIN_TEMPERATURE:
        raise ValueError(f"temperature {temperature} is too small to divide by in float32 (below "
                         f"{MIN_TEMPERATURE:.3g}); use do_sample=False for greedy")
    if temperature == float("inf"):
        raise ValueError("temperature must be finite, got inf")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    return SamplingParams(do_sample, float(temperature), top_k, None if top_p is None else float(top_p))


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


ARGMAX_CHUNK = 1024


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """(B, V) -> (B,): `x.argmax(-1)` (the first index of the row maximum, NaN counting as the maximum), in
    two stages over chunks of ARGMAX_CHUNK: the maximum of each chunk, then the first chunk holding the row's.
    Why: compiled, a one-stage argmax over a 128K vocabulary at batch 1 is one program per row, 32 us on the
    H200 (profile of the fused step), more than a layer; the chunked form spreads it over the GPU."""
    B, V = x.shape
    if V <= 4 * ARGMAX_CHUNK:
        return x.argmax(dim=-1)
    n = -(-V // ARGMAX_CHUNK)
    padded = torch.nn.functional.pad(x, (0, n * ARGMAX_CHUNK - V), value=float("-inf"))
    best, within = padded.view(B, n, ARGMAX_CHUNK).max(dim=-1)  # first index of each chunk's maximum
    chunk = best.argmax(dim=-1)  # first chunk holding the row maximum
    return chunk * ARGMAX_CHUNK + within.gather(1, chunk[:, None])[:, 0]


def pick_next(logits: torch.Tensor, noise: torch.Tensor | None, params: SamplingParams) -> torch.Tensor:
    """(B, V) logits -> (B,) token ids. Same order of warpers as Hugging Face: temperature, top-k, top-p."""
    if noise is None:
        return argmax_rows(logits)
    logits = logits.float()
    # shifted by the row maximum first: the division can then only overflow to -inf (see the docstring)
    scores = (logits - logits.amax(dim=-1, keepdim=True)) / params.temperature
    if params.top_k is not None and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]  # (B, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - params.top_p)
        drop_sorted[:, -1] = False  # always keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    probs = scores.softmax(dim=-1)
    return argmax_rows(probs / noise)
