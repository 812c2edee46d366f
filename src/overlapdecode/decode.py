"""The decode loop and the `Decoder` that owns its state; `generate` uses one decoder kept per model.

One loop serves every strategy: step 0 is the (eager) prefill, step j >= 1 feeds token j-1 through one
model forward, picks token j, replaces it by pad on finished rows and updates the finished mask, all on the
device. A strategy (strategy.py) chooses the cache (caches.py), whether the one-token step is compiled, and
the stop check (stopping.py). The tokens do not depend on the strategy: the tests compare every preset with
Hugging Face `generate()` and with the no-cache loop.

A `Decoder` owns what outlives one call: the kept static caches, the two side streams, the pinned stop-flag
slots, the compiled step, and the event that marks the end of its last call. It runs one call at a time.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import torch

from . import caches, markers
from .architecture import check_strategy
from .inputs import Request, check_model, check_request, model_device
from .sampling import SamplingParams, check_sampling, draw_noise, make_generator, pick_next
from .step_graph import StepGraph
from .stopping import Slots, make_check, mark_finished
from .strategy import LATE_CHECKS, Strategy, resolve_strategy
from .tp import is_sharded

# Captured fused steps kept per fused cache (one per count of EOS ids, pad id and sampling setting).
KEEP_GRAPHS = 4


def decode_step(model, model_kwargs: dict, state, eos_ids, pad_id: int, noise, params: SamplingParams,
                choose=None):
    """One forward and token choice, all on the device.

    `state` (B, 3) long holds, per row, the last token, its position and the finished flag. A decode step
    (no `input_ids` in `model_kwargs`) feeds the token at its position; the prefill passes the prompt.
    `choose`: `choose_next` or a compiled copy of it. -> the new state (B, 3) and the all-finished flag (0-d bool).
    """
    if "input_ids" not in model_kwargs:
        model_kwargs = dict(model_kwargs, input_ids=state[:, 0:1], position_ids=state[:, 1:2])  # (B, 1) each
    logits = model(**model_kwargs).logits[:, -1, :]  # (B, V)
    position = model_kwargs["position_ids"][:, -1]  # (B,)
    return (choose or choose_next)(logits, position, state, eos_ids, pad_id, noise, params)


def choose_next(logits, position, state, eos_ids, pad_id: int, noise, params: SamplingParams):
    """(B, V) logits of the tokens at `position` (B,) -> the new state (B, 3) and the all-finished flag."""
    tokens = pick_next(logits, noise, params)
    tokens, finished, done = mark_finished(tokens, state[:, 2].bool(), eos_ids, pad_id)
    return torch.stack([tokens, position + 1, finished.long()], dim=1), done


@functools.cache
def compiled_choose_next():
    """`choose_next` compiled without CUDA graphs, for the steps StepGraph captures itself: a handful of
    fused kernels instead of a dozen eager ones."""
    _raise_recompile_limits()
    return torch.compile(choose_next, fullgraph=True, dynamic=False)


@functools.cache
def compiled_decode_step():
    """`decode_step` compiled once per process; dynamo specialises per model and shape.

    The static cache tensors are marked static addresses by Hugging Face, so the CUDA graph of a shape is
    recorded once and replayed on every later call of that shape.
    """
    _raise_recompile_limits()
    return torch.compile(decode_step, mode="reduce-overhead", fullgraph=True, dynamic=False)


def _raise_recompile_limits() -> None:
    # Each (model, batch, cache length, sampling) is one specialisation; the default limit of 8 would make
    # a benchmark sweep fall back to eager silently.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, 512)


def compile_count() -> int:
    """How many graphs dynamo has compiled in this process (for the no-recompilation checks)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


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
        if fused_options is not None and not isinstance(fused_options, dict):
            raise TypeError(f"fused_options must be a dict of FusedModel options or None, got "
                            f"{type(fused_options).__name__}")
        # the decoder od.generate keeps per model (decoder_for) holds it weakly: a strong reference from the
        # value of a weakly keyed dictionary to its key would keep every model ever used alive
        self._model = weakref.ref(model) if _weak else (lambda: model)
        # FusedModel's keywords (pdl, tiles, symmetric_all_reduce, ...): their names and values checked now, what
        # depends on the device (the model may still move) when the fused model is made (first use)
        self.fused_options = dict(fused_options or {})
        if self.fused_options:
            try:
                from .fused.model import check_option_values  # Triton: a heavy import, only where options are
            except ImportError:
                pass  # no Triton: the first fused call says so (fused_model)
            else:
                check_option_values(**self.fused_options)
        self.static_caches = caches.StaticCaches(keep_static)
        self._lock = threading.Lock()
        self._side_streams: dict = {}  # device -> two streams, made once: new streams per call would each
        # get their own allocator pool (and library workspaces), raising reserved memory
        self._slots: dict = {}  # (slots, batch, device) -> Slots, pinned host memory reused call after call
        self._end_event: torch.cuda.Event | None = None  # the last call's last step, on its caller's stream
        self._late_steps = False  # whether the last call returned with steps still queued (a late stop)
        self._fused = None  # the FusedModel (re-laid weights, fused caches), made on the first fused call

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
            if self._fused is not None:
                self._fused.clear_caches()

    def fused_model(self):
        """The fused decode of this model (fused/): its weights are re-laid out once, on first use, and the
        Hugging Face model's parameters become views of them (it keeps working). ValueError if the model's
        family is not supported."""
        embed = self.model.get_input_embeddings().weight
        if self._fused is None or self._fused.weights.embed.data_ptr() != embed.data_ptr():
            # first use, or the model was moved or cast since (`.to` breaks the views): fuse again
            try:
                from .fused.model import FusedModel  # imported on first use: Triton is a heavy import
            except ImportError as err:
                raise ValueError(
                    f"strategy: 'fused' needs Triton ({err}); it comes with CUDA builds of torch, and on CPU "
                    "`pip install triton` provides the module its torch reference lives beside"
                ) from None
            if self._fused is not None:
                self._wait_last_call()
                self._fused.clear_caches()  # the old weights' caches and graphs go now, with the old weights
            self._fused = FusedModel(self.model, **self.fused_options)
        return self._fused

    def generate(
        self,
        input_ids,
        attention_mask=None,
        max_new_tokens: int = 64,
        strategy="interleaved",
        eos_token_id=None,
        pad_token_id=None,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        streamer=None,
    ) -> torch.Tensor:
        """Generate up to `max_new_tokens` tokens after each prompt (the arguments of `od.generate`).

        Returns (B, P + n) ids: the prompt, then the generated tokens (pad after a row's EOS); n is the
        number of steps until every row emitted EOS, or max_new_tokens.
        """
        strat = resolve_strategy(strategy)
        req = check_request(self.model, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id)
        params = check_sampling(do_sample, temperature, top_k, top_p, seed)
        check_strategy(self.model, strat, strategy, req)  # what the model's layers need of the strategy
        if strat.lag > req.max_new_tokens and strat.stop_check in LATE_CHECKS:
            raise ValueError(
                f"strategy: a stop check {strat.lag} steps late cannot be used with max_new_tokens="
                f"{req.max_new_tokens}; use a lag <= max_new_tokens"
            )
        if params.do_sample and seed is None and is_sharded(self.model):
            raise ValueError(
                "seed: sampling under tensor parallelism needs an explicit seed, so that every rank draws the "
                "same noise and picks the same token (each rank's global generator may differ)"
            )
        sink = _token_sink(streamer)
        with self._guard(), torch.no_grad():
            return self._decode(req, strat, params, seed, sink)

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

    def _step_graph(self, fused_cache, batch: int, eos_ids, pad_id: int, params: SamplingParams, vocab: int,
                    device: torch.device) -> StepGraph:
        """The captured fused step of this cache for these stop and sampling settings, kept with the cache
        (a few per cache) so that later calls replay it."""
        key = (len(eos_ids), pad_id, params)
        graph = fused_cache.graphs.pop(key, None)
        if graph is None:
            from .fused.cache import decode_kwargs  # the fused package is imported on first fused use (Triton)

            if params.do_sample:
                choose = compiled_choose_next()
                step = functools.partial(_fused_step, self._fused, decode_kwargs(fused_cache), pad_id, params, choose)
            else:  # one kernel chooses the token and updates state and flag (fused/kernels/greedy.py)
                step = functools.partial(_fused_greedy_step, self._fused, fused_cache, pad_id)
            noise = (batch, vocab) if params.do_sample else None
            # the greedy step writes each step's tokens and flag where the loop reads them (StepLog): one column
            # per position of a call, as many as the cache has slots
            log = fused_cache.length if not params.do_sample and self._fused.writes_step_log else 0
            graph = StepGraph(step, batch, len(eos_ids), noise, device, log_length=log)
        fused_cache.graphs[key] = graph
        while len(fused_cache.graphs) > KEEP_GRAPHS:
            fused_cache.graphs.popitem(last=False)
        return graph

    def _decode(self, req: Request, strat: Strategy, params: SamplingParams, seed, sink) -> torch.Tensor:
        model = self.model
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

        # an unsupported family is refused here, before any buffer is made on the device
        fused = self.fused_model() if strat.cache == "fused" else None

        # 1) buffers made once on the caller's stream, before the loop
        eos_ids = torch.tensor(req.eos_ids, dtype=torch.long, device=device)  # (E,), E = 0: never stop
        generator = make_generator(params, seed, device)
        vocab_out = model.get_output_embeddings().weight.shape[0]
        graph = None
        if strat.cache == "fused":
            from .fused.cache import FusedKV  # imported on first use: Triton is a heavy import

            cache = FusedKV(fused, req.input_ids, req.attention_mask, caches.static_cache_len(P, N),
                            caches.position_ids_for_prompt(req.attention_mask))
            step_model = cache.model  # the fused step replaces the Hugging Face forward
            if strat.compile:
                # the fused step is captured by StepGraph (step_graph.py), not by torch.compile's CUDA graphs
                graph = self._step_graph(cache.cache, B, eos_ids, req.pad_id, params, vocab_out, device)
                graph.eos.copy_(eos_ids)
        log = graph.log if graph is not None else None
        # (B, P + N); with a log, the graph's steps write their tokens into it, which is this call's output
        # (returned as a copy: the next call writes it again), and their flags into its pinned slots, at column P + j
        out = _output(B, P + N, req.input_ids, device, log)
        if strat.cache != "fused":
            cache = caches.make_cache(strat.cache, model, req.input_ids, req.attention_mask, out, N,
                                      self.static_caches, strat.compile)  # the no-cache step reads `out`
            step_model = model
        if graph is not None:
            state = graph.state  # the graph reads and advances it in place
            state.zero_()
        else:
            # (B, 3): last token, its position, finished. Our own copy of each step's result: a CUDA graph's
            # outputs are overwritten by its next replay, so they are copied here before the next step runs.
            state = torch.zeros((B, 3), dtype=torch.long, device=device)
        side = self._streams_for(device) if cuda and strat.stop_check == "pingpong" else None
        slots = self._slots_for(strat.lag + 1, B, device) if strat.stop_check in LATE_CHECKS else None
        if sink is not None:
            sink.start(req.input_ids)
        check = make_check(strat.stop_check, strat.lag, N, main, side, slots, out[:, P:], eos_ids,
                           sink.put if sink is not None else None)
        step_fn = compiled_decode_step() if strat.compile and graph is None else decode_step

        finished, result = False, None
        try:
            # 2) the loop: step j enqueues token j; the check reads the flag it owes after each step
            for j in range(N):
                with check.step(j), markers.phase(markers.PREFILL if j == 0 else markers.DECODE_STEP, cuda):
                    kwargs = cache.model_kwargs(j)
                    noise = draw_noise((B, vocab_out), device, generator, out=graph.noise if graph else None)
                    if j == 0 and graph is not None and not params.do_sample:
                        # greedy fused: the prefill, then the step's own choice kernel (FusedModel.greedy_prefill)
                        step_model.greedy_prefill(cache.cache, kwargs["input_ids"], kwargs["attention_mask"],
                                                  kwargs["position_ids"], state, eos_ids, req.pad_id, graph.done)
                        done = graph.done
                    elif j == 0 or not strat.compile:
                        new_state, done = decode_step(step_model, kwargs, state, eos_ids, req.pad_id, noise, params)
                        state.copy_(new_state)
                    elif graph is not None:
                        graph.run()  # advances state and graph.done in place
                        done = graph.done
                    else:
                        torch.compiler.cudagraph_mark_step_begin()  # the previous replay's outputs are consumed
                        new_state, done = step_fn(step_model, kwargs, state, eos_ids, req.pad_id, noise, params)
                        state.copy_(new_state)  # before the next replay overwrites new_state
                    if log is None or j == 0:
                        out[:, P + j] = state[:, 0]
                        check.publish(j, done, state[:, 0])
                    else:  # the step wrote its tokens into `out` and its flag into pinned host memory itself
                        check.publish(j, done, state[:, 0], log.flags[P + j])
                if j == 0 and side is not None:
                    cache.used_on(side)
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
                # on the caller's stream, after every step and before the end event: a log is the kept graph's,
                # which the next call (whatever its stream) writes again once that event has passed
                result = out if n == N and log is None else out[:, : P + n].clone()
            self._late_steps = not finished or n < check.last + 1  # steps n .. last may still be running
            if cuda:
                self._end_event = torch.cuda.Event()
                self._end_event.record(main)  # on the caller's stream, after every step of this call
            if sink is not None:
                sink.end()  # also on error: an iterator streamer's reader must not wait for ever
        return result


