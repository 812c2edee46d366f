"""Tensor parallelism on CPU: two gloo processes (torchrun) return exactly the single-process tokens.

Each torchrun launch runs tests/support/tp_worker.py on both ranks with a JSON spec of calls; the expected tokens
are computed here, in one process, on the same model. Every launch has a timeout, so a rank left waiting
in a collective fails the test instead of hanging it. Compiled presets compile on CPU (tens of seconds
per shape), so they run on one batch shape per model.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

import overlapdecode as od
from overlapdecode import tp as tensor_parallel
from overlapdecode.models import loading as models
from overlapdecode.models import random_init
from support.helpers import eos_hit_midway, make_batch, naive_generate

TESTS = Path(__file__).parents[1]  # on the workers' path: they import support/
WORKER = TESTS / "support" / "tp_worker.py"
SRC = Path(od.__file__).resolve().parents[1]
EAGER = ["baseline", "kv", "static", "fused-eager"]  # fused-eager: the fused step uncompiled (tp_worker.EXTRA)
COMPILED = ["compiled", "interleaved", "fused"]
N = 16  # new tokens; prompt 8 + 16 <= 64: one compiled shape per batch size


def torchrun(
    spec: dict, tmp_path: Path, timeout: float, env: dict | None = None
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the worker on 2 gloo ranks; (the process, each rank's record). Raises on timeout (a hang). `env`: more
    environment variables for the ranks.

    A launch in which a rank died of a crash signal (SIGSEGV and the like: never an outcome the worker chooses)
    runs once more, and the crash is reported as a warning with the dying rank's Python stack (faulthandler is
    on in every rank); a second crash fails the test with it. Why: one such crash, in a CPU launch that passed
    alone every time it was rerun, failed a whole suite run without saying where the rank was."""
    proc, records = _launch(spec, tmp_path, timeout, env)
    crash = crashed_rank(proc)
    if crash:
        warnings.warn(
            f"a tensor-parallel rank crashed ({crash}); the launch ran again:\n{fault_report(proc)}", stacklevel=2
        )
        proc, records = _launch(spec, tmp_path, timeout, env)
    return proc, records


CRASH_SIGNALS = {signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGSEGV}


def crashed_rank(proc: subprocess.CompletedProcess) -> str | None:
    """'rank R: SIGNAL' where torchrun's summary says a rank exited by a crash signal; None otherwise."""
    if proc.returncode == 0:
        return None
    for rank, code in re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*-(\d+)", proc.stderr):
        if int(code) in CRASH_SIGNALS:
            return f"rank {rank}: {signal.Signals(int(code)).name}"
    return None


def fault_report(proc: subprocess.CompletedProcess) -> str:
    """The output from faulthandler's 'Fatal Python error' on (the crashing rank's stack), else the output's end."""
    text = proc.stdout + proc.stderr
    at = text.find("Fatal Python error")
    return text[at : at + 6000] if at >= 0 else text[-6000:]


def _launch(spec: dict, tmp_path: Path, timeout: float, env: dict | None) -> tuple[subprocess.CompletedProcess, list]:
    out = tmp_path / f"out-{len(list(tmp_path.glob('out-*')))}"
    out.mkdir()
    spec_file = out / "spec.json"
    spec_file.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS)]), OMP_NUM_THREADS="1", **(env or {}))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        str(WORKER),
        str(spec_file),
        str(out),
    ]
    proc = run_torchrun(cmd, env, timeout)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return proc, records


