"""Engine logits vs the NumPy oracle on tiny models written by `specnode tiny-model`.

For every shape x weight type: `specnode logits` for every position of a token list
must match the oracle (float64) within a per-type tolerance, measured relative to the
standard deviation of the oracle's logits, and pick the same argmax wherever the
oracle's top-1/top-2 margin is not a near-tie.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from numpy_llama import NumpyLlama, top2_gaps

# (layers, d_model, heads, kv_heads, ff): MHA, GQA 3:1, MQA with head_dim 64, deeper GQA.
# Inner dims are multiples of 32 so every quantised type is possible.
SHAPES = {
    "mha": (2, 64, 4, 4, 128),
    "gqa": (3, 96, 6, 2, 160),
    "mqa": (1, 128, 2, 1, 256),
    "deep": (4, 64, 4, 2, 96),
}
# Heads whose width is not d_model / heads (attention.key_length, as Qwen3 and Gemma files
# state it): (layers, d_model, heads, kv_heads, ff, head_dim) — wider (4 x 32 = 128 > 64)
# and narrower (4 x 16 = 64 < 96) than the quotient.
HEAD_DIM_SHAPES = {
    "wide": (2, 64, 4, 2, 128, 32),
    "narrow": (2, 96, 4, 2, 128, 16),
}
TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"]

# Tolerances relative to std(oracle logits): (max |engine - oracle|, RMS, near-tie margin).
# They were sized by running the oracle against itself with the activation rounding a
# llama.cpp-style engine applies (NumpyLlama(act_sim=True): f16 / bf16 activations for
# f16 / bf16 weights, 8-bit blocks of 32 for quantised weights) on random tiny models of
# these shapes, over 3 seeds x 4 shapes x 24-32 tokens:
#   type    measured max   measured RMS   largest margin at which argmax flipped
#   f32     7e-7           2e-7           (no flips)
#   f16     2.5e-3         5.7e-4         1.1e-3
#   bf16    1.8e-2         4.7e-3         7.2e-3
#   q8/q4   7.7e-2         1.7e-2         4.5e-2
# and set at ~3-4x those. An engine that keeps activations in f32 lands far inside them;
# f32 keeps room for a different summation order and vectorised exp/rsqrt.
TOLERANCES = {
    "f32": (1e-4, 2e-5, 2e-4),
    "f16": (1e-2, 2e-3, 5e-3),
    "bf16": (6e-2, 1.5e-2, 3e-2),
    "q8_0": (0.25, 0.06, 0.12),
    "q4_0": (0.25, 0.06, 0.12),
    "q4_1": (0.25, 0.06, 0.12),
    # Q5_0 / Q5_1 and the K-quants: the CPU's x8 kernels run Q4_K / Q5_K / Q6_K as stored
    # (model/cpu/cpu_repack_kquant.h); the rest, and K-quants where those kernels do not run
    # (SPECNODE_REPACK=0, SPECNODE_KQUANT_NATIVE=0, the scalar table), are converted at load (Q5_0 ->
    # Q8_0 exactly, Q5_1 / Q5_K / Q6_K -> Q8_0 requantised, Q4_K -> Q4_1 with f16-rounded
    # sub-block factors: model/gguf/ggml_converted_types.h); the oracle decodes them exactly
    # with gguf-py. Both are far below the activation rounding these bounds were sized for,
    # so the quantised types' bounds apply unchanged.
    "q5_0": (0.25, 0.06, 0.12),
    "q5_1": (0.25, 0.06, 0.12),
    "q4_k": (0.25, 0.06, 0.12),
    "q5_k": (0.25, 0.06, 0.12),
    "q6_k": (0.25, 0.06, 0.12),
}
# K-quant matrices need rows of whole 256-value blocks (narrower ones fall back to Q8_0 in
# tiny-model, as in llama.cpp's quantiser), so they get a shape where every matrix has them.
K_SHAPE = (2, 256, 4, 2, 512)
K_TYPES = ["q4_k", "q5_k", "q6_k"]
# A half-precision KV cache adds its own rounding (measured the same way with
# NumpyLlama(kv_round=...) on f32 weights: f16 K/V max 1.3e-3 / RMS 2.7e-4, bf16 K/V max
# 1.2e-2 / RMS 2.4e-3; llama.cpp with its default f16 cache: max 1.0e-3). Tell the test
# what the engine stores with SPECNODE_ORACLE_KV=f32|f16|bf16 (default f32: strict).
KV_EXTRA = {"f32": (0.0, 0.0, 0.0), "f16": (5e-3, 1e-3, 2e-3), "bf16": (4e-2, 8e-3, 1e-2)}


def tolerance(wtype: str) -> tuple[float, float, float]:
    kv = os.environ.get("SPECNODE_ORACLE_KV", "f32")
    if kv not in KV_EXTRA:
        raise ValueError(f"SPECNODE_ORACLE_KV={kv!r}: expected one of {sorted(KV_EXTRA)}")
    return tuple(a + b for a, b in zip(TOLERANCES[wtype], KV_EXTRA[kv]))


N_TOKENS = 20


def token_list(vocab: int, n: int, seed: int) -> list[int]:
    """Deterministic tokens covering both ends of the vocabulary and a repeat."""
    rng = np.random.default_rng(seed)
    toks = [1, vocab - 1, 0] + rng.integers(0, vocab, n - 4).tolist() + [1]
    return [int(t) for t in toks]


def compare_logits(got: np.ndarray, want: np.ndarray, tol: tuple[float, float, float], what: str):
    max_tol, rms_tol, tie_tol = tol
    assert got.shape == want.shape, f"{what}: engine logits {got.shape}, oracle {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite engine logits"
    std = want.std()
    diff = np.abs(got - want)
    max_rel = diff.max() / std
    rms_rel = np.sqrt(np.mean(diff ** 2)) / std
    where = np.unravel_index(np.argmax(diff), diff.shape)
    hint = "" if os.environ.get("SPECNODE_ORACLE_KV") else \
        " (if the engine's KV cache is f16/bf16, set SPECNODE_ORACLE_KV accordingly)"
    assert max_rel <= max_tol, (f"{what}: max |diff| / std = {max_rel:.3g} > {max_tol:.3g} "
                                f"at position {where[0]}, token {where[1]}{hint}")
    assert rms_rel <= rms_tol, f"{what}: RMS diff / std = {rms_rel:.3g} > {rms_tol:.3g}{hint}"
    gaps = top2_gaps(want) / std
    bad = (np.argmax(got, axis=1) != np.argmax(want, axis=1)) & (gaps >= tie_tol)
    assert not bad.any(), (f"{what}: argmax differs at positions {np.flatnonzero(bad).tolist()} "
                           f"where the oracle's margin is {gaps[bad].round(4).tolist()} std (>= {tie_tol})")
    return max_rel, rms_rel


@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_logits_match_oracle(specnode, tiny_model, tmp_path, shape, wtype):
    layers, d_model, heads, kv_heads, ff = SHAPES[shape]
    seed = 7 + list(SHAPES).index(shape)
    path = tiny_model(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ff=ff,
                      type=wtype, seed=seed)
    oracle = NumpyLlama(path, dtype=np.float64)
    c = oracle.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.d_ff) == (layers, d_model, heads, kv_heads, ff), \
        f"tiny-model wrote {c}, asked for {SHAPES[shape]}"
    tokens = token_list(c.vocab_size, N_TOKENS, seed)
    want = oracle.logits(tokens)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, want, tolerance(wtype), f"{shape}/{wtype}")


@pytest.mark.parametrize("wtype", ["f32", "q8_0", "q4_1"])
@pytest.mark.parametrize("shape", list(HEAD_DIM_SHAPES))
def test_head_dim_from_key_length_matches_oracle(specnode, tiny_model, tmp_path, shape, wtype):
    layers, d_model, heads, kv_heads, ff, head_dim = HEAD_DIM_SHAPES[shape]
    path = tiny_model(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ff=ff,
                      type=wtype, seed=21, head_dim=head_dim)
    oracle = NumpyLlama(path, dtype=np.float64)
    assert (oracle.cfg.head_dim, oracle.cfg.d_model) == (head_dim, d_model), oracle.cfg
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 21)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance(wtype), f"{shape}/{wtype}")


# Architectures of the table beyond llama (model/llama/llama_arch.h), each on a GQA shape,
# a wide-head shape (qwen3's heads are wider than d_model / heads) and a K-quant shape:
# (layers, d_model, heads, kv_heads, ff, head_dim).
ARCH_SHAPES = {
    "gqa": (3, 96, 6, 2, 160, 0),
    "wide": (2, 64, 4, 2, 128, 32),
    "k256": (2, 256, 4, 2, 512, 0),
}
ARCH_CASES = [(a, s, t) for a in ["qwen2", "qwen3", "gemma3"] for s, t in
              [("gqa", "f32"), ("gqa", "q8_0"), ("gqa", "q4_1"), ("wide", "f16"), ("k256", "q4_k")]]


@pytest.mark.parametrize("arch,shape,wtype", ARCH_CASES)
def test_architecture_logits_match_oracle(specnode, tiny_model, tmp_path, arch, shape, wtype):
    """qwen2 (NeoX RoPE, Q/K/V biases), qwen3 (NeoX RoPE, per-head Q/K RMSNorm) and gemma3
    (those norms, embedding scale, GeGLU, post-norms; 6+ layers with a window of 5 so local
    and global layers, and their two RoPE bases, both run) against the oracle's own reading
    of those model definitions."""
    layers, d_model, heads, kv_heads, ff, head_dim = ARCH_SHAPES[shape]
    window = 0
    if arch == "gemma3":
        layers, window = max(layers, 6) + (1 if shape == "gqa" else 0), 5
    seed = 31 + list(ARCH_SHAPES).index(shape)
    path = tiny_model(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ff=ff,
                      type=wtype, seed=seed, head_dim=head_dim, arch=arch, window=window)
    oracle = NumpyLlama(path, dtype=np.float64)
    assert oracle.cfg.arch == arch, oracle.cfg
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, seed)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance(wtype), f"{arch}/{shape}/{wtype}")


def test_rope_frequency_factors_match_oracle(specnode, tiny_model, tmp_path):
    """Llama 3.1-style rope_freqs.weight: each pair's angle divided by its factor."""
    path = tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="q8_0", seed=61,
                      rope_freqs=True)
    oracle = NumpyLlama(path, dtype=np.float64)
    assert "rope_freqs.weight" in oracle.w
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 61)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance("q8_0"), "rope_freqs")
    del oracle.w["rope_freqs.weight"]
    wrong = oracle.logits(tokens)
    assert np.abs(got - wrong).max() / wrong.std() > 2 * tolerance("q8_0")[0]


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_linear_rope_scaling_matches_oracle(specnode, tiny_model, tmp_path, arch):
    """rope.scaling.type linear: positions divided by the factor on every layer (llama) or on
    the global layers only (gemma3 4B+; 7 layers, window 5: layer 5 is global)."""
    layers, window = (7, 5) if arch == "gemma3" else (2, 0)
    path = tiny_model(layers=layers, d_model=64, heads=4, kv_heads=2, ff=128, type="f32",
                      seed=71, arch=arch, window=window, rope_scale=8)
    oracle = NumpyLlama(path, dtype=np.float64)
    assert oracle.cfg.rope_scale_global == 8.0, oracle.cfg
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 71)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance("f32"), f"{arch}/rope-scale-8")
    import dataclasses
    oracle.cfg = dataclasses.replace(oracle.cfg, rope_scale_global=1.0)
    wrong = oracle.logits(tokens)
    assert np.abs(got - wrong).max() / wrong.std() > 100 * tolerance("f32")[0]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_architecture_variants_change_the_logits(specnode, tiny_model, tmp_path, arch):
    """The oracle without the architecture's variants (llama's RoPE, no biases / no Q/K norms)
    is far from the engine: the match above is not the plain Llama graph by accident."""
    import dataclasses
    path = tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=41,
                      arch=arch)
    oracle = NumpyLlama(path, dtype=np.float64)
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 41)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance("f32"), arch)
    for variant in ["rope_neox", "qkv_bias" if arch == "qwen2" else "qk_norm"]:
        oracle.cfg = dataclasses.replace(oracle.cfg, **{variant: False})
        wrong = oracle.logits(tokens)
        assert np.abs(got - wrong).max() / wrong.std() > 100 * tolerance("f32")[0], variant
        oracle = NumpyLlama(path, dtype=np.float64)


