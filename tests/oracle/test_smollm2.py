"""The engine on the real SmolLM2-135M-Instruct (Q4_1) vs the NumPy oracle.

(a) logits of the first 16 positions of 5 plain-text prompts (ids from the reference
    tokenizer, so this does not depend on the engine's tokenizer);
(b) 64 greedy tokens (--temperature 0 --ignore-eos --kv-mode dense, i.e. an f32 KV cache
    like the oracle's) after 5 chat prompts (ids from `specnode tokenize --chat`). The
    oracle scores the engine's own sequence in one batched forward ("teacher forcing"), so
    a step's margin is the oracle's top logit minus its logit of the engine's token on the
    same prefix. Asserted, as the foundation issue states it: at least 4 of 5
    continuations are identical to the oracle's greedy continuation, and wherever one
    departs, the oracle's margin there (which bounds its top-2 gap from above) is below
    GREEDY_TIE_TOL: a near-tie. Every later step is held to the same bound.

Why this holds: the engine quantises matmul activations to int16 blocks (relative error
~1e-5), not to int8 as llama.cpp does (~0.3 RMS logit error, which departs from this
oracle on 5 of 5 of these prompts at margins up to 0.25). Measured with int16 activations:
3-5/5 identical depending on the build, departures only at margins 0.001-0.031.

Tolerances (logit units; SmolLM2's logits have a std of ~6.5-8 over these prompts),
measured on the (a) prompts:
  * oracle vs llama.cpp 0.3.36 (logits_all):        max |diff| 0.97-1.58, RMS 0.19-0.29
  * oracle vs oracle with 8-bit activations (act_sim): max |diff| 1.04-1.48, RMS 0.21-0.29
and set at about twice those. (specnode itself, first version: max 0.96-1.93, RMS 0.21-0.34;
greedy 0/5 identical, worst margin 0.26, all departures at margins <= 0.25.)
"""

from __future__ import annotations

import numpy as np
import pytest

from hf_tokenizer import load_gguf_tokenizer
from numpy_llama import top2_gaps

PLAIN_PROMPTS = [
    "The quick brown fox jumps over the lazy dog, and then it runs into the forest to find",
    "In 1969, Neil Armstrong became the first person to walk on the Moon. The mission was called",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) +",
    "Photosynthesis is the process by which green plants use sunlight to turn water and carbon dioxide into",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
]
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Explain what a KV cache is in two sentences.",
    "Write a short poem about the ocean.",
    "List three primary colors.",
    "How do airplanes fly?",
]
N_POSITIONS = 16
N_GREEDY = 64

# Logit-space tolerances, absolute (see the module docstring for the measurements).
MAX_ABS_TOL = 3.0        # max |engine - oracle| over 16 positions x 49152 logits
RMS_TOL = 0.6            # RMS of (engine - oracle) over the same
NEAR_TIE = 0.5           # argmax may differ only where the oracle's top-2 margin is below this
# Greedy: the engine's token may trail the oracle's top logit by at most this. Flipping a
# choice needs the two logits' errors to exceed the margin together; with ~0.3 RMS
# per-logit error, llama.cpp's worst over 320 steps was 0.26 (act_sim oracle: 0.29).
GREEDY_TIE_TOL = 0.1    # a departure must be a near-tie: oracle margin below this (logits)
MIN_IDENTICAL = 4        # of 5 continuations identical to the oracle's
MIN_AGREEMENT = 0.95     # share of greedy steps equal to the oracle's argmax


@pytest.fixture(scope="module")
def ref_tok(smollm2_path):
    return load_gguf_tokenizer(smollm2_path)


@pytest.mark.parametrize("idx", range(len(PLAIN_PROMPTS)))
def test_prefix_logits_match_oracle(specnode, smollm2_path, smollm2_oracle, ref_tok, tmp_path, idx):
    ids = ref_tok.encode(PLAIN_PROMPTS[idx])[:N_POSITIONS]
    assert len(ids) == N_POSITIONS
    want = smollm2_oracle.logits(ids)
    got = specnode.logits(smollm2_path, ids, tmp_path / "logits.bin")
    assert got.shape == want.shape, f"engine {got.shape}, oracle {want.shape}"
    assert np.isfinite(got).all()
    diff = np.abs(got - want)
    pos, tok = np.unravel_index(np.argmax(diff), diff.shape)
    assert diff.max() <= MAX_ABS_TOL, f"max |diff| {diff.max():.3f} at position {pos}, token {tok}"
    rms = float(np.sqrt(np.mean(diff ** 2)))
    assert rms <= RMS_TOL, f"RMS diff {rms:.3f}"
    gaps = top2_gaps(want)
    bad = (got.argmax(1) != want.argmax(1)) & (gaps >= NEAR_TIE)
    assert not bad.any(), f"argmax differs at positions {np.flatnonzero(bad).tolist()} (margins {gaps[bad]})"


