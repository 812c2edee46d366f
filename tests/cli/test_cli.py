"""`overlapdecode generate` and `overlapdecode profile` on CPU."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

import overlapdecode as od
from overlapdecode.cli import main
from support.saved_models import save_tiny_with_bpe_tokenizer, save_tiny_with_tokenizer


def test_generate_prints_ids_with_random_weights_note(capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-gpt2",
                "--prompt-ids",
                "5,6,7",
                "--max-new-tokens",
                "6",
                "--strategy",
                "kv",
                "--eos",
                "none",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "random weights" in out
    model = od.load_model("tiny-gpt2", device="cpu")
    ref = od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=6, strategy="kv", eos_token_id=[])
    assert "ids: " + " ".join(str(t) for t in ref[0, 3:].tolist()) in out
    assert "[6 new tokens, strategy kv]" in out


def test_generate_prints_text_with_a_tokenizer(tmp_path, capsys):
    save_tiny_with_tokenizer(tmp_path)
    assert (
        main(
            [
                "generate",
                "--model",
                str(tmp_path),
                "--prompt",
                "w5 w6 w7",
                "--max-new-tokens",
                "5",
                "--strategy",
                "interleaved",
                "--eos",
                "none",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    model = od.load_model(str(tmp_path), device="cpu")
    ref = od.generate(model, torch.tensor([[5, 6, 7]]), max_new_tokens=5, strategy="static", eos_token_id=[])
    words = " ".join(f"w{t}" for t in ref[0, 3:].tolist())
    # one line: the prompt, a space, the new words each separated by one space (not "w5 w6 w7w968 ...")
    assert out.splitlines()[0] == "w5 w6 w7 " + words


def test_generate_text_with_an_embedded_model(capsys):
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-llama",
                "--prompt",
                "héllo",
                "--max-new-tokens",
                "8",
                "--strategy",
                "kv",
                "--eos",
                "none",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert "random weights" in lines[0] and "random bytes" in lines[0]
    model, tok = od.load_model("tiny-llama", device="cpu"), od.load_tokenizer("tiny-llama")
    ids = tok("héllo", return_tensors="pt").input_ids
    ref = od.generate(model, ids, max_new_tokens=8, strategy="kv", eos_token_id=[])
    assert "\n".join(lines[1:-1]) == tok.decode(ref[0], skip_special_tokens=True)
    assert lines[-1] == "[8 new tokens, strategy kv]"


@pytest.mark.parametrize("hugging_face", [False, True])
def test_generate_shows_every_id_as_text_or_as_its_number(hugging_face, tmp_path, capsys):
    """tiny-gpt2's byte tokenizer knows ids 3..258 of its 1000, the saved BPE tokenizer fewer than 300: the
    other ids a random model emits printed nothing (gpt2-random's `--prompt Hello` printed no text at all)."""
    from overlapdecode.models.tokenizer import OFFSET, readable

    name = "tiny-gpt2"
    if hugging_face:
        name = str(tmp_path)
        save_tiny_with_bpe_tokenizer(tmp_path)
    assert (
        main(
            [
                "generate",
                "--model",
                name,
                "--prompt",
                "Hello",
                "--max-new-tokens",
                "12",
                "--strategy",
                "kv",
                "--eos",
                "none",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    model, tok = od.load_model(name, device="cpu"), od.load_tokenizer(name)
    ids = tok("Hello", return_tensors="pt").input_ids
    new = od.generate(model, ids, max_new_tokens=12, strategy="kv", eos_token_id=[])[0, ids.shape[1] :].tolist()
    known = range(len(tok)) if hugging_face else range(OFFSET, OFFSET + 256)
    unknown = [t for t in new if t not in known]
    assert unknown  # this random model emits ids its tokenizer cannot decode
    printed = out.split("Hello", 1)[1].rsplit("\n[12 new tokens, strategy kv]\n", 1)[0]  # random bytes: any chars
    assert printed == readable(tok, new) and all(f"<{t}>" in printed for t in unknown)


def test_prompt_text_needs_a_tokenizer(tmp_path, capsys):
    od.load_model("tiny-gpt2", device="cpu").save_pretrained(tmp_path)  # no tokenizer saved
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hello"]) == 2
    captured = capsys.readouterr()
    assert "--prompt needs a tokenizer" in captured.err and captured.out == ""


def test_profile_writes_trace_and_summary_without_faking_gpu_figures(tmp_path, capsys):
    out = str(tmp_path / "prof")
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny-gpt2",
                "--strategies",
                "static,interleaved:2",
                "--new-tokens",
                "6",
                "--prompt-len",
                "8",
                "--out",
                out,
                "--device",
                "cpu",
            ]
        )
        == 0
    )
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
    # a second profile into the same directory replaced the first one's summary and traces without a word
    before = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)}
    capsys.readouterr()
    assert (
        main(
            [
                "profile",
                "--model",
                "tiny-gpt2",
                "--strategies",
                "kv",
                "--new-tokens",
                "3",
                "--prompt-len",
                "4",
                "--out",
                out,
                "--device",
                "cpu",
            ]
        )
        == 2
    )
    _one_line(capsys, f"--out {out} already holds a profile (summary.json): choose another --out")
    assert {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out)} == before