# Sliding-window attention (Mistral's layers; Gemma 3's local ones): a window of 6 over 20
# tokens, through every KV cache and pass shape — one pass, chunks of 3 and 7 (queries
# whose prefix is inside the window go in blocks, later ones alone over their window), one
# token per step.
@pytest.mark.parametrize("kv_mode", ["dense", "full", "mixed"])
@pytest.mark.parametrize("chunk", [0, 1, 3, 7])
def test_sliding_window_matches_oracle(specnode, tiny_model, tmp_path, kv_mode, chunk):
    path = tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=51,
                      window=6)
    oracle = NumpyLlama(path, dtype=np.float64)
    assert oracle.cfg.sliding_window == 6, oracle.cfg
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 51)
    extra = ["--kv-mode", kv_mode] + (["--chunk", str(chunk)] if chunk else [])
    got = specnode.logits(path, tokens, tmp_path / "logits.bin", *extra)
    tol = tolerance("f32") if kv_mode == "dense" else \
        tuple(a + b for a, b in zip(TOLERANCES["f32"], KV_EXTRA["f16"]))
    compare_logits(got, oracle.logits(tokens), tol, f"window6/{kv_mode}/chunk{chunk}")
    # The window matters: the oracle attending to the whole prefix is far off after it.
    full = dataclasses_replace_window(oracle)
    assert np.abs(got[6:] - full.logits(tokens)[6:]).max() / got.std() > 100 * tolerance("f32")[0]


