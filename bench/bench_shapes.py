#!/usr/bin/env python3
"""Speed and memory at real model shapes with random weights (`specnode tiny-model
--shape llama3-8b | llama3-70b-layer`: Llama-3-8B, and one layer of Llama-3-70B; Q4_0 by
default). Not a quality benchmark: the weights are seeded noise.

Per shape, in one run: this machine's read bandwidth (bench_peak), decode tokens/s at
batch 1 (`specnode bench`), the bytes its matmuls read per token and that as a fraction of
the bandwidth, and the KV bytes per token in each KV mode (`specnode generate`'s kv line).
The files are written once into --dir (minutes: 4.5 / 1.7 GB at Q4_0) and reused.

    bench/bench_shapes.py --threads 2 [--shapes llama3-8b,llama3-70b-layer] [--device cuda:0]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KV_MODES = ["full", "int8", "int4", "mixed"]


def run(cmd, timeout):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"))
    ap.add_argument("--peak", default=str(ROOT / "build" / "bench" / "bench_peak"))
    ap.add_argument("--shapes", default="llama3-8b,llama3-70b-layer")
    ap.add_argument("--type", default="q4_0", help="weight type of the written files")
    ap.add_argument("--dir", default=os.path.expanduser("~/.cache/specnode/shapes"))
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--decode-tokens", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()

    peak = json.loads(run([args.peak, "--threads", args.threads, "--json"], args.timeout)
                      .stdout.strip().splitlines()[-1]) if os.access(args.peak, os.X_OK) else {}
    read_gbs = float(peak.get("read_gbs_all") or 0.0)
    print(f"read bandwidth ({args.threads} threads): {read_gbs:.1f} GB/s")
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in args.shapes.split(","):
        path = Path(args.dir) / f"{shape}-{args.type}.gguf"
        if not path.is_file():
            t0 = time.monotonic()
            run([args.specnode, "tiny-model", "--shape", shape, "--type", args.type, "--out", path],
                args.timeout)
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.monotonic() - t0:.0f} s")
        bench = json.loads(run([args.specnode, "bench", "--model", path, "--threads", args.threads,
                                "--batch", "1", "--prompt-tokens", "16", "--decode-tokens",
                                args.decode_tokens, "--device", args.device, "--json"],
                               args.timeout).stdout.strip().splitlines()[-1])
        tps = bench["results"][0]["decode_tokens_per_s"]
        bytes_tok = bench["matmul_bytes_per_token"]
        kv = {}
        for mode in KV_MODES:
            p = run([args.specnode, "generate", "--model", path, "--prompt-ids", ",".join(["1"] * 80),
                     "--max-tokens", "4", "--temperature", "0", "--kv-mode", mode, "--kv-window",
                     "16", "--kv-demote-every", "8", "--threads", args.threads, "--device",
                     args.device, "--quiet"], args.timeout)
            m = re.search(r"kv: ([0-9.]+) KiB/token", p.stderr)
            kv[mode] = float(m.group(1)) if m else None
        frac = bytes_tok * tps / (read_gbs * 1e9) if read_gbs else None
        row = dict(shape=shape, type=args.type, file_gb=path.stat().st_size / 1e9,
                   decode_tokens_per_s=tps, matmul_bytes_per_token=bytes_tok,
                   fraction_of_read_bandwidth=frac, kv_kib_per_token=kv)
        rows.append(row)
        print(json.dumps(row))
    print("\nshape              type  decode tok/s  GB read/token  of bandwidth  KV KiB/token (full/int8/int4/mixed)")
    for r in rows:
        kv = "/".join(f"{r['kv_kib_per_token'][m]:.0f}" if r['kv_kib_per_token'][m] else "-" for m in KV_MODES)
        frac = f"{100 * r['fraction_of_read_bandwidth']:.0f}%" if r["fraction_of_read_bandwidth"] else "-"
        print(f"{r['shape']:<18} {r['type']:<5} {r['decode_tokens_per_s']:>12.2f} "
              f"{r['matmul_bytes_per_token'] / 1e9:>14.2f} {frac:>13}  {kv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