def _output(batch: int, length: int, input_ids, device, log) -> torch.Tensor:
    """A call's (B, P + N) output buffer, the prompt in its first columns: the first P + N columns of a StepGraph's
    `log` (whose steps write their tokens there; its count set to the first graph step's column), or a new one."""
    P = input_ids.shape[1]
    if log is None:
        out = torch.empty((batch, length), dtype=torch.long, device=device)
    else:
        if length > log.tokens.shape[1]:  # the log has a column per cache slot, and the cache holds P + N
            raise RuntimeError(f"internal: a step log of {log.tokens.shape[1]} columns for a call of {length}")
        out = log.tokens[:, :length]
        log.count.fill_(P + 1)  # step 1 is the graph's first
    out[:, :P] = input_ids
    return out


def _fused_step(fused, kwargs: dict, pad_id: int, params: SamplingParams, choose, state, eos_ids, noise, done,
                log=None):
    """The sampling fused decode step StepGraph captures: the FusedModel's kernels (`kwargs`: its cache), then
    `choose`, its results copied into the graph's state and flag (no step log: `log` must be None)."""
    if log is not None:
        raise ValueError("log: the sampling step does not write a step log; make its StepGraph without one")
    new_state, all_done = decode_step(fused, kwargs, state, eos_ids, pad_id, noise, params, choose)
    state.copy_(new_state)
    done.copy_(all_done)


