"""The decode loop and the `Decoder` that owns its state; `generate` uses one decoder kept per model.

One loop serves every strategy: step 0 is the (eager) prefill, step j >= 1 feeds token j-1 through one
model forward, picks token j, replaces it by pad on finished rows and updates the finished mask, all on the
device. A call is first resolved into a plan (plan.py: its cache, how its step runs, its stop check); the step
objects (loop/steps.py with hf/caches.py, or fused/path.py) run the steps and the stop check
(loop/stopping.py) reads their flags, the same way for every plan as seen from the loop. The tokens do not
depend on the strategy: the tests compare every preset with Hugging Face `generate()` and with the no-cache loop.

A `Decoder` owns what outlives one call: the kept static caches, the fused model and its captured steps
(fused/path.py), the two side streams, the pinned stop-flag slots, and the event that marks the end of its
last call. It runs one call at a time.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import weakref

import torch

from .fused.path import FusedPath, spec_rows
from .hf.caches import StaticCaches
from .hf.graph_experts import graph_safe_experts
from .inputs import check_model, model_device
from .loop import markers
from .loop.rounds import forward_for, run_rounds
from .loop.steps import StepInputs, hf_steps
from .loop.stopping import Slots, make_check
from .plan import STATIC_ROUND, Plan, make_plan
from .sampling import eos_tensor, make_generator, seen_tokens
from .spec.cache import StaticRows, spec_cache_len
from .spec.rounds import speculate


class Decoder:
    """Generation for one model, with the state that outlives a call owned here, not on the model.

        dec = od.Decoder(model)
        out = dec.generate(input_ids, max_new_tokens=64, strategy="interleaved")   # as od.generate

    One call at a time: a second call that overlaps a running one (from another thread, or from a streamer
    of the running call) raises RuntimeError at once; it never waits and never shares the running call's
    cache. A server that shares a model between requests serialises them with a lock around `generate`
    (or gives each worker its own model and decoder).

    Between calls: a call ends with its last step's completion recorded as an event on the caller's stream,
    and the next call's stream waits on that event before it resets a kept cache or reuses a pinned slot,
    so steps still running after a late stop can never see the next call's writes, whatever stream the next
    call runs on.
    """

    def __init__(self, model, keep_static: int = 4, fused_options: dict | None = None, _weak: bool = False):
        check_model(model)
        if isinstance(keep_static, bool) or not isinstance(keep_static, int) or keep_static < 0:
            raise ValueError(f"keep_static must be an int >= 0 (the static cache shapes kept), got {keep_static!r}")
        # the decoder od.generate keeps per model (decoder_for) holds it weakly: a strong reference from the
        # value of a weakly keyed dictionary to its key would keep every model ever used alive
        self._model = weakref.ref(model) if _weak else (lambda: model)
        # FusedModel's keywords (pdl, tiles, symmetric_all_reduce, ...), checked now as far as they can be
        self._fused = FusedPath(fused_options)
        self.static_caches = StaticCaches(keep_static)
        self._lock = threading.Lock()
        self._side_streams: dict = {}  # device -> two streams, made once: new streams per call would each
        # get their own allocator pool (and library workspaces), raising reserved memory
        self._slots: dict = {}  # (slots, batch, device) -> Slots, pinned host memory reused call after call
        self._end_event: torch.cuda.Event | None = None  # the last call's last step, on its caller's stream
        self._late_steps = False  # whether the last call returned with steps still queued (a late stop)
        self.last_speculation = None  # the SpecStats of the last speculative call (spec/state.py)
        self._rounds = None  # the last speculative call's captured round (loop/rounds.py), which late rounds replay

    @property
    def fused_options(self) -> dict:
        """FusedModel's keywords for this decoder's fused calls (read when the fused model is made)."""
        return self._fused.options

    @property
    def model(self):
        model = self._model()
        if model is None:
            raise RuntimeError("this decoder's model has been freed")
        return model

    def clear(self) -> None:
        """Free the kept static caches, fused caches and pinned slots (the benchmark calls it between
        configurations). The fused weights stay: they are the model's own parameters, re-laid out once."""
        with self._guard():
            self._wait_last_call()
            self.static_caches.clear()
            self._slots.clear()
            self._fused.clear()
            self._rounds = None

    def fused_model(self):
        """The fused decode of this model (fused/): its weights are re-laid out once, on first use, and the
        Hugging Face model's parameters become views of them (it keeps working). ValueError if the model's
        family is not supported."""
        return self._fused.model_for(self.model, self._wait_last_call)

    def generate(
        self,
        input_ids,
        attention_mask=None,
        max_new_tokens: int = 64,
        strategy="interleaved",
        eos_token_id=None,
        pad_token_id=None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        streamer=None,
        prompt_lookup_num_tokens: int | None = None,
        assistant_model=None,
        num_assistant_tokens: int | None = None,
    ) -> torch.Tensor:
        """Generate up to `max_new_tokens` tokens after each prompt (`od.generate` takes the same arguments,
        after the model; docs/DESIGN.md states the contract).

        Returns (B, P + n) ids: the prompt, then the generated tokens (pad after a row's EOS); n is the
        number of steps until every row emitted EOS, or max_new_tokens. `prompt_lookup_num_tokens` or
        `assistant_model` (with `num_assistant_tokens`): speculative decoding, the same tokens (greedy) or the same
        distribution (sampling); docs/SPECULATIVE.md. `last_speculation` then holds its rounds' counts.
        """
        request = (input_ids, attention_mask, max_new_tokens, strategy, eos_token_id, pad_token_id)
        sampling = dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        sampling.update(repetition_penalty=repetition_penalty, seed=seed)
        speculation = dict(prompt_lookup_num_tokens=prompt_lookup_num_tokens, assistant_model=assistant_model)
        plan = make_plan(self.model, *request, **sampling, **speculation, num_assistant_tokens=num_assistant_tokens)
        sink = _token_sink(streamer)
        # a compiled call's captured step cannot run experts that copy to the host: hf/graph_experts.py
        experts = graph_safe_experts(self.model, plan.step == "compiled", model_device(self.model).type)
        with self._guard(), torch.no_grad(), experts:
            return self._decode(plan, sink) if plan.spec is None else self._speculate(plan, sink)

    def _wait_last_call(self) -> None:
        """Host sync on the last call's last step, before freeing what its late steps may still use."""
        if self._end_event is not None:
            self._end_event.synchronize()

    @contextlib.contextmanager
    def _guard(self):
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "this model's Decoder is already generating (another thread, or a streamer calling generate "
                "again): one call at a time per decoder; serialise calls with a lock, or give each worker its "
                "own model and od.Decoder"
            )
        try:
            yield
        finally:
            self._lock.release()

    def _streams_for(self, device: torch.device) -> list:
        if device not in self._side_streams:
            self._side_streams[device] = [torch.cuda.Stream(device) for _ in range(2)]
        return self._side_streams[device]

    def _slots_for(self, n: int, batch: int, device: torch.device) -> Slots:
        key = (n, batch, device)
        if key not in self._slots:
            while len(self._slots) >= 4:
                self._slots.pop(next(iter(self._slots)))
            self._slots[key] = Slots(n, batch, device)
        return self._slots[key]

    def _steps_maker(self, plan: Plan):
        """What makes the step objects of a call: the fused path's (its fused model made now, or refused) or the
        Hugging Face model's (loop/steps.py)."""
        if plan.fused:
            self.fused_model()
            return self._fused.steps
        return functools.partial(hf_steps, self.model, store=self.static_caches)

    def _decode(self, plan: Plan, sink) -> torch.Tensor:
        model, req, params = self.model, plan.request, plan.sampling
        device = model_device(model)
        cuda = device.type == "cuda"
        main = torch.cuda.current_stream(device) if cuda else None
        B, P = req.input_ids.shape
        N = req.max_new_tokens
        if self._end_event is not None:
            if self._late_steps:
                # host sync, only after a call that stopped with steps still queued: this call may drop (evict) a
                # kept cache or graph those steps use, and a graph's pinned flags would go back to the host
                # allocator's pool while the GPU still writes them (it sees no stream use of them)
                self._wait_last_call()
            # stream hand-off: the last call's late steps are done before this call resets what they used
            main.wait_event(self._end_event)

        make_steps = self._steps_maker(plan)  # an unsupported family is refused here, before any device buffer

        # 1) buffers made once on the caller's stream, before the loop
        eos_ids = eos_tensor(req.eos_ids, device)  # (W,), padded with -1: no EOS id, never stop
        generator = make_generator(params, plan.seed, device)
        vocab_out = model.get_output_embeddings().weight.shape[0]
        # the repetition penalty's (B, V) mask of the tokens each row has seen: the prompt's, then each step's
        seen = seen_tokens(req.input_ids, vocab_out) if params.uses_seen else None
        inputs = StepInputs(P, eos_ids, req.pad_id, params, generator, (B, vocab_out), device, seen)
        steps = make_steps(plan, inputs)  # this call's cache, output buffer (B, P + N) and state (B, 3)
        out = steps.out
        side = self._streams_for(device) if cuda and plan.side_streams else None
        slots = self._slots_for(plan.slots, B, device) if plan.slots else None
        if sink is not None:
            sink.start(req.input_ids)
        check = make_check(
            plan.stop_check,
            plan.lag,
            N,
            main,
            side,
            slots,
            out[:, P:],
            eos_ids if req.eos_ids else None,
            sink.put if sink is not None else None,
        )

        finished, result = False, None
        try:
            # 2) the loop: step j enqueues token j; the check reads the flag it owes after each step
            for j in range(N):
                with check.step(j), markers.phase(markers.PREFILL if j == 0 else markers.DECODE_STEP, cuda):
                    done = steps.prefill() if j == 0 else steps.step(j)
                    # a host flag: the step wrote its tokens into `out` and its flag into pinned host memory itself
                    check.publish(j, done, steps.state[:, 0], steps.host_flag(j))
                if j == 0 and side is not None:
                    steps.used_on(side)
                with markers.phase(markers.STOP_CHECK, cuda):
                    n = check.after_step(j)
                if n is not None:
                    break  # steps n .. j ran late: their tokens are dropped below
            else:
                # 3) a late check still owes the flags of the last `lag` steps
                with markers.phase(markers.STOP_CHECK, cuda):
                    n = check.drain()
            finished = True
        finally:
            check.finish()  # the caller's stream waits for every step enqueued, also if a streamer raised
            if finished:
                # on the caller's stream, after every step and before the end event: a kept output is the kept
                # graph's log, which the next call (whatever its stream) writes again once that event has passed
                result = out if n == N and not steps.out_is_kept else out[:, : P + n].clone()
            self._late_steps = not finished or n < check.last + 1  # steps n .. last may still be running
            if cuda:
                self._end_event = torch.cuda.Event()
                self._end_event.record(main)  # on the caller's stream, after every step of this call
            if sink is not None:
                sink.end()  # also on error: an iterator streamer's reader must not wait for ever
        return result

    def _speculate(self, plan: Plan, sink) -> torch.Tensor:
        """A speculative call: spec/rounds.py's reference loop on the eager presets, which reads the host once a round;
        loop/rounds.py's captured rounds on the others, which read it late (rounds past the stop may still run)."""
        device = model_device(self.model)
        self._wait_last_call()  # host sync: a kept cache of the last call stays untouched by this one
        self._rounds = None  # its rounds are done: their graph may go
        if sink is not None:
            sink.start(plan.request.input_ids)
        put = sink.put if sink is not None else None
        late = False
        try:
            if plan.step == "eager" and not plan.fused:
                out, self.last_speculation = speculate(self.model, plan, device, put)
            else:
                target, draft, kept = self._spec_rows(plan, device)
                out, self.last_speculation, late, self._rounds = run_rounds(plan, device, target, draft, put, kept)
        finally:
            self._late_steps = late
            if device.type == "cuda":
                self._end_event = torch.cuda.Event()
                self._end_event.record(torch.cuda.current_stream(device))
            if sink is not None:
                sink.end()
        return out

    def _spec_rows(self, plan: Plan, device: torch.device):
        """The caches of a call's captured rounds: the model's and the draft model's (None for prompt lookup), and
        where its captured round may be kept for the next call of its shape (the fused cache's graphs where every
        cache of the round is fused: see _keep_rounds_of_draft; else None). Fused: the fused model's, and the draft's
        too where the fused path serves its family; otherwise a static cache each, compiled on CUDA."""
        req, spec = plan.request, plan.spec
        B, P = req.input_ids.shape
        N = req.max_new_tokens
        forward = forward_for(plan, device)
        length = spec_cache_len(P, N, spec.k, B, round_to=STATIC_ROUND)
        if plan.fused:
            target = spec_rows(self.fused_model(), B, plan.cache_len)
        else:
            target = StaticRows(self.model, req.attention_mask, length, forward)
        kept = target.cache.graphs if plan.fused else None
        if spec.kind != "assistant":
            return target, None, kept
        drafter = spec.assistant
        if plan.fused:
            try:
                fused = self.fused_model() if drafter is self.model else decoder_for(drafter).fused_model()
            except ValueError:
                fused = None  # a family the fused path lacks: the draft runs on a static cache
            if fused is not None:
                draft = spec_rows(fused, B, plan.cache_len, tag="draft")
                if drafter is not self.model:
                    _keep_rounds_of_draft(target.fused, target.cache, drafter, fused)
                return target, draft, kept
        return target, StaticRows(drafter, req.attention_mask, length, forward), None


