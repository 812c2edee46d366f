"""`overlapdecode generate --prompt-lookup K` and `--assistant MODEL --num-assistant-tokens K`: the tokens of the
same strategy without speculation, the drafts accepted on the last line, and every mistake one line naming its
flag (exit status 2), before any token is printed."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import overlapdecode as od
from overlapdecode.cli import main

PROMPT = [5, 6, 7, 5, 6, 8, 9]


def _run(capsys, *flags) -> tuple[list[int], str]:
    argv = ["generate", "--model", "tiny-llama", "--prompt-ids", ",".join(map(str, PROMPT)), "--max-new-tokens", "9"]
    assert main(argv + ["--eos", "none", *flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    ids = next(line for line in lines if line.startswith("ids:"))
    return [int(t) for t in ids.split()[1:]], lines[-1]


@pytest.mark.parametrize("strategy", ["kv", "static", "fused"])
def test_speculation_prints_the_tokens_without_it(tiny_llama, capsys, strategy):
    ref = od.generate(tiny_llama, torch.tensor([PROMPT]), max_new_tokens=9, strategy=strategy, eos_token_id=[])
    ref = ref[0, len(PROMPT) :].tolist()
    for flags, kind in (
        (["--prompt-lookup", "3"], "prompt lookup K=3"),
        (["--assistant", "tiny-llama", "--num-assistant-tokens", "2"], "assistant tiny-llama K=2"),
    ):
        ids, last = _run(capsys, "--strategy", strategy, *flags)
        assert ids == ref, flags
        assert last.startswith(f"[9 new tokens, strategy {strategy}, {kind}: ") and "drafts accepted in" in last
    ids, last = _run(capsys, "--prompt-lookup", "2")  # no --strategy: kv on a CPU
    assert ids == ref and ", strategy kv, prompt lookup K=2" in last


def _one_line(capsys, words: str) -> None:
    captured = capsys.readouterr()
    # Hugging Face's progress bar of loading a directory's weights (its own, not the command's) left out
    err = "\n".join(line for line in captured.err.strip().splitlines() if not line.startswith("Loading weights"))
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.split(": error: ", 1)[1].startswith("--"), err  # the flag comes first
    assert captured.out == "", captured.out


@pytest.fixture
def other_vocabulary(tmp_path):
    config = LlamaConfig(
        vocab_size=500, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--prompt-lookup", "0"], "--prompt-lookup must be >= 1"),
        (["--num-assistant-tokens", "3"], "--num-assistant-tokens is given without --assistant"),
        (["--assistant", "tiny-llama", "--num-assistant-tokens", "0"], "--num-assistant-tokens must be >= 1"),
        (["--prompt-lookup", "2", "--strategy", "baseline"], "--strategy: strategy 'baseline': speculative"),
        (["--assistant", "tiny-llama", "--strategy", "baseline"], "presets 'kv', 'static', 'compiled', 'interleaved'"),
        (["--assistant", "/nonexistent/draft"], "--assistant: path /nonexistent/draft does not exist"),
        (["--assistant", "OTHER"], "--assistant: assistant_model scores 500 token ids and the model 1000"),
    ],
)
def test_speculation_mistakes_are_one_line_naming_the_flag(flags, words, capsys, other_vocabulary):
    capsys.readouterr()  # what saving the other vocabulary's model printed
    flags = [other_vocabulary if f == "OTHER" else f for f in flags]
    assert main(["generate", "--model", "tiny-llama", "--prompt-ids", "1,2", *flags]) == 2
    _one_line(capsys, words)


def test_prompt_lookup_and_an_assistant_together_are_one_line(capsys):
    with pytest.raises(SystemExit) as ended:  # argparse's refusal of two exclusive flags
        main(["generate", "--model", "tiny-llama", "--prompt-ids", "1,2", "--assistant", "x", "--prompt-lookup", "2"])
    assert ended.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--prompt-lookup: not allowed with argument --assistant" in err and len(err.splitlines()) == 1, err
