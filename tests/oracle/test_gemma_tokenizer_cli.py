"""`specnode tokenize` on Gemma 3's SentencePiece vocabulary vs llama.cpp's encodings.

The expected ids and decodings are tests/data/gemma3-tokenizer-golden.json, written by
tests/data/make_gemma_tokenizer_golden.py with llama.cpp (llama-cpp-python, vocab only).
The model is $SPECNODE_GEMMA_MODEL (scripts/fetch-model --model gemma3-270m prints it):
unset or a missing file, the tests fail under SPECNODE_REQUIRE_MODEL=1 (scripts/test sets
both) and skip otherwise. `tokenize` reads only the GGUF's tokenizer metadata, so this runs
whether or not the engine can load Gemma's weights.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "gemma3-tokenizer-golden.json"


@pytest.fixture(scope="module")
def gemma_path() -> str:
    path = os.environ.get("SPECNODE_GEMMA_MODEL", "")
    if not path:
        if os.environ.get("SPECNODE_REQUIRE_MODEL", "") == "1":
            pytest.fail("SPECNODE_GEMMA_MODEL is unset but SPECNODE_REQUIRE_MODEL=1")
        pytest.skip("SPECNODE_GEMMA_MODEL is unset "
                    "(scripts/fetch-model --model gemma3-270m prints the path)")
    if not os.path.isfile(path):
        msg = f"SPECNODE_GEMMA_MODEL={path} does not exist"
        if os.environ.get("SPECNODE_REQUIRE_MODEL", "") == "1":
            pytest.fail(msg + " (SPECNODE_REQUIRE_MODEL=1)")
        pytest.skip(msg)
    return path


def _cases():
    with open(GOLDEN, encoding="utf-8") as f:
        return json.load(f)["cases"]


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{'special' if c['parse_special'] else 'plain'}"
                                             for i, c in enumerate(CASES)])
def test_tokenize_matches_llama_cpp(specnode, gemma_path, case):
    args = ["tokenize", "--model", gemma_path, "--text", case["text"]]
    if case["parse_special"]:
        args.append("--special")
    reply = specnode.json(*args)
    assert [int(i) for i in reply["ids"]] == case["ids"], repr(case["text"])
    assert len(reply["pieces"]) == len(case["ids"])


@pytest.mark.parametrize("index", [1, 25, 29, 33])
def test_decode_matches_llama_cpp(specnode, gemma_path, index):
    case = CASES[2 * index + 1]  # the parse_special encoding: decode renders control tokens
    ids = ",".join(map(str, case["ids"]))
    reply = specnode.json("tokenize", "--model", gemma_path, "--decode", ids, "--special")
    assert reply["text"] == case["decoded"]


def test_chat_uses_gemma_turns(specnode, gemma_path):
    """The file ships no chat template (a base model); --chat-template gemma supplies it."""
    reply = specnode.json("tokenize", "--model", gemma_path, "--text", "Hi", "--chat",
                          "--chat-template", "gemma")
    ids = [int(i) for i in reply["ids"]]
    # llama.cpp on "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n" with
    # add_bos and parse_special (the template adds no "<bos>" text of its own).
    assert ids == [2, 105, 2364, 107, 10979, 106, 107, 105, 4368, 107], ids