def _keep_rounds_of_draft(model, cache, drafter, fused) -> None:
    """A round with a draft model other than the model is kept with the model's fused `cache` like any other (its key
    holds the draft cache's id: loop/rounds.py Round.key), so that the next call of its shape replays it rather than
    capturing a round again. Such a round holds the draft's fused model `fused` and its cache, never the draft module
    itself, and must not keep them alive past their use: every round kept with a cache of the fused `model` whose
    draft cache its own fused model no longer keeps is dropped here, and every round of `fused` once `drafter` is
    collected (its decoder, which holds `fused`, goes with it). The finalizer holds `cache` weakly: a kept round of a
    draft never keeps the model's cache alive."""
    for mine in model.kept_caches():
        for key, rows in _draft_rounds(mine):
            if not any(c is rows.cache for c in rows.fused.kept_caches()):
                del mine.graphs[key]
    if id(fused) not in cache.drafts_watched:
        cache.drafts_watched.add(id(fused))
        weakref.finalize(drafter, _drop_rounds_of_draft, weakref.ref(cache), id(fused))


def _draft_rounds(cache, fused_id: int | None = None) -> list:
    """(key, the draft's rows) of each round kept with `cache` whose draft runs on a fused model (of id `fused_id`,
    where given)."""
    found = []
    for key, entry in cache.graphs.items():
        rows = getattr(entry, "draft", None)
        fused = getattr(rows, "fused", None)
        if fused is not None and fused_id in (None, id(fused)):
            found.append((key, rows))
    return found


