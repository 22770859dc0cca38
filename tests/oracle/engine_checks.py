"""Checks of the engine against an oracle shared by the real-model tests (test_gemma3.py,
test_qwen25.py)."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from numpy_llama import top2_gaps


def greedy_margins(specnode, path, oracle, ids, n):
    """`specnode generate` greedy for n tokens after ids (an f32 KV cache, --kv-mode dense, like
    the oracle's), scored by the oracle on the engine's own sequence (teacher forcing): each
    step's margin is the oracle's top logit minus its logit of the engine's token (0: the
    oracle's greedy choice). Returns (margins [n], the engine's text)."""
    reply = specnode.json("generate", "--model", path, "--prompt-ids", ",".join(map(str, ids)),
                          "--max-tokens", n, "--temperature", 0, "--ignore-eos", "--kv-mode",
                          "dense", "--json", "--quiet")
    gen = [int(i) for i in reply["generated_ids"]]
    assert len(gen) == n
    rows = list(range(len(ids) - 1, len(ids) + n - 1))
    logits = oracle.logits(ids + gen[:-1], rows=rows)
    return logits.max(axis=1) - logits[np.arange(n), gen], reply["text"]


def k_quant_mode(specnode, path, modes) -> str:
    """Which of `modes` ("native" / "converted") this engine runs a file's K-quant matrices
    in, as its backend description (printed by `generate`) says."""
    p = subprocess.run([specnode.path, "generate", "--model", path, "--prompt", "Hi",
                        "--max-tokens", "1"], capture_output=True, text=True, timeout=300)
    text = p.stdout + p.stderr
    for mode in modes:
        if f"K-quants {mode}" in text:
            return mode
    pytest.fail(f"generate did not say how it runs K-quants:\n{text[-800:]}")


def compare_logits(got, want, tol, near_tie, label=""):
    """Engine logits `got` against the oracle's `want` ([positions, vocab]): max |diff| and RMS
    within tol = (max_abs, rms), and the same argmax wherever the oracle's top-2 gap is at
    least near_tie. Prints the figures."""
    max_abs_tol, rms_tol = tol
    assert got.shape == want.shape
    diff = np.abs(got - want)
    pos, tok = np.unravel_index(np.argmax(diff), diff.shape)
    rms = float(np.sqrt(np.mean(diff ** 2)))
    print(f"\n  {label}: max |diff| {diff.max():.4f} (position {pos}), RMS {rms:.4f}, "
          f"logit std {want.std():.2f}")
    assert diff.max() <= max_abs_tol, (
        f"{label}: max |diff| {diff.max():.4f} at position {pos}, token {tok}")
    assert rms <= rms_tol, f"{label}: RMS diff {rms:.4f}"
    gaps = top2_gaps(want)
    bad = (got.argmax(1) != want.argmax(1)) & (gaps >= near_tie)
    assert not bad.any(), f"argmax differs at {np.flatnonzero(bad).tolist()} (margins {gaps[bad]})"
