"""Checks of the NumPy oracle itself (no engine needed).

The oracle is compared with a deliberately naive scalar-loop Llama written from the
definition (per position, per head, per pair), on tiny GGUFs written here with
gguf.GGUFWriter. Shapes are all different (d_ff != d_model, n_kv_heads < n_heads,
vocab != anything) so a transposed matrix or a mixed-up head mapping cannot pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from numpy_llama import NumpyLlama, argmax_and_gap, rope_norm, top2_gaps
from tiny_gguf import random_llama_weights, write_llama_gguf

# inner dims are multiples of 32 (the quantised block size)
SHAPE = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=96, vocab=67)
TOKENS = [3, 17, 0, 66, 5, 5, 41]


# ------------------------------------------------------------------ naive reference


def naive_forward(w: dict[str, np.ndarray], tokens, n_heads, n_kv_heads, base=10000.0, eps=1e-5,
                  rope_mode="norm"):
    """Scalar-loop Llama forward in float64. rope_mode 'norm' rotates pairs (2i, 2i+1)
    (ggml NORM); 'neox' rotates pairs (i, i + hd/2) (HF rotate_half)."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    d = w["token_embd.weight"].shape[1]
    hd = d // n_heads
    n_layers = sum(1 for k in w if k.endswith("attn_q.weight"))
    group = n_heads // n_kv_heads
    head = w.get("output.weight", w["token_embd.weight"])

    def rmsnorm(x, g):
        return x / math.sqrt(sum(v * v for v in x) / len(x) + eps) * g

    def matvec(m, x):
        return np.array([sum(m[o, i] * x[i] for i in range(m.shape[1])) for o in range(m.shape[0])])

    def rope(vec, pos):
        out = vec.copy()
        for i in range(hd // 2):
            theta = pos * base ** (-2.0 * i / hd)
            a, b = (2 * i, 2 * i + 1) if rope_mode == "norm" else (i, i + hd // 2)
            out[a] = vec[a] * math.cos(theta) - vec[b] * math.sin(theta)
            out[b] = vec[a] * math.sin(theta) + vec[b] * math.cos(theta)
        return out

    keys = [[] for _ in range(n_layers)]   # keys[layer][pos] = [n_kv, hd]
    vals = [[] for _ in range(n_layers)]
    all_logits = []
    for pos, tok in enumerate(tokens):
        x = w["token_embd.weight"][tok].copy()
        for L in range(n_layers):
            b = f"blk.{L}."
            h = rmsnorm(x, w[b + "attn_norm.weight"])
            q = matvec(w[b + "attn_q.weight"], h).reshape(n_heads, hd)
            k = matvec(w[b + "attn_k.weight"], h).reshape(n_kv_heads, hd)
            v = matvec(w[b + "attn_v.weight"], h).reshape(n_kv_heads, hd)
            q = np.array([rope(q[j], pos) for j in range(n_heads)])
            k = np.array([rope(k[j], pos) for j in range(n_kv_heads)])
            keys[L].append(k)
            vals[L].append(v)
            attn = np.zeros(n_heads * hd)
            for j in range(n_heads):
                kvh = j // group
                s = [sum(q[j, e] * keys[L][p][kvh, e] for e in range(hd)) / math.sqrt(hd)
                     for p in range(pos + 1)]
                m = max(s)
                p_ = [math.exp(si - m) for si in s]
                z = sum(p_)
                for p in range(pos + 1):
                    attn[j * hd:(j + 1) * hd] += p_[p] / z * vals[L][p][kvh]
            x = x + matvec(w[b + "attn_output.weight"], attn)
            h = rmsnorm(x, w[b + "ffn_norm.weight"])
            g = matvec(w[b + "ffn_gate.weight"], h)
            u = matvec(w[b + "ffn_up.weight"], h)
            act = np.array([gi / (1 + math.exp(-gi)) * ui for gi, ui in zip(g, u)])
            x = x + matvec(w[b + "ffn_down.weight"], act)
        x = rmsnorm(x, w["output_norm.weight"])
        all_logits.append(matvec(head, x))
    return np.array(all_logits)


def hf_permute(m: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's Q/K row permutation (HF rotate_half -> ggml NORM)."""
    return m.reshape(n_head, 2, m.shape[0] // n_head // 2, *m.shape[1:]).swapaxes(1, 2).reshape(m.shape)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(1234)
    s = SHAPE
    return {tied: random_llama_weights(rng, s["n_layers"], s["d_model"], s["n_heads"], s["n_kv_heads"],
                                       s["d_ff"], s["vocab"], tied=tied)
            for tied in (False, True)}


def write(tmp_path, w, name, **kw):
    p = str(tmp_path / name)
    write_llama_gguf(p, w, n_heads=SHAPE["n_heads"], n_kv_heads=SHAPE["n_kv_heads"], **kw)
    return p


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("tied", [False, True])
def test_matches_naive_loop_f32(tmp_path, weights, tied):
    w = weights[tied]
    path = write(tmp_path, w, "m.gguf", rope_base=500.0, eps=1e-6)
    m = NumpyLlama(path, dtype=np.float64)
    assert m.tied == tied
    assert m.cfg.rope_base == 500.0 and abs(m.cfg.rms_eps - 1e-6) < 1e-12
    got = m.logits(TOKENS)
    want = naive_forward(w, TOKENS, SHAPE["n_heads"], SHAPE["n_kv_heads"], base=500.0, eps=1e-6)
    assert got.shape == (len(TOKENS), SHAPE["vocab"])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_incremental_kv_cache_equals_full_forward(tmp_path, weights):
    path = write(tmp_path, weights[False], "m.gguf")
    m = NumpyLlama(path, dtype=np.float64)
    full = m.logits(TOKENS)
    cache = m.new_cache()
    parts = [m.forward(TOKENS[:3], cache), m.forward(TOKENS[3:4], cache), m.forward(TOKENS[4:], cache)]
    np.testing.assert_allclose(np.concatenate(parts), full, rtol=0, atol=1e-10)


def test_greedy_matches_repeated_full_forward(tmp_path, weights):
    path = write(tmp_path, weights[True], "m.gguf")
    m = NumpyLlama(path, dtype=np.float64)
    ids, gaps = m.greedy(TOKENS[:3], 6)
    seq = list(TOKENS[:3])
    for tok, gap in zip(ids, gaps):
        last = m.logits(seq)[-1]
        want_tok, want_gap = argmax_and_gap(last)
        assert tok == want_tok
        assert abs(gap - want_gap) < 1e-9 and gap >= 0
        seq.append(tok)
    assert len(ids) == len(gaps) == 6


def test_hf_permutation_makes_norm_rope_equal_neox(tmp_path, weights):
    """The oracle's NORM RoPE on converter-permuted Q/K == HF's rotate_half on the originals."""
    w_hf = weights[False]
    w_gguf = dict(w_hf)
    for L in range(SHAPE["n_layers"]):
        b = f"blk.{L}."
        w_gguf[b + "attn_q.weight"] = hf_permute(w_hf[b + "attn_q.weight"], SHAPE["n_heads"])
        w_gguf[b + "attn_k.weight"] = hf_permute(w_hf[b + "attn_k.weight"], SHAPE["n_kv_heads"])
    path = write(tmp_path, w_gguf, "perm.gguf")
    got = NumpyLlama(path, dtype=np.float64).logits(TOKENS)
    want = naive_forward(w_hf, TOKENS, SHAPE["n_heads"], SHAPE["n_kv_heads"], rope_mode="neox")
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_rope_norm_is_complex_rotation():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 8))
    pos = np.array([0, 1, 7, 100, 4095])
    got = rope_norm(x, pos, n_rot=8, base=10000.0)
    z = x[..., 0::2] + 1j * x[..., 1::2]
    theta = pos[:, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    zr = z * np.exp(1j * theta)
    np.testing.assert_allclose(got[..., 0::2], zr.real, atol=1e-12)
    np.testing.assert_allclose(got[..., 1::2], zr.imag, atol=1e-12)
    np.testing.assert_allclose(got[:, 0], x[:, 0], atol=0)  # position 0 is the identity


# Relative RMS weight error that round-tripping N(0, 1/in) weights through each type
# causes (measured: F16 ~3e-4, BF16 ~1.6e-3, Q8_0 ~5e-3, Q4_0/Q4_1 ~8e-2), with ~2x room.
@pytest.mark.parametrize("qtype,tol", [(QT.F16, 1e-3), (QT.BF16, 4e-3), (QT.Q8_0, 1e-2),
                                       (QT.Q4_0, 0.15), (QT.Q4_1, 0.15)],
                         ids=lambda v: v.name if isinstance(v, QT) else str(v))
def test_quantised_files_load_to_the_right_weights(tmp_path, weights, qtype, tol):
    """Every weight type loads as [out, in] matrices close to the originals, and the
    forward runs on it (a transposed or mis-shaped dequantisation would be far off)."""
    w = weights[False]
    m = NumpyLlama(write(tmp_path, w, f"{qtype.name}.gguf", qtype=qtype), dtype=np.float64)
    assert m.types["blk.0.ffn_down.weight"] == qtype
    for name, orig in w.items():
        got = m.w[name]
        assert got.shape == orig.shape, name
        rel = np.sqrt(np.mean((got - orig) ** 2)) / orig.std() if orig.ndim == 2 else np.abs(got - orig).max()
        assert rel < (tol if orig.ndim == 2 else 1e-7), f"{name}: relative RMS error {rel:.3g}"
    logits = m.logits(TOKENS)
    assert logits.shape == (len(TOKENS), SHAPE["vocab"]) and np.isfinite(logits).all()


def test_top2_gaps():
    a = np.array([[1.0, 3.0, 2.5], [0.0, 0.0, -1.0]])
    np.testing.assert_allclose(top2_gaps(a), [0.5, 0.0])
