"""The bench's prompt lookup on a looping prompt (`--prompt-lookup-loop`, bench/speculative.py looping_prompt): where
a greedy output starts to repeat itself and with what period, the prompt cut into every row's loop (two periods,
and K + lookup's n-gram at least), a row that never loops refused naming it, the search kept inside the model's
positions, one token repeated where the output wanders (a fixed point of the model's one-token step, checked by
generation), and the rows of a run whose model loops at once or wanders (every draft accepted, the speed-up over
the same strategy on the same prompt)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import overlapdecode as od
from overlapdecode.bench.report.results import latest_rows
from overlapdecode.bench.speculative import LOOP_PERIOD, fixed_points, greedy_successor, loop_start, looping_prompt
from overlapdecode.cli import main


@pytest.mark.parametrize(
    "tokens, want",
    [
        ([5, 6, 7, 1, 1, 1], (3, 1)),
        ([9, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3], (2, 3)),
        ([9, 1, 2, 1, 2, 1, 2, 1, 2], (1, 2)),  # period 2 from index 1 (period 4 would start there too)
        ([4, 4, 4, 4], (0, 1)),
        ([1, 2, 3, 1, 2, 3], None),  # two periods only
        ([1, 2, 3, 4, 5, 6, 7], None),
        ([3, 1, 1], None),  # two repeats of period 1 at the end: 3 needed
    ],
)
def test_loop_start(tokens, want):
    assert loop_start(tokens) == want


def test_a_loop_longer_than_the_period_limit_is_not_one():
    period = list(range(LOOP_PERIOD + 1))
    assert loop_start(period * 3) is None
    assert loop_start(period[1:] * 3) == (0, LOOP_PERIOD)


def test_the_prompt_is_cut_two_periods_into_every_rows_loop():
    ids = torch.tensor([[50, 51], [60, 61]])
    rows = [[7, 8, 9, 1, 2, 1, 2, 1, 2, 1, 2], [3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]]  # loops at 3 (p 2) and 0 (p 1)
    calls = []

    def generate(x, n):
        calls.append(n)
        assert torch.equal(x, ids)
        return torch.cat([x, torch.tensor([r + [r[-2]] * (n - len(r)) for r in rows])], dim=1)

    out, how = looping_prompt(generate, ids, new_tokens=4, k=1, max_positions=2 + 4 + 11)
    assert (
        calls == [11] and how == "greedy loop, period 2"
    )  # the search: 4 x 4 new tokens, at least 256, but no more than the positions leave
    assert torch.equal(
        out, torch.cat([ids, torch.tensor([r[:7] for r in rows])], dim=1)
    )  # max(3 + max(4, 1 + 2), 0 + max(2, 1 + 2))


def test_a_row_that_never_loops_is_named_and_a_model_without_room_refused():
    ids = torch.zeros((2, 3), dtype=torch.long)

    def generate(x, n):
        out = torch.arange(n).repeat(2, 1)
        out[0] = 7
        return torch.cat([x, out], dim=1)

    with pytest.raises(ValueError, match="row 1: the model's greedy output does not repeat itself within 256"):
        looping_prompt(generate, ids, new_tokens=16, k=4)
    with pytest.raises(ValueError, match="no room for a looping prompt: the model has 20 positions"):
        looping_prompt(generate, ids, new_tokens=16, k=4, max_positions=20)


def _wandering(x, n, holds):
    """A stand-in generate: a row whose prompt is one token t repeated continues with t if t is in `holds`, every
    other row counts up (never repeats)."""
    rows = []
    for r in x.tolist():
        t = r[0]
        constant = all(v == t for v in r)
        rows.append([t] * n if constant and t in holds else [1000 + i for i in range(n)])
    return torch.cat([x, torch.tensor(rows, dtype=x.dtype)], dim=1)


def test_fixed_points_are_the_tokens_the_one_token_step_keeps():
    table = torch.tensor([3, 1, 0, 3, 7, 5, 2, 7, 8])  # x -> its successor: fixed at 1, 3, 5, 7, 8
    seen = []

    def successor(x):
        seen.append(x.shape)
        return table[x[:, 0]]

    assert fixed_points(successor, 9, chunk=4) == [1, 3, 5, 7, 8]
    assert seen == [(4, 1), (4, 1), (1, 1)]


def test_a_wandering_output_gets_one_token_repeated_that_continues_itself():
    """The greedy search finds no loop; the fixed points are tried by generation in groups of the batch's rows,
    the first group with one that holds gives every row that token; the prompt keeps the call's shape."""
    ids = torch.tensor([[50, 51, 52], [60, 61, 62]])
    table = torch.arange(20)  # every token is a fixed point of the one-token step ...
    calls = []

    def generate(x, n):
        calls.append(x.tolist())
        return _wandering(x, n, holds={5})  # ... but only 5 repeated continues itself

    out, how = looping_prompt(generate, ids, 4, 2, successor=lambda x: table[x[:, 0]], vocab=8)
    assert torch.equal(out, torch.full((2, 3), 5)) and how.startswith("one token repeated") and "5" in how
    assert calls[1:] == [[[0] * 3, [1] * 3], [[2] * 3, [3] * 3], [[4] * 3, [5] * 3]]
    with pytest.raises(ValueError, match="row 0: the model's greedy output does not repeat itself within 256"):
        looping_prompt(generate, ids, 4, 2)  # no successor: no fallback