def run_torchrun(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """subprocess.run for torchrun, failing the test on a timeout (a hang) with the end of its output. torchrun
    starts each rank detached (setsid): subprocess.run's SIGKILL on timeout would leave the ranks running,
    orphaned, one of them waiting in its collective; SIGTERM makes torchrun end them first. Every rank runs with
    faulthandler on: one that crashes prints its Python stack."""
    env = dict(env, PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # torchrun ends every rank, then exits
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            stdout, stderr = "", "(torchrun did not end on SIGTERM: killed)"
        pytest.fail(
            f"torchrun ran past {timeout} s (a rank left waiting in a collective?); its output ends:\n"
            f"{stdout[-2000:]}\n{stderr[-4000:]}"
        )
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def first_eos(free: torch.Tensor, eos: list[int]) -> list[int | None]:
    """Per row of the free run `free` (B, N): the step of its first token in `eos`, None if none."""
    return [next((j for j, t in enumerate(row) if t in eos), None) for row in free.tolist()]


def stop_at(free: torch.Tensor, steps: list[int]) -> list[int] | None:
    """EOS ids making row r stop exactly at step steps[r] of the free run `free` (B, N), or None."""
    eos = sorted({int(free[r, s]) for r, s in enumerate(steps)})
    return eos if first_eos(free, eos) == steps else None


def finish_last(free: torch.Tensor) -> tuple[int, list[int]]:
    """(n, EOS ids) such that with max_new_tokens = n every row stops and the last one at step n - 1, the
    last allowed token."""
    for n in range(free.shape[1], 1, -1):
        eos = sorted({int(t) for t in free[:, n - 1]})
        if max(first_eos(free[:, :n], eos)) == n - 1:
            return n, eos
    raise AssertionError("no EOS choice stops the batch at its last token: change the seed")


def cases_for(model, strategies: list[str], batches: tuple[int, ...], sampling: bool) -> list[dict]:
    """Calls covering batch 1 and 4 (left padding), EOS mid-way for some and for all rows, a stop at the
    first token and at the last allowed one, and (if asked) seeded sampling; with their expected tokens."""
    cases = []

    def add(name, ids, mask, eos, n=N, pad=0, steps=None, **sampling_kw):
        expected = od.generate(
            model,
            ids,
            attention_mask=mask,
            max_new_tokens=n,
            strategy="kv",
            eos_token_id=eos,
            pad_token_id=pad,
            **sampling_kw,
        )
        if steps is not None:  # the case stops where it claims to (the whole batch finished after `steps`)
            assert steps(expected.shape[1] - ids.shape[1]), (name, expected.shape)
        cases.append(
            dict(
                name=name,
                ids=ids.tolist(),
                mask=mask.tolist(),
                max_new_tokens=n,
                eos=eos,
                pad=pad,
                strategies=strategies,
                sampling=sampling_kw,
                expected=expected.tolist(),
            )
        )

    for batch in batches:
        ids, mask = make_batch(batch)
        free = naive_generate(model, ids, mask, N, [], 0)[:, ids.shape[1] :]
        add(f"b{batch}-free", ids, mask, [])
        some = eos_hit_midway(model, ids, mask, N, [0] if batch == 1 else [0, 2])
        all_rows = stop_at(free, [N // 2] * batch) or eos_hit_midway(model, ids, mask, N, list(range(batch)))
        first = stop_at(free, [0] * batch)
        n_last, last = finish_last(free)
        assert some and all_rows and first, "no EOS choice for this batch: change the seed"
        add(f"b{batch}-eos-some", ids, mask, some)
        add(f"b{batch}-eos-all", ids, mask, all_rows, steps=lambda k: 1 < k < N)
        add(f"b{batch}-eos-first", ids, mask, first, steps=lambda k: k == 1)
        add(f"b{batch}-eos-last", ids, mask, last, n=n_last, steps=lambda k: k == n_last)
        if sampling:
            add(f"b{batch}-sample", ids, mask, [], do_sample=True, seed=7, temperature=0.8, top_k=50)
    return cases


def check_records(proc, records: list[dict], jobs: list[dict]) -> None:
    assert proc.returncode == 0, fault_report(proc) if crashed_rank(proc) else proc.stdout[-3000:] + proc.stderr[-6000:]
    assert len(records) == 2
    for job in jobs:
        for case in job["cases"]:
            for strategy in case["strategies"]:
                key = f"{job['name']}/{case['name']}/{strategy}"
                for rank, record in enumerate(records):
                    assert record["results"][key] == case["expected"], f"rank {rank}: {key}"
        for record in records:  # each rank caches only its KV heads
            for kind in ("static", "dynamic"):
                assert set(record["results"][f"{job['name']}/{kind}-cache-heads"]) == {job["kv_heads"] // 2}, kind
        if any("fused" in s for case in job["cases"] for s in case["strategies"]):
            # the fused step read its rank's rows of the LM head: ceil(V / 2) on rank 0, the rest on rank 1
            rows = [record["results"][f"{job['name']}/lm-head-rows"] for record in records]
            vocab = rows[0][1]
            assert vocab is not None and [r[0] for r in rows] == [-(-vocab // 2), vocab // 2], rows


def _with_biases(model, seed: int):
    """Non-zero biases everywhere (Hugging Face initialises them to zero): a bias added twice must show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    """tiny GPT-2 and tiny Qwen2 (q/k/v bias), with non-zero biases, saved for from_pretrained. Qwen2's
    vocabulary (1001) does not divide by 2: the fused step's vocabulary-parallel LM head pads the last rank's
    logits (tp.VocabShard)."""
    root = tmp_path_factory.mktemp("tp-models")
    gpt2 = _with_biases(od.load_model("tiny-gpt2", device="cpu"), 1)
    gpt2.save_pretrained(root / "gpt2")
    qwen_config = Qwen2Config(
        vocab_size=1001,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=2,
        bos_token_id=1,
        initializer_range=0.2,
    )  # varied output
    torch.manual_seed(0)
    qwen = _with_biases(Qwen2ForCausalLM(qwen_config).eval(), 2)
    qwen.save_pretrained(root / "qwen2")
    return {"gpt2": str(root / "gpt2"), "qwen2": str(root / "qwen2")}


def test_every_preset_matches_one_process(tmp_path, tiny_llama, saved_models):
    """The eager presets at batch 1 and 4, greedy and sampled, on three families; the compiled ones at one compiled
    shape a model (batch 4: compiled and interleaved share it; fused compiles nothing on CPU): one torchrun launch
    for all (a launch's start, two processes importing torch and transformers, is most of a small job's time)."""
    jobs = []
    for name, path in [("llama", "tiny-llama"), ("gpt2", saved_models["gpt2"]), ("qwen2", saved_models["qwen2"])]:
        model = tiny_llama if name == "llama" else od.load_model(path, device="cpu")
        jobs.append(
            dict(
                name=name,
                model=path,
                tp=2,
                cases=cases_for(model, EAGER, (1, 4), sampling=True),
                kv_heads=getattr(model.config, "num_key_value_heads", model.config.num_attention_heads),
            )
        )
    llama_cases = cases_for(tiny_llama, COMPILED, (4,), sampling=False) + cases_for(
        tiny_llama, ["fused"], (1,), sampling=False
    )
    gpt2 = od.load_model(saved_models["gpt2"], device="cpu")
    gpt2_cases = cases_for(gpt2, ["interleaved", "fused"], (4,), sampling=False)
    jobs += [
        dict(name="llama-compiled", model="tiny-llama", tp=2, cases=llama_cases, kv_heads=2, stream_rank0=COMPILED),
        dict(name="gpt2-compiled", model=saved_models["gpt2"], tp=2, cases=gpt2_cases, kv_heads=4),
    ]
    proc, records = torchrun({"jobs": jobs}, tmp_path, timeout=600)
    check_records(proc, records, jobs)
    # a streamer on rank 0 only: both ranks return the tokens, rank 0 streams each kept step's (B,) tokens
    case = llama_cases[0]
    prompt = len(case["ids"][0])
    steps = [list(col) for col in zip(*(row[prompt:] for row in case["expected"]))]
    for strategy in COMPILED:
        (out0, streamed0), (out1, streamed1) = (
            r["results"][f"llama-compiled/stream-rank0/{strategy}"] for r in records
        )
        assert out0 == out1 == case["expected"] and streamed0 == steps and streamed1 == [], strategy


def test_fused_triton_kernels_under_tp_match_one_process(tmp_path, saved_models):
    """The fused preset with the Triton kernels (Triton's interpreter, on CPU) on 2 gloo ranks: the sharded QKV,
    the row-parallel projections' all-reduces, the vocabulary-parallel LM head (tiny Qwen2's 1001 rows: the last
    rank's logits padded) gathered into the greedy choice kernel, which writes each step's tokens and flag into
    the step log: every rank returns the one-process tokens, with EOS for some rows, for all at the first token
    and at the last allowed one (batch 4, left padding). On a GPU this path has not run under tp yet."""
    pytest.importorskip("triton")
    qwen = od.load_model(saved_models["qwen2"], device="cpu")
    cases = [c for c in cases_for(qwen, ["fused"], (4,), sampling=False) if not c["name"].endswith("-all")]
    jobs = [
        dict(
            name="qwen2",
            model=saved_models["qwen2"],
            tp=2,
            cases=cases,
            kv_heads=2,
            fused_options=dict(kernels="triton", compile_prefill=False),
        )
    ]
    proc, records = torchrun({"jobs": jobs}, tmp_path, timeout=400, env={"TRITON_INTERPRET": "1"})
    check_records(proc, records, jobs)
    for record in records:  # the kernels that ran, and the step log they wrote
        assert record["results"]["qwen2/fused-kernels"] == ["triton", True]


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    """Configs only (the checks fail before any weight is read)."""
    root = tmp_path_factory.mktemp("tp-bad")
    LlamaConfig(
        vocab_size=1000,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=3,
    ).save_pretrained(root / "kv3")
    GPTNeoXConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4
    ).save_pretrained(root / "neox")
    return {"kv3": str(root / "kv3"), "neox": str(root / "neox")}


def test_bad_tp_fails_on_every_rank(tmp_path, bad_models):
    spec = {
        "errors_before": [
            dict(model="tiny-gpt2", tp=4),  # 4 divides the heads, but the world has 2 processes
            dict(model=bad_models["kv3"], tp=2),
            dict(model=bad_models["neox"], tp=2),
            dict(model="tiny-llama", tp=3),
        ],
        "jobs": [
            dict(
                name="ok",
                model="tiny-llama",
                tp=2,
                cases=[],
                kv_heads=2,  # starts the group
                seedless_sampling=True,
            )
        ],
        "errors_after": [
            dict(model="tiny-gpt2", tp=4),
            # ranks whose replicated weights differ would return different outputs and could stop apart
            dict(model="tiny-llama", tp=2, per_rank=dict(seed=[0, 1], dtype=["float32", "bfloat16"])),
        ],
    }
    proc, records = torchrun(spec, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert len(records) == 2
    for record in records:
        world, kv3, neox, three, world_after, differ = record["errors"]
        assert differ == records[0]["errors"][-1]  # the same error on every rank
        assert "tp=2: every rank must call load_model with the same arguments" in differ
        assert "seed: rank 0 0, rank 1 1" in differ
        assert "dtype: rank 0 'torch.float32', rank 1 'torch.bfloat16'" in differ
        assert "tp=4 must equal the number of processes, but torch.distributed has 2" in world
        assert "torchrun --nproc-per-node 4" in world
        assert "tp=2 does not divide the model's 3 KV heads" in kv3
        assert "no sharding plan for model type 'gpt_neox'" in neox and "llama" in neox and "gpt2" in neox
        assert "tp=3 does not divide the model's 4 attention heads" in three
        assert world_after == world
        assert record["results"]["ok/seedless-sampling"].startswith("seed: sampling under tensor parallelism needs")


def test_uncaught_bad_tp_ends_every_rank(tmp_path):
    proc, records = torchrun({"errors_before": [dict(model="tiny-gpt2", tp=4)], "raise": True}, tmp_path, timeout=120)
    assert proc.returncode != 0
    assert [r["errors"] for r in records] == [[records[0]["errors"][0]]] * 2
    assert "tp=4 must equal the number of processes" in records[0]["errors"][0]


def test_a_hung_rank_fails_the_test_and_ends(tmp_path):
    """A launch that runs past its timeout fails the test and leaves no rank behind: rank 0 waits in a barrier
    that rank 1 never joins (before, subprocess.run killed torchrun alone and both ranks lived on, orphaned)."""
    import time

    with pytest.raises(pytest.fail.Exception, match="torchrun ran past 20 s"):
        torchrun({"hang": True}, tmp_path, timeout=20)
    pids = [int(p.read_text()) for p in sorted(tmp_path.glob("out-*/pid*"))]
    assert len(pids) == 2  # both ranks had started
    deadline = time.monotonic() + 30
    while pids and time.monotonic() < deadline:
        pids = [
            pid
            for pid in pids
            if Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
        ]
        time.sleep(0.2)
    assert not pids, f"ranks still running: {pids}"


def test_tp_without_torchrun(monkeypatch):
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match=r"tp=2 needs one process per shard: start the program with torchrun"):
        od.load_model("tiny-llama", device="cpu", tp=2)
    with pytest.raises(ValueError, match=r"tp must be >= 1, got 0"):
        od.load_model("tiny-llama", device="cpu", tp=0)
    with pytest.raises(TypeError, match=r"tp must be an int"):
        od.load_model("tiny-llama", device="cpu", tp=True)
    with pytest.raises(TypeError, match=r"tp must be an int"):
        od.load_model("tiny-llama", device="cpu", tp="2")


def test_tp_probe_refuses_bad_arguments_before_any_work(monkeypatch, capsys, tmp_path):
    """scripts/tp_probe.py answers an unknown --parts name, a --models list that does not name one model per
    part, an --out holding an earlier tp.json, and a start outside torchrun in one line, before
    torch.distributed starts (a wrong part found at its turn would end a run after the parts before it)."""
    import importlib.util

    for var in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "TORCH_NCCL_AVOID_RECORD_STREAMS"):
        monkeypatch.delenv(var, raising=False)  # the script sets them on import; restored afterwards
    spec = importlib.util.spec_from_file_location("tp_probe", TESTS.parent / "scripts" / "tp_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    monkeypatch.setenv("RANK", "0")
    cpu = ["--out", str(tmp_path / "probe"), "--device", "cpu"]
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "tp.json").write_text("{}")
    for argv, message in [
        (cpu + ["--parts", "equal,spead"], "--parts: unknown part(s) 'spead'; the parts are equal, speed, big"),
        (cpu + ["--models", "tiny-llama"], "--models takes 3 comma-separated names, the models of equal, speed"),
        (["--out", str(tmp_path / "earlier"), "--device", "cpu"], "tp.json exists: choose a new --out"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            probe.parse_args(argv)
        assert exit_.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1], argv
    args = probe.parse_args(cpu + ["--models", "tiny-llama,tiny-llama,tiny-llama", "--parts", "equal,big"])
    assert args.parts == "equal,big" and args.json == str(tmp_path / "probe" / "tp.json")
    monkeypatch.delenv("RANK")
    with pytest.raises(SystemExit):
        probe.parse_args(cpu + ["--models", "tiny-llama,tiny-llama,tiny-llama"])
    assert "run it under torchrun: torchrun --nproc-per-node 2" in capsys.readouterr().err


def test_tp1_changes_nothing(tiny_llama):
    model = od.load_model("tiny-llama", device="cpu", tp=1)
    for (name, a), (_, b) in zip(model.named_parameters(), tiny_llama.named_parameters()):
        assert torch.equal(a, b), name
    assert model.config.num_key_value_heads == tiny_llama.config.num_key_value_heads


def test_gpt2_c_attn_is_cut_per_q_k_v():
    split = tensor_parallel.Split(dim=1, blocks=3)
    assert tensor_parallel.local_ranges(12, split, 0, 2) == [(0, 2), (4, 6), (8, 10)]
    assert tensor_parallel.local_ranges(12, split, 1, 2) == [(2, 4), (6, 8), (10, 12)]


TILED = dict(
    vocab_size=600,
    hidden_size=64,
    intermediate_size=320,
    num_hidden_layers=2,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


def _random_llama(rank: int, tp: int, dtype=torch.float32):
    place = tensor_parallel.Placement(rank, tp, torch.device("cpu"), group="unused")
    return random_init.random_model(LlamaForCausalLM, LlamaConfig(**TILED), place, dtype, seed=3)


@pytest.mark.parametrize("tp", [2, 4])
def test_random_shards_concatenate_to_the_unsharded_model(tp):
    full = _random_llama(0, 1)
    shards = [_random_llama(r, tp) for r in range(tp)]
    splits = tensor_parallel.param_splits(full)
    assert splits  # the q/k/v/o and gate/up/down of both layers
    for name, param in full.named_parameters():
        parts = [dict(s.named_parameters())[name] for s in shards]
        if name in splits:
            assert torch.equal(torch.cat(parts, splits[name].dim), param), name
        else:
            assert all(torch.equal(p, param) for p in parts), name
    head = shards[1]
    assert head.lm_head.weight is head.model.embed_tokens.weight  # the tie survives the draw
    assert head.config.num_attention_heads == 8 // tp and head.config.num_key_value_heads == 4 // tp
    assert head.config.head_dim == 8
    assert isinstance(head.model.layers[0].self_attn.o_proj, tensor_parallel.RowParallelLinear)
    assert head.model.rotary_emb.inv_freq.dtype == torch.float32 and not head.model.rotary_emb.inv_freq.is_meta


@pytest.mark.parametrize(
    "name, params",
    [
        ("llama-1b-random", 1_235_814_400),
        ("llama-3b-random", 3_212_749_824),
        ("llama-8b-random", 8_030_261_248),
        ("llama-70b-random", 70_553_706_496),
    ],
)
def test_real_size_shapes_are_llama_3s_and_shard_in_whole_tiles(name, params):
    """The embedded real-size shapes (never drawn on CPU: too large) have Llama-3's parameter counts, admit
    tp 2, 4 and 8 and refuse 16 (8 KV heads; 24 query heads at 3B), and every shard boundary of those tp falls
    between the tiles random_init draws, so their shards are drawn directly and concatenate to the tp=1 weights."""
    config = models.embedded_config(name)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == params
    assert tensor_parallel.max_tp(config) == 8
    with pytest.raises(ValueError, match=r"tp=16 does not divide the model's (8 KV|24 attention) heads"):
        tensor_parallel.check_config(config, 16)
    splits = tensor_parallel.param_splits(model)
    assert len(splits) == 7 * config.num_hidden_layers
    for pname, split in splits.items():
        size = model.get_parameter(pname).shape[split.dim]
        t = random_init.tile_size(size, split, 8)
        for tp in (2, 4, 8):
            tensor_parallel.check_config(config, tp)
            for rank in range(tp):
                assert all(a % t == 0 and b % t == 0 for a, b in tensor_parallel.local_ranges(size, split, rank, tp)), (
                    pname,
                    tp,
                    rank,
                )


def test_random_init_draws_llama_statistics():
    model = _random_llama(0, 1, torch.bfloat16)
    w = model.model.layers[1].mlp.down_proj.weight.float()
    assert w.dtype == torch.float32 and abs(w.std().item() - 0.02) < 0.002 and abs(w.mean().item()) < 0.001
    assert torch.equal(model.model.norm.weight, torch.ones(64, dtype=torch.bfloat16))
    # different tiles differ (a generator reused without re-seeding, or one seed for all, would not)
    q = model.model.layers[0].self_attn.q_proj.weight
    assert random_init.tile_size(64, tensor_parallel.Split(0), 4) == 16
    assert not torch.equal(q[:16], q[16:32])
    assert not torch.equal(q, model.model.layers[1].self_attn.q_proj.weight)


def test_bench_tp_writes_rank0_rows_with_tp(tmp_path):
    out = tmp_path / "bench"
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "overlapdecode",
        "bench",
        "--tp",
        "2",
        "--model",
        "tiny-llama",
        "--strategies",
        "kv,static",
        "--peers",
        "hf-dynamic",
        "--lengths",
        "6",
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--no-profile",
        "--out",
        str(out),
    ]
    proc = run_torchrun(cmd, env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["tp"] == 2
    rows = results["rows"]
    assert sorted(r["strategy"] for r in rows) == ["hf-dynamic", "kv", "static"]
    assert all(r["tp"] == 2 and "error" not in r for r in rows)
    assert proc.stdout.count("report:") == 1  # rank 0 alone reports


def test_bench_tp_refuses_what_ranks_could_disagree_on(monkeypatch, tmp_path, capsys, bad_models):
    """Also, before any worker: bench without --tp under torchrun (every process would write --out) and a --tp
    the model's heads refuse (each rank's worker ended in a traceback and left its rows file in --out)."""
    from overlapdecode.cli import main

    base = ["bench", "--model", "tiny-llama", "--device", "cpu", "--out", str(tmp_path / "b")]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(base + ["--tp", "2"]) == 2
    assert "--tp 2 runs under torchrun: torchrun --nproc-per-node 2" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(base + ["--tp", "2", "--time-budget", "60"]) == 2
    assert "--tp and --time-budget exclude each other" in capsys.readouterr().err
    assert main(base + ["--tp", "0"]) == 2
    assert "--tp must be >= 1, got 0" in capsys.readouterr().err
    assert main(base) == 2
    assert "WORLD_SIZE=2 (torchrun) without --tp: every process would write --out" in capsys.readouterr().err
    bad = ["bench", "--model", bad_models["kv3"], "--device", "cpu", "--tp", "2", "--out", str(tmp_path / "c")]
    assert main(bad) == 2
    assert "--tp: tp=2 does not divide the model's 3 KV heads" in capsys.readouterr().err
    bad[2] = bad_models["neox"]
    assert main(bad) == 2
    assert "--tp: tp > 1: no sharding plan for model type 'gpt_neox'" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_vocab_shard_rows_cover_the_vocabulary_once():
    """Each rank's rows of a vocabulary-parallel LM head: ceil(V / tp) each, the last one short, together
    every row once; the fused layout shards only where every rank holds rows."""
    for vocab, tp in ((1000, 2), (1001, 2), (128256, 8), (50257, 4), (10, 4)):
        shards = [tensor_parallel.VocabShard("g", r, tp, vocab) for r in range(tp)]
        rows = [s.rows for s in shards]
        c = -(-vocab // tp)  # ceil(V / tp), computed here, not taken from the shard
        assert all(s.chunk == c for s in shards)
        assert rows == [(min(r * c, vocab), min((r + 1) * c, vocab)) for r in range(tp)]
    assert tensor_parallel.VocabShard("g", 3, 4, 9).rows == (9, 9)  # a toy vocabulary leaves a rank none


def test_reduce_residual_sums_the_kernels_own_output_buffer():
    """With a symmetric all-reduce the kernel writes its partial sum into the buffer the all-reduce reads
    (no copy), the residual and bias join on rank 0 only, and the all-reduce's result is returned."""
    from overlapdecode.fused.kernels.linear_residual import linear_residual_ref
    from overlapdecode.tp import RowReduce, reduce_residual

    class Recorder:  # stands in for SymmetricAllReduce (CUDA only): the sum of one rank is its own part
        def __init__(self):
            self.buffers, self.summed = [], []

        def buffer(self, shape, dtype):
            self.buffers.append(torch.full(shape, float("nan"), dtype=dtype))
            return self.buffers[-1]

        def sum(self, buf):
            self.summed.append(buf)
            return buf * 2

    written = []  # the buffers the kernel was given to write into

    def kernel(x, w, b, residual, out=None):
        written.append(out)
        out.copy_(linear_residual_ref(x, w, b, residual))
        return out

    torch.manual_seed(0)
    x, w, b, res = torch.randn(2, 6), torch.randn(4, 6), torch.randn(4), torch.randn(2, 4)
    for rank in (0, 1):
        rec = Recorder()
        written.clear()
        got = reduce_residual(kernel, x, w, b, res, RowReduce("g", rank), rec)
        part = linear_residual_ref(x, w, b, res) if rank == 0 else x @ w.T
        assert len(rec.buffers) == 1 and len(rec.summed) == 1 and len(written) == 1
        # the kernel wrote straight into the all-reduce's buffer, and that very buffer was summed: no copy
        assert written[0] is rec.buffers[0] and rec.summed[0] is rec.buffers[0]
        torch.testing.assert_close(got, 2 * part)


def test_symmetric_all_reduce_needs_a_sharded_model(tiny_llama):
    from overlapdecode.fused.model import FusedModel

    with pytest.raises(ValueError, match="symmetric_all_reduce needs a tensor-parallel shard"):
        FusedModel(tiny_llama, symmetric_all_reduce=True)


def test_a_crashed_rank_runs_the_launch_again(tmp_path):
    """Rank 1 dies of SIGSEGV in the first launch only: the rerun passes, and a warning holds the crash's stack."""
    with pytest.warns(UserWarning, match=r"(?s)rank 1: SIGSEGV.*Fatal Python error: Segmentation fault"):
        proc, records = torchrun({"crash": "once"}, tmp_path, timeout=120)
    assert proc.returncode == 0 and len(records) == 2


def test_a_crash_in_the_rerun_fails_with_the_ranks_stack():
    """A launch's process as torchrun ends it when a rank dies of SIGSEGV (its summary, the rank's faulthandler
    stack before it): named a crash, and the check fails showing the stack however long the output after it."""
    stack = 'Fatal Python error: Segmentation fault\n\nCurrent thread 0x01 (most recent call first):\n  File "x.py"'
    summary = (
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-01-01_00:00:00\n  host      : localhost\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -11 (pid: 2)\n"
    )
    proc = subprocess.CompletedProcess([], 1, "", stack + "\n" + "x" * 20000 + "\n" + summary)
    assert crashed_rank(proc) == "rank 1: SIGSEGV"
    with pytest.raises(AssertionError, match="Fatal Python error: Segmentation fault"):
        check_records(proc, [], [])
    ended = subprocess.CompletedProcess([], 1, "", summary.replace("-11", "-15"))  # SIGTERM: torchrun ended it
    assert crashed_rank(ended) is None
