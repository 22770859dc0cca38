"""Write small random llama GGUFs with the `gguf` package (for the oracle's own tests).

Independent of the engine's writer (`specnode tiny-model`): this is how the oracle is
checked before, and apart from, any comparison with the engine.
"""

from __future__ import annotations

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


def random_llama_weights(rng: np.random.Generator, n_layers: int, d_model: int, n_heads: int,
                         n_kv_heads: int, d_ff: int, vocab: int, tied: bool) -> dict[str, np.ndarray]:
    """float32 weights in numpy order ([out, in] for matrices)."""
    hd = d_model // n_heads

    def mat(o, i):
        return (rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((vocab, d_model)).astype(np.float32),
         "output_norm.weight": norm(d_model)}
    if not tied:
        w["output.weight"] = mat(vocab, d_model)
    for i in range(n_layers):
        b = f"blk.{i}."
        w[b + "attn_norm.weight"] = norm(d_model)
        w[b + "attn_q.weight"] = mat(n_heads * hd, d_model)
        w[b + "attn_k.weight"] = mat(n_kv_heads * hd, d_model)
        w[b + "attn_v.weight"] = mat(n_kv_heads * hd, d_model)
        w[b + "attn_output.weight"] = mat(d_model, n_heads * hd)
        w[b + "ffn_norm.weight"] = norm(d_model)
        w[b + "ffn_gate.weight"] = mat(d_ff, d_model)
        w[b + "ffn_up.weight"] = mat(d_ff, d_model)
        w[b + "ffn_down.weight"] = mat(d_model, d_ff)
    return w


def write_llama_gguf(path: str, weights: dict[str, np.ndarray], *, n_heads: int, n_kv_heads: int,
                     rope_base: float = 10000.0, eps: float = 1e-5, qtype: QT = QT.F32,
                     context: int = 256, tokenizer_model: str | None = None) -> None:
    """Write `weights` as a llama GGUF; 2-D weights stored as `qtype`, norms as F32.

    tokenizer_model: e.g. "no_vocab" so that llama.cpp accepts a file without a vocabulary."""
    emb = weights["token_embd.weight"]
    vocab, d_model = emb.shape
    n_layers = sum(1 for k in weights if k.endswith("attn_q.weight"))
    d_ff = weights["blk.0.ffn_gate.weight"].shape[0]
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(n_layers)
    w.add_context_length(context)
    w.add_embedding_length(d_model)
    w.add_feed_forward_length(d_ff)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv_heads)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_rope_dimension_count(d_model // n_heads)
    w.add_vocab_size(vocab)
    if tokenizer_model:
        w.add_tokenizer_model(tokenizer_model)
    for name, arr in weights.items():
        if arr.ndim == 2 and qtype != QT.F32:
            if qtype == QT.F16:
                w.add_tensor(name, arr.astype(np.float16))
            else:
                w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