@pytest.fixture(scope="module")
def greedy_runs(specnode, smollm2_path, smollm2_oracle):
    runs = []
    for prompt in CHAT_PROMPTS:
        prompt_ids = [int(i) for i in specnode.tokenize(smollm2_path, prompt, chat=True)["ids"]]
        reply = specnode.json("generate", "--model", smollm2_path, "--prompt-ids", ",".join(map(str, prompt_ids)),
                              "--max-tokens", N_GREEDY, "--temperature", 0, "--ignore-eos", "--kv-mode", "dense",
                              "--json")
        runs.append({"prompt": prompt, "prompt_ids": prompt_ids, "reply": reply})
    return runs


def test_generate_json_shape(greedy_runs):
    for r in greedy_runs:
        reply = r["reply"]
        missing = {"prompt_ids", "generated_ids", "text", "prompt_tokens_per_s", "decode_tokens_per_s"} - set(reply)
        assert not missing, f"generate --json lacks {sorted(missing)}"
        assert [int(i) for i in reply["prompt_ids"]] == r["prompt_ids"]
        assert len(reply["generated_ids"]) == N_GREEDY, "--ignore-eos must produce exactly --max-tokens tokens"
        assert isinstance(reply["text"], str)
        assert reply["decode_tokens_per_s"] > 0 and reply["prompt_tokens_per_s"] > 0


def greedy_margins(oracle, prompt_ids: list[int], generated: list[int]) -> np.ndarray:
    """For each generated token: oracle top logit minus the oracle's logit of that token,
    given the engine's own prefix (one batched oracle forward)."""
    logits = oracle.logits(prompt_ids + generated[:-1])
    rows = logits[len(prompt_ids) - 1:]
    return rows.max(axis=1) - rows[np.arange(len(generated)), generated]


def test_greedy_matches_oracle(greedy_runs, smollm2_oracle, ref_tok, capsys):
    identical, agree, steps, problems = 0, 0, 0, []
    for r in greedy_runs:
        got = [int(i) for i in r["reply"]["generated_ids"]]
        assert len(got) == N_GREEDY
        margins = greedy_margins(smollm2_oracle, r["prompt_ids"], got)
        identical += int((margins == 0).all())
        agree += int((margins == 0).sum())
        steps += len(margins)
        first = int(np.argmax(margins > 0)) if (margins > 0).any() else None
        line = (f"{r['prompt']!r}: " + ("identical to the oracle" if first is None else
                f"departs at step {first} (margin {margins[first]:.3f}), worst margin {margins.max():.3f} "
                f"at step {int(margins.argmax())}; shared prefix {ref_tok.decode(got[:first])!r}"))
        with capsys.disabled():
            print("\n  " + line, end="")
        if margins.max() >= GREEDY_TIE_TOL:
            problems.append(line)
    assert not problems, f"engine picked tokens the oracle ranks >= {GREEDY_TIE_TOL} below its top:\n" + \
        "\n".join(problems)
    print(f"{identical}/{len(greedy_runs)} continuations identical; {agree}/{steps} steps agree")
    assert identical >= MIN_IDENTICAL, f"only {identical}/{len(greedy_runs)} continuations identical"
    assert agree / steps >= MIN_AGREEMENT, f"only {agree}/{steps} greedy steps equal the oracle's argmax"


def test_oracle_continuation_is_coherent(smollm2_oracle, ref_tok):
    """Guards the oracle itself: SmolLM2 answers a simple chat question sensibly."""
    ids = ref_tok.encode_chat("What is the capital of France?")
    out, _ = smollm2_oracle.greedy(ids, 12, stop_at_eos=True)
    assert "Paris" in ref_tok.decode(out)
