#!/usr/bin/env python3
"""Writes tests/data/gemma3-tokenizer-golden.json: llama.cpp's encodings of Gemma 3's
SentencePiece vocabulary, for tokenizer_test and tests/oracle/test_gemma_tokenizer_cli.py.

Usage: python3 tests/data/make_gemma_tokenizer_golden.py MODEL.gguf \
           > tests/data/gemma3-tokenizer-golden.json
  MODEL.gguf: gemma-3-270m-q4_k_m.gguf (scripts/fetch-model --model gemma3-270m)
Needs: llama-cpp-python (bench/setup-llama-cpp installs it into specnode's venv).

The reference is llama.cpp itself (through llama-cpp-python, loaded with vocab_only: no
weights), which shares no code with specnode: llama_tokenize with add_special=True (the
file sets add_bos_token, so every encoding starts with <bos> = 2) and parse_special both
off and on, and llama_detokenize(remove_special=False, unparse_special=parse_special) of
the ids it produced.

No text contains "</s>": Gemma's vocabulary has it as a user-defined token (id 212, the
HTML strikethrough tag, as <s> is 203), which SentencePiece and specnode split out of any
text, but llama.cpp re-types every token spelled "</s>" as a control end-of-generation
token (a text heuristic in its vocab loader), so it matches it only with parse_special.
tokenizer_spm_test.cc checks specnode's handling of it separately.
"""
import ctypes
import hashlib
import json
import os
import sys

import llama_cpp

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "forty spaces:" + " " * 40 + "end",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four",
    "  \n\n  x",
    "\n",
    " ",
    "\r\n\r\nwindows\r\n",
    "Digits: 12345, 3.14159 and 2024-06-01",
    "I'm sure you're right; they'll see we've won.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "int main() { std::vector<int> v{1, 2, 3}; return v[0]; }",
    '{"key": "value", "list": [1, 2.5, null, true]}',
    "<table><tr><td>cell</td></tr></table> <b>bold</b> <s>struck",
    "https://example.com/path?query=1&lang=en#frag",
    "café, naïve, Zürich, señor, Ærøskøbing",
    "你好，世界。日本語のテキスト、한국어 텍스트",
    "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. שלום עולם",
    "emoji 🙂👍🏽 and 👨‍👩‍👧‍👦 family, flags 🇫🇷🇯🇵",
    "symbols © ™ → ∑ ∫ √ ≠ ≤ ≥ ∞ ½ €100 £5 ¥3",
    "control \x01\x02\x1f bytes and \x7f del",
    "rare: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 ꙮ \u200b zero-width \ufeff bom",
    "<start_of_turn>user\nWhat is a KV cache?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text after bos<eos> and <pad><unk><mask>",
    "unused tokens <unused0><unused6241> [multimodal] <start_of_image><end_of_image>",
    "<start_of_turn <end_of_turn> half <start_of_turn>",
    "A KV cache stores the keys and values of past tokens so attention need not recompute "
    "them; speculative decoding drafts K tokens and verifies them in one pass.",
]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    m = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = m._model.vocab

    def encode(text: str, special: bool) -> list:
        return m.tokenize(text.encode("utf-8"), add_bos=True, special=special)

    def decode(ids: list, special: bool) -> str:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, special)
        if n < 0:
            sys.exit(f"llama_detokenize needs {-n} bytes")
        return buf.raw[:n].decode("utf-8")

    cases = []
    for text in TEXTS:
        for special in (False, True):
            ids = encode(text, special)
            cases.append({"text": text, "parse_special": special, "ids": ids,
                          "decoded": decode(ids, special)})
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    json.dump({
        "generator": "tests/data/make_gemma_tokenizer_golden.py",
        "reference": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
        "model": os.path.basename(path),
        "sha256": sha,
        "vocab_size": m.n_vocab(),
        "cases": cases,
    }, sys.stdout, ensure_ascii=True, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
