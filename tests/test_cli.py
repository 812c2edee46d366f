"""`overlapdecode generate` and `overlapdecode profile` on CPU."""

from __future__ import annotations

import json
import os

import torch

import overlapdecode as od
from overlapdecode.cli import main
from test_models import save_tiny_with_tokenizer


def test_generate_prints_ids_with_random_weights_note(capsys):
    assert main(["generate", "--model", "tiny-gpt2", "--prompt-ids", "5,6,7", "--max-new-tokens", "6",
                 "--strategy", "kv", "--eos", "none"]) == 0
    out = capsys.readouterr().out
    assert "random weights" in out
    model = od.load_model("tiny-gpt2", device="cpu")
    ref = od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=6, strategy="kv", eos_token_id=[])
    assert "ids: " + " ".join(str(t) for t in ref[0, 3:].tolist()) in out
    assert "[6 new tokens, strategy kv]" in out


def test_generate_prints_text_with_a_tokenizer(tmp_path, capsys):
    save_tiny_with_tokenizer(tmp_path)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "w5 w6 w7", "--max-new-tokens", "5",
                 "--strategy", "interleaved", "--eos", "none"]) == 0
    out = capsys.readouterr().out
    model = od.load_model(str(tmp_path), device="cpu")
    ref = od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=5, strategy="static", eos_token_id=[])
    words = " ".join(f"w{t}" for t in ref[0, 3:].tolist())
    assert out.startswith("w5 w6 w7") and words in out


def test_profile_writes_trace_and_summary_without_faking_gpu_figures(tmp_path, capsys):
    out = str(tmp_path / "prof")
    assert main(["profile", "--model", "tiny-gpt2", "--strategies", "static,interleaved:2", "--new-tokens", "6",
                 "--prompt-len", "8", "--out", out, "--device", "cpu"]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    assert summary["strategies"]["interleaved:2"]["trace"] == "trace-interleaved-lag2.json.gz"  # a safe file name
    for name in ("static", "interleaved:2"):
        s = summary["strategies"][name]
        assert os.path.getsize(os.path.join(out, s["trace"])) > 0
        assert os.path.getsize(os.path.join(out, s["timeline"])) > 0
        assert s["available"] is False and "busy_fraction" not in s  # unavailable without CUDA, not faked
        assert s["decode_steps"] == 5  # the NVTX/record_function ranges were found: 6 tokens = prefill + 5
    text = open(os.path.join(out, "summary.md")).read()
    assert "unavailable" in text and "Made by `overlapdecode profile --model tiny-gpt2" in text
