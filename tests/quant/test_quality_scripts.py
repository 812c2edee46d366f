"""scripts/train_stdlib.py, scripts/quant_quality.py, scripts/spec_acceptance.py and scripts/quality_job.sh, run tiny
on CPU: a model trained on a few hundred KB of the standard library's sources, its held-out perplexity measured
through quantized layers, a draft sharing its tokenizer and the acceptance rates of speculation with it, and the
refusals that keep an earlier run from being overwritten."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import overlapdecode as od

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPTS = os.path.join(ROOT, "scripts")
TINY = ["--max-mb", "0.3", "--vocab", "512", "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2"]
TINY += ["--intermediate", "256", "--seq", "64", "--batch", "8", "--warmup", "10", "--lr", "3e-3", "--log-every", "25"]
STEPS = 150


def _script(name: str):
    """scripts/NAME.py as a module, with scripts/ on the path as when it runs as a script."""
    if SCRIPTS not in sys.path:
        sys.path.insert(0, SCRIPTS)
    spec = importlib.util.spec_from_file_location(f"script_{name}", os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A target (150 steps), a draft on its tokenizer (other shape and seed) and the target's quality."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: more threads than free cores only wait on each other
    try:
        tmp = tmp_path_factory.mktemp("quality")
        train, quality = _script("train_stdlib"), _script("quant_quality")
        target = train.main(["--out", str(tmp / "target"), "--steps", str(STEPS), *TINY])
        draft_args = [*TINY, "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--steps", "150", "--seed", "1"]
        draft_args += ["--vocab", "300"]  # ignored with --tokenizer: the target's 512 come with it
        draft = train.main(["--out", str(tmp / "draft"), "--tokenizer", str(tmp / "target"), *draft_args])
        # groups of 32 and 16: at hidden 64, 128 and 64 would each be one group per row of most layers
        measured = quality.main([str(tmp / "target"), "--out", str(tmp / "q.json"), "--groups", "32,16"])
        yield {"tmp": tmp, "target": target, "draft": draft, "quality": measured, "train": train, "qmod": quality}
    finally:
        torch.set_num_threads(threads)


def test_training_writes_a_model_that_learned(runs):
    tmp, rec = runs["tmp"], runs["target"]
    assert {"config.json", "model.safetensors", "tokenizer.json", "train.json"} <= set(os.listdir(tmp / "target"))
    assert json.loads((tmp / "target" / "train.json").read_text()) == json.loads(json.dumps(rec))
    curve = rec["loss curve"]
    assert [p["step"] for p in curve] == [1, 25, 50, 75, 100, 125, 150] and rec["steps"] == STEPS
    assert all(math.isfinite(p["loss"]) and math.isfinite(p["heldout loss"]) for p in curve)
    assert abs(curve[0]["loss"] - math.log(512)) < 0.3  # a fresh model guesses about uniformly
    assert curve[-1]["loss"] < curve[0]["loss"] - 1.5 and curve[-1]["heldout loss"] < curve[0]["heldout loss"] - 1.0
    assert rec["tokens seen"] == STEPS * 8 * 64 and rec["stopped by"] == "steps"
    model = od.load_model(str(tmp / "target"), device="cpu")
    assert model.config.hidden_size == 64 and model.config.vocab_size == 512
    assert sum(p.numel() for p in model.parameters()) == rec["parameters"]


def test_the_split_is_by_path_and_the_held_out_files_are_not_trained_on(runs):
    train, split = runs["train"], runs["target"]["split"]
    full = train.split_sources(split["stdlib"], 5.0, None)
    assert full["train"] and full["heldout"] and not set(full["train"]) & set(full["heldout"])
    assert 0.02 < len(full["heldout"]) / (len(full["train"]) + len(full["heldout"])) < 0.08
    key = lambda rel: int(hashlib.sha256(rel.encode()).hexdigest()[:12], 16) % 10000  # noqa: E731
    assert all(key(r) < 500 for r in full["heldout"]) and all(key(r) >= 500 for r in full["train"])
    assert not any("site-packages" in r for r in full["train"])
    assert split["heldout"] and set(split["heldout"]) <= set(full["heldout"])
    assert split["heldout files"] == len(split["heldout"]) and split["train files"] > split["heldout files"]
    assert split["train bytes"] + split["heldout bytes"] < 0.4e6  # --max-mb 0.3, give or take one file per side


def test_a_seed_gives_the_same_run_on_cpu(runs, tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = [*TINY, "--steps", "30"]
        first = runs["train"].main(["--out", str(tmp_path / "a"), *args])
        again = runs["train"].main(["--out", str(tmp_path / "b"), *args])
        other = runs["train"].main(["--out", str(tmp_path / "c"), *args, "--seed", "1"])
    finally:
        torch.set_num_threads(threads)
    losses = lambda rec: [(p["loss"], p["heldout loss"]) for p in rec["loss curve"]]  # noqa: E731
    assert losses(first) == losses(again) and losses(first) != losses(other)
    weights = lambda d: (tmp_path / d / "model.safetensors").read_bytes()  # noqa: E731
    assert weights("a") == weights("b") != weights("c")


def test_a_draft_reuses_the_targets_tokenizer(runs):
    from transformers import AutoTokenizer

    tmp = runs["tmp"]
    target, draft = (AutoTokenizer.from_pretrained(str(tmp / d)) for d in ("target", "draft"))
    assert target.get_vocab() == draft.get_vocab() and len(draft) == 512
    text = 'def f(x):\n    return {"a": x}  # comment\n'
    assert target(text)["input_ids"] == draft(text)["input_ids"]
    assert draft(text)["input_ids"][0] == draft.bos_token_id and draft.decode(draft(text)["input_ids"][1:]) == text
    assert runs["draft"]["tokenizer"]["from"] == str(tmp / "target")
    assert runs["draft"]["split"]["heldout"] == runs["target"]["split"]["heldout"]
    assert od.load_model(str(tmp / "draft"), device="cpu").config.hidden_size == 32


def test_quality_scores_every_form_through_its_quantized_layers(runs, capsys):
    result = runs["quality"]
    forms = {(r["form"], r["group"]): r for r in result["forms"]}
    assert list(forms) == [("float32", "-"), ("int8", "row"), ("int4", 32), ("int4", 16)]
    base = forms["float32", "-"]
    assert base["ratio"] == 1.0 and base["kl from unquantized"] == 0.0 and base["top-1 agreement"] == 1.0
    assert base["quantized layers"] == 0
    assert base["perplexity"] < 512 / 4  # the trained model beats a uniform guess by far
    int8, int4 = forms["int8", "row"], [forms["int4", 32], forms["int4", 16]]
    for row in (int8, *int4):
        assert row["quantized layers"] == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the head
        assert row["perplexity"] != base["perplexity"] and row["kl from unquantized"] > 0
        assert row["weight bytes"] < base["weight bytes"]
    for row in int4:  # 8 bits per weight are far closer to the unquantized model than 4
        assert int8["kl from unquantized"] < row["kl from unquantized"] / 10
        assert int8["top-1 agreement"] > row["top-1 agreement"]
        assert row["weight bytes"] < int8["weight bytes"]
    assert int4[1]["kl from unquantized"] < int4[0]["kl from unquantized"]  # groups of 16 err less than of 32
    assert result["windows"] == result["heldout tokens"] // 64 and result["tokens scored"] == result["windows"] * 63


def test_the_scripts_refuse_in_one_line_and_overwrite_nothing(runs, tmp_path, capsys):
    train, quality, tmp = runs["train"], runs["qmod"], runs["tmp"]

    def refused(main, argv, words):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and words in err and len(err.splitlines()) == 1, err

    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "note").write_text("mine")
    x = ["--out", str(tmp_path / "x"), *TINY, "--steps", "1"]  # tiny: a refusal that failed would train briefly
    refused(train.main, [*x, "--out", str(kept)], "is not an empty directory")
    refused(train.main, [*x, "--hidden", "66"], "not a multiple of --heads")
    refused(train.main, [*x, "--kv-heads", "3"], "not a multiple of --kv-heads")
    refused(train.main, [*x, "--steps", "0"], "--steps: expected a positive integer")
    refused(train.main, [*x, "--tokenizer", str(kept)], "no tokenizer.json")
    refused(train.main, TINY, "required: --out")
    assert (kept / "note").read_text() == "mine" and not (tmp_path / "x").exists()

    refused(quality.main, [str(tmp / "target"), "--out", str(kept / "note")], "exists: choose a new path")
    assert (kept / "note").read_text() == "mine"
    refused(quality.main, [str(kept), "--out", str(tmp_path / "q.json")], "has no train.json")
    refused(quality.main, [str(tmp / "target"), "--out", str(tmp_path / "q.json"), "--groups", "0"], "--groups")
    moved = tmp_path / "moved"  # the same model, its held-out files named differently: not the text it held out
    moved.mkdir()
    for name in os.listdir(tmp / "target"):
        (moved / name).write_bytes((tmp / "target" / name).read_bytes())
    record = json.loads((moved / "train.json").read_text())
    record["split"]["heldout sha256"] = "0" * 64
    (moved / "train.json").write_text(json.dumps(record))
    refused(quality.main, [str(moved), "--out", str(tmp_path / "q.json")], "differ from those the model was trained")
    assert not (tmp_path / "q.json").exists()


def _costs(path, model: str, one_token_ms: float, ratios: list[float]) -> str:
    """A bench results.json holding one fused verify row (the fields spec_acceptance.py reads)."""
    row = dict(workload="verify", strategy="fused", model=model, verify_tokens=list(range(1, len(ratios) + 1)))
    row.update(verify_ms=[one_token_ms * r for r in ratios], verify_ratio=ratios)
    path.write_text(json.dumps({"rows": [dict(row, strategy="static"), row]}))
    return str(path)


def test_acceptance_of_lookup_and_the_draft_with_projected_speed_ups(runs, tmp_path, capsys):
    """Every speculative call gave the plain call's tokens (the script checks); the counts add up; a shape's
    speed-up is tokens per round / (its verify step at K + 1 + (K + 1) x the draft's step), from its results.json."""
    tmp, spec = runs["tmp"], _script("spec_acceptance")
    big = _costs(tmp_path / "big.json", "big", 4.0, [1.0, 1.02, 1.03, 1.05, 1.06])
    small = _costs(tmp_path / "small.json", "small", 1.0, [1.0, 1.1, 1.2, 1.3, 1.4])
    argv = [str(tmp / "target"), "--draft", str(tmp / "draft"), "--out", str(tmp_path / "a.json"), "--prompts", "4"]
    argv += ["--prompt-len", "32", "--new-tokens", "12", "--k", "1,3", "--batch", "2"]
    result = spec.main([*argv, "--shape", f"big={big},{small}", "--shape", f"small={small}"])
    assert json.loads((tmp_path / "a.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    rows = {(r["drafts by"], r["k"]): r for r in result["rows"]}
    assert list(rows) == [("prompt lookup", 1), ("draft model", 1), ("prompt lookup", 3), ("draft model", 3)]
    for (kind, k), r in rows.items():
        assert 0 <= r["accepted"] <= r["offered"] <= k * r["row rounds"]
        assert r["row rounds"] >= 4 * 11 // (k + 1)  # 4 prompts, 11 tokens after the first, k + 1 a round at most
        assert r["tokens per round"] == (r["accepted"] + r["row rounds"]) / r["row rounds"]
        big_cost = {1: 1.02, 3: 1.05}[k] + ((k + 1) * 0.25 if kind == "draft model" else 0.0)
        assert r["projections"]["big"]["speed-up"] == pytest.approx(r["tokens per round"] / big_cost)
        if kind == "draft model":
            assert "small" not in r["projections"]  # no draft shape named for it
        else:
            assert r["projections"]["small"]["speed-up"] == pytest.approx(r["tokens per round"] / {1: 1.1, 3: 1.3}[k])
    assert rows["draft model", 1]["accepted"] > 0  # a draft trained on the same text agrees with its target at times
    shapes = {s["name"]: s for s in result["shapes"]}
    assert shapes["big"]["draft_ratio"] == pytest.approx(0.25) and shapes["small"]["draft_ratio"] is None
    assert "| draft model | 3 |" in capsys.readouterr().out


def test_acceptance_fails_where_speculation_changes_the_tokens(runs, tmp_path, monkeypatch, capsys):
    tmp, spec = runs["tmp"], _script("spec_acceptance")
    real = od.generate

    def altered(*args, **kw):  # speculation that returns other tokens than the plain call
        out = real(*args, **kw)
        if kw.get("prompt_lookup_num_tokens"):
            out = out.clone()
            out[0, -1] = (out[0, -1] + 1) % 512
        return out

    monkeypatch.setattr(od, "generate", altered)
    argv = [str(tmp / "target"), "--draft", str(tmp / "draft"), "--out", str(tmp_path / "a.json"), "--prompts", "2"]
    with pytest.raises(SystemExit):
        spec.main([*argv, "--prompt-len", "16", "--new-tokens", "4", "--k", "2"])
    assert "prompt lookup K=2 gave other tokens than kv without it" in capsys.readouterr().err
    assert not (tmp_path / "a.json").exists()


def test_acceptance_refuses_in_one_line(runs, tmp_path, capsys):
    tmp, spec = runs["tmp"], _script("spec_acceptance")

    def refused(argv, words):
        with pytest.raises(SystemExit) as exit_:
            spec.main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and words in err and len(err.splitlines()) == 1, err

    kept = tmp_path / "kept.json"
    kept.write_text("mine")
    base = [str(tmp / "target"), "--draft", str(tmp / "draft"), "--out", str(tmp_path / "a.json")]
    refused([*base[:3], "--out", str(kept)], "exists: choose a new path")
    refused([str(tmp / "target"), "--draft", str(tmp_path), "--out", str(tmp_path / "a.json")], "has no train.json")
    refused([*base, "--k", "9"], "--k: expected drafts per round from 1 to 8")
    refused([*base, "--shape", "big"], "expected NAME=TARGET_JSON[,DRAFT_JSON]")
    refused([*base, "--shape", f"big={tmp_path / 'none.json'}"], "is not a file")
    refused([*base, "--shape", f"big={kept}"], "is not a bench results.json")
    assert kept.read_text() == "mine" and not (tmp_path / "a.json").exists()


def test_quality_job_runs_the_three_steps_into_outdir(tmp_path):
    script = os.path.join(SCRIPTS, "quality_job.sh")
    done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "expected one argument, OUTDIR" in done.stderr
    # the commands it runs, recorded by a python3 ahead of the real one on PATH (no GPU here); it makes the
    # train.json a finished training leaves, or fails where QUALITY_FAIL names the step's --out
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(
        "#!/bin/sh\n"
        'echo "$*" >> "$QUALITY_CALLS"\n'
        'prev=""; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done\n'
        '[ -n "${out:-}" ] && [ "$out" = "${QUALITY_FAIL:-}" ] && exit 3\n'
        'case "$*" in *train_stdlib.py*) mkdir -p "$out" && echo {} > "$out/train.json" ;; esac\n'
        "exit 0\n"
    )
    (bin_dir / "python3").chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", QUALITY_CALLS=str(calls))
    out = tmp_path / "job"
    done = subprocess.run(["bash", script, str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line for line in calls.read_text().splitlines() if line.startswith("scripts/")]
    assert runs[0] == f"scripts/train_stdlib.py --out {out}/target --max-seconds 160"
    assert runs[1].startswith(f"scripts/train_stdlib.py --out {out}/draft --tokenizer {out}/target --hidden 256 ")
    assert runs[2] == f"scripts/quant_quality.py {out}/target --out {out}/quality.json"
    assert runs[3] == f"scripts/quant_quality.py {out}/draft --out {out}/draft-quality.json" and len(runs) == 4
    timings = (out / "timings.txt").read_text().splitlines()
    assert [t.split()[0] for t in timings] == ["target", "draft", "quality", "draft-quality", "total"]
    assert timings[-1].endswith("status=0") and {"gpu.txt", "target.log", "quality.log"} <= set(os.listdir(out))

    done = subprocess.run(["bash", script, str(out)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "is not empty: choose a new OUTDIR" in done.stderr
    assert len(calls.read_text().splitlines()) == 5  # nothing ran the second time

    failed = tmp_path / "failed"
    env["QUALITY_FAIL"] = str(failed / "target")
    done = subprocess.run(["bash", script, str(failed)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1 and "target" in (failed / "timings.txt").read_text()
    assert "rc=3" in (failed / "timings.txt").read_text() and not (failed / "quality.log").exists()
