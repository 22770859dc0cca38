"""An independent NumPy reference forward pass for Llama-architecture GGUF files
(and the llama-like qwen2 / qwen3 / gemma3 variants, see ARCHS).

It shares no code with the engine: weights are read and dequantised with the `gguf`
package (GGUFReader, gguf.quants.dequantize) and the forward pass is written from the
Llama definition:

    x = token_embd[ids]
    per layer:  h = RMSNorm(x) -> Q, K, V projections -> RoPE(Q, K)
                x = x + W_o . causal_GQA_attention(Q, K, V)
                h = RMSNorm(x);  x = x + W_down . (silu(W_gate h) * (W_up h))
    logits = head . RMSNorm(x)     (head = output.weight, or token_embd.weight when tied)

RoPE uses ggml's "NORM" mode: adjacent pairs (x[2i], x[2i+1]) are rotated by
pos * base^(-2i/n_rot). llama.cpp's HF->GGUF converter permutes the Q/K rows of Llama
models so that this mode reproduces the HF (NeoX-style) rotation.

Shapes: GGUFReader reports a tensor's dims in ggml order (ne0 = fastest = input dim),
while `tensor.data` / `dequantize` give the numpy row-major array, i.e. [out, in] for a
weight matrix. Every matrix here is [out, in] and is applied as x @ W.T.

Gemma 3 (arch "gemma3", from HF modeling_gemma3 Gemma3TextModel and llama.cpp's converter):
    x = token_embd[ids] * sqrt(d_model)
    per layer:  h = RMSNorm(x) -> Q, K, V -> per-head RMSNorm(Q), RMSNorm(K) -> NeoX RoPE
                x = x + RMSNorm_post_attn(W_o . attention(Q, K, V) with scale 1/sqrt(head_dim))
                x = x + RMSNorm_post_ffw(W_down . (gelu_tanh(W_gate h) * (W_up h))),  h = RMSNorm(x)
    logits = token_embd . RMSNorm(x)   (tied; no final-logit softcapping in Gemma 3)
Layer i is global iff (i + 1) % 6 == 0 (RoPE base = rope.freq_base, full causal attention);
the others are local: RoPE base 10000 and a `attention.sliding_window`-token window.
HF's Gemma RMSNorm multiplies by (1 + w); llama.cpp's convert_hf_to_gguf.py (Gemma3Model,
norm_shift = 1.0) stores w + 1 in every *norm.weight, so the stored weight is used as-is.

Usage:
    m = NumpyLlama("model.gguf")             # float32 math (dtype=np.float64 for tiny models)
    m.logits([1, 2, 3])                      # -> [3, vocab] logits, one row per position
    m.logits(ids, rows=[-1])                 # -> [1, vocab]: head for the chosen positions only
    ids, gaps = m.greedy([1, 2, 3], 16)      # greedy continuation + top-2 logit gap per step
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

# Weight types whose matmuls an engine typically runs with 8-bit quantised activations
# (llama.cpp quantises the activation to Q8_0/Q8_1 for these). Used only by the optional
# `act_sim` simulation below, to estimate how far an honest engine can drift from us.
QUANTISED_TYPES = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int
    n_rot: int            # RoPE dimensions per head (usually head_dim)
    rope_base: float
    rms_eps: float
    vocab_size: int
    arch: str = "llama"
    rope_neox: bool = False   # rotate (i, i + n_rot/2) as HF's rotate_half, not (2i, 2i+1)
    qkv_bias: bool = False    # Qwen2: q/k/v projections carry biases
    qk_norm: bool = False     # Qwen3: RMSNorm over each head of q and k before RoPE
    sliding_window: int = 0   # > 0: a token attends to its last `sliding_window` positions
    # Gemma 3 (all defaults = off, i.e. the llama behaviour):
    embed_scale: bool = False     # multiply the embedding rows by sqrt(d_model)
    post_norms: bool = False      # RMSNorm the attention / MLP outputs (post_attention_norm,
                                  # post_ffw_norm) before each residual add
    geglu: bool = False           # MLP activation gelu_tanh(gate) * up instead of silu(gate) * up
    swa_period: int = 0           # > 0: only layers with (i + 1) % swa_period != 0 use the
                                  # sliding window (and rope_base_local); 0: every layer does
    rope_base_local: float = 0.0  # RoPE base of the sliding-window layers (0: rope_base)
    rope_scale_global: float = 1.0  # linear RoPE scaling factor of the global layers (positions / f)
    attn_scale: float = 0.0       # attention score scale (0: 1/sqrt(head_dim))

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` uses the sliding window (and the local RoPE base)."""
        if self.sliding_window <= 0:
            return False
        return self.swa_period <= 0 or (layer + 1) % self.swa_period != 0

    def layer_rope(self, layer: int) -> tuple[float, float]:
        """(RoPE base, linear position scale factor) of `layer`."""
        if self.swa_period > 0 and self.is_sliding(layer):
            return (self.rope_base_local or self.rope_base), 1.0
        return self.rope_base, self.rope_scale_global