def test_profile_prints_no_lines_of_the_tracing_library(tmp_path, capfd):
    """The profiler's tracing library (kineto) wrote `USDT:... profiler_start` and `profiler_stop` to file
    descriptor 2 around every trace; the rest of stderr still comes through."""
    argv = ["profile", "--model", "tiny-gpt2", "--strategies", "kv,static", "--new-tokens", "3", "--prompt-len", "4"]
    assert main(argv + ["--device", "cpu", "--out", str(tmp_path / "p")]) == 0
    err = capfd.readouterr().err
    assert "USDT" not in err and "profiler_st" not in err, err
    from overlapdecode.bench.timeline import trace_call

    def speaks():
        os.write(2, b"a line of the traced call\n")

    trace_call(speaks, "cpu", str(tmp_path / "t.json"))
    assert capfd.readouterr().err == "a line of the traced call\n"


def _one_line(capsys, words):
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert words in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert captured.out == "", captured.out  # no dangling partial line on stdout
    return err


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="the answer of a machine without CUDA")


@pytest.mark.parametrize(
    "argv, words",
    [
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--device", "banana"],
            "--device: device 'banana' is not a device",
        ),
        (["profile", "--model", "tiny-gpt2", "--device", "banana"], "--device: device 'banana' is not a device"),
        (["bench", "--device", "banana"], "--device: device 'banana' is not a device"),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "/nonexistent/dir"],
            "--model: path /nonexistent/dir does not exist",
        ),
        (["profile", "--model", "./nonexistent"], "--model: path ./nonexistent does not exist"),
        (["bench", "--model", "~/nonexistent-model"], "--model: path ~/nonexistent-model does not exist"),
        (
            [
                "generate",
                "--prompt-ids",
                "1,2",
                "--model",
                "tiny-gpt2",
                "--strategy",
                "interleaved:100000000",
                "--max-new-tokens",
                "8",
            ],
            "a lag of 100000000 is beyond --max-new-tokens 8",
        ),
        (
            ["bench", "--strategies", "interleaved:100000000", "--device", "cpu"],
            "--strategies interleaved:100000000: a lag of 100000000 is beyond the 16 new tokens",
        ),
        (["profile", "--strategies", "deferred:65", "--new-tokens", "64"], "a lag of 65 is beyond the 64 new tokens"),
        (["bench", "--dtype", "", "--device", "cpu"], "--dtype names no dtype"),
        (["bench", "--dtype-batch", "", "--device", "cpu"], "--dtype-batch names no pair"),
        (["bench", "--workloads", ",", "--device", "cpu"], "--workloads names no workload"),
        (
            ["generate", "--prompt-ids", "1,5000", "--model", "tiny-gpt2"],
            "--prompt-ids: input_ids holds ids in [1, 5000], outside the vocabulary [0, 1000)",
        ),
        (
            ["generate", "--prompt-ids", "1,99999999999999999999", "--model", "tiny-gpt2"],
            "--prompt-ids: input_ids holds ids in [1, 99999999999999999999], outside the vocabulary [0, 1000)",
        ),
        (
            ["generate", "--prompt", "hi", "--model", "tiny-gpt2", "--max-new-tokens", "255"],
            "--prompt and --max-new-tokens: prompt length 2 + max_new_tokens 255 = 257 exceeds the model's 256",
        ),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--eos", "5000"],
            "--eos: eos_token_id [5000] outside the vocabulary [0, 1000)",
        ),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--eos=-3"],
            "--eos: eos_token_id [-3] outside the vocabulary",
        ),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--max-new-tokens", "300"],
            "--prompt-ids and --max-new-tokens: prompt length 2 + max_new_tokens 300",
        ),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--do-sample", "--seed", "-1"],
            "seed must be in [0, 2**64)",
        ),
        (
            ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--do-sample", "--temperature", "1e-45"],
            "too small to divide by",
        ),
        (["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--dtype", "float8"], "dtype must be one of"),
    ],
)
def test_user_mistakes_get_one_line_naming_the_flag(argv, words, capsys, tmp_path):
    out = ["--out", str(tmp_path / "out")] if argv[0] in ("bench", "profile") else []  # never the working dir
    assert main(argv + out) == 2
    err = _one_line(capsys, words)
    assert err.split(": error: ", 1)[1].startswith("--"), err  # the flag comes first
    assert not (tmp_path / "out" / "results.json").exists()


