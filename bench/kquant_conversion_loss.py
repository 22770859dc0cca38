#!/usr/bin/env python3
"""KL / perplexity cost of converting Gemma 3 270M's K-quant matrices at load (Q4_K -> Q4_1,
Q6_K -> Q8_0, as model/gguf/ggml_converted_types.h describes), measured with the NumPy
oracle: exact gguf-py dequantisation vs the converted values, same prompts. With --engine,
also the engine's own logits with native K-quant kernels (model/cpu/cpu_repack_kquant.h) and
with the conversion (SPECNODE_KQUANT_NATIVE=0), each against the exact oracle."""
import argparse
import json
import os
import subprocess
import tempfile
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "oracle"))
from numpy_llama import NumpyLlama  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--model", required=True, help="a GGUF with Q4_K / Q6_K matrices (Gemma 3 270M)")
ap.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"))
ap.add_argument("--tokens", type=int, default=300, help="positions per text")
ap.add_argument("--engine", action="store_true",
                help="also compare specnode's logits, native and converted, with the oracle")
args = ap.parse_args()
G, S = args.model, args.specnode
QT = gguf.GGMLQuantizationType
f16 = lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float32)

def q4k_to_q41(raw, rows, cols):
    """Q4_K blocks -> the Q4_1 values the engine computes with: each 32-value sub-block keeps
    its nibbles, d * sc and -dmin * m rounded to f16."""
    b = raw.reshape(-1, 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    sc = b[:, 4:16].astype(np.int32); qs = b[:, 16:144].astype(np.int32)
    S_, M_ = np.zeros((len(b), 8), np.int32), np.zeros((len(b), 8), np.int32)
    for j in range(8):
        if j < 4:
            S_[:, j] = sc[:, j] & 63; M_[:, j] = sc[:, j + 4] & 63
        else:
            S_[:, j] = (sc[:, j + 4] & 0xF) | ((sc[:, j - 4] >> 6) << 4)
            M_[:, j] = (sc[:, j + 4] >> 4) | ((sc[:, j] >> 6) << 4)
    q = np.zeros((len(b), 8, 32), np.int32)
    for c in range(4):
        q[:, 2 * c] = qs[:, 32 * c:32 * c + 32] & 0xF
        q[:, 2 * c + 1] = qs[:, 32 * c:32 * c + 32] >> 4
    scale = f16(d[:, None] * S_)      # Q4_1's d
    offs = f16(-(dmin[:, None] * M_))  # Q4_1's m
    return (scale[..., None] * q + offs[..., None]).reshape(rows, cols)

def to_q80(x):
    """Q8_0 round trip of exact values: d = f16(max|x| / 127), q = round(x / d)."""
    xb = x.reshape(-1, 32)
    amax = np.abs(xb).max(1, keepdims=True)
    d = f16(amax / 127.0)
    q = np.clip(np.round(np.where(d > 0, xb / np.where(d > 0, d, 1), 0)), -127, 127)
    return (q * d).reshape(x.shape)

exact = NumpyLlama(G)
conv = NumpyLlama(G)
r = gguf.GGUFReader(G)
n_q4k = n_q6k = 0
for t in r.tensors:
    if t.tensor_type == QT.Q4_K:
        rows, cols = int(t.shape[1]), int(t.shape[0])
        conv.w[t.name] = q4k_to_q41(np.asarray(t.data).reshape(-1), rows, cols); n_q4k += 1
    elif t.tensor_type == QT.Q6_K:
        conv.w[t.name] = to_q80(exact.w[t.name]); n_q6k += 1
print("converted", n_q4k, "Q4_K ->Q4_1 and", n_q6k, "Q6_K -> Q8_0")
for name in ["blk.0.attn_output.weight", "blk.0.ffn_down.weight"]:
    e, c = exact.w[name], conv.w[name]
    print(name, "rel RMS err", float(np.sqrt(((e - c) ** 2).mean()) / np.sqrt((e ** 2).mean())))
texts = [(ROOT / "tests/data/kv-eval/01-lighthouse-history.txt").read_text()[:1500],
         "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n    pivot = xs[0]\n    left = [x for x in xs[1:] if x < pivot]\n    right = [x for x in xs[1:] if x >= pivot]\n    return quicksort(left) + [pivot] + quicksort(right)\n"]
def engine_logits(ids, native):
    env = dict(os.environ, SPECNODE_KQUANT_NATIVE="1" if native else "0")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.bin"
        subprocess.run([S, "logits", "--model", G, "--tokens", ",".join(map(str, ids)), "--out",
                        str(out), "--kv-mode", "dense"], check=True, env=env, capture_output=True)
        return np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)

def logp(l):
    l = l - l.max(1, keepdims=True); return l - np.log(np.exp(l).sum(1, keepdims=True))

engine = {"native": ([], []), "converted": ([], [])}  # per mode: KL rows, logit diffs
kls, nll_e, nll_c, n = [], 0.0, 0.0, 0
for text in texts:
    ids = json.loads(subprocess.run([S, "tokenize", "--model", G, "--text", text], capture_output=True, text=True).stdout)["ids"][:args.tokens]
    le, lc = exact.logits(ids), conv.logits(ids)
    pe, pc = logp(le), logp(lc)
    if args.engine:
        for mode, (kl_rows, diffs) in engine.items():
            lg = engine_logits(ids, mode == "native")
            kl_rows.append((np.exp(pe) * (pe - logp(lg))).sum(1))
            diffs.append((lg - le).ravel())
    kls.append((np.exp(pe) * (pe - pc)).sum(1))
    tgt = np.array(ids[1:])
    nll_e += -pe[np.arange(len(tgt)), tgt].sum(); nll_c += -pc[np.arange(len(tgt)), tgt].sum(); n += len(tgt)
    print(len(ids), "tokens; argmax agreement", float((le.argmax(1) == lc.argmax(1)).mean()))
kl = np.concatenate(kls)
print(f"KL(exact||converted) mean {kl.mean():.2e} p99 {np.quantile(kl, 0.99):.2e} max {kl.max():.2e}")
print(f"perplexity exact {np.exp(nll_e / n):.4f} converted {np.exp(nll_c / n):.4f} (+{100 * (np.exp((nll_c - nll_e) / n) - 1):.3f}%) over {n} tokens")
for mode, (kl_rows, diffs) in engine.items():
    if not kl_rows:
        continue
    k, d = np.concatenate(kl_rows), np.concatenate(diffs)
    print(f"engine {mode}: KL(exact||engine) mean {k.mean():.2e} p99 {np.quantile(k, 0.99):.2e}"
          f" max {k.max():.2e}; logits RMS diff {np.sqrt((d ** 2).mean()):.4f}")
