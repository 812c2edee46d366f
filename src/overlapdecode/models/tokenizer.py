"""A byte-level tokenizer for the embedded random models, so that text goes in and out with no download.

Token id = UTF-8 byte + OFFSET: the ids below OFFSET are left to the models' special tokens (tiny-llama's
BOS 1 and EOS 2), and the models' own EOS (tiny-gpt2's 999, gpt2-random's 50256, the Llama shapes' 128001)
lie above every byte id, so no byte is ever taken for EOS. The weights are random, so the text that comes
out is random bytes (and `<id>` for the ids above them): this is for trying the text path, not for reading it.

It has what `overlapdecode generate --prompt`, a Python caller and Hugging Face's `TextStreamer` /
`TextIteratorStreamer` use: `encode`, `decode` (invalid UTF-8 is replaced, so a cut multi-byte character
never raises; an id that is no byte and no special token is shown as `<id>`, so every id of a large
vocabulary leaves a trace), `batch_decode`, and `__call__` returning `input_ids` and `attention_mask` with
left padding, as a Hugging Face tokenizer with `padding_side="left"` would.

`readable` is the command line's text of a sequence for any tokenizer: a Hugging Face tokenizer's decode drops
ids beyond its vocabulary without a word, which it shows as `<id>` too.
"""

from __future__ import annotations

import torch

OFFSET = 3  # ids 0, 1, 2: pad, BOS, EOS of tiny-llama; bytes 0..255 -> ids 3..258


class _Encoding(dict):
    """The dict a Hugging Face tokenizer returns, with attribute access (`enc.input_ids`)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class ByteTokenizer:
    """UTF-8 bytes as token ids (byte + OFFSET); the model's EOS, BOS and pad ids are its special tokens."""

    padding_side = "left"

    def __init__(self, vocab_size: int, eos_token_id: int | None = None, bos_token_id: int | None = None):
        if vocab_size < OFFSET + 256:
            raise ValueError(f"vocab_size {vocab_size} is too small for byte ids {OFFSET}..{OFFSET + 255}")
        self.vocab_size = vocab_size
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.pad_token_id = 0 if eos_token_id is None else eos_token_id
        self.all_special_ids = sorted({i for i in (eos_token_id, bos_token_id, self.pad_token_id) if i is not None})

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`text` -> ids (no BOS: the embedded models were never trained with one)."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [b + OFFSET for b in text.encode("utf-8")]

    def decode(self, ids, skip_special_tokens: bool = False, **_) -> str:
        """ids -> text; an id outside the byte range is shown as <id>, except a special one (EOS, BOS, pad)
        with `skip_special_tokens`, which is dropped (gpt2-random's ids 259..50255 are neither)."""
        if isinstance(ids, torch.Tensor):
            ids = ids.reshape(-1).tolist()
        elif isinstance(ids, int):
            ids = [ids]
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            i = int(i)
            if OFFSET <= i < OFFSET + 256:
                run.append(i - OFFSET)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not (skip_special_tokens and i in self.all_special_ids):
                parts.append(f"<{i}>")
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def batch_decode(self, sequences, skip_special_tokens: bool = False, **kw) -> list[str]:
        return [self.decode(s, skip_special_tokens=skip_special_tokens, **kw) for s in sequences]

    def __call__(self, text, return_tensors: str | None = None, padding=True, **_) -> _Encoding:
        """One text or a list of texts -> input_ids and attention_mask, rows left-padded with pad_token_id."""
        texts = [text] if isinstance(text, str) else list(text)
        ids = [self.encode(t) for t in texts]
        width = max((len(r) for r in ids), default=0)
        if len(ids) > 1 and len({len(r) for r in ids}) > 1 and not padding:
            raise ValueError("texts of different lengths need padding=True")
        input_ids = [[self.pad_token_id] * (width - len(r)) + r for r in ids]
        mask = [[0] * (width - len(r)) + [1] * len(r) for r in ids]
        if return_tensors == "pt":
            return _Encoding(
                input_ids=torch.tensor(input_ids, dtype=torch.long).reshape(len(ids), width),
                attention_mask=torch.tensor(mask, dtype=torch.long).reshape(len(ids), width),
            )
        if return_tensors is not None:
            raise ValueError(f"return_tensors must be 'pt' or None, got {return_tensors!r}")
        if isinstance(text, str):
            return _Encoding(input_ids=input_ids[0], attention_mask=mask[0])
        return _Encoding(input_ids=input_ids, attention_mask=mask)


def readable(tokenizer, ids: list[int]) -> str:
    """`ids` as text for a person: the tokenizer's text of every id it knows (special tokens skipped), `<id>`
    for an id it cannot decode, which a Hugging Face tokenizer's decode drops without a word (the ids a
    model's vocabulary has beyond its tokenizer's, say)."""
    if isinstance(tokenizer, ByteTokenizer):
        return tokenizer.decode(ids, skip_special_tokens=True)  # already shows every id it cannot decode
    known = len(tokenizer)
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
        if 0 <= i < known:
            run.append(i)
            continue
        if run:
            parts.append(tokenizer.decode(run, skip_special_tokens=True))
            run = []
        parts.append(f"<{i}>")
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=True))
    return "".join(parts)
