#!/usr/bin/env python3
"""Writes tests/data/tokenizer_golden.json: reference encodings for tokenizer_test.

Usage: python3 tests/data/make_tokenizer_golden.py MODEL.gguf > tests/data/tokenizer_golden.json
Needs: pip install gguf tokenizers

The reference is Hugging Face `tokenizers` (Rust, Oniguruma regexes), built from the
GGUF's own vocabulary and merges (read with the `gguf` package) and SmolLM2's
pre-tokenizer: Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False,
use_regex=True)], a BPE model without unk, and a byte-level decoder. Control tokens are
added as special tokens for the parse_special cases (HF matches them leftmost-longest).

Besides the model encodings, "pretokenize" holds the splits of every case text by the
other pre-tokenizer regexes specnode supports (HF Split(Regex, "isolated")), which the
C++ test checks without needing the model file.
"""
import json
import sys

import gguf
import tokenizers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models
from tokenizers import pre_tokenizers as pt

GPT2 = (r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
         r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four",
    "  \n\n  x",
    "\n",
    " ",
    "\t\t",
    "\r\n\r\nwindows\r\n",
    "x \n y",
    "12345",
    "3.14 and 2.71828",
    "Call 555-0123 or +1 (800) 123-4567 before 2024-01-31.",
    "I'm sure you're right, they'll know we've said she'd go; it's John's.",
    "DON'T SHOUT, I'M HERE. WE'LL SEE.",
    "rock'n'roll ''s 'tis '''",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v[0]; }",
    '{"key": "value", "list": [1, 2.5, null, true]}',
    "<div class=\"x\">&nbsp;</div>",
    "https://example.com/path?query=1&lang=en#frag",
    "user@example.com",
    "!!!???...,,,;;;",
    "--->  <===  ***",
    "$$$ 100% #hashtag @mention",
    "Emoji: 😀😃 👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "你好，世界！这是一个测试。",
    "こんにちは世界、カタカナ",
    "안녕하세요 세계",
    "café naïve résumé façade Ångström",
    "e\u0301 combining acute",
    "مرحبا بالعالم ١٢٣",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Привет, мир! Ёжик",
    "Γειά σου Κόσμε",
    "x² + y³ = z⁴, ½ ¾, Ⅻ",
    "nbsp\u00a0here and\u3000ideographic\u2028ls\u0085nel",
    "ctrl\x00\x01\x1c\x1f\x7fchars",
    "zero\u200bwidth\ufeffbom",
    "ſtraße 'ſ",
    "!\x04! a\x04\x06b \x13\x14\x16\x1d",  # bytes without a token in SmolLM2's vocabulary
    "plane5 \U00050000 \U000f0000 end",  # lead bytes 0xf1 (no token) and 0xf3
    "Pneumonoultramicroscopicsilicovolcanoconiosis" * 12,
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "1234567890" * 5,
    "    indented\n\tmixed \t \n",
    "<|im_start|>user\nHi there<|im_end|>\n",
    "<|im_start|><|im_end|><|endoftext|>",
    "<|im_start partial <|im_end",
    "<<|im_end|>>",
    "<repo_name>specnode<file_sep>main.cc",
    "<|endoftext|>text after",
    "The year 1999 was 25 years ago; 10,000 people and 0.5% more.",
    "Mixed123Letters456 and x1y2z3",
]


def read_vocab(path):
    reader = gguf.GGUFReader(path)

    def strings(key):
        f = reader.fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    tf = reader.fields["tokenizer.ggml.token_type"]
    types = [int(tf.parts[i][0]) for i in tf.data]
    pre = bytes(reader.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    return tokens, merges, types, pre


def build(tokens, merges, specials):
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate tokens"
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs))
    tok.pre_tokenizer = pt.Sequence([
        pt.Digits(individual_digits=True),
        pt.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    if specials:
        tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def main():
    path = sys.argv[1]
    tokens, merges, types, pre = read_vocab(path)
    assert pre == "smollm", pre
    control = [t for t, ty in zip(tokens, types) if ty in (3, 4)]
    plain = build(tokens, merges, [])
    special = build(tokens, merges, control)
    cases = []
    for text in TEXTS:
        for parse_special in (False, True):
            tok = special if parse_special else plain
            ids = tok.encode(text, add_special_tokens=False).ids
            if parse_special and ids == cases[-1]["ids"]:
                continue  # same as without special parsing: not worth a separate case
            case = {"text": text, "parse_special": parse_special, "ids": ids}
            if tok.decode(ids, skip_special_tokens=False) != text:
                case["lossy"] = True  # some bytes have no token and were dropped
            cases.append(case)
    splits = {"gpt2": GPT2, "llama3": LLAMA3, "qwen2": QWEN2}
    pretokenize = []
    for name, pattern in splits.items():
        split = pt.Split(Regex(pattern), behavior="isolated")
        for text in TEXTS:
            pieces = [p for p, _ in split.pre_tokenize_str(text)]
            assert "".join(pieces) == text
            pretokenize.append({"pre": name, "text": text, "pieces": pieces})
    out = {
        "generator": "tests/data/make_tokenizer_golden.py",
        "model": path.rsplit("/", 1)[-1],
        "tokenizers_version": tokenizers.__version__,
        "vocab_size": len(tokens),
        "cases": cases,
        "pretokenize": pretokenize,
    }
    json.dump(out, sys.stdout, ensure_ascii=True, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