def _drop_rounds_of_draft(cache_ref, fused_id: int) -> None:
    """A draft module was collected: drop the rounds kept with the model's cache (if it still lives) that hold its
    fused model (`fused_id`: stable while such a round holds it), and with them that fused model."""
    cache = cache_ref()
    if cache is None:
        return
    cache.drafts_watched.discard(fused_id)
    for key, _ in _draft_rounds(cache, fused_id):
        del cache.graphs[key]


class _TokenSink:
    """A streamer seen through one interface: a callable of (B,) host tokens, or a Hugging Face streamer
    object (`put`/`end`: `TextStreamer`, `TextIteratorStreamer`), which first receives the prompt, as from
    Hugging Face `generate()`."""

    def __init__(self, streamer):
        self.streamer = streamer
        self.hf = _is_hf_streamer(streamer)

    def start(self, input_ids: torch.Tensor) -> None:
        if self.hf:
            self.streamer.put(input_ids.cpu())  # host sync (once, before the loop), as Hugging Face does

    def put(self, tokens: torch.Tensor) -> None:
        if self.hf:
            self.streamer.put(tokens)
        else:
            self.streamer(tokens)

    def end(self) -> None:
        if self.hf:
            self.streamer.end()


def _is_hf_streamer(streamer) -> bool:
    return hasattr(streamer, "put") and hasattr(streamer, "end")


