"""Every causal LM that transformers maps (tests/support/tiny_archs.py builds each one tiny) x every preset that runs on
CPU: Hugging Face generate()'s tokens, or one ValueError from plan.py (`strategy '<name>': ...`) before
any device work (or, for a model whose config is no decoder-only causal LM, inputs.check_causal_config's one
ValueError, whatever the preset); never a crash, never other tokens. Four left-padded prompts, greedy, without
and with an EOS that some rows emit mid-way.

The eager presets (baseline, kv, static, fused) run on every model. A compiled preset costs 10-40 s of
compilation per model on CPU, so compiled and interleaved run on one model per distinct set of features the
detector reports for the models it accepts (the one of fewest parameters in each set), and only the decision
is checked for the rest; OVERLAPDECODE_FULL_SWEEP=1 compiles every accepted model instead.

Where Hugging Face's own cached generate() and its uncached forward disagree (the model's two code paths give
other tokens), `baseline` (the uncached loop) is held to the uncached oracle and the cached presets to
generate(); such models are listed by test_models_whose_own_paths_disagree.
"""

from __future__ import annotations

import functools
import os
import warnings

import pytest
import torch
import transformers

import overlapdecode as od
from overlapdecode.hf.architecture import describe
from overlapdecode.hf.refusals import refusal
from overlapdecode.inputs import NotCausalLM, check_causal_config
from overlapdecode.plan import GREEDY_PROCESSORS, greedy_processors
from overlapdecode.strategy import PRESETS
from support.helpers import make_batch, naive_generate
from support.tiny_archs import VOCAB, causal_lm_types, tiny_model