def _fused_greedy_step(fused, cache, pad_id: int, state, eos_ids, noise, done, log=None):
    """The greedy fused decode step StepGraph captures: FusedModel.greedy_step, which advances state, done and
    the step log in place (one kernel after the head chooses: no inductor choice kernels, no copies)."""
    fused.greedy_step(cache, state, eos_ids, pad_id, done, log)


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
_DECODERS: "weakref.WeakKeyDictionary[torch.nn.Module, Decoder]" = weakref.WeakKeyDictionary()
_DECODERS_LOCK = threading.Lock()


def decoder_for(model) -> Decoder:
    """The decoder `od.generate` keeps for `model` (made on first use)."""
    check_model(model)  # before a weak reference is taken (a str cannot be one)
    with _DECODERS_LOCK:
        dec = _DECODERS.get(model)
        if dec is None:
            dec = _DECODERS[model] = Decoder(model, _weak=True)
        return dec


def generate(
    model,
    input_ids,
    attention_mask=None,
    max_new_tokens: int = 64,
    strategy="interleaved",
    eos_token_id=None,
    pad_token_id=None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    streamer=None,
) -> torch.Tensor:
    """Generate up to `max_new_tokens` tokens after each prompt with the decoder kept for `model`.

    The contract (arguments, output, errors, stop-check semantics) is in docs/DESIGN.md. Returns (B, P + n)
    ids: the prompt, then the generated tokens (pad after a row's EOS); n is the number of steps until every
    row emitted EOS, or max_new_tokens. One call at a time per model (RuntimeError otherwise).
    """
    return decoder_for(model).generate(
        input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, strategy=strategy,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, do_sample=do_sample, temperature=temperature,
        top_k=top_k, top_p=top_p, seed=seed, streamer=streamer,
    )