def test_sliding_window_is_batch_invariant(specnode, tiny_model, tmp_path):
    """The page pool's windowed attention gives every query the bits it gets alone: one
    pass, chunks and single steps agree exactly (what greedy speculation relies on)."""
    path = tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=51,
                      window=6)
    tokens = token_list(NumpyLlama(path).cfg.vocab_size, N_TOKENS, 51)
    runs = [specnode.logits(path, tokens, tmp_path / f"l{c}.bin", "--kv-mode", "full",
                            *(["--chunk", str(c)] if c else [])) for c in (0, 1, 3, 7)]
    for c, got in zip((1, 3, 7), runs[1:]):
        assert np.array_equal(got, runs[0]), f"--chunk {c} differs from one pass"


def dataclasses_replace_window(oracle: NumpyLlama) -> NumpyLlama:
    import dataclasses
    oracle.cfg = dataclasses.replace(oracle.cfg, sliding_window=0)
    return oracle


@pytest.mark.parametrize("wtype", K_TYPES)
def test_k_quant_logits_match_oracle(specnode, tiny_model, tmp_path, wtype):
    """K-quant files (as Q4_K_M / Q5_K_M / Q6_K GGUFs store their matrices): gguf-py's own
    decoder is the reference for both the engine's K-quant decoding and its conversion."""
    layers, d_model, heads, kv_heads, ff = K_SHAPE
    path = tiny_model(layers=layers, d_model=d_model, heads=heads, kv_heads=kv_heads, ff=ff,
                      type=wtype, seed=11)
    oracle = NumpyLlama(path, dtype=np.float64)
    matrices = {n: t for n, t in oracle.types.items() if not n.endswith("norm.weight")}
    assert matrices and all(t.name == wtype.upper() for t in matrices.values()), matrices
    tokens = token_list(oracle.cfg.vocab_size, N_TOKENS, 11)
    got = specnode.logits(path, tokens, tmp_path / "logits.bin")
    compare_logits(got, oracle.logits(tokens), tolerance(wtype), f"k256/{wtype}")


def test_logits_are_causal(specnode, tiny_model, tmp_path):
    """A prefix's logits do not depend on the tokens after it (checked on the engine alone)."""
    path = tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=3)
    vocab = NumpyLlama(path, dtype=np.float64).cfg.vocab_size
    tokens = token_list(vocab, 12, 3)
    full = specnode.logits(path, tokens, tmp_path / "full.bin")
    part = specnode.logits(path, tokens[:5], tmp_path / "part.bin")
    np.testing.assert_allclose(part, full[:5], rtol=0, atol=tolerance("f32")[0] * full.std())
