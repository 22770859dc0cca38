#!/usr/bin/env python3
"""Writes tests/data/pretokenizer_golden.json: how Hugging Face `tokenizers` (its Split
pre-tokenizer over the published regexes, an implementation independent of specnode's)
splits a set of texts, per pre-tokenizer specnode supports:

  gpt2       GPT-2's ByteLevel regex
  smollm     SmolLM's: every digit alone (Digits(individual_digits=True)), then GPT-2's regex
  llama-bpe  Llama 3's regex (numbers in runs of up to 3)
  qwen2      Qwen2's regex (each digit alone)

tokenizer_test.cc (PreTokenizeTest.MatchesHfTokenizers) compares specnode's pre-tokenizer
with it; tests/oracle/test_pretokenizer_golden.py regenerates it in memory and checks that
the committed file is what `tokenizers` says. Run: python tests/data/make_pretokenizer_golden.py
"""
import json
import sys
from pathlib import Path

from tokenizers import Regex, pre_tokenizers

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
         r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TEXTS = [
    "Hello world",
    "I'M  \n\n  x 12345",
    "don't DON'T we'll They'VE I'd",
    "  leading spaces and trailing   ",
    "tabs\tand\t\tmixed \t whitespace",
    "line one\nline two\r\nline three\n\n\nend",
    "numbers: 1 12 123 1234 12345 3.14159 -42 1,000,000",
    "code: def f(x):\n    return x**2 + 3*x - 1  # comment",
    "punctuation!!! ... ??? (parens) [brackets] {braces} <tags/>",
    "emoji 😀🎉 and symbols © ® ™ € £ ¥",
    "naïve café façade Ångström résumé",
    "中文文本，包含标点。日本語のテキスト",
    "한국어 텍스트 123",
    "Ελληνικά και русский текст",
    "mixed123abc456def",
    "email@example.com https://example.com/path?q=1&r=2",
    "   \n   \n",
    "a\n\n\tb",
    "'s 's 'S",
    "x  \n",
]


def splitters():
    split = lambda pattern: pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    return {
        "gpt2": split(GPT2),
        "smollm": pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           split(GPT2)]),
        "llama-bpe": split(LLAMA3),
        "qwen2": split(QWEN2),
    }


def golden() -> dict:
    out = {"source": "tokenizers " + __import__("tokenizers").__version__, "cases": []}
    for name, pre in splitters().items():
        for text in TEXTS:
            pieces = [p for p, _ in pre.pre_tokenize_str(text)]
            assert "".join(pieces) == text
            out["cases"].append({"pre": name, "text": text, "pieces": pieces})
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("pretokenizer_golden.json")
    path.write_text(json.dumps(golden(), ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}", file=sys.stderr)
