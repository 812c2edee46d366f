"""Every causal LM transformers maps, built tiny (support/tiny_archs.py): speculation (prompt lookup, and the model
as its own draft) gives exactly the tokens of the same preset without it, at batch 2 with left padding, or is
refused with one ValueError naming the argument (spec/options.py: recurrent and local layers, no position_ids,
length-dependent rotary tables). Never other tokens, never a crash."""

from __future__ import annotations

import pytest
import torch
import transformers

import overlapdecode as od
from support.helpers import make_batch
from support.tiny_archs import VOCAB, causal_lm_types, tiny_model

N = 10


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


def _outcome(model, ids, mask, preset, ref, spec: dict) -> str:
    """'exact' when speculation gives `ref`, 'refused' when refused naming its argument; else what went wrong."""
    name = next(iter(spec))
    try:
        out = od.generate(
            model, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=[], pad_token_id=0, **spec
        )
    except ValueError as err:
        return "refused" if str(err).startswith(f"{name}: ") else f"refused without naming {name}: {err}"
    except Exception as err:  # noqa: BLE001 - what the sweep is for: a crash is a finding
        return f"{type(err).__name__}: {str(err)[:200]}"
    return "exact" if torch.equal(out, ref) else "other tokens"


@pytest.mark.filterwarnings("ignore")
def test_every_architecture_speculates_exactly_or_is_refused():
    ids, mask = make_batch(2, seed=3, high=VOCAB - 10)
    problems, seen = [], {"exact": 0, "refused": 0}
    for model_type in causal_lm_types():
        model, _ = tiny_model(model_type)
        if model is None:
            continue
        for preset in ("kv", "static"):
            try:
                ref = od.generate(
                    model, ids, attention_mask=mask, max_new_tokens=N, strategy=preset, eos_token_id=[], pad_token_id=0
                )
            except Exception:  # noqa: BLE001 - refused or failing without speculation: tests/hf's sweep's concern
                continue
            for spec in (dict(prompt_lookup_num_tokens=3), dict(assistant_model=model, num_assistant_tokens=2)):
                found = _outcome(model, ids, mask, preset, ref, spec)
                if found in seen:
                    seen[found] += 1
                else:
                    problems.append((model_type, preset, next(iter(spec)), found))
    assert problems == [], problems
    assert seen["exact"] > 100 and seen["refused"] > 40, seen  # both outcomes are reached


@pytest.mark.filterwarnings("ignore")
def test_git_is_refused_exactly_where_its_forward_shifts_a_lone_token(monkeypatch):
    """GIT's forward on some transformers moves a one-token step's positions by the cache length and a longer step's
    not: there speculation is refused, and without the refusal a verify step of K + 1 tokens gives other tokens
    (so the refusal is needed); where the forward has no such shift, GIT speculates exactly."""
    from overlapdecode.spec import options

    model, _ = tiny_model("git")
    ids, mask = make_batch(2, seed=3, high=VOCAB - 10)
    kwargs = dict(attention_mask=mask, max_new_tokens=N, strategy="kv", eos_token_id=[], pad_token_id=0)
    ref = od.generate(model, ids, **kwargs)
    spec = dict(assistant_model=model, num_assistant_tokens=3)  # every draft accepted: verify steps of 4 tokens
    if options._shifts_lone_token(model):
        with pytest.raises(ValueError, match="^assistant_model: .*one-token step"):
            od.generate(model, ids, **kwargs, **spec)
        monkeypatch.setattr(options, "_shifts_lone_token", lambda model: False)
        assert not torch.equal(od.generate(model, ids, **kwargs, **spec), ref)
    else:
        assert torch.equal(od.generate(model, ids, **kwargs, **spec), ref)
