"""`specnode tokenize` vs a HF `tokenizers` BPE built from the same GGUF's vocab/merges."""

from __future__ import annotations

import pytest

from hf_tokenizer import load_gguf_tokenizer

TEXTS = [
    "Hello world",
    " leading space and  two   runs of spaces",
    "line one\nline two\n\n\ttabbed\r\n",
    "Digits: 12345, 3.14159 and 2024-06-01",
    "I'm sure you're right; they'll see we've won.",
    "café, naïve, Zürich, señor",
    "你好，世界。日本語のテキスト",
    "emoji 🙂👍🏽 and symbols © ™ →",
    "def f(x):\n    return x ** 2  # square",
    "!!!???... --- ===",
    "trailing spaces   ",
    "A KV cache stores the keys and values of past tokens so attention need not recompute them.",
]


@pytest.fixture(scope="module")
def ref(smollm2_path):
    return load_gguf_tokenizer(smollm2_path)


def check_reply(reply: dict, want_ids: list[int], what: str):
    assert set(reply) >= {"ids", "pieces"}, f"{what}: reply keys {sorted(reply)}"
    ids = [int(i) for i in reply["ids"]]
    assert len(reply["pieces"]) == len(ids), f"{what}: {len(reply['pieces'])} pieces for {len(ids)} ids"
    assert ids == want_ids, f"{what}: engine {ids} != reference {want_ids}"


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_tokenize_matches_hf(specnode, smollm2_path, ref, text):
    check_reply(specnode.tokenize(smollm2_path, text), ref.encode(text), repr(text))


@pytest.mark.parametrize("text", ["What is a KV cache?", "Write a haiku about\nthe sea. 🌊"])
def test_tokenize_chat_matches_template(specnode, smollm2_path, ref, text):
    """--chat applies the GGUF's chat template (one user turn + generation prompt) and
    parses its control tokens (<|im_start|>, <|im_end|>) as single ids."""
    check_reply(specnode.tokenize(smollm2_path, text, chat=True), ref.encode_chat(text), f"chat {text!r}")


def test_reference_tokenizer_round_trips(ref):
    """Sanity of the reference itself: byte-level BPE decodes back to the input."""
    for text in TEXTS:
        assert ref.decode(ref.encode(text)) == text
    assert ref.encode("12345") == [ref.tokens.index(d) for d in "12345"]
    im_start = ref.tokens.index("<|im_start|>")
    assert ref.encode("<|im_start|>user")[0] == im_start