@NO_CUDA
@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--device", "cuda"],
        ["profile", "--device", "cuda:7"],
        ["bench", "--device", "cuda"],
    ],
)
def test_cuda_on_a_cpu_machine_is_one_line_before_any_worker(argv, capsys, tmp_path):
    assert main(argv + (["--out", str(tmp_path / "o")] if argv[0] != "generate" else [])) == 2
    _one_line(capsys, "--device: device=cuda")
    assert not (tmp_path / "o").exists()  # refused before any work: no worker, no directory


def test_a_file_as_model(tmp_path, capsys):
    f = tmp_path / "model.bin"
    f.write_bytes(b"x")
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(f)]) == 2
    _one_line(capsys, "is a file, not a model directory")


def test_an_unknown_hub_name_is_one_line(monkeypatch, capsys):
    """Offline, from_pretrained raises its own error (here an OSError as from the hub client); it is reworded."""
    import overlapdecode.models.loading

    def offline(*a, **k):
        raise OSError(
            "We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them\n"
            "in the cached files."
        )

    monkeypatch.setattr(
        overlapdecode.models.loading, "_hub_unreachable", lambda: None
    )  # as on a machine with a network
    monkeypatch.setattr(overlapdecode.models.loading.AutoConfig, "from_pretrained", offline)  # the config is read first
    monkeypatch.setattr(overlapdecode.models.loading.AutoModelForCausalLM, "from_pretrained", offline)
    assert main(["generate", "--prompt-ids", "1,2", "--model", "nobody/no-such-model"]) == 2
    _one_line(capsys, "--model nobody/no-such-model: cannot load this hub name (OSError: We couldn't connect")