FULL = os.environ.get("OVERLAPDECODE_FULL_SWEEP") == "1"
TYPES = causal_lm_types()
N = 10
P = 8
PAD = 0
EAGER = ("baseline", "kv", "static", "fused")
COMPILED = ("compiled", "interleaved")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models run fastest on one thread (two threads on two busy cores spin against each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the tiny configs' warnings (vocabularies, unused ids)
    yield
    transformers.logging.set_verbosity(verbosity)
    torch.set_num_threads(threads)


class Case:
    """One tiny model, its test batch and its Hugging Face references (or why it cannot be tested)."""

    def __init__(self, model_type: str):
        self.model_type = model_type
        self.model, self.skip = tiny_model(model_type)
        if self.model is None:
            return
        self.ids, self.mask = make_batch(4, seed=3, prompt_len=P, high=VOCAB)
        # generation_config settings overlapdecode warns of and does not apply: Hugging Face's reference without them
        neutral = dict(GREEDY_PROCESSORS)
        self.processors = greedy_processors(self.model)
        self.without = {name: neutral[name] for name in self.processors}
        try:
            self.free = self._hf([])
            self.eos = [int(self.free[0, P + 3])]  # row 0 stops after 4 tokens; others may, later or not
            self.stopped = self._hf(self.eos)
            other = self.ids.clone()
            other[:, : P - 2] = torch.roll(other[:, : P - 2], 1, 0)  # other prompts, the same last two tokens
            reads_context = not torch.equal(self._hf([], other)[:, P:], self.free[:, P:])
        except Exception as err:  # noqa: BLE001 - Hugging Face's own generate() fails on the tiny config
            self.model = None
            self.skip = (
                f"Hugging Face generate() fails on the tiny config: {type(err).__name__}: "
                f"{str(err).strip().splitlines()[0][:160]}"
            )
            return
        if not reads_context:
            self.model = None
            self.skip = "its tokens do not depend on the prompt at the tiny sizes (a lost context could not show)"
        self._uncached = {}
        self._outcomes = {}

    @torch.no_grad()
    def _hf(self, eos, ids=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.model.generate(
                self.ids if ids is None else ids,
                attention_mask=self.mask,
                max_new_tokens=N,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=PAD,
                **self.without,
            )

    def uncached(self, eos):
        """The naive no-cache loop's tokens (the model's uncached forward), made on first use."""
        key = tuple(eos)
        if key not in self._uncached:
            self._uncached[key] = naive_generate(self.model, self.ids, self.mask, N, list(eos), PAD)
        return self._uncached[key]

    def outcome(self, strategy: str) -> str:
        """check(strategy), run once per model and strategy."""
        if strategy not in self._outcomes:
            self._outcomes[strategy] = self.check(strategy)
        return self._outcomes[strategy]

    def check(self, strategy: str) -> str:
        """Run `strategy` without and with EOS: 'ok', 'ok-uncached' (baseline held to the uncached oracle),
        'refused' (hf/refusals.py's refusal of the strategy) or 'not-causal-lm' (its config is no decoder-only
        causal LM: inputs.check_causal_config, whatever the strategy). Fails the test on other tokens, on a crash,
        and on a refusal that is not the up-front one."""
        for eos, ref in (([], self.free), (self.eos, self.stopped)):
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    out = od.generate(
                        self.model,
                        self.ids,
                        attention_mask=self.mask,
                        max_new_tokens=N,
                        strategy=strategy,
                        eos_token_id=eos,
                        pad_token_id=PAD,
                    )
                named = any("generation_config asks" in str(w.message) for w in caught)
                assert named == bool(self.processors), f"{self.model_type}: {self.processors} not warned of"
            except NotCausalLM as err:
                assert str(err).startswith(f"model {type(self.model).__name__} "), f"{self.model_type}: {err}"
                return "not-causal-lm"
            except ValueError as err:
                # the fused path's own checks: its families (fused/layout.py, naming the strategy), a window
                # shorter than the call (fused/cache.py)
                fused_family = strategy == "fused" and str(err).startswith(
                    ("strategy 'fused': the fused path", "strategy 'fused': some of", "max_new_tokens: ")
                )
                up_front = str(err).startswith(f"strategy {strategy!r}: ") and not fused_family
                assert up_front or fused_family, f"{self.model_type} {strategy}: refused late or unclearly: {err}"
                assert up_front == (refusal(self.model, PRESETS[strategy].cache, PRESETS[strategy].compile) is not None)
                return "refused"
            if strategy == "baseline" and not torch.equal(out, ref):
                # held to the model's own uncached forward, where Hugging Face's cached generate() differs from it
                oracle = self.uncached(eos)
                assert not torch.equal(oracle, ref), f"{self.model_type} baseline: other tokens than Hugging Face"
                assert torch.equal(out, oracle), f"{self.model_type} baseline: other tokens than the uncached loop"
                return "ok-uncached"
            assert torch.equal(out, ref), f"{self.model_type} {strategy}: other tokens than Hugging Face (eos={eos})"
        return "ok"


@functools.cache
def case(model_type: str) -> Case:
    return Case(model_type)


def _case_or_skip(model_type: str) -> Case:
    c = case(model_type)
    if c.model is None:
        pytest.skip(f"{model_type}: {c.skip}")
    return c


@pytest.mark.parametrize("model_type", TYPES)
def test_eager_presets_give_hf_tokens_or_are_refused(model_type):
    c = _case_or_skip(model_type)
    outcomes = {s: c.outcome(s) for s in EAGER}
    if "not-causal-lm" in outcomes.values():  # refused from its config, before any strategy is looked at
        assert set(outcomes.values()) == {"not-causal-lm"}, outcomes
        return
    for strategy in COMPILED:  # the decision only (compiling is the representatives' test)
        why = refusal(c.model, PRESETS[strategy].cache, PRESETS[strategy].compile)
        assert why == refusal(c.model, "static", compiled=True)  # the stop check changes nothing the model needs
        if outcomes["static"] == "refused":
            assert why is not None, f"{model_type}: static refused but {strategy} accepted"


def _causal_lm(model) -> bool:
    try:
        check_causal_config(model.config, f"model {type(model).__name__}")
    except NotCausalLM:
        return False
    return True


def _accepted_by_feature_set() -> dict[tuple, list[str]]:
    groups: dict[tuple, list[str]] = {}
    for model_type in TYPES:
        c = case(model_type)
        if c.model is not None and _causal_lm(c.model) and refusal(c.model, "static", compiled=True) is None:
            groups.setdefault(describe(c.model).features(), []).append(model_type)
    return groups


def _parameter_count(model_type: str) -> int:
    return sum(p.numel() for p in case(model_type).model.parameters())


def test_compiled_presets_on_one_model_per_feature_set():
    groups = _accepted_by_feature_set()
    # plain attention, hybrid recurrent models, sliding-window and global/local models
    assert () in groups and ("recurrent",) in groups and ("local",) in groups, groups
    # one per set: its smallest model (a mixture of experts, a larger graph, compiles for longer)
    chosen = [t for types in groups.values() for t in (types if FULL else [min(types, key=_parameter_count)])]
    for model_type in chosen:
        c = case(model_type)
        before = od.compile_count()
        for strategy in COMPILED:
            assert c.outcome(strategy) == "ok", (model_type, strategy)
        # the prefill is eager: one decode-step graph per shape, whatever the EOS ids (none before: another test
        # may have compiled the shape for this model's class)
        assert od.compile_count() - before <= 1, model_type


def test_models_whose_own_paths_disagree():
    """The models whose baseline is held to their uncached forward: Hugging Face's cached generate() gives other
    tokens than the model's own uncached forward (a fact about the model's code, listed so that a change shows)."""
    listed = []
    for model_type in TYPES:
        c = case(model_type)
        if c.model is not None and c.outcome("baseline") == "ok-uncached":
            listed.append(model_type)
    assert set(listed) <= {"git", "rwkv"}, listed
