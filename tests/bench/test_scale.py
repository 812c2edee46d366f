"""bench/scale.py's figures (KV bytes per step, MBU and toll with them, tok/s) and scripts/scale_sweep.py's run, on
CPU: the arithmetic against numbers worked by hand, the sweep end to end on a tiny model."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

import overlapdecode as od
from overlapdecode.bench import scale

LLAMA_1B = scale.Shape(layers=16, kv_heads=8, head_dim=64, elt_bytes=2)


def test_kv_bytes_per_step_count_every_rows_keys_and_values_in_every_layer():
    # one row of 16384 slots at Llama-1B in bfloat16: 16 layers x 2 x 8 heads x 64 x 2 bytes x 16384 = 2**29
    assert scale.kv_bytes_per_step(LLAMA_1B, 1, 16384) == 2**29
    assert scale.kv_bytes_per_step(LLAMA_1B, 8, 16384) == 8 * 2**29
    assert scale.mean_context(4096, 32) == 4112  # the steps attend to 4097 .. 4127 slots
    with pytest.raises(ValueError, match="new_tokens must be >= 2"):
        scale.mean_context(32, 1)


def test_mbu_and_toll_charge_the_kv_bytes_to_the_floor_not_to_the_kernels():
    # 2.5 GB of weights and 0.5 GB of cache at 5000 GB/s: a floor of 0.6 ms; a 1.0 ms step over 16 layers leaves
    # 0.4 ms, 25 us per layer; MBU 60% (50% counting the weights alone)
    got = scale.step_figures(1.0, 8, 2.5e9, 0.5e9, 5000.0, 16)
    assert got["floor_ms"] == pytest.approx(0.6)
    assert got["mbu"] == pytest.approx(0.6) and got["mbu_weights_only"] == pytest.approx(0.5)
    assert got["toll_us_per_layer"] == pytest.approx(25.0)
    assert got["tok_s"] == pytest.approx(8000.0)
    cpu = scale.step_figures(2.0, 4, 1e6, 1e5, None, 2)  # no measured bandwidth: no MBU, no toll
    assert cpu["mbu"] is None and cpu["toll_us_per_layer"] is None and cpu["tok_s"] == pytest.approx(2000.0)


def test_model_shape_reads_layers_kv_heads_and_head_size():
    assert scale.model_shape(od.load_model("tiny-llama", device="cpu")) == scale.Shape(2, 2, 16, 4)
    assert scale.model_shape(od.load_model("tiny-gpt2", device="cpu", dtype="bfloat16")) == scale.Shape(2, 4, 16, 2)


def test_points_run_every_strategy_at_a_point_short_prompts_first():
    assert scale.points([1, 64], [32], [8], [4096, 8192], ["fused", "interleaved"]) == [
        ("fused", 1, 32),
        ("interleaved", 1, 32),
        ("fused", 64, 32),
        ("interleaved", 64, 32),
        ("fused", 8, 4096),
        ("interleaved", 8, 4096),
        ("fused", 8, 8192),
        ("interleaved", 8, 8192),
    ]


def _script():
    path = Path(__file__).parents[2] / "scripts" / "scale_sweep.py"
    spec = importlib.util.spec_from_file_location("scale_sweep", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_sweep_runs_end_to_end_and_refuses_an_earlier_sweeps_directory(tmp_path, capsys):
    out = tmp_path / "sweep"
    args = [
        "--out",
        str(out),
        "--model",
        "tiny-llama",
        "--dtype",
        "float32",
        "--rows",
        "1,3",
        "--long-rows",
        "2",
        "--long-prompts",
        "70",
        "--strategies",
        "fused",
        "--new-tokens",
        "3",
        "--long-new-tokens",
        "2",
        "--repeats",
        "1",
        "--no-kernels",
    ]
    assert _script().main(args) == 0
    result = json.loads((out / "scale.json").read_text())
    assert [(r["rows"], r["prompt_len"]) for r in result["rows"]] == [(1, 32), (3, 32), (2, 70)]
    for r in result["rows"]:
        # 3 tokens timed once on a shared CPU: the difference of two calls can have either sign, so only the
        # figures' relation is checked here (the speed itself is the GPU sweep's)
        assert math.isfinite(r["ms_per_step"]) and r["tok_s"] == pytest.approx(r["rows"] / r["ms_per_step"] * 1e3)
        assert r["kv_bytes"] == scale.kv_bytes_per_step(
            scale.Shape(2, 2, 16, 4), r["rows"], r["prompt_len"] + r["new_tokens"] / 2
        )
    table = (out / "scale.md").read_text().splitlines()
    assert sum(line.startswith("| fused |") for line in table) == 3
    with pytest.raises(SystemExit):
        _script().main(args)
    assert "already holds a sweep" in capsys.readouterr().err


def test_the_table_lists_points_out_of_memory_and_not_run():
    result = dict(
        config=dict(model="m", dtype="bfloat16"),
        bandwidth_gbs=None,
        weight_bytes=1e9,
        not_run=[["fused", 8, 16384]],
        rows=[dict(strategy="fused", rows=8, prompt_len=8192, error="out of memory")],
    )
    text = scale.markdown(result)
    assert "| fused | 8 | 8192 | out of memory |" in text and "| fused | 8 | 16384 | not run: time budget |" in text


def test_the_sweep_replaces_the_rules_it_is_told_to(tmp_path, monkeypatch):
    """--rope-table never and --prenorm never/always replace the rule where the step reads it (for the run's
    process; the monkeypatch puts the originals back after the test)."""
    from overlapdecode.fused import forward
    from overlapdecode.fused.kernels import norm_prologue

    monkeypatch.setattr(forward, "step_rope_tables", forward.step_rope_tables)
    monkeypatch.setattr(norm_prologue, "use_prenorm", norm_prologue.use_prenorm)
    assert norm_prologue.use_prenorm(64)
    args = ["--out", str(tmp_path / "s"), "--model", "tiny-llama", "--dtype", "float32", "--rows", "20"]
    args += ["--long-rows", "1", "--long-prompts", "8", "--strategies", "fused", "--new-tokens", "2"]
    args += ["--long-new-tokens", "2", "--repeats", "1", "--no-kernels", "--rope-table", "never", "--prenorm", "never"]
    assert _script().main(args) == 0
    assert forward.step_rope_tables(None, {}, None, None, None) == {} and not norm_prologue.use_prenorm(64)


def test_the_sweeps_variants_run_in_one_process_each_with_its_rule(tmp_path, monkeypatch):
    """--variants: each point runs `fused` once per variant and round, with that variant's rule in place only
    while it runs (dense:qkv+o: the QKV and O weights' launches in dense form, down not), and the table names each
    row's variant. (On CPU the fused step runs the torch references, so the rule in force is what is checked.)"""
    from overlapdecode.fused.kernels import dense

    rule = dense.use_dense
    seen = []

    def fake_point(decoder, model, name, rows, prompt_len, *a):
        # tiny-llama: hidden 64, 4 heads of 16, 2 kv heads: QKV (128, 64), O (64, 64), down (256, 64) -> (64, 256)
        seen.append(tuple(dense.use_dense(20, n, k) for n, k in ((128, 64), (64, 64), (64, 256))))
        return dict(strategy=name, rows=rows, prompt_len=prompt_len, ms_per_step=1.0, tok_s=1.0, kv_bytes=0, ttft_ms=1)

    monkeypatch.setattr(scale, "measure_point", fake_point)
    out = tmp_path / "ab"
    args = ["--out", str(out), "--model", "tiny-llama", "--dtype", "float32", "--rows", "20", "--prompts", "8"]
    args += ["--long-rows", "1", "--long-prompts", "8", "--strategies", "fused", "--new-tokens", "2"]
    args += ["--long-new-tokens", "2", "--repeats", "1", "--no-kernels", "--variants", "rule,dense:qkv+o"]
    args += ["--rounds", "2"]
    assert _script().main(args) == 0
    assert dense.use_dense is rule  # put back
    result = json.loads((out / "scale.json").read_text())
    assert [(r["rows"], r.get("variant"), r.get("round")) for r in result["rows"]] == [
        (20, "rule", 0),
        (20, "dense:qkv+o", 0),
        (20, "rule", 1),
        (20, "dense:qkv+o", 1),
        (1, "rule", 0),
        (1, "dense:qkv+o", 0),
        (1, "rule", 1),
        (1, "dense:qkv+o", 1),
    ]
    off, on = (rule(20, 128, 64),) * 3, (True, True, False)
    assert seen == [off, on] * 4
    assert "| fused [dense:qkv+o] | 20 | 8 |" in (out / "scale.md").read_text()
    with pytest.raises(SystemExit):
        _script().main(["--out", str(tmp_path / "x"), "--variants", "dense:mlp", "--no-kernels"])
    with pytest.raises(SystemExit):
        _script().main(["--out", str(tmp_path / "y"), "--variants", "rule"])


def _probes_per_variant(tmp_path, monkeypatch, variants: str, probe) -> list:
    """scale_sweep --variants `variants` over one point of 20 rows, then one of 1 row (tiny-llama, float32, fused
    only), each point's measurement faked: what `probe()` returned at each, in the order run."""
    seen = []

    def fake_point(decoder, model, name, rows, prompt_len, *a):
        seen.append(probe())
        return dict(strategy=name, rows=rows, prompt_len=prompt_len, ms_per_step=1.0, tok_s=1.0, kv_bytes=0, ttft_ms=1)

    monkeypatch.setattr(scale, "measure_point", fake_point)
    args = ["--out", str(tmp_path / "ab"), "--model", "tiny-llama", "--dtype", "float32", "--rows", "20"]
    args += ["--prompts", "8", "--long-rows", "1", "--long-prompts", "8", "--strategies", "fused"]
    args += ["--new-tokens", "2", "--long-new-tokens", "2", "--repeats", "1", "--no-kernels"]
    assert _script().main(args + ["--variants", variants]) == 0
    return seen


def test_the_residual_norm_variant_turns_the_hand_off_off_while_it_runs(tmp_path, monkeypatch):
    """--variants rule,residual-norm:off: with the variant kernels/residual_norm.py is switched off (ENABLED: every
    dense O and down epilogue leaves the next norm to its own launch), with rule on; put back after."""
    from overlapdecode.fused.kernels import residual_norm

    seen = _probes_per_variant(tmp_path, monkeypatch, "rule,residual-norm:off", lambda: residual_norm.ENABLED)
    assert seen == [True, False, True, False] and residual_norm.ENABLED is True


def test_the_pieces_and_direct_tile_variants_replace_their_rules_while_they_run(tmp_path, monkeypatch):
    """dense-pieces:off: every dense product over the whole of K; attention-direct:off: no direct tiles at many
    rows; each put back after."""
    from overlapdecode.fused.kernels import decode_attention, dense

    rules = dense.pieces_for, decode_attention.direct_tiles
    seen = _probes_per_variant(
        tmp_path,
        monkeypatch,
        "rule,dense-pieces:off,attention-direct:off",
        lambda: (dense.pieces_for(2048, 8192, 132), decode_attention.direct_tiles(64, 1, 512, 264)),
    )
    assert seen[:3] == [(2, (32, 2)), (1, (32, 2)), (2, None)]
    assert (dense.pieces_for, decode_attention.direct_tiles) == rules


def test_the_option_variants_make_their_decoders_with_those_fused_options(tmp_path, monkeypatch):
    """pdl:off is a FusedModel option, not a rule: its variant's Decoder is made with it (checked by name and
    type when it is made), the rule's with none."""
    seen = []

    def fake_point(decoder, model, name, rows, prompt_len, *a):
        seen.append(decoder.fused_options)
        return dict(strategy=name, rows=rows, prompt_len=prompt_len, ms_per_step=1.0, tok_s=1.0, kv_bytes=0, ttft_ms=1)

    monkeypatch.setattr(scale, "measure_point", fake_point)
    args = ["--out", str(tmp_path / "ab"), "--model", "tiny-llama", "--dtype", "float32", "--rows", "1"]
    args += ["--prompts", "8", "--long-rows", "1", "--long-prompts", "8", "--strategies", "fused", "--no-kernels"]
    assert _script().main(args + ["--variants", "rule,pdl:off"]) == 0
    assert seen[:2] == [dict(compile_prefill=False), dict(compile_prefill=False, pdl=False)]
    for bad in ("pdl:3", "pdl:on"):
        with pytest.raises(SystemExit):
            _script().main(args + ["--variants", bad])


def test_the_sweep_quantizes_the_model_it_loads(tmp_path, monkeypatch):
    """--quantize int4 --group-size 32: every point measures the model load_model quantized (its down projection
    an Int4Linear in groups of 32), and the step's bytes are the packed ones (fewer than the float32 model's)."""
    from overlapdecode.facts import step_weight_bytes
    from overlapdecode.quant.modules import Int4Linear

    seen = []

    def fake_point(decoder, model, name, rows, prompt_len, n, repeats, bandwidth, step_bytes, traces):
        down = model.model.layers[0].mlp.down_proj
        seen.append((type(down), down.group_size, step_bytes))
        return dict(strategy=name, rows=rows, prompt_len=prompt_len, ms_per_step=1.0, tok_s=1.0, kv_bytes=0, ttft_ms=1)

    monkeypatch.setattr(scale, "measure_point", fake_point)
    args = ["--out", str(tmp_path / "q"), "--model", "tiny-llama", "--dtype", "float32", "--rows", "1"]
    args += ["--prompts", "8", "--long-rows", "1", "--long-prompts", "8", "--strategies", "fused"]
    args += ["--new-tokens", "2", "--long-new-tokens", "2", "--repeats", "1", "--no-kernels"]
    assert _script().main(args + ["--quantize", "int4", "--group-size", "32"]) == 0
    full = od.load_model("tiny-llama", dtype="float32", device="cpu")
    assert [s[:2] for s in seen] == [(Int4Linear, 32)] * 2
    assert seen[0][2] < step_weight_bytes(full, 1)