# What each supported architecture changes, from the published model definitions (Hugging
# Face's modeling_qwen2 / modeling_qwen3: rotate_half RoPE, `bias=True` on q/k/v_proj,
# q_norm / k_norm over head_dim) — written here independently of the engine's table.
# gemma3 (HF modeling_gemma3 / Gemma3TextConfig; llama.cpp's LLM_ARCH_GEMMA3 hparams):
# Gemma3TextScaledWordEmbedding (sqrt(hidden_size)), q_norm / k_norm, sandwich norms,
# gelu_pytorch_tanh GeGLU, layer_types "full_attention" iff (i + 1) % 6 == 0 (llama.cpp
# set_swa_pattern(6)), rope_local_base_freq 10000 (llama.cpp rope_freq_base_train_swa),
# rotate_half RoPE. Not in the GGUF, so fixed here.
ARCHS = {
    "llama": dict(),
    "qwen2": dict(rope_neox=True, qkv_bias=True),
    "qwen3": dict(rope_neox=True, qk_norm=True),
    "gemma3": dict(rope_neox=True, qk_norm=True, embed_scale=True, post_norms=True, geglu=True,
                   swa_period=6, rope_base_local=10000.0),
}


def _field(reader: gguf.GGUFReader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF metadata key {key!r} missing")
        return default
    v = f.contents()
    return v


def read_config(reader: gguf.GGUFReader, vocab_size: int) -> LlamaConfig:
    arch = _field(reader, "general.architecture", "llama")
    if arch not in ARCHS:
        raise ValueError(f"numpy_llama handles {sorted(ARCHS)} GGUFs, got {arch!r}")
    p = arch + "."
    d_model = int(_field(reader, p + "embedding_length"))
    n_heads = int(_field(reader, p + "attention.head_count"))
    head_dim = int(_field(reader, p + "attention.key_length", d_model // n_heads))
    n_layers = int(_field(reader, p + "block_count"))
    extra = dict(ARCHS[arch])
    # Linear RoPE scaling (HF rope_scaling {"type": "linear"}: positions / factor) on every
    # layer, except that Gemma 3 (4B+) applies it to the global layers only (HF resets the
    # local rotary to "default"; llama.cpp rope_freq_scale_train_swa = 1): layer_rope.
    scaling = str(_field(reader, p + "rope.scaling.type", "none"))
    if scaling == "linear":
        extra["rope_scale_global"] = float(_field(reader, p + "rope.scaling.factor"))
    elif scaling != "none":
        raise ValueError(f"{arch}: unsupported rope.scaling.type {scaling!r}")
    if arch == "gemma3":
        # llama.cpp (f_attention_scale) and Google's config use query_pre_attn_scalar =
        # head_dim except for the 27B (62 layers), where it is d_model / n_heads.
        q_scalar = (d_model / n_heads) if n_layers == 62 else head_dim
        extra["attn_scale"] = float(q_scalar) ** -0.5
    return LlamaConfig(
        n_layers=n_layers,
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(_field(reader, p + "attention.head_count_kv", n_heads)),
        d_ff=int(_field(reader, p + "feed_forward_length")),
        head_dim=head_dim,
        n_rot=int(_field(reader, p + "rope.dimension_count", head_dim)),
        rope_base=float(_field(reader, p + "rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        vocab_size=vocab_size,
        arch=arch,
        sliding_window=int(_field(reader, p + "attention.sliding_window", 0)),
        **extra,
    )


def dequantize_tensor(t) -> np.ndarray:
    """A GGUF tensor as float32 in numpy order ([out, in] for matrices)."""
    if t.tensor_type == QT.F32:
        arr = np.asarray(t.data, dtype=np.float32)
    elif t.tensor_type == QT.F16:
        arr = np.asarray(t.data).astype(np.float32)
    else:
        arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32)
    # ggml dims are reversed relative to numpy's row-major shape.
    want = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
    return arr.reshape(want)


# ----------------------------------------------------------------------------- math


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(ms + eps) * w


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (PyTorch's approximate="tanh", HF "gelu_pytorch_tanh")."""
    c = x.dtype.type(np.sqrt(2.0 / np.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + 0.044715 * x * x * x)))


def rope_cos_sin(positions: np.ndarray, n_rot: int, base: float, scale: float,
                 freq_factors: np.ndarray | None, dtype) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin [T, n_rot/2] of pair i's angle pos/scale * base^(-2i/n_rot), divided by
    freq_factors[i] when given (Llama 3.1's rope_freqs.weight: HF's rescaled inv_freq)."""
    inv_freq = base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)       # [half]
    if freq_factors is not None:
        inv_freq = inv_freq / freq_factors.astype(np.float64)
    ang = (positions.astype(np.float64) / scale)[:, None] * inv_freq[None, :]      # [T, half]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rope_norm(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float,
              scale: float = 1.0, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """ggml RoPE "NORM" mode on x [n_heads, T, head_dim] at absolute `positions` [T].

    Pair i = (x[2i], x[2i+1]) for 2i < n_rot is rotated by angle pos/scale * base^(-2i/n_rot);
    dims from n_rot on pass through unchanged.
    """
    half = n_rot // 2
    cos, sin = rope_cos_sin(positions, n_rot, base, scale, freq_factors, x.dtype)
    out = x.copy()
    x0 = x[..., 0:n_rot:2]
    x1 = x[..., 1:n_rot:2]
    out[..., 0:n_rot:2] = x0 * cos - x1 * sin
    out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    assert x0.shape[-1] == half
    return out


def rope_neox(x: np.ndarray, positions: np.ndarray, n_rot: int, base: float,
              scale: float = 1.0, freq_factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE as GPT-NeoX / HF's rotate_half on x [n_heads, T, head_dim]: dim i and dim
    i + n_rot/2 form a pair, turned by pos/scale * base^(-2i/n_rot); dims from n_rot on
    unchanged (scale: linear RoPE scaling factor)."""
    half = n_rot // 2
    cos, sin = rope_cos_sin(positions, n_rot, base, scale, freq_factors, x.dtype)
    out = x.copy()
    x0 = x[..., :half]
    x1 = x[..., half:n_rot]
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_rot] = x1 * cos + x0 * sin
    return out


def quantize_act_q8(x: np.ndarray, block: int = 32) -> np.ndarray:
    """Round-trip activations through Q8_0-style blocks (int8, one scale per 32 values).

    Not part of the reference forward; only used (act_sim=True) to measure how much an
    engine that quantises activations to 8 bits for quantised-weight matmuls can differ.
    """
    n = x.shape[-1]
    if n % block:
        return x
    xb = x.reshape(*x.shape[:-1], n // block, block)
    amax = np.max(np.abs(xb), axis=-1, keepdims=True)
    d = (amax / 127.0).astype(np.float16).astype(x.dtype)  # ggml stores the scale as fp16
    inv = np.where(d > 0, 1.0 / np.where(d > 0, d, 1), 0)
    q = np.clip(np.round(xb * inv), -127, 127)
    return (q * d).reshape(x.shape)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float values to bfloat16 (round to nearest even), returned in x's dtype."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.view(np.float32).astype(x.dtype)


def simulate_activation_rounding(x: np.ndarray, weight_type) -> np.ndarray:
    """What a llama.cpp-style engine does to a matmul's input for each weight type:
    F16 weights -> f16 activations, BF16 -> bf16, block-quantised -> Q8 blocks."""
    if weight_type in QUANTISED_TYPES:
        return quantize_act_q8(x)
    if weight_type == QT.F16:
        return x.astype(np.float16).astype(x.dtype)
    if weight_type == QT.BF16:
        return round_bf16(x)
    return x


def causal_gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos0: int,
                         window: int = 0, scale: float = 0.0) -> np.ndarray:
    """q [H, T, hd] for positions q_pos0..q_pos0+T-1; k, v [Hkv, S, hd] for positions 0..S-1.

    Query head h uses kv head h // (H / Hkv); window > 0 (HF's sliding_window mask): a query
    at position p sees keys at positions p - window < kpos <= p only. scale: the factor on
    q.k (0: 1/sqrt(hd)). Returns [T, H*hd].
    """
    n_heads, T, hd = q.shape
    n_kv, S, _ = k.shape
    group = n_heads // n_kv
    kk = np.repeat(k, group, axis=0)                      # [H, S, hd]
    vv = np.repeat(v, group, axis=0)
    if scale > 0:
        scores = (q @ kk.transpose(0, 2, 1)) * q.dtype.type(scale)   # [H, T, S]
    else:
        scores = (q @ kk.transpose(0, 2, 1)) / np.sqrt(hd)           # [H, T, S]
    qpos = q_pos0 + np.arange(T)[:, None]
    kpos = np.arange(S)[None, :]
    visible = kpos <= qpos
    if window > 0:
        visible &= kpos > qpos - window
    scores = np.where(visible, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    out = p @ vv                                          # [H, T, hd]
    return out.transpose(1, 0, 2).reshape(T, n_heads * hd)


# ----------------------------------------------------------------------------- model


class KVCache:
    """Per-layer K and V after RoPE: lists of [n_kv_heads, S, head_dim] arrays."""

    def __init__(self, n_layers: int):
        self.k: list[np.ndarray | None] = [None] * n_layers
        self.v: list[np.ndarray | None] = [None] * n_layers
        self.length = 0

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.k[layer] is None:
            self.k[layer], self.v[layer] = k, v
        else:
            self.k[layer] = np.concatenate([self.k[layer], k], axis=1)
            self.v[layer] = np.concatenate([self.v[layer], v], axis=1)
        return self.k[layer], self.v[layer]


class NumpyLlama:
    def __init__(self, path: str, dtype=np.float32, act_sim: bool = False, kv_round: str | None = None):
        """Load and dequantise every weight of a llama GGUF once (kept in memory).

        dtype: compute precision (float32 is ample for SmolLM2; float64 makes the oracle's
        own rounding negligible for tiny models). act_sim: round matmul inputs the way a
        llama.cpp-style engine does for each weight type (f16 / bf16 / 8-bit blocks);
        diagnostics only, to size the tolerances of the comparisons with the engine.
        kv_round: None, "f16" or "bf16": store K/V (after RoPE) at that precision, as an
        engine with a half-precision KV cache does (diagnostics only).
        """
        self.path = str(path)
        self.dtype = np.dtype(dtype)
        self.act_sim = act_sim
        self.kv_round = kv_round
        reader = gguf.GGUFReader(self.path)
        tensors = {t.name: t for t in reader.tensors}
        self.types = {name: t.tensor_type for name, t in tensors.items()}
        self.w = {name: dequantize_tensor(t).astype(self.dtype, copy=False) for name, t in tensors.items()}
        emb = self.w["token_embd.weight"]
        self.cfg = read_config(reader, vocab_size=emb.shape[0])
        self.tied = "output.weight" not in self.w
        self.head_name = "token_embd.weight" if self.tied else "output.weight"
        self._check_shapes()
        self.eos_id = int(_field(reader, "tokenizer.ggml.eos_token_id", -1))

    def _check_shapes(self) -> None:
        c = self.cfg
        q_out, kv_out = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        want = {
            "token_embd.weight": (c.vocab_size, c.d_model),
            "output_norm.weight": (c.d_model,),
            self.head_name: (c.vocab_size, c.d_model),
        }
        for i in range(c.n_layers):
            b = f"blk.{i}."
            want.update({
                b + "attn_norm.weight": (c.d_model,),
                b + "attn_q.weight": (q_out, c.d_model),
                b + "attn_k.weight": (kv_out, c.d_model),
                b + "attn_v.weight": (kv_out, c.d_model),
                b + "attn_output.weight": (c.d_model, q_out),
                b + "ffn_norm.weight": (c.d_model,),
                b + "ffn_gate.weight": (c.d_ff, c.d_model),
                b + "ffn_up.weight": (c.d_ff, c.d_model),
                b + "ffn_down.weight": (c.d_model, c.d_ff),
            })
            if c.qkv_bias:
                want.update({b + "attn_q.bias": (q_out,), b + "attn_k.bias": (kv_out,),
                             b + "attn_v.bias": (kv_out,)})
            if c.qk_norm:
                want.update({b + "attn_q_norm.weight": (c.head_dim,),
                             b + "attn_k_norm.weight": (c.head_dim,)})
            if c.post_norms:
                want.update({b + "post_attention_norm.weight": (c.d_model,),
                             b + "post_ffw_norm.weight": (c.d_model,)})
        for name, shape in want.items():
            if name not in self.w:
                raise ValueError(f"{self.path}: tensor {name} missing")
            if self.w[name].shape != shape:
                raise ValueError(f"{self.path}: {name} has shape {self.w[name].shape}, expected {shape}")
        if c.n_heads % c.n_kv_heads:
            raise ValueError(f"n_heads {c.n_heads} not a multiple of n_kv_heads {c.n_kv_heads}")

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        if self.act_sim:
            x = simulate_activation_rounding(x, self.types[name])
        y = x @ self.w[name].T
        bias = name.removesuffix(".weight") + ".bias"
        if self.cfg.qkv_bias and bias in self.w:
            y = y + self.w[bias]
        return y

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layers)

    def layer(self, i: int, x: np.ndarray, pos0: int, cache: KVCache) -> np.ndarray:
        """Transformer block i on the residual stream x [T, d] at positions pos0..pos0+T-1;
        appends its K/V to `cache` (cache.length is not advanced). Returns the new x."""
        c = self.cfg
        T = x.shape[0]
        positions = pos0 + np.arange(T)
        rope = rope_neox if c.rope_neox else rope_norm
        b = f"blk.{i}."
        h = rms_norm(x, self.w[b + "attn_norm.weight"], c.rms_eps)
        q = self._linear(h, b + "attn_q.weight").reshape(T, c.n_heads, c.head_dim).transpose(1, 0, 2)
        k = self._linear(h, b + "attn_k.weight").reshape(T, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        v = self._linear(h, b + "attn_v.weight").reshape(T, c.n_kv_heads, c.head_dim).transpose(1, 0, 2)
        if c.qk_norm:
            q = rms_norm(q, self.w[b + "attn_q_norm.weight"], c.rms_eps)
            k = rms_norm(k, self.w[b + "attn_k_norm.weight"], c.rms_eps)
        base, scale = c.layer_rope(i)
        factors = self.w.get("rope_freqs.weight")
        q = rope(q, positions, c.n_rot, base, scale, factors)
        k = rope(k, positions, c.n_rot, base, scale, factors)
        if self.kv_round == "f16":
            k, v = k.astype(np.float16).astype(self.dtype), v.astype(np.float16).astype(self.dtype)
        elif self.kv_round == "bf16":
            k, v = round_bf16(k), round_bf16(v)
        k_all, v_all = cache.append(i, k, v)
        window = c.sliding_window if c.is_sliding(i) else 0
        attn = causal_gqa_attention(q, k_all, v_all, pos0, window, c.attn_scale)
        a = self._linear(attn, b + "attn_output.weight")
        if c.post_norms:
            a = rms_norm(a, self.w[b + "post_attention_norm.weight"], c.rms_eps)
        x = x + a
        h = rms_norm(x, self.w[b + "ffn_norm.weight"], c.rms_eps)
        g = self._linear(h, b + "ffn_gate.weight")
        u = self._linear(h, b + "ffn_up.weight")
        act = gelu_tanh(g) if c.geglu else silu(g)
        f = self._linear(act * u, b + "ffn_down.weight")
        if c.post_norms:
            f = rms_norm(f, self.w[b + "post_ffw_norm.weight"], c.rms_eps)
        x = x + f
        return x

    def forward(self, token_ids: Sequence[int], cache: KVCache,
                rows: Sequence[int] | None = None) -> np.ndarray:
        """Run `token_ids` at positions cache.length.. ; returns logits [n, vocab] (float64).

        rows: indices into token_ids (negative allowed) whose logits are wanted; the output
        head (the costliest matmul for a 262k vocabulary) then runs for those rows only and
        the result is [len(rows), vocab]. None: every row.
        """
        c = self.cfg
        ids = np.asarray(token_ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("token_ids must be a non-empty 1-D sequence")
        if ids.min() < 0 or ids.max() >= c.vocab_size:
            raise ValueError(f"token id out of range [0, {c.vocab_size})")
        T, pos0 = ids.size, cache.length
        x = self.embed(ids)                                                # [T, d]
        for i in range(c.n_layers):
            x = self.layer(i, x, pos0, cache)
        cache.length += T
        if rows is not None:
            x = x[np.asarray(rows, dtype=np.int64)]
        return self.head(x)

    def embed(self, ids: np.ndarray) -> np.ndarray:
        """The residual stream entering layer 0: embedding rows [T, d] (scaled for Gemma)."""
        x = self.w["token_embd.weight"][np.asarray(ids, dtype=np.int64)].astype(self.dtype)
        if self.cfg.embed_scale:
            # llama.cpp scales by sqrtf(n_embd) in f32; HF casts the normaliser to the hidden
            # dtype first (bf16: sqrt(640) = 25.298 -> 25.25), a 0.2% difference we don't model.
            x = x * self.dtype.type(np.sqrt(self.cfg.d_model))
        return x

    def head(self, x: np.ndarray) -> np.ndarray:
        """Final RMSNorm and output head on residual rows x [n, d] -> logits [n, vocab] (float64)."""
        x = rms_norm(x, self.w["output_norm.weight"], self.cfg.rms_eps)
        return self._linear(x, self.head_name).astype(np.float64)

    def logits(self, token_ids: Sequence[int], rows: Sequence[int] | None = None) -> np.ndarray:
        """Logits [n, vocab] for every position of `token_ids` (fresh cache); with rows, only
        for those positions ([len(rows), vocab])."""
        return self.forward(token_ids, self.new_cache(), rows=rows)

    def greedy(self, prompt_ids: Sequence[int], n: int, stop_at_eos: bool = False):
        """Greedy-decode n tokens after prompt_ids.

        Returns (generated_ids, gaps): gaps[i] is the top-1 minus top-2 logit at the step
        that produced generated_ids[i] (how close that choice was to a tie).
        """
        cache = self.new_cache()
        logits = self.forward(prompt_ids, cache)[-1]
        out: list[int] = []
        gaps: list[float] = []
        for step in range(n):
            tok, gap = argmax_and_gap(logits)
            out.append(tok)
            gaps.append(gap)
            if (stop_at_eos and tok == self.eos_id) or step == n - 1:
                break
            logits = self.forward([tok], cache)[-1]
        return out, gaps


def argmax_and_gap(logits: np.ndarray) -> tuple[int, float]:
    """Index of the largest logit (lowest index on exact ties) and its margin over the runner-up."""
    best = int(np.argmax(logits))
    top2 = -np.partition(-logits, 1)[:2]
    return best, float(top2[0] - top2[1])


def top2_gaps(logits: np.ndarray) -> np.ndarray:
    """Row-wise top-1 minus top-2 logit for a [n, vocab] array."""
    part = -np.partition(-logits, 1, axis=-1)[:, :2]
    return part[:, 0] - part[:, 1]


@functools.lru_cache(maxsize=8)
def load_cached(path: str, dtype: str = "float32", act_sim: bool = False) -> NumpyLlama:
    """One dequantised copy per (file, dtype, act_sim) for the whole test session."""
    return NumpyLlama(path, dtype=np.dtype(dtype), act_sim=act_sim)