def test_no_token_that_continues_itself_is_refused_naming_both_searches():
    ids = torch.zeros((1, 3), dtype=torch.long)
    table = torch.tensor([1, 1, 3, 3, 5, 5])  # fixed at 1, 3, 5
    with pytest.raises(
        ValueError, match=r"no token repeated continues itself \(3 fixed points of the one-token step, 3"
    ):
        looping_prompt(
            lambda x, n: _wandering(x, n, holds=set()), ids, 4, 2, successor=lambda x: table[x[:, 0]], vocab=6
        )
    with pytest.raises(ValueError, match=r"\(0 fixed points of the one-token step, 0 tried"):
        looping_prompt(lambda x, n: _wandering(x, n, holds=set()), ids, 4, 2, successor=lambda x: x[:, 0] + 1, vocab=6)


def test_greedy_successor_is_the_models_next_token():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    x = torch.arange(50)[:, None]
    with torch.no_grad():
        want = torch.stack([model(input_ids=t[None]).logits[0, -1].argmax() for t in x])
    assert torch.equal(greedy_successor(model)(x), want)


@pytest.fixture(scope="module")
def looping_model(tmp_path_factory):
    """A tiny Llama whose LM head is all zeros: every logit 0, greedy picks token 0 at every step (the first of
    equal scores), so its output loops with period 1 from its first token."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.zero_()
    path = tmp_path_factory.mktemp("looping")
    model.save_pretrained(path)
    return str(path)


def test_the_looping_prompt_rows_accept_every_draft(looping_model, tmp_path):
    """--prompt-lookup-loop alone: its verify rows, and rows whose every round offers K drafts (the prompt ends two
    periods and K + 2 tokens into the loop, so lookup's match has K tokens after it), all accepted."""
    out = str(tmp_path / "out")
    flags = ["bench", "--model", looping_model, "--device", "cpu", "--peers", "none", "--prompt-len", "8"]
    flags += ["--lengths", "12", "--warmup", "0", "--repeats", "2", "--no-profile", "--strategies", "static"]
    assert main([*flags, "--prompt-lookup-loop", "3", "--out", out]) == 0
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    assert not [r for r in rows if "error" in r]
    (verify,) = [r for r in rows if r["workload"] == "verify"]
    assert verify["verify_tokens"] == list(range(1, 10))
    (loop,) = [r for r in rows if r["workload"] == "speculative"]
    assert loop["speculation"] == "prompt_lookup" and loop["lookup_prompt"] == "loop" and loop["k"] == 3
    assert loop["prompt_len"] == 8 + 3 + 2  # K + lookup's 2-gram into the loop (period 1, from the first token)
    assert loop["acceptance_rate"] == 1.0 and loop["rounds"] == -(-11 // 4)  # 11 tokens after the first, 4 a round
    assert loop["speedup"] > 0 and loop["plain_ms_per_token"] > 0 and len(loop["plain_seq_s_all"]) == 2
    text = open(os.path.join(out, "report.md")).read()
    assert "| static | float32 | 1 | prompt lookup, looping prompt | 3 |" in text
    assert od.load_model(looping_model, device="cpu").lm_head.weight.abs().sum() == 0


def test_the_draft_models_rows_run_on_the_looping_prompt_too(looping_model, tmp_path):
    """--assistant with --prompt-lookup-loop: the draft's rows on the run's prompt and on the looping prompt, the
    latter sharing prompt lookup's looping prompt and its time without speculation (same K: found and timed once)."""
    out = str(tmp_path / "out")
    flags = ["bench", "--model", looping_model, "--device", "cpu", "--peers", "none", "--prompt-len", "8"]
    flags += ["--lengths", "12", "--warmup", "0", "--repeats", "2", "--no-profile", "--strategies", "kv"]
    flags += ["--prompt-lookup-loop", "3", "--assistant", "self", "--num-assistant-tokens", "3", "--out", out]
    assert main(flags) == 0
    rows = [r for r in json.load(open(os.path.join(out, "results.json")))["rows"] if r["workload"] == "speculative"]
    assert not [r for r in rows if "error" in r]
    by = {(r["speculation"], r.get("lookup_prompt")): r for r in rows}
    assert sorted(by, key=str) == sorted(
        [("prompt_lookup", "loop"), ("assistant", None), ("assistant", "loop")], key=str
    )
    lookup, draft = by["prompt_lookup", "loop"], by["assistant", "loop"]
    assert draft["assistant"] == "self" and draft["k"] == 3 and draft["acceptance_rate"] == 1.0
    assert draft["prompt_len"] == lookup["prompt_len"] == 8 + 3 + 2
    assert draft["plain_seq_s_all"] == lookup["plain_seq_s_all"]  # one time without speculation for both
    assert draft["loop_found"] == lookup["loop_found"] == "greedy loop, period 1"
    assert by["assistant", None]["prompt_len"] == 8
    assert "| kv | float32 | 1 | draft self, looping prompt | 3 |" in open(os.path.join(out, "report.md")).read()
    from overlapdecode.cli.bench import speculation_tables

    (table,) = speculation_tables(json.load(open(os.path.join(out, "results.json")))["rows"])
    assert sorted(table.columns[1]._cells) == ["lookup, loop", "self", "self, loop"]


def test_a_wandering_model_gets_one_token_repeated_and_accepts_every_draft(tmp_path):
    """tiny-llama's greedy output wanders past the search (its 256 positions leave 208 tokens for it): the row runs
    on one token repeated, a fixed point of its one-token step, and accepts every draft."""
    out = str(tmp_path / "out")
    flags = ["bench", "--model", "tiny-llama", "--device", "cpu", "--peers", "none", "--lengths", "16"]
    flags += ["--warmup", "0", "--repeats", "1", "--no-profile", "--strategies", "kv", "--dtype-batch", "float32:2"]
    assert main([*flags, "--prompt-lookup-loop", "3", "--out", out]) == 0
    rows = json.load(open(os.path.join(out, "results.json")))["rows"]
    (loop,) = [r for r in rows if r["workload"] == "speculative"]
    assert "error" not in loop, loop.get("error")
    assert loop["loop_found"].startswith("one token repeated") and loop["acceptance_rate"] == 1.0
    assert "| kv | float32 | 2 | prompt lookup, one token repeated | 3 |" in open(os.path.join(out, "report.md")).read()


def test_a_looping_prompt_row_not_run_is_kept_beside_the_run_prompts_row():
    """A row of each prompt at one K: the loop row that could not run is not replaced by the other, whose
    configuration is otherwise the same; a prompt lookup row written before `lookup_prompt` is the run prompt's."""
    base = dict(model="m", allocator="default", dtype="float32", batch=1, prompt_len=8, workload="speculative")
    base.update(max_new_tokens=12, strategy="kv", speculation="prompt_lookup", assistant=None, k=3)
    measured = dict(base, lookup_prompt="random", seq_s=1.0)
    failed = dict(base, lookup_prompt="loop", error="not run: row 0: ... does not repeat itself")
    assert latest_rows([measured, failed]) == [measured, failed]
    older = {k: v for k, v in measured.items() if k != "lookup_prompt"}
    assert latest_rows([older, measured]) == [measured]


def test_the_flag_makes_looping_rows_of_the_greedy_strategies_alone(tmp_path):
    from overlapdecode.bench.config import plan
    from overlapdecode.cli import build_parser
    from overlapdecode.cli.bench_flags import bench_config

    flags = ["bench", "--model", "tiny-gpt2", "--device", "cpu", "--out", str(tmp_path / "out")]
    flags += ["--strategies", "kv,kv+sample", "--prompt-lookup-loop", "2,5", "--prompt-lookup", "3"]
    cfg = bench_config(build_parser().parse_args(flags))
    assert cfg.prompt_lookup_loop == (2, 5) and cfg.speculating == ("kv", "kv+sample")
    spec = [r[4] for r in plan(cfg)[1] if r[2] == "speculative" and r[3] == 16]
    loop = [("kv", "prompt_lookup_loop", 2), ("kv", "prompt_lookup_loop", 5)]
    assert spec == [("kv", "prompt_lookup", 3), *loop, ("kv+sample", "prompt_lookup", 3)]
    cfg = bench_config(build_parser().parse_args([*flags, "--assistant", "self", "--num-assistant-tokens", "4"]))
    spec = [r[4] for r in plan(cfg)[1] if r[2] == "speculative" and r[3] == 16]
    draft = [("kv", "assistant", 4), ("kv", "assistant_loop", 4)]
    assert spec == [
        ("kv", "prompt_lookup", 3),
        *loop,
        *draft,
        ("kv+sample", "prompt_lookup", 3),
        ("kv+sample", "assistant", 4),
    ]
    with pytest.raises(SystemExit):
        bench_config(build_parser().parse_args([*flags[:6], "--prompt-lookup-loop", "0"]))
