"""The engine on the real Gemma 3 270M (Q4_K_M: Q8_0 / Q5_0 / Q4_K / Q6_K matrices; gemma3
architecture) vs the NumPy oracle, which reads the family from Hugging Face's definition
and is itself checked against llama.cpp (test_gemma3_oracle.py, where llama.cpp is
installed). Prompt ids come from `specnode tokenize` (its SentencePiece tokenizer equals
llama.cpp's on tests/data/gemma3-tokenizer-golden.json).

(a) logits of the first 16 positions of 4 plain prompts;
(b) 32 greedy tokens (--temperature 0 --ignore-eos --kv-mode dense: an f32 KV cache like
    the oracle's) after each, and 16 after a ~700-token prompt that runs past the 512-token
    window of the local layers. The oracle scores the engine's own sequence (teacher
    forcing): a step's margin is the oracle's top logit minus its logit of the engine's
    token. Asserted: every margin below GREEDY_TIE_TOL (a departure only at a near-tie) and
    at least MIN_IDENTICAL continuations identical to the oracle's greedy ones.

Measured (2026-12-03, avx512-vnni kernels, int16 activations; logit std 5.2-5.8): with
the native K-quant kernels (model/cpu/cpu_repack_kquant.h) prefix logits max |diff|
0.0046-0.0074, RMS 0.0007-0.0011; with the K-quants converted at load (Q4_K -> Q4_1, Q6_K ->
Q8_0: SPECNODE_KQUANT_NATIVE=0, or kernels without them, which the backend's description
says) max 0.21-0.50, RMS 0.041-0.067. Greedy 4/4 continuations identical, every margin 0,
both ways. The tolerances are 2-4x the measurement (SmolLM2's are set the same way), the
converted ones applying only when the engine says it converts.
"""
from __future__ import annotations

import pytest

from engine_checks import compare_logits, greedy_margins, k_quant_mode

PLAIN_PROMPTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission was called",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon dioxide into",
]
LONG_PROMPT = " ".join(["The lighthouse keeper climbed the stairs every evening, lit the lamp and"
                        " wrote the weather into the log book before the ships came past."] * 24)
N_POSITIONS = 16
N_GREEDY = 32
# (max |diff|, RMS) bounds for K-quants run natively / converted.
LOGIT_TOL = {"native": (0.02, 0.003), "converted": (1.0, 0.15)}
NEAR_TIE = 0.5
GREEDY_TIE_TOL = 0.1
MIN_IDENTICAL = 3  # of the 4 plain prompts


def prompt_ids(specnode, path, text):
    return [int(i) for i in specnode.tokenize(path, text)["ids"]]


@pytest.fixture(scope="module")
def k_quants(specnode, gemma3_path) -> str:
    return k_quant_mode(specnode, gemma3_path, LOGIT_TOL)


@pytest.mark.parametrize("idx", range(len(PLAIN_PROMPTS)))
def test_prefix_logits_match_oracle(specnode, gemma3_path, gemma3_oracle, tmp_path, idx,
                                    k_quants):
    ids = prompt_ids(specnode, gemma3_path, PLAIN_PROMPTS[idx])[:N_POSITIONS]
    assert ids[0] == 2 and len(ids) == N_POSITIONS, ids
    got = specnode.logits(gemma3_path, ids, tmp_path / "logits.bin", "--kv-mode", "dense")
    compare_logits(got, gemma3_oracle.logits(ids), LOGIT_TOL[k_quants], NEAR_TIE,
                   f"K-quants {k_quants}")


def test_greedy_matches_oracle(specnode, gemma3_path, gemma3_oracle, capsys):
    identical, problems = 0, []
    for text in PLAIN_PROMPTS:
        ids = prompt_ids(specnode, gemma3_path, text)[:N_POSITIONS]
        margins, reply = greedy_margins(specnode, gemma3_path, gemma3_oracle, ids, N_GREEDY)
        identical += int((margins == 0).all())
        line = f"{text[:40]!r}: worst margin {margins.max():.3f}; {reply[:50]!r}"
        with capsys.disabled():
            print("\n  " + line, end="")
        if margins.max() >= GREEDY_TIE_TOL:
            problems.append(line)
    assert not problems, "engine picked tokens the oracle ranks below its top:\n" + "\n".join(problems)
    assert identical >= MIN_IDENTICAL, f"only {identical}/{len(PLAIN_PROMPTS)} continuations identical"


def test_greedy_past_the_sliding_window(specnode, gemma3_path, gemma3_oracle):
    ids = prompt_ids(specnode, gemma3_path, LONG_PROMPT)
    assert len(ids) > 600, len(ids)
    margins, reply = greedy_margins(specnode, gemma3_path, gemma3_oracle, ids, 16)
    assert margins.max() < GREEDY_TIE_TOL, (margins.round(3).tolist(), reply)