@pytest.mark.parametrize("command", ["bench", "profile"])
def test_out_that_is_a_file_or_unwritable(command, tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("mine")
    assert main([command, "--device", "cpu", "--out", str(f)]) == 2
    _one_line(capsys, f"--out {f}: is a file, not a directory")
    assert f.read_text() == "mine"
    assert main([command, "--device", "cpu", "--out", "/proc/overlapdecode-cannot-be-here"]) == 2
    _one_line(capsys, "--out /proc/overlapdecode-cannot-be-here: not a writable directory")


def test_generate_failure_leaves_no_partial_line(capsys):
    assert main(["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--max-new-tokens", "300"]) == 2
    _one_line(capsys, "exceeds the model's 256 positions")


def test_python_dash_m_runs_the_command():
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, "-m", "overlapdecode", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0 and "generate" in done.stdout and "bench" in done.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "overlapdecode", "report", "/nonexistent/dir"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "results.json not found" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(
    "flags, words",
    [
        (["--strategy", "fastest"], "--strategy: unknown strategy 'fastest'"),
        (["--do-sample", "--temperature", "0"], "--temperature: temperature must be > 0"),
        (["--do-sample", "--top-k", "-1"], "--top-k: top_k must be >= 0"),
        (["--do-sample", "--top-p", "0"], "--top-p: top_p must be in (0, 1]"),
        (["--do-sample", "--seed", "-2"], "--seed: seed must be in [0, 2**64)"),
        (["--do-sample", "--min-p", "1.5"], "--min-p: min_p must be in [0, 1]"),
        (["--repetition-penalty", "0"], "--repetition-penalty: repetition_penalty must be a finite number > 0"),
    ],
)
def test_generate_flags_are_checked_before_the_model_is_loaded(flags, words, monkeypatch, capsys):
    """These were checked by generate() only, after load_model: llama-1b-random took 50-58 s and 5 GB of host
    memory on CPU to say that the strategy was misspelt."""
    import overlapdecode.models.loading

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the flags were checked")

    monkeypatch.setattr(overlapdecode.models.loading, "load_model", no_load)
    assert main(["generate", "--model", "llama-1b-random", "--prompt-ids", "1,2"] + flags) == 2
    _one_line(capsys, words)


def test_a_directory_that_is_not_a_model_is_named_as_model(tmp_path, capsys):
    """from_pretrained's ValueError ("Unrecognized model in DIR...") went out without the flag."""
    assert main(["generate", "--prompt-ids", "1,2", "--model", str(tmp_path), "--strategy", "kv"]) == 2
    _one_line(capsys, f"--model {tmp_path}: cannot load this directory (ValueError: Unrecognized model")


def test_generate_warns_once_of_an_ignored_sampling_value(capsys):
    """--temperature 0.7 without --do-sample: greedy, with one clean line naming the flags (it was a Python
    UserWarning with its file and source line, saying "pass do_sample=True"; the flags' check before loading
    gave it a second time)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        argv = ["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--strategy", "kv"]
        assert main(argv + ["--temperature", "0.7", "--top-p", "0.5"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "overlapdecode generate: warning: --temperature, --top-p ignored: the decoding is greedy; pass --do-sample "
        "to sample"
    ], err


@pytest.mark.parametrize("eos", ["", " , "])
def test_an_empty_eos_is_refused_not_taken_for_none(eos, capsys):
    """`--eos ""` (say, an unset shell variable) silently meant 'never stop early', which only 'none' asks for."""
    assert main(["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,2", "--strategy", "kv", "--eos", eos]) == 2
    _one_line(capsys, "names no id: give ids such as 2,3, or 'none'")


def test_no_library_module_imports_the_command_line():
    """The library (load_model, generate...) and the bench stand without the command line: no module outside cli/
    and __main__.py imports one of those, at the top or inside a function."""
    import ast
    import pkgutil

    pkg_dir = os.path.dirname(od.__file__)
    command_line = ("overlapdecode.cli", "overlapdecode.__main__")
    found = []
    for info in pkgutil.walk_packages([pkg_dir], "overlapdecode."):
        if info.name.startswith(command_line):
            continue
        path = os.path.join(pkg_dir, *info.name.split(".")[1:]) + ("/__init__.py" if info.ispkg else ".py")
        package = info.name.split(".") if info.ispkg else info.name.split(".")[:-1]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                targets = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found += [(info.name, t) for t in targets if t.startswith(command_line)]
    assert found == [], found


def test_generate_samples_where_the_models_generation_config_says_so_unless_greedy(tmp_path, capsys):
    """Without --do-sample or --greedy the model's generation config decides, as Hugging Face generate() does;
    --greedy overrides it; the two flags together are one line naming them."""
    import overlapdecode as od

    model = od.load_model("tiny-gpt2", device="cpu")
    model.generation_config.do_sample = True
    model.generation_config.temperature = 2.0
    model.save_pretrained(tmp_path / "m")
    args = ["generate", "--model", str(tmp_path / "m"), "--prompt-ids", "5,6,7", "--max-new-tokens", "6"]
    args += ["--strategy", "kv", "--eos", "none", "--seed", "4"]
    ids = torch.tensor([[5, 6, 7]])
    kw = dict(max_new_tokens=6, strategy="kv", eos_token_id=[], seed=4)
    printed = {}
    for flag in ([], ["--greedy"]):
        assert main(args + flag) == 0
        printed[bool(flag)] = capsys.readouterr().out.split("ids:")[1].split("\n")[0].split()
    sampled = od.generate(model, ids, do_sample=True, **kw)[0, 3:].tolist()
    greedy = od.generate(model, ids, do_sample=False, **kw)[0, 3:].tolist()
    assert sampled != greedy
    assert [int(t) for t in printed[False]] == sampled and [int(t) for t in printed[True]] == greedy
    with pytest.raises(SystemExit) as stop:  # argparse's own check: its error line, exit status 2
        main(args + ["--do-sample", "--greedy"])
    assert stop.value.code == 2
    _one_line(capsys, "--greedy: not allowed with argument --do-sample")


def test_generate_samples_with_every_sampling_flag(capsys):
    """The sampling flags reach od.generate: the printed ids are those of the same call in Python."""
    import overlapdecode as od

    flags = [
        "--do-sample",
        "--temperature",
        "0.8",
        "--top-k",
        "20",
        "--top-p",
        "0.9",
        "--min-p",
        "0.05",
        "--repetition-penalty",
        "1.3",
        "--seed",
        "4",
    ]
    assert (
        main(
            [
                "generate",
                "--model",
                "tiny-gpt2",
                "--prompt-ids",
                "5,6,7",
                "--max-new-tokens",
                "6",
                "--strategy",
                "kv",
                "--eos",
                "none",
            ]
            + flags
        )
        == 0
    )
    printed = capsys.readouterr().out
    model = od.load_model("tiny-gpt2", device="cpu")
    want = od.generate(
        model,
        torch.tensor([[5, 6, 7]]),
        max_new_tokens=6,
        strategy="kv",
        eos_token_id=[],
        do_sample=True,
        temperature=0.8,
        top_k=20,
        top_p=0.9,
        min_p=0.05,
        repetition_penalty=1.3,
        seed=4,
    )[0, 3:].tolist()
    assert "ids: " + " ".join(map(str, want)) in printed, (printed, want)


@pytest.mark.parametrize("when", ["while loading", "while streaming"])
def test_ctrl_c_in_generate_is_one_line(when, monkeypatch, capsys):
    """Ctrl-C printed the traceback of wherever it landed (16-20 frames inside torch or transformers)."""
    import overlapdecode.decode
    import overlapdecode.models.loading

    real = overlapdecode.decode.generate

    def interrupted_load(*a, **k):
        raise KeyboardInterrupt

    def interrupted_after_a_step(*a, streamer, **k):
        def first_step_then_ctrl_c(tokens):
            streamer(tokens)
            raise KeyboardInterrupt

        return real(*a, streamer=first_step_then_ctrl_c, **k)

    if when == "while loading":
        monkeypatch.setattr(overlapdecode.models.loading, "load_model", interrupted_load)
    else:
        monkeypatch.setattr(overlapdecode.decode, "generate", interrupted_after_a_step)
    try:
        rc = main(["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,2", "--strategy", "kv"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C went out of main as a KeyboardInterrupt (a traceback)")
    assert rc == 130
    captured = capsys.readouterr()
    assert captured.err == "overlapdecode generate: interrupted\n"
    if when == "while loading":
        assert captured.out == ""
    else:  # the streamed line is ended before the notice, not left dangling
        lines = captured.out.split("\n")
        assert lines[-1] == "" and re.fullmatch(r"ids: \d+", lines[-2]), captured.out


def test_an_out_holding_an_interrupted_runs_rows_is_named_as_out(tmp_path, capsys):
    (tmp_path / "rows-default.jsonl").write_text('{"meta": {}}\n')  # a run killed outright (kill -9)
    assert main(["bench", "--device", "cpu", "--out", str(tmp_path)]) == 2
    _one_line(capsys, f"--out {tmp_path} holds the rows of an interrupted run: keep them with")


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--strategy", "interleaved:0"],
        ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--strategy", "kv:2"],
        ["generate", "--prompt-ids", "1,2", "--model", "tiny-gpt2", "--strategy", "fused:9", "--max-new-tokens", "4"],
        ["bench", "--strategies", "interleaved:x", "--device", "cpu"],
        ["profile", "--strategies", "deferred:99", "--new-tokens", "8", "--device", "cpu"],
    ],
)
def test_a_lag_error_names_every_strategy_that_takes_a_lag(argv, capsys, tmp_path):
    """`interleaved:0` answered "applies to interleaved and deferred only", leaving out fused."""
    assert main(argv + (["--out", str(tmp_path / "o")] if argv[0] != "generate" else [])) == 2
    err = _one_line(capsys, "interleaved, fused and deferred")
    assert "--strateg" in err


@pytest.mark.parametrize(
    "argv, near",
    [
        (["generate", "--prompt-ids", "1,2", "--max_new_tokens", "5"], "--max-new-tokens"),
        (["bench", "--lenghts", "8"], "--lengths"),
        (["profile", "--new_tokens", "8"], "--new-tokens"),
        (["report", "some-dir", "--markdwn", "B.md"], "--markdown"),
    ],
)
def test_an_unknown_flag_points_at_its_subcommands_help(argv, near, capsys):
    """A `--max_new_tokens` typo in generate pointed at `overlapdecode --help`, which does not list the flag."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"overlapdecode {argv[0]}: error: unrecognized arguments")
    assert err.endswith(f"did you mean {near}? (see overlapdecode {argv[0]} --help)"), err


def test_fused_for_a_family_it_lacks_names_the_strategy(tmp_path, capsys):
    """Refusing `fused` for GPT-NeoX named --model, as if the model were wrong rather than the strategy."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    small = dict(vocab_size=1000, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    model = GPTNeoXForCausalLM(GPTNeoXConfig(**small)).eval()
    model.save_pretrained(tmp_path / "neox")
    with pytest.raises(ValueError, match=r"^strategy 'fused': the fused path supports the Llama family"):
        od.generate(model, torch.tensor([[1, 2]]), max_new_tokens=2, strategy="fused")
    capsys.readouterr()  # save_pretrained's progress bar
    argv = ["generate", "--model", str(tmp_path / "neox"), "--prompt-ids", "1,2", "--strategy", "fused"]
    assert main(argv + ["--device", "cpu"]) == 2
    err = _one_line(capsys, "got model_type 'gpt_neox'")
    assert err.startswith("overlapdecode generate: error: --strategy: strategy 'fused': the fused path"), err


def test_the_default_strategy_follows_the_device(capsys, monkeypatch):
    """The CLI's default `interleaved` compiled the step on CPU, where kv is the one to use; the library's
    default stays interleaved (a contract)."""
    import inspect

    import overlapdecode.cli.commands as cli
    import overlapdecode.models.loading as models

    argv = ["generate", "--model", "tiny-gpt2", "--prompt-ids", "1,2", "--max-new-tokens", "2", "--device", "cpu"]
    assert main(argv) == 0
    assert capsys.readouterr().out.endswith("[2 new tokens, strategy kv]\n")
    monkeypatch.setattr(models, "check_device", lambda device: torch.device("cuda"))  # as a CUDA machine answers
    assert cli.default_strategy(None) == "interleaved"
    monkeypatch.undo()
    assert cli.default_strategy("cpu") == "kv"
    helped = " ".join(cli.build_parser().commands["generate"].format_help().split())
    assert "(default: interleaved on CUDA, kv on CPU," in helped
    assert inspect.signature(od.generate).parameters["strategy"].default == "interleaved"
