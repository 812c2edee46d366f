"""The byte-level tokenizer of the embedded random models: text in and out with no download."""

from __future__ import annotations

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer

import overlapdecode as od
from overlapdecode.tokenizer import OFFSET, ByteTokenizer


@pytest.mark.parametrize("name", od.EMBEDDED)
def test_embedded_names_get_a_byte_tokenizer_whose_ids_miss_the_special_ones(name):
    tok = od.load_tokenizer(name)
    assert isinstance(tok, ByteTokenizer)
    cfg = od.models.embedded_config(name)
    byte_ids = set(range(OFFSET, OFFSET + 256))
    assert max(byte_ids) < cfg.vocab_size
    assert cfg.eos_token_id not in byte_ids and cfg.bos_token_id not in byte_ids
    assert tok.eos_token_id == cfg.eos_token_id


def test_round_trip_utf8_and_special_ids():
    tok = od.load_tokenizer("tiny-llama")
    text = "héllo, wörld ✓ 日本"
    ids = tok.encode(text)
    assert ids == [b + OFFSET for b in text.encode("utf-8")]
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text
    assert tok.decode(ids + [2], skip_special_tokens=True) == text  # EOS dropped
    assert tok.decode(ids + [2]) == text + "<2>"
    assert tok.decode(tok.encode("✓")[:2]) == "\ufffd"  # a cut character is replaced, never raises
    assert tok.batch_decode([tok.encode("a"), tok.encode("bc")]) == ["a", "bc"]


def test_call_pads_on_the_left_like_hugging_face():
    tok = od.load_tokenizer("tiny-gpt2")
    enc = tok(["ab", "c"], return_tensors="pt")
    a, b, c = (x + OFFSET for x in b"abc")
    assert enc.input_ids.tolist() == [[a, b], [tok.pad_token_id, c]]
    assert enc["attention_mask"].tolist() == [[1, 1], [0, 1]]
    assert tok("ab").input_ids == [a, b]


def test_text_through_generate_and_hugging_face_streamers(tiny_llama):
    tok = od.load_tokenizer("tiny-llama")
    enc = tok(["hello", "hi"], return_tensors="pt")
    out = od.generate(tiny_llama, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=6,
                      strategy="kv", eos_token_id=[])
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    # what TextStreamer / TextIteratorStreamer call: decode(list of ids, **decode_kwargs)
    printed = []
    streamer = TextStreamer(tok, skip_special_tokens=True)
    streamer.on_finalized_text = lambda text, stream_end=False: printed.append(text)
    streamer.put(out[0, enc.input_ids.shape[1]:])
    streamer.end()
    assert "".join(printed) == texts[0]
    it = TextIteratorStreamer(tok, skip_special_tokens=True)
    it.put(out[0, enc.input_ids.shape[1]:])
    it.end()
    assert "".join(it) == texts[0]


def test_too_small_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size 100 is too small"):
        ByteTokenizer(100)
