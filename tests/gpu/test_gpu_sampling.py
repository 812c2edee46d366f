"""On a real GPU, float32: sampling under every preset at real vocabularies (GPT-2's 50257, Llama-3's 128256,
Qwen2's 151936), batch 1 and 4. Every sampled token lies in the set Hugging Face's processors keep for its prefix
(teacher-forced), and one seed gives the same tokens under every preset. The models are two layers deep at the
real vocabulary (the sampler's cost and the inductor path that failed are set by the vocabulary, not the depth),
with a sharpened LM head so that top-k, top-p and min-p each drop most of the vocabulary."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import overlapdecode as od
from support.helpers import assert_inside_hf_kept_sets, make_batch

DEV = "cuda"
N = 24
PRESETS = ("baseline", "kv", "static", "compiled", "interleaved", "fused")
SETTINGS = [
    dict(temperature=0.7),
    dict(top_k=50),
    dict(top_p=0.9),
    dict(min_p=0.1),
    dict(repetition_penalty=1.3),
    dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.2),
]
VOCABS = (50257, 128256, 151936)


def name(setting):
    return ",".join(f"{k}={v}" for k, v in setting.items())


@pytest.fixture(scope="module", params=VOCABS, ids=lambda v: f"vocab{v}")
def model(request):
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=request.param,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    m = LlamaForCausalLM(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(40)  # peaked distributions: the warpers drop most tokens
    return m.to(DEV).eval()


EAGER = ("baseline", "kv", "static", "fused")
# the compiled presets compile once per (vocabulary, batch, setting), 20-60 s each: they run where top-p failed
# to compile, top-p alone at batch 4 at every vocabulary, and every control at once at batch 4 and at batch 1
COMPILED_CASES = {(v, 4, "top_p=0.9") for v in VOCABS} | {
    (151936, 4, name(SETTINGS[-1])),
    (128256, 1, name(SETTINGS[-1])),
}


def cases():
    for batch in (4, 1):
        for setting in SETTINGS:
            yield batch, setting


@pytest.mark.parametrize("batch,setting", list(cases()), ids=lambda x: name(x) if isinstance(x, dict) else f"b{x}")
def test_sampling_runs_inside_hf_kept_sets_and_agrees_across_presets(model, batch, setting):
    ids, mask = make_batch(batch, seed=7, high=min(990, model.config.vocab_size), device=DEV)
    do_sample = set(setting) != {"repetition_penalty"}
    kw = dict(
        attention_mask=mask,
        max_new_tokens=N,
        eos_token_id=[],
        do_sample=do_sample,
        seed=7 if do_sample else None,
        **setting,
    )
    presets = PRESETS if (model.config.vocab_size, batch, name(setting)) in COMPILED_CASES else EAGER
    outs = {p: od.generate(model, ids, strategy=p, **kw) for p in presets}
    ref = outs["kv"]
    if do_sample:
        assert_inside_hf_kept_sets(model, ref.cpu(), mask.cpu(), ids.shape[1], setting, model_device=DEV)
    else:  # greedy with a penalty: Hugging Face's own tokens
        hf = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=N,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
            repetition_penalty=setting["repetition_penalty"],
        )
        assert torch.equal(ref, hf)
    for p, out in outs.items():
        assert torch.equal(out, ref), (p, name(setting), (out != ref).nonzero()[:4].tolist())


CLI_FLAGS = ["--do-sample", "--temperature", "0.7", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05"]
CLI_FLAGS += ["--repetition-penalty", "1.2", "--seed", "3"]


@pytest.mark.parametrize("strategy", ["fused", "interleaved", "kv"])
def test_the_cli_samples_with_every_flag_on_the_gpu(strategy, capsys):
    """`overlapdecode generate` with every sampling flag on the GPU (the compiled presets' top-p crashed the
    compiler here): it prints the ids od.generate gives with the same settings, and they lie in Hugging Face's
    kept sets."""
    from overlapdecode.cli import main

    args = ["generate", "--model", "gpt2-random", "--dtype", "float32", "--device", DEV, "--prompt-ids", "5,6,7"]
    args += ["--max-new-tokens", "12", "--strategy", strategy, "--eos", "none"] + CLI_FLAGS
    assert main(args) == 0
    printed = capsys.readouterr().out
    model = od.load_model("gpt2-random", dtype="float32", device=DEV)
    settings = dict(temperature=0.7, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.2)
    ids = torch.tensor([[5, 6, 7]], device=DEV)
    out = od.generate(
        model, ids, max_new_tokens=12, strategy=strategy, eos_token_id=[], do_sample=True, seed=3, **settings
    )
    assert "ids: " + " ".join(map(str, out[0, 3:].tolist())) in printed, printed
    mask = torch.ones_like(ids)
    assert_inside_hf_kept_sets(model, out.cpu(), mask.cpu(), 3, settings, model_device=DEV)