def _token_sink(streamer) -> _TokenSink | None:
    if streamer is None:
        return None
    if not (callable(streamer) or _is_hf_streamer(streamer)):
        raise TypeError(
            "streamer must be callable (given each step's (B,) host tokens), a Hugging Face streamer (put/end) or None, got "
            f"{type(streamer).__name__}"
        )
    return _TokenSink(streamer)


# `od.generate` keeps one decoder per model, so that its caches and compiled graphs are reused call after
# call; weakly keyed, so that a model that is no longer used is freed with its decoder.
_DECODERS: weakref.WeakKeyDictionary[torch.nn.Module, Decoder] = weakref.WeakKeyDictionary()
_DECODERS_LOCK = threading.Lock()


def decoder_for(model) -> Decoder:
    """The decoder `od.generate` keeps for `model` (made on first use)."""
    check_model(model)  # before a weak reference is taken (a str cannot be one)
    with _DECODERS_LOCK:
        dec = _DECODERS.get(model)
        if dec is None:
            dec = _DECODERS[model] = Decoder(model, _weak=True)
        return dec


def generate(model, *args, **kwargs) -> torch.Tensor:
    """Generate up to `max_new_tokens` tokens after each prompt with the decoder kept for `model`: the arguments
    of `Decoder.generate`, after the model.

    The contract (arguments, output, errors, stop-check semantics) is in docs/DESIGN.md. Returns (B, P + n)
    ids: the prompt, then the generated tokens (pad after a row's EOS); n is the number of steps until every
    row emitted EOS, or max_new_tokens. One call at a time per model (RuntimeError otherwise).
    """
    try:
        _GENERATE_SIGNATURE.bind(model, *args, **kwargs)  # an unknown or missing argument, before any work
    except TypeError as err:
        raise TypeError(f"generate(): {err}") from None
    return decoder_for(model).generate(*args, **kwargs)


def _model_first(method) -> inspect.Signature:
    """The signature of a Decoder method as a function of the model: `self` becomes `model`."""
    sig = inspect.signature(method)
    params = list(sig.parameters.values())
    return sig.replace(parameters=[params[0].replace(name="model"), *params[1:]])


# one signature, written once (Decoder.generate's): help(od.generate) shows its arguments and defaults; the
# check above reads the constant, not `generate.__signature__`, so a wrapper put in generate's place still binds
_GENERATE_SIGNATURE = generate.__signature__ = _model_first(Decoder.generate)
