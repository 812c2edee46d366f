"""Tiny models saved as from the hub, with a tokenizer: what the command line and load_tokenizer are tested on."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import overlapdecode as od


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


def save_tiny_with_bpe_tokenizer(path):
    """tiny-gpt2 and a byte-level BPE tokenizer trained here on a few strings, saved as from the hub: right
    padding and no pad token, as GPT-2's own tokenizer is saved. Its vocabulary (under 300 ids) is smaller
    than the model's 1000, so most ids the random model emits are ones it cannot decode."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        ["The quick brown fox jumps over the lazy dog", "Hello world", "hello there, fox"],
        trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<eos>"]),
    )
    saved = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>", unk_token="<unk>")
    assert saved.padding_side == "right" and saved.pad_token is None
    model = od.load_model("tiny-gpt2", device="cpu")
    model.save_pretrained(path)
    saved.save_pretrained(path)
    return model
