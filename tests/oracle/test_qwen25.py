"""The real draft/target pair (Qwen2.5-Coder 1.5B target, 0.5B draft; Q4_K_M files of the
`qwen2` architecture: Q/K/V biases, NeoX RoPE, tied embeddings) against the NumPy oracle,
and their chat template against Jinja2's rendering of the file's own template.

  SPECNODE_QWEN_MODEL        qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (Q4_K / Q6_K matrices)
  SPECNODE_QWEN_DRAFT_MODEL  qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (mostly Q5_0: rows of
                             896 are not whole K-quant super-blocks; Q8_0 embeddings)
  (scripts/fetch-model --model qwen2.5-coder-1.5b / -0.5b; scripts/test sets both.)

(a) logits of the first 16 positions of plain prompts (an f32 KV cache, --kv-mode dense,
    like the oracle's), target and draft: the draft exercises the native Q5_0 kernels
    (model/cpu/cpu_repack.h) on real weights;
(b) 32 greedy target tokens after each prompt, scored by the oracle on the engine's own
    sequence (teacher forcing, as test_gemma3.py): every step's margin below GREEDY_TIE_TOL
    and at least MIN_IDENTICAL continuations identical to the oracle's greedy ones;
(c) conversations rendered by `specnode tokenize --messages` equal transformers-style Jinja2
    rendering of the file's template (its default system message when none is given, a later
    system turn, multi-turn, text with newlines and non-ASCII), token for token too. The
    template's tools branch is never taken by the node: the chat API refuses `tools` and
    the `tool` role with a clear error (tests/serve/test_openai_http.py).

Measured (2026-12-07, avx512-vnni kernels, int16 activations): see LOGIT_TOL's comments;
greedy: 4/4 continuations identical to the oracle's, every margin 0.
"""
from __future__ import annotations

import json

import pytest

from engine_checks import compare_logits, greedy_margins, k_quant_mode
from hf_tokenizer import load_gguf_tokenizer
from numpy_llama import load_cached

PROMPTS = [
    "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n",
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find",
    "import numpy as np\n\n# Compute the moving average of a 1-D array with window w\ndef moving_average(x, w):",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission was called",
]
N_POSITIONS = 16
N_GREEDY = 32
# (max |diff|, RMS) of engine vs oracle logits over the first 16 positions, by how the engine
# runs the K-quant matrices (its description says; Q5_0 -> Q8_0 is exact either way).
# Measured native: target max 0.0010-0.0025, RMS 0.0002-0.0003 (logit std 2.7-3.3); draft
# (Q5_0 native) max 0.0020-0.0022, RMS 0.0003. Bounds 4x that; converted as test_gemma3.py.
LOGIT_TOL = {"native": (0.01, 0.0012), "converted": (1.0, 0.15)}
NEAR_TIE = 0.5
GREEDY_TIE_TOL = 0.15
MIN_IDENTICAL = 3  # of the 4 prompts

CONVERSATIONS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "  Grüße,\n  indented\n"},
     {"role": "assistant", "content": "```python\nprint('hi')\n```"},
     {"role": "user", "content": "更多 ✓"}],
    [{"role": "user", "content": "first"}, {"role": "system", "content": "later system"},
     {"role": "user", "content": "second"}],
]


@pytest.fixture(scope="module")
def k_quants(specnode, qwen_target_path) -> str:
    return k_quant_mode(specnode, qwen_target_path, LOGIT_TOL)


@pytest.fixture(scope="module")
def target_oracle(qwen_target_path):
    """The dequantised 1.5B target (~6.2 GB in float32), once per module."""
    m = load_cached(qwen_target_path, "float32")
    assert m.cfg.arch == "qwen2"
    return m


@pytest.fixture(scope="module")
def draft_oracle(qwen_draft_path):
    m = load_cached(qwen_draft_path, "float32")
    assert m.cfg.arch == "qwen2"
    return m


def prompt_ids(specnode, path, text):
    return [int(i) for i in specnode.tokenize(path, text)["ids"]]


def check_prefix_logits(specnode, path, oracle, tmp_path, text, tol):
    ids = prompt_ids(specnode, path, text)[:N_POSITIONS]
    assert len(ids) == N_POSITIONS, ids
    got = specnode.logits(path, ids, tmp_path / "logits.bin", "--kv-mode", "dense")
    compare_logits(got, oracle.logits(ids), tol, NEAR_TIE, repr(text[:30]))


@pytest.mark.parametrize("idx", range(len(PROMPTS)))
def test_target_prefix_logits_match_oracle(specnode, qwen_target_path, target_oracle, tmp_path,
                                           idx, k_quants):
    check_prefix_logits(specnode, qwen_target_path, target_oracle, tmp_path, PROMPTS[idx],
                        LOGIT_TOL[k_quants])


@pytest.mark.parametrize("idx", [0, 1])
def test_draft_prefix_logits_match_oracle(specnode, qwen_draft_path, draft_oracle, tmp_path, idx,
                                          k_quants):
    check_prefix_logits(specnode, qwen_draft_path, draft_oracle, tmp_path, PROMPTS[idx],
                        LOGIT_TOL[k_quants])


def test_target_greedy_matches_oracle(specnode, qwen_target_path, target_oracle, capsys):
    identical, problems = 0, []
    for text in PROMPTS:
        ids = prompt_ids(specnode, qwen_target_path, text)
        margins, reply = greedy_margins(specnode, qwen_target_path, target_oracle, ids, N_GREEDY)
        identical += int((margins == 0).all())
        line = f"{text[:30]!r}: worst margin {margins.max():.3f}; {reply[:50]!r}"
        with capsys.disabled():
            print("\n  " + line, end="")
        if margins.max() >= GREEDY_TIE_TOL:
            problems.append(line)
    assert not problems, "engine picked tokens the oracle ranks below its top:\n" + "\n".join(problems)
    assert identical >= MIN_IDENTICAL, f"only {identical}/{len(PROMPTS)} continuations identical"


@pytest.mark.parametrize("idx", range(len(CONVERSATIONS)))
def test_chat_renders_as_the_files_jinja_template(specnode, qwen_target_path, idx):
    convo = CONVERSATIONS[idx]
    ref = load_gguf_tokenizer(qwen_target_path)
    want = ref.render_messages(convo)
    if idx != 1 and convo[0]["role"] != "system":
        assert "You are Qwen, created by Alibaba Cloud." in want  # the default system turn
    reply = specnode.json("tokenize", "--model", qwen_target_path, "--messages", json.dumps(convo))
    assert reply["prompt"] == want
    assert reply["ids"] == ref.encode(want)


def test_draft_and_target_render_alike(specnode, qwen_target_path, qwen_draft_path):
    """The pair's draft renders prompts as the target does (speculation needs one token
    stream): the same vocabulary, and every conversation the node takes rendered to the same
    ids. (The two files' template texts differ, in the tools branch only: the 1.5B's
    tool-call example has doubled braces, the 0.5B's single ones.)"""
    t, d = load_gguf_tokenizer(qwen_target_path), load_gguf_tokenizer(qwen_draft_path)
    assert t.tokens == d.tokens
    for convo in CONVERSATIONS:
        msgs = json.dumps(convo)
        want = specnode.json("tokenize", "--model", qwen_target_path, "--messages", msgs)
        got = specnode.json("tokenize", "--model", qwen_draft_path, "--messages", msgs)
        assert got["ids"] == want["ids"]
        assert d.render_messages(convo) == t.render_messages(convo)
