"""The byte-level tokenizer of the embedded random models: text in and out with no download."""

from __future__ import annotations

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer

import overlapdecode as od
from overlapdecode.models import loading
from overlapdecode.models.tokenizer import OFFSET, ByteTokenizer
from support.saved_models import save_tiny_with_bpe_tokenizer


@pytest.mark.parametrize("name", od.EMBEDDED)
def test_embedded_names_get_a_byte_tokenizer_whose_ids_miss_the_special_ones(name):
    tok = od.load_tokenizer(name)
    assert isinstance(tok, ByteTokenizer)
    cfg = loading.embedded_config(name)
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
    # an id that is no byte and no special token is shown even when special tokens are skipped
    assert tok.decode([500] + ids + [2], skip_special_tokens=True) == "<500>" + text
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
    out = od.generate(
        tiny_llama, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=6, strategy="kv", eos_token_id=[]
    )
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert len(texts) == 2 and all(isinstance(t, str) for t in texts)
    # what TextStreamer / TextIteratorStreamer call: decode(list of ids, **decode_kwargs)
    printed = []
    streamer = TextStreamer(tok, skip_special_tokens=True)
    streamer.on_finalized_text = lambda text, stream_end=False: printed.append(text)
    streamer.put(out[0, enc.input_ids.shape[1] :])
    streamer.end()
    assert "".join(printed) == texts[0]
    it = TextIteratorStreamer(tok, skip_special_tokens=True)
    it.put(out[0, enc.input_ids.shape[1] :])
    it.end()
    assert "".join(it) == texts[0]


def test_too_small_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size 100 is too small"):
        ByteTokenizer(100)


def test_a_hugging_face_tokenizer_comes_set_for_generation(tmp_path):
    """Prompts of different lengths through a real Hugging Face tokenizer: it pads (EOS as pad), on the left,
    and generate gives Hugging Face's tokens."""
    from support.helpers import hf_generate

    model = save_tiny_with_bpe_tokenizer(tmp_path)
    tok = od.load_tokenizer(str(tmp_path))
    assert tok.padding_side == "left" and tok.pad_token == "<eos>"
    enc = tok(["The quick brown fox jumps", "Hello", "hello there"], padding=True, return_tensors="pt")
    assert enc.attention_mask[:, 0].tolist() == [1, 0, 0] and enc.attention_mask[:, -1].tolist() == [1, 1, 1]
    want = hf_generate(model, enc.input_ids, enc.attention_mask, 8, [999], 999)
    for strategy in ("baseline", "kv", "static"):
        got = od.generate(model, enc.input_ids, attention_mask=enc.attention_mask, max_new_tokens=8, strategy=strategy)
        assert torch.equal(got, want), strategy


def test_the_readme_example_with_a_hugging_face_tokenizer(tmp_path):
    """The README's Python example as written, with a saved model and tokenizer as `name` (and the eager
    `kv` strategy, so that CPU does not compile again)."""
    import contextlib
    import io
    import os
    import re

    save_tiny_with_bpe_tokenizer(tmp_path)
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "README.md")) as f:
        (block,) = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    block, named = re.subn(r"^name = .*$", f"name = {str(tmp_path)!r}", block, flags=re.M)
    block, eager = re.subn(r'strategy="[a-z]+"( if cuda else "[a-z]+")?', 'strategy="kv"', block)
    assert named == eager == 1
    scope: dict = {}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(block, "README.md", "exec"), scope)  # noqa: S102 - the README's own code
    out, batch = scope["out"], scope["batch"]
    assert out.shape[0] == 2 and out.shape[1] > batch.input_ids.shape[1]
    assert (
        eval(printed.getvalue())
        == scope["tokenizer"].batch_decode(  # noqa: S307 - the list it printed
            out[:, batch.input_ids.shape[1] :], skip_special_tokens=True
        )
    )


def test_readable_shows_every_id_a_tokenizer_cannot_decode(tmp_path):
    """Hugging Face's decode drops an id beyond its vocabulary without a word; readable shows it as <id>."""
    from overlapdecode.models.tokenizer import readable

    save_tiny_with_bpe_tokenizer(tmp_path)
    tok = od.load_tokenizer(str(tmp_path))
    hello = tok.encode("Hello")
    beyond = len(tok) + 5
    assert tok.decode(hello + [beyond] + hello) == "HelloHello"  # what Hugging Face does
    assert readable(tok, hello + [beyond] + hello) == f"Hello<{beyond}>Hello"
    assert readable(tok, hello + [tok.eos_token_id]) == "Hello"  # special tokens skipped, as before
    byte_tok = od.load_tokenizer("gpt2-random")
    assert readable(byte_tok, byte_tok.encode("Hi") + [1234, 50256]) == "Hi<1234>"  # EOS is special


def test_a_directory_without_a_tokenizer_is_one_error_naming_it(tmp_path):
    """load_tokenizer returned None there, and the README example's next line failed with "'NoneType' object is
    not callable"; a tokenizer that is there but does not load is named as such."""
    d = tmp_path / "model"
    od.load_model("tiny-gpt2", device="cpu").save_pretrained(d)  # no tokenizer saved
    with pytest.raises(ValueError, match=f"^{d}: no tokenizer in this directory") as err:
        od.load_tokenizer(str(d))
    assert len(str(err.value).splitlines()) == 1
    (d / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"^{d}: its tokenizer does not load"):
        od.load_tokenizer(str(d))
