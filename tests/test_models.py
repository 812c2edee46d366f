"""load_model: embedded configs, a local directory saved with save_pretrained (no download), dtype/device."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import overlapdecode as od
from helpers import hf_generate, make_batch


def save_tiny_with_tokenizer(path):
    """A tiny GPT-2 and a word-level tokenizer (words w0..w999), saved as a hub model would be."""
    model = od.load_model("tiny-gpt2", device="cpu")
    vocab = {f"w{i}": i for i in range(1000)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w999", unk_token="w0")
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return model


@pytest.mark.parametrize("name, layers", [("tiny-gpt2", 2), ("tiny-llama", 2), ("gpt2-random", 12)])
def test_embedded_configs(name, layers):
    model = od.load_model(name, device="cpu") if name != "gpt2-random" else None
    if model is None:  # the 124M model: check its config only (CPU memory and time in CI)
        cfg = od.models.embedded_config(name)
        assert (cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.n_positions) == (12, 768, 50257, 1024)
        return
    assert model.config.num_hidden_layers == layers and not model.training
    assert od.load_model(name, device="cpu", seed=0).state_dict().keys() == model.state_dict().keys()


def test_seed_makes_weights_reproducible():
    a = od.load_model("tiny-gpt2", device="cpu", seed=1)
    b = od.load_model("tiny-gpt2", device="cpu", seed=1)
    c = od.load_model("tiny-gpt2", device="cpu", seed=2)
    wa, wb, wc = (m.transformer.h[0].attn.c_attn.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_local_directory_round_trip(tmp_path):
    original = save_tiny_with_tokenizer(tmp_path)
    loaded = od.load_model(str(tmp_path), device="cpu")
    assert loaded._overlapdecode_random is False
    ids, mask = make_batch(2, seed=9)
    out = od.generate(loaded, ids, attention_mask=mask, max_new_tokens=10, strategy="static", eos_token_id=[])
    assert torch.equal(out, hf_generate(original, ids, mask, 10, [], 0))
    tok = od.load_tokenizer(str(tmp_path))
    assert tok("w5 w17").input_ids == [5, 17]


def test_dtype_and_bad_arguments():
    assert next(od.load_model("tiny-llama", dtype="bfloat16", device="cpu").parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        od.load_model("tiny-gpt2", dtype="float8")
    with pytest.raises(TypeError, match="name_or_path must be a non-empty string"):
        od.load_model("")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            od.load_model("tiny-gpt2", device="cuda")
