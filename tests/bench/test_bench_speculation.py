"""The bench's speculative rows on tiny-gpt2 (CPU): the flags, the rows' figures end to end (the model as its own
draft accepts every draft, a draft of unrelated random weights about none), the verify step's cost, the model
curve, results.json's checks, the report's table and plot.

Nothing here asserts a speed: on CPU the times are the host's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import overlapdecode as od
from overlapdecode.bench.config import plan
from overlapdecode.bench.report.results import ResultsError, load
from overlapdecode.bench.report.speculation import (
    _draw,
    expected_tokens,
    model_speedup,
    plot,
    predicted,
    section,
    speedup_text,
)
from overlapdecode.cli import build_parser, main
from overlapdecode.cli.bench_flags import bench_config
from support.results_rows import CONFIG, result_row, write_results

K, N = 3, 12
BASE = ["bench", "--model", "tiny-gpt2", "--device", "cpu", "--peers", "none", "--prompt-len", "8"]
QUICK = ["--lengths", str(N), "--warmup", "0", "--repeats", "2", "--no-profile"]


def _config(tmp_path, *flags):
    args = build_parser().parse_args([*BASE, "--out", str(tmp_path / "out"), *flags])
    return bench_config(args)


@torch.no_grad()
def test_an_oracle_of_a_given_shape_is_made_from_the_draft_the_run_loads(tmp_path, monkeypatch):
    """--assistant oracle:A@DIR: the run loads DIR as its draft (load_draft), the verify row times that draft's step,
    and a draft model's row gets an oracle whose decoder is that draft's (worker._row_draft)."""
    from overlapdecode.bench import speculative
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.speculative import load_draft, verify_row
    from overlapdecode.bench.worker import _row_draft

    _tiny_body(tied=False).save_pretrained(tmp_path)
    spec = f"oracle:0.5@{tmp_path}"
    model = od.load_model("tiny-llama", device="cpu")
    body = load_draft(spec, "tiny-llama", model, "float32", torch.device("cpu"), seed=0)
    assert body.config.hidden_size == 256 and load_draft("oracle:0.5", "tiny-llama", model, "float32", "cpu", 0) is None
    cfg = BenchConfig(model="tiny-llama", assistant=spec, num_assistant_tokens=(2,), device="cpu", lengths=(6,))
    ids = torch.randint(0, 500, (1, 5), generator=torch.Generator().manual_seed(4))
    draft, fits = _row_draft(cfg, "kv", model, body, ids, 6, 0, {}, ("draft",), "assistant", 2)
    assert draft.model is body.model and fits == 1
    timed = []  # the models whose forwards the verify row times, in order: the model's, then the draft's
    monkeypatch.setattr(speculative, "forward_ms", lambda m, kind, ids, ts, *a: timed.append(m) or [1.0] * len(ts))
    verify_row(cfg, "kv", model, body, 1, 1000, torch.device("cpu"))
    assert timed == [model, body]  # the draft's step timed: the loaded draft itself


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--prompt-lookup", "0"], "--prompt-lookup values must be >= 1, got [0]"),
        (["--prompt-lookup", "2,x"], "--prompt-lookup takes comma-separated integers"),
        (["--prompt-lookup", ","], "--prompt-lookup needs at least one value"),
        (["--num-assistant-tokens", "4"], "--num-assistant-tokens is given without --assistant"),
        (["--assistant", "self", "--num-assistant-tokens", "2,-1"], "--num-assistant-tokens values must be >= 1"),
        (["--assistant", " "], "--assistant takes self, random, oracle[:A][@MODEL], or a model name or directory"),
        (["--assistant", "oracle:0.7@"], "--assistant oracle:0.7@: oracle@MODEL names the draft's shape"),
        (["--assistant", "oracle@gpt2-random"], "--assistant oracle@gpt2-random scores 50257 token ids and --model"),
        (["--assistant", "oracle:0"], "--assistant oracle:0: oracle:A takes an acceptance rate 0 < A <= 1"),
        (["--assistant", "oracle:most"], "--assistant oracle:most: oracle:A takes an acceptance rate 0 < A <= 1"),
        (["--assistant", "gpt2-random"], "--assistant gpt2-random scores 50257 token ids and --model tiny-gpt2 1000"),
        (["--assistant", "/nonexistent/draft"], "--assistant"),
        (["--prompt-lookup", "4", "--strategies", "baseline"], "none of the strategies measured (baseline)"),
        (["--assistant", "self", "--workloads", "eos"], "--assistant needs the fixed workload"),
        (
            ["--model", "gemma3-1b-random", "--prompt-lookup", "2"],
            "--prompt-lookup: --model gemma3-1b-random: Gemma3ForCausalLM has local attention layers",
        ),
    ],
)
def test_bad_speculation_flags_get_one_line(flags, words, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*BASE, "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not out.exists()  # refused before any work


def test_the_flags_make_the_speculative_rows_of_each_strategy_that_speculates(tmp_path):
    cfg = _config(
        tmp_path, "--strategies", "kv,baseline,kv+sample,fused", "--prompt-lookup", "2,4,2", "--assistant", "random"
    )
    assert cfg.prompt_lookup == (2, 4) and cfg.assistant == "random" and cfg.num_assistant_tokens == (4,)
    assert cfg.speculating == ("kv", "kv+sample", "fused")  # baseline does not speculate
    rows = plan(cfg)[1]
    assert [r[4] for r in rows if r[2] == "verify"] == ["kv", "fused"]  # a sampled variant verifies as its preset
    spec = [r[4] for r in rows if r[2] == "speculative" and r[3] == 16]
    assert spec == [
        (s, kind, k)
        for s in cfg.speculating
        for kind, k in (("prompt_lookup", 2), ("prompt_lookup", 4), ("assistant", 4))
    ]
    workloads = [r[2] for r in rows]  # after the fixed rows, whose times the speed-up divides
    assert workloads.index("speculative") > max(i for i, w in enumerate(workloads) if w == "fixed")
    plain = _config(tmp_path, "--strategies", "kv")
    assert plain.speculating == () and {r[2] for r in plan(plain)[1]} == {"fixed", "profile"}


def test_the_tensor_parallel_bench_refuses_speculation(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([*BASE, "--out", str(tmp_path / "o"), "--tp", "2", "--prompt-lookup", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--prompt-lookup: speculative decoding does not run on tensor-parallel shards" in err, err


@pytest.mark.parametrize("k", [1, 3, 8])
def test_the_model_curve(k):
    assert expected_tokens(0.0, k) == 1.0  # every draft rejected: the round's one token
    assert expected_tokens(1.0, k) == k + 1  # every draft accepted
    assert expected_tokens(1 - 1e-9, k) == pytest.approx(k + 1, rel=1e-6)  # continuous at 1
    assert expected_tokens(0.5, k) == pytest.approx(sum(0.5**j for j in range(k + 1)))
    assert model_speedup(1.0, k, 1.25) == pytest.approx((k + 1) / 1.25)
    assert model_speedup(0.0, k, 1.0, 0.5) == pytest.approx(1 / (1 + (k + 1) * 0.5))  # the draft's K + 1 forwards
    # the K-th draft fed at a measured cost (fused: no LM head) instead of a whole forward
    assert model_speedup(0.0, k, 1.0, 0.5, 0.1) == pytest.approx(1 / (1 + k * 0.5 + 0.1))
    with pytest.raises(ValueError, match="a must be an acceptance probability"):
        expected_tokens(1.5, k)


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory):
    """One run with the model as its own draft and prompt lookup, then an --append run with a random draft."""
    out = str(tmp_path_factory.mktemp("spec"))
    flags = [*BASE, *QUICK, "--strategies", "kv", "--out", out]
    assert main([*flags, "--assistant", "self", "--num-assistant-tokens", str(K), "--prompt-lookup", "2"]) == 0
    assert main([*flags, "--append", "--assistant", "random", "--num-assistant-tokens", str(K)]) == 0
    assert main([*flags, "--append", "--assistant", "oracle", "--num-assistant-tokens", str(K)]) == 0
    return out


def _rows(spec_dir, workload):
    return [r for r in load(spec_dir)["rows"] if r["workload"] == workload]


def test_the_drafts_set_the_acceptance_rate(spec_dir):
    rows = {(r["speculation"], r["assistant"]): r for r in _rows(spec_dir, "speculative")}
    assert set(rows) == {
        ("assistant", "self"),
        ("assistant", "random"),
        ("assistant", "oracle"),
        ("prompt_lookup", None),
    }
    for r in rows.values():
        assert "error" not in r, r
        assert r["k"] == (2 if r["speculation"] == "prompt_lookup" else K) and r["new_tokens"] == N
        assert r["drafts_offered"] > 0 and r["rounds"] == r["row_rounds"] > 0  # batch 1: one row a round
        # every round emits its accepted drafts and one token more; step 0 (the prompt) is no round
        assert r["tokens_per_round"] == pytest.approx((N - 1) / r["rounds"])
        assert r["drafts_accepted"] + r["rounds"] == N - 1
    own, other = rows[("assistant", "self")], rows[("assistant", "random")]
    oracle = rows[("assistant", "oracle")]  # the model's own tokens by a one-layer draft: every draft accepted
    assert oracle["acceptance_rate"] == oracle["draft_acceptance"] == 1.0
    assert oracle["oracle_fits"] == 1  # float32 on a CPU: the speculative call's tokens are the plain call's
    assert oracle["tokens_per_round"] == own["tokens_per_round"]
    assert own["acceptance_rate"] == 1.0 and own["drafts_accepted"] == own["drafts_offered"]
    assert own["tokens_per_round"] > 3  # K + 1 a round, but for the last one, cut at the last allowed token
    assert other["acceptance_rate"] < 0.2 and other["tokens_per_round"] < 1.3


def test_the_speed_up_is_over_the_same_strategy_in_the_same_run(spec_dir):
    """Each row divides the plain row of its own run: each --append run measured kv again, which replaced the
    earlier run's kv row in results.json, and the last one's row (the oracle draft's) is over that one."""
    (plain,) = _rows(spec_dir, "fixed")
    for r in _rows(spec_dir, "speculative"):
        assert r["speedup"] == pytest.approx(r["plain_ms_per_token"] * N / 1e3 / r["seq_s"])
        if r["assistant"] == "oracle":  # the decode's: each call less its time to first token (None where a tiny
            # model's call is no longer than its first token's, as on a loaded CPU)
            mine, theirs = r["seq_s"] - r["ttft_ms"] / 1e3, plain["seq_s"] - plain["ttft_ms"] / 1e3
            decode = theirs / mine if mine > 0 and theirs > 0 else None
            assert r["decode_speedup"] == (pytest.approx(decode) if decode is not None else None)
        if r["assistant"] == "oracle":
            assert r["plain_ms_per_token"] == plain["ms_per_token"]
            assert r["speedup"] == pytest.approx(plain["seq_s"] / r["seq_s"])


def test_the_decode_speed_up_takes_each_calls_first_token_off():
    """(time per call - time to first token) without speculation / with it; None where a call is no longer than its
    first token or a row lacks that time, and no decode figure without the plain row."""
    from overlapdecode.bench.speculative import speed_up

    plain = dict(seq_s=0.130, ttft_ms=10.0, ms_per_token=1.0)
    row = dict(seq_s=0.040, ttft_ms=10.0)
    figures = speed_up(plain, row)
    assert figures["speedup"] == pytest.approx(3.25) and figures["decode_speedup"] == pytest.approx(4.0)
    assert speed_up(plain, dict(row, ttft_ms=40.0))["decode_speedup"] is None
    assert speed_up(dict(plain, ttft_ms=None), row)["decode_speedup"] is None
    assert speed_up(None, row) == dict(plain_ms_per_token=None, speedup=None, decode_speedup=None)


def test_the_verify_step_is_timed_for_every_token_count(spec_dir):
    (verify,) = _rows(spec_dir, "verify")  # the --append run's replaced the first's: one per configuration
    assert verify["strategy"] == "kv" and verify["verify_tokens"] == list(range(1, 10))
    assert len(verify["verify_ms"]) == 9 and all(t > 0 for t in verify["verify_ms"])
    assert verify["verify_ratio"] == pytest.approx([t / verify["verify_ms"][0] for t in verify["verify_ms"]])
    assert verify["draft_step_ms"] > 0 and verify["draft_ratio"] == pytest.approx(
        verify["draft_step_ms"] / verify["verify_ms"][0]
    )
    assert "draft_feed_ms" not in verify  # a Hugging Face cache feeds with a whole forward: draft_ratio covers it


@pytest.fixture(scope="module")
def fused_dir(tmp_path_factory):
    """A run of `fused` with prompt lookup and the model as its own draft."""
    out = str(tmp_path_factory.mktemp("fused"))
    flags = [*BASE, *QUICK, "--strategies", "fused", "--out", out, "--prompt-lookup", "2"]
    assert main([*flags, "--assistant", "self", "--num-assistant-tokens", str(K)]) == 0
    return out


def test_the_fused_verify_step_is_timed_for_every_token_count(fused_dir):
    (verify,) = _rows(fused_dir, "verify")
    assert "error" not in verify, verify
    assert verify["strategy"] == "fused" and verify["verify_tokens"] == list(range(1, 10))
    assert len(verify["verify_ms"]) == 9 and all(t > 0 for t in verify["verify_ms"])
    assert verify["verify_ratio"] == pytest.approx([t / verify["verify_ms"][0] for t in verify["verify_ms"]])
    assert verify["verify_graph"] is False  # on CPU the forwards run eagerly: no graph is captured
    assert verify["draft_step_ms"] > 0
    # the draft's last token of a round fed without its LM head, timed apart (the model's round cost takes it)
    assert verify["draft_feed_ms"] > 0 and verify["draft_feed_ratio"] == pytest.approx(
        verify["draft_feed_ms"] / verify["verify_ms"][0]
    )
    text = open(os.path.join(fused_dir, "report.md")).read()
    verify_table = text[text.index("| strategy | dtype | batch | 1-token ms |") :].split("\n\n")[0]
    assert "| fused | float32 | 1 |" in verify_table and verify_table.rstrip().endswith("| eager |")
    (row,) = [r for r in _rows(fused_dir, "speculative") if r["speculation"] == "prompt_lookup"]
    assert predicted(load(fused_dir)["rows"], row) is not None  # the model figure reads the fused verify row


def _spy_fused_forwards(monkeypatch):
    """Record each call of forward.decode_step (its rows, cache_group, positions, first K cache, whether
    forward.verify_step made it, whether it read the LM head) and the T of each forward.verify_step."""
    import inspect

    from overlapdecode.fused import forward

    calls, verifies, inside = [], [], []
    decode, verify = forward.decode_step, forward.verify_step
    params = inspect.signature(decode)

    def decode_spy(*args, **kwargs):
        a = params.bind(*args, **kwargs).arguments
        calls.append(
            (
                a["ids"].shape[0],
                a.get("cache_group", 1),
                a["pos"].tolist(),
                id(a["k_caches"][0]),
                bool(inside),
                a.get("head", True),
            )
        )
        return decode(*args, **kwargs)

    def verify_spy(W, k_caches, v_caches, pad, ids, pos, ops):
        verifies.append(ids.shape[1])
        inside.append(True)
        try:
            return verify(W, k_caches, v_caches, pad, ids, pos, ops)
        finally:
            inside.pop()

    monkeypatch.setattr(forward, "decode_step", decode_spy)
    monkeypatch.setattr(forward, "verify_step", verify_spy)
    return calls, verifies


def test_the_fused_verify_forward_at_one_token_is_the_decode_step(tmp_path, monkeypatch):
    """The worker's verify row of `fused`: at T = 1 each forward is the fused decode step itself (decode_step over
    the B rows, cache_group 1, not through verify_step), at T > 1 forward.verify_step over the B * T tokens at
    positions P..P + T - 1 of the fused cache holding the prompt; the draft's one-token forward on its own cache, then
    its feed of one token (the decode step without the LM head)."""
    import torch

    import overlapdecode as od
    from overlapdecode.bench.speculative import verify_row

    cfg = _config(tmp_path, *QUICK, "--strategies", "fused", "--prompt-lookup", "2", "--assistant", "self")
    model = od.load_model("tiny-gpt2", device="cpu")
    calls, verifies = _spy_fused_forwards(monkeypatch)
    B, P, runs = 2, cfg.prompt_len, 1 + 2 + 5  # each T: the eager run, 2 untimed (the least), 5 timed
    row = verify_row(cfg, "fused", model, model, B, 1000, torch.device("cpu"))
    assert row["verify_tokens"] == list(range(1, 10)) and len(row["verify_ms"]) == 9
    assert verifies == [T for T in range(2, 10) for _ in range(runs)]  # T = 1 never through verify_step
    model_cache = calls[0][3]
    expected = [(B, 1, [P] * B, model_cache, False, True)] * runs  # T = 1: the one-token decode step
    for T in range(2, 10):
        expected += [(B * T, T, list(range(P, P + T)) * B, model_cache, True, True)] * runs
    assert calls[: len(expected)] == expected
    draft = calls[len(expected) :]  # the draft's one-token forward, on the cache its rounds give it (tag "draft")
    assert len(draft) == 2 * runs and all(c[:3] == (B, 1, [P] * B) and not c[4] for c in draft)
    assert [c[5] for c in draft] == [True] * runs + [False] * runs  # the forward, then the feed
    assert {c[3] for c in draft} != {model_cache} and len({c[3] for c in draft}) == 1


def test_the_captured_verify_forward_cuts_a_static_cache_back_to_the_prompt():
    """`compiled` (a StaticRows, compiled on CUDA, eager here): each run feeds T tokens at positions P..P + T - 1
    with the cache's counter at the prompt's P slots (the device cut after each), keeping the logits of all T."""
    import torch

    import overlapdecode as od
    from overlapdecode.bench.speculative import captured_ms, captured_rows
    from overlapdecode.bench.workloads import prompt
    from overlapdecode.hf.caches import static_length

    model = od.load_model("tiny-gpt2", device="cpu")
    ids = prompt(2, 5, 1000, "cpu")
    rows = captured_rows(model, od.resolve_strategy("compiled"), torch.ones_like(ids), 16)
    seen = []

    def record(module, args, kwargs, output):
        written = int(static_length(rows.cache))  # after this forward's writes
        seen.append(
            (tuple(kwargs["input_ids"].shape), kwargs["position_ids"][0].tolist(), output.logits.shape[1], written)
        )

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            ms, replayed = captured_ms(rows, ids, (1, 3), warmup=1, repeats=2, vocab=1000, seed=0)
    finally:
        handle.remove()
    assert len(ms) == 2 and all(t > 0 for t in ms) and replayed is False  # no graph on CPU
    assert seen[0] == ((2, 5), [0, 1, 2, 3, 4], 1, 5)  # the prompt
    for T, calls in ((1, seen[1:5]), (3, seen[5:9])):  # the eager run, then 3: each from the prompt's 5 slots
        assert calls == [((2, T), list(range(5, 5 + T)), T, 5 + T)] * 4
    assert len(seen) == 9 and int(static_length(rows.cache)) == 5


def test_the_report_shows_the_rows_and_the_plot(spec_dir, capsys):
    text = open(os.path.join(spec_dir, "report.md")).read()
    assert "## Speculative decoding" in text and "(speculation.png)" in text
    assert os.path.getsize(os.path.join(spec_dir, "speculation.png")) > 0
    table = text[text.index("| strategy | dtype | batch | drafts by |") :]
    assert table.count("| kv | float32 | 1 |") == 4
    assert f"| kv | float32 | 1 | draft self | {K} | {N} |" in table and "draft random" in table
    assert f"| kv | float32 | 1 | draft oracle | {K} | {N} |" in table
    assert "| kv | float32 | 1 | prompt lookup | 2 |" in table
    assert "| strategy | dtype | batch | 1-token ms | K+1=1 |" in text
    assert "| speed-up | decode speed-up | model |" in text
    os.remove(os.path.join(spec_dir, "speculation.png"))
    assert main(["report", spec_dir]) == 0  # rebuilt from results.json alone
    assert os.path.exists(os.path.join(spec_dir, "speculation.png"))


def _spec_row(a=0.5, speedup=1.5, speculation="assistant", k=4, **kw):
    row = dict(result_row("kv", n=8, seq_s=0.1), workload="speculative")
    row.update(speculation=speculation, assistant="self" if speculation == "assistant" else None, k=k)
    row.update(drafts_offered=8, drafts_accepted=round(8 * a), acceptance_rate=a, tokens_per_round=2.0)
    row.update(plain_ms_per_token=15.0, speedup=speedup, **kw)
    return row


def _verify_row(**kw):
    """A verify row: a one-token forward of 1 ms, 0.1 ms more per token, a draft forward a quarter of it."""
    tokens = list(range(1, 10))
    row = dict(result_row("kv"), workload="verify", max_new_tokens=0, verify_tokens=tokens)
    for k in ("seq_s", "seq_s_all", "ms_per_token", "tokens_per_s", "ttft_ms", "first_call_s", "new_tokens"):
        row.pop(k)
    ms = [1.0 + 0.1 * (t - 1) for t in tokens]
    row.update(verify_ms=ms, verify_ratio=[t / ms[0] for t in ms], draft_ratio=0.25, draft_step_ms=0.25)
    row.update(kw)
    return row


def test_the_model_at_a_rows_rate_uses_its_verify_cost_and_draft():
    """The model takes a checked draft's acceptance (draft_acceptance), not accepted / offered (which counts the
    drafts after a rejection, never checked); a row recorded before that figure was takes accepted / offered."""
    rows = [
        _verify_row(),
        _spec_row(a=0.25, k=4, draft_acceptance=0.5),
        _spec_row(speculation="prompt_lookup", a=1.0, k=2),
    ]
    c5, c3 = 1.4, 1.2  # verify_ratio at K + 1 = 5 and 3 tokens
    assert predicted(rows, rows[1]) == pytest.approx(expected_tokens(0.5, 4) / (c5 + 5 * 0.25))
    assert predicted(rows, rows[2]) == pytest.approx(3 / c3)  # prompt lookup: no draft forwards; an older row
    assert predicted(rows[1:], rows[1]) is None  # no verify row: no model figure
    md = "\n".join(section(rows))
    assert "| kv | float32 | 1 | draft self | 4 | 8 | 8 | 2 | 0.25 | 0.50 | 2.00 |" in md
    assert "| kv | float32 | 1 | prompt lookup | 2 | 8 | 8 | 8 | 1.00 | - | 2.00 |" in md


def test_a_checked_drafts_acceptance_counts_one_rejection_a_round_that_had_one():
    """round_figures: two rows accepting 4 of 4 and 2 of 2, then 2 of 4 and 0 of 3, then 0 of 0 (prompt lookup
    found nothing) beside a row that has stopped: 8 accepted, 2 rejected (the drafts after a rejection are never
    checked)."""
    from overlapdecode.bench.speculative import round_figures
    from overlapdecode.spec.state import SpecStats

    stats = SpecStats(4)
    stats.add([True, True], [4, 2], [4, 2])
    stats.add([True, True], [4, 3], [2, 0])
    stats.add([True, False], [0, 4], [0, 0])
    fig = round_figures(stats)
    assert fig["drafts_offered"] == 13 and fig["drafts_accepted"] == 8
    assert fig["acceptance_rate"] == pytest.approx(8 / 13) and fig["draft_acceptance"] == pytest.approx(8 / 10)
    assert fig["tokens_per_round"] == pytest.approx((8 + 5) / 5)


def test_the_plot_draws_the_model_curve_beside_the_points(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [_verify_row(), _spec_row(a=0.5, k=4)]
    fig, ax = plt.subplots()
    _draw(ax, ("default", "float32", 1, "kv"), rows, rows[1:])
    (curve,) = [line for line in ax.lines if len(line.get_xdata()) > 2]
    cost = 1.4 + 5 * 0.25
    xs, ys = list(curve.get_xdata()), list(curve.get_ydata())
    assert xs[0] == 0 and xs[-1] == 1
    assert ys[0] == pytest.approx(1 / cost) and ys[-1] == pytest.approx(5 / cost)
    (points,) = ax.collections  # a row without the decode's speed-up (recorded before it was): its call's
    assert points.get_offsets().tolist() == [[0.5, 1.5]]
    plt.close(fig)
    rows[1]["decode_speedup"] = 1.75
    fig, ax = plt.subplots()
    _draw(ax, ("default", "float32", 1, "kv"), rows, rows[1:])
    decode, call = ax.collections  # the decode's, filled; the whole call's, hollow
    assert decode.get_offsets().tolist() == [[0.5, 1.75]] and call.get_offsets().tolist() == [[0.5, 1.5]]
    assert len(call.get_facecolors()) == 0 or call.get_facecolors()[0][3] == 0
    plt.close(fig)
    assert [name for name, _ in plot({"rows": rows}, str(tmp_path))] == ["speculation.png"]
    assert plot({"rows": [_verify_row()]}, str(tmp_path / "none")) == []  # no speculative row: no plot


def test_a_speed_up_within_the_spread_is_marked():
    rows = [result_row("kv", n=8, seq_s=0.12), _spec_row(speedup=1.05)]  # its calls 10% apart: 1.05x unresolved
    assert speedup_text(rows, rows[1]) == "1.05x !"
    rows[1]["speedup"] = 1.2
    assert speedup_text(rows, rows[1]) == "1.20x"


@pytest.mark.parametrize(
    "row, words",
    [
        (_spec_row(k=0), "row 0 has k of the wrong kind"),
        (_spec_row(speculation="magic"), "row 0 has speculation of the wrong kind"),
        (_spec_row(a=1.5), "row 0 has acceptance_rate of the wrong kind"),
        (_spec_row(speedup="fast"), "row 0 has speedup of the wrong kind"),
        (_spec_row(decode_speedup="fast"), "row 0 has decode_speedup of the wrong kind"),
        (_verify_row(verify_ms=[1.0, 2.0]), "row 0 has verify_ms of the wrong kind"),
        (_verify_row(verify_tokens=[0, 1]), "row 0 has verify_tokens of the wrong kind"),
        (_verify_row(draft_ratio=-1), "row 0 has draft_ratio of the wrong kind"),
        (_verify_row(verify_graph="yes"), "row 0 has verify_graph of the wrong kind"),
    ],
)
def test_a_malformed_speculative_row_is_refused_naming_it(row, words, tmp_path):
    write_results(str(tmp_path), dict(commands=["overlapdecode bench"], config=CONFIG, rows=[row]))
    with pytest.raises(ResultsError, match=words):
        load(str(tmp_path))


def test_rows_of_every_draft_and_k_are_kept_and_older_files_still_read(tmp_path):
    rows = [result_row("kv"), _spec_row(k=2), _spec_row(k=4), _spec_row(k=4, speculation="prompt_lookup")]
    rows.append(dict(_spec_row(k=4), assistant="random"))
    rows.append(_verify_row())
    write_results(str(tmp_path), dict(commands=["overlapdecode bench"], config=CONFIG, rows=rows))
    assert len(load(str(tmp_path))["rows"]) == 6  # no speculative row replaces another
    old = [result_row("kv"), result_row("kv", n=16)]  # written before the speculative rows: no such keys
    write_results(str(tmp_path), json.dumps(dict(commands=["overlapdecode bench"], config=CONFIG, rows=old)))
    assert main(["report", str(tmp_path)]) == 0
    assert "Speculative" not in open(tmp_path / "report.md").read()


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_the_verify_forward_is_the_rounds_forward_against_the_prompt(kind):
    """Each timed forward feeds T tokens at positions P..P + T - 1 and keeps the logits of all T, against a cache
    cut back to the prompt's P slots after each (as a round whose drafts are all rejected leaves it)."""
    import torch

    import overlapdecode as od
    from overlapdecode.bench.speculative import forward_ms
    from overlapdecode.bench.workloads import prompt

    model = od.load_model("tiny-gpt2", device="cpu")
    seen, grads = [], []

    def record(module, args, kwargs, output):
        grads.append(torch.is_grad_enabled())
        seen.append((tuple(kwargs["input_ids"].shape), kwargs["position_ids"][0].tolist(), output.logits.shape[1]))
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        seen[-1] += (cache.get_seq_length() if kind == "dynamic" else None,)  # a static cache counts on the device

    handle = model.register_forward_hook(record, with_kwargs=True)
    try:
        ms = forward_ms(model, kind, prompt(2, 5, 1000, "cpu"), (1, 3), warmup=1, repeats=2, length=16, seed=0)
    finally:
        handle.remove()
    assert len(ms) == 2 and all(t > 0 for t in ms)
    dynamic = kind == "dynamic"
    assert seen[0] == ((2, 5), [0, 1, 2, 3, 4], 1, 5 if dynamic else None)  # the prompt
    for T, calls in ((1, seen[1:4]), (3, seen[4:7])):  # each written after the prompt's 5 slots
        assert calls == [((2, T), list(range(5, 5 + T)), T, 5 + T if dynamic else None)] * 3
    assert len(seen) == 7 and grads == [False] * 7  # no autograd graph recorded in the timed forwards


def test_a_random_draft_of_a_directory_has_its_shape_and_other_weights(tmp_path):
    import torch

    import overlapdecode as od
    from overlapdecode.bench.speculative import load_draft
    from support.saved_models import save_tiny_with_tokenizer

    save_tiny_with_tokenizer(str(tmp_path))
    model = od.load_model(str(tmp_path), device="cpu")
    draft = load_draft("random", str(tmp_path), model, "float32", torch.device("cpu"), seed=0)
    assert load_draft("self", str(tmp_path), model, "float32", torch.device("cpu"), seed=0) is model
    ours, theirs = dict(model.named_parameters()), dict(draft.named_parameters())
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    assert not any(torch.equal(ours[k], theirs[k]) for k in ours if ours[k].dim() == 2)  # every matrix drawn anew
    assert draft.dtype == torch.float32 and not draft.training


def test_the_terminal_shows_the_speculative_rows_at_the_longest_length_within_80_columns():
    import io

    from rich.console import Console

    from overlapdecode.cli.bench import speculation_tables

    rows = [result_row("kv", n=8, seq_s=0.12), _spec_row(a=1.0, speedup=1.05), _spec_row(a=0.0, k=2)]
    rows.append(dict(_spec_row(speculation="prompt_lookup"), max_new_tokens=4))  # a shorter length: not shown
    rows.append(dict(_spec_row(k=8, a=0.0), assistant="/models/my-draft", speedup=0.5, strategy="static+sample"))
    (table,) = speculation_tables(rows)
    out = io.StringIO()
    Console(file=out, width=80).print(table)
    text = out.getvalue()
    assert max(map(len, text.splitlines())) <= 80 and "8 new tokens" in text
    lines = [line for line in text.splitlines() if "│ kv" in line or "│ static" in line]
    assert [[cell.strip() for cell in line.split("│")[1:-1]] for line in lines] == [
        ["kv", "self", "2", "0.00", "2.00", "12.500", "1.50x"],
        ["kv", "self", "4", "1.00", "2.00", "12.500", "1.05x !"],  # within its calls' spread
        ["static+sample", "my-draft", "8", "0.00", "2.00", "12.500", "0.50x"],
    ]


def test_a_short_call_still_has_room_for_the_largest_verify_step(tmp_path):
    """4 new tokens and K = 3 size a round loop's cache below the prompt + 9 tokens the verify row also times."""
    out = str(tmp_path / "out")
    flags = [*BASE, "--lengths", "4", "--warmup", "0", "--repeats", "1", "--no-profile", "--strategies", "kv"]
    assert main([*flags, "--prompt-lookup", "3", "--out", out]) == 0
    (verify,) = [r for r in load(out)["rows"] if r["workload"] == "verify"]
    assert "error" not in verify and verify["verify_tokens"] == list(range(1, 10))


@pytest.mark.parametrize("strategy", ["kv", "fused"])
@torch.no_grad()
def test_the_oracle_draft_proposes_the_models_own_tokens_a_share_of_them_right(strategy):
    """oracle.oracle_draft: a one-layer draft whose greedy token after each position of the rows' greedy
    output is the model's next one (a token repeated, rows at one position: each position its own key), so every
    draft is accepted, at batch 3; with acceptance 0.5 about half its answers are right, and the tokens stay those
    without speculation either way. Without keys it is one head wide."""
    from overlapdecode.bench.oracle import ORACLE_HEAD, oracle_draft

    model = od.load_model("tiny-llama", device="cpu")
    ids = torch.randint(0, 500, (3, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=30, eos_token_id=[], pad_token_id=0)
    out = od.generate(model, ids, strategy="kv", **kw)
    followers = {}  # token -> the tokens that follow it in the rows' output: several where a token-keyed map fails
    for row in out[:, 5:].tolist():
        for t, nxt in zip(row, row[1:]):
            followers.setdefault(t, set()).add(nxt)
    assert max(map(len, followers.values())) > 1
    for acceptance in (1.0, 0.5):
        draft = oracle_draft(model, ids, out, acceptance, seed=1)
        assert draft.config.n_embd == -(-2 * 3 * 30 // ORACLE_HEAD) * ORACLE_HEAD  # twice the 90 keys, in heads
        right, stats = _speculate_with(model, draft, ids, out, strategy, kw)
        if acceptance == 1.0:
            assert bool(right.all()) and stats.acceptance_rate == 1.0 and stats.rounds <= -(-29 // 5) + 1
        else:
            assert 0.3 < right.float().mean() < 0.7 and 0 < stats.acceptance_rate < 0.7
    assert oracle_draft(model, None, None, 1.0, seed=1).config.n_embd == ORACLE_HEAD
    assert oracle_draft(model, None, None, 1.0, seed=1, keys=90).config.n_embd == draft.config.n_embd


def _speculate_with(model, draft, ids, out, strategy: str, kw: dict):
    """The oracle `draft` against the model's greedy output `out` (B, 6 + 30) from `ids` (B, 6): (B, 29) whether its
    greedy token after each generated position is the model's next one, and the SpecStats of a speculative call
    with it, whose tokens must be `out`."""
    right = draft(input_ids=out, use_cache=False).logits.argmax(-1)[:, 5:-1] == out[:, 6:]
    dec = od.Decoder(model)
    got = dec.generate(ids, strategy=strategy, assistant_model=draft, num_assistant_tokens=4, **kw)
    assert torch.equal(got, out)
    return right, dec.last_speculation


def _tiny_body(tied: bool):
    """A draft body of another shape than tiny-llama's (wider, one layer) and its vocabulary, random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=256, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=tied,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def test_oracle_specs_name_an_acceptance_and_a_shape():
    from overlapdecode.bench.oracle import oracle_acceptance, oracle_spec

    assert oracle_spec("oracle") == (1.0, None) and oracle_spec("oracle:0.7") == (0.7, None)
    assert oracle_spec("oracle@llama-1b-random") == (1.0, "llama-1b-random")
    assert oracle_spec("oracle:0.7@/models/draft") == (0.7, "/models/draft")
    assert oracle_spec(None) is None and oracle_spec("self") is None and oracle_spec("team@oracle") is None
    assert oracle_acceptance("oracle:0.5@x") == 0.5
    for bad in ("oracle:0.7@", "oracle@ ", "oracle:0@x", "oracle:x@y"):
        with pytest.raises(ValueError, match=f"--assistant {bad}"):
            oracle_spec(bad)


@pytest.mark.parametrize("strategy", ["kv", "fused"])
@torch.no_grad()
def test_an_oracle_of_a_given_shape_proposes_the_models_own_tokens_a_share_of_them_right(strategy):
    """oracle.oracle_draft with `body` (`--assistant oracle[:A]@MODEL`): a draft of the body's shape (its
    decoder shared, its tied head untied and fitted on the decoder's hidden states) whose greedy token after each
    position of the rows' greedy output is the model's next one at acceptance 1, about half of them at 0.5; the
    tokens stay those without speculation; the body keeps its own embeddings; a body of another vocabulary is
    refused."""
    from overlapdecode.bench.oracle import oracle_draft

    model = od.load_model("tiny-llama", device="cpu")
    body = _tiny_body(tied=True)
    embed = body.get_input_embeddings().weight.clone()
    ids = torch.randint(0, 500, (3, 6), generator=torch.Generator().manual_seed(3))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=30, eos_token_id=[], pad_token_id=0)
    out = od.generate(model, ids, strategy="kv", **kw)
    for acceptance in (1.0, 0.5):
        draft = oracle_draft(model, ids, out, acceptance, seed=1, body=body)
        assert draft.model is body.model and draft.get_output_embeddings() is not body.get_output_embeddings()
        assert torch.equal(body.get_input_embeddings().weight, embed)
        right, stats = _speculate_with(model, draft, ids, out, strategy, kw)
        if acceptance == 1.0:
            assert bool(right.all()) and stats.acceptance_rate == 1.0
        else:
            assert 0.3 < right.float().mean() < 0.7 and 0 < stats.acceptance_rate < 0.7
    assert oracle_draft(model, None, None, 1.0, seed=1, body=body) is body  # the verify row times its step
    with pytest.raises(ValueError, match="the draft scores 50257 token ids, the model 1000"):
        oracle_draft(model, ids, out, 1.0, seed=1, body=od.load_model("gpt2-random", device="cpu"))


def test_the_oracle_fit_settles_on_the_speculative_calls_own_tokens():
    """worker._oracle_fit, against a stand-in of a bfloat16 target whose verify step rounds otherwise than its
    one-token step: the speculative call keeps the drafted tokens up to the first its own rounding refuses, there
    takes its own, and after that (other rounds, other rounding) goes its own way. Refitted to each call's tokens,
    the draft reaches the call's fixed point; a limit too small for that says so (limit + 1); every refitted draft
    is dropped."""
    from overlapdecode.bench.worker import _oracle_fit

    settled = torch.arange(100, 120).unsqueeze(0)  # the tokens the call gives once its every draft is accepted
    plain = settled.clone()
    plain[0, 3:] += 50  # the call without speculation: its rounding flipped the token at step 3

    def speculate(draft):
        j = int((draft != settled).nonzero()[0, 1]) if not torch.equal(draft, settled) else settled.shape[1]
        got = settled.clone()
        got[0, j + 1 :] += 7  # past the first refused draft the call runs other rounds: other tokens
        return got

    dropped = []
    draft, fits = _oracle_fit(speculate, lambda out: out.clone(), plain, drop=dropped.append)
    assert torch.equal(draft, settled) and 1 < fits <= settled.shape[1] and len(dropped) == fits - 1
    draft, fits = _oracle_fit(speculate, lambda out: out.clone(), plain, limit=2, drop=dropped.append)
    assert fits == 3 and not torch.equal(draft, settled)
    draft, fits = _oracle_fit(speculate, lambda out: out.clone(), settled.clone(), drop=dropped.append)
    assert fits == 1 and torch.equal(draft, settled)  # already the fixed point: one call says so


def test_a_prompt_lookup_row_of_an_oracle_run_makes_no_oracle():
    """worker._row_draft under --assistant oracle: a draft model's row gets the oracle (made once for its key, with
    the calls its fit took); a prompt-lookup row of the same run drafts nothing, so none is made or fitted for it."""
    from overlapdecode.bench.config import BenchConfig
    from overlapdecode.bench.worker import _row_draft

    model = od.load_model("tiny-llama", device="cpu")
    ids = torch.randint(0, 500, (1, 5), generator=torch.Generator().manual_seed(4))
    cfg = BenchConfig(model="tiny-llama", assistant="oracle", num_assistant_tokens=(2,), device="cpu")
    made = {}
    assert _row_draft(cfg, "kv", model, None, ids, 6, 0, made, ("lookup",), "prompt_lookup", 2) == (None, None)
    assert made == {}
    draft, fits = _row_draft(cfg, "kv", model, None, ids, 6, 0, made, ("draft",), "assistant", 2)
    assert draft is not None and fits == 1 and list(made) == [("draft",)]
    assert _row_draft(cfg, "kv", model, None, ids, 6, 0, made, ("draft",), "assistant", 2) == (draft, fits)
