#!/usr/bin/env python3
"""The draft->target path per domain as a cluster user runs it: `specnode serve` as an mpirun
job of 1 + T ranks (rank 0 the coordinator, the front ends and the draft; ranks 1..T the
target's tensor-parallel shards), driven over its OpenAI-compatible HTTP API with the
`openai` SDK, one node per configuration:

  target    speculation.draft none (the baseline), run first and again last (A/A noise)
  draft     the draft model on rank 0, the adaptive controller
  ngram     prompt lookup on rank 0, the adaptive controller

  ~/.cache/specnode/venv/bin/python bench/bench_spec_cluster.py \\
      --model <target.gguf> --draft <draft.gguf> --mpirun-tp 2 --per-domain 2 --max-tokens 96

Each request is a greedy chat completion of one prompt of bench/prompts/*.jsonl (domains
named by bench/prompts/router-rules.json, as bench/bench_spec.py does); the node's own done
stats give the decode time (total - TTFT), the drafted and accepted tokens and the target
passes. Per domain and configuration it reports acceptance, tokens per target pass, and
the decode speed-up against the first target-only node (the ratio counts, not the
milliseconds); every text must equal target-only's (the acceptance rule is exact). Writes
bench/results/spec-cluster-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from node_launch import start_node, stop_node

ROOT = Path(__file__).resolve().parents[1]


def load_prompts(per_domain: int) -> list[dict]:
    out = []
    for path in sorted((ROOT / "bench/prompts").glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out.extend(rows[:per_domain])
    return out


def run_config(args, name: str, draft: str, prompts: list[dict], log) -> list[dict]:
    body = (f"speculation:\n  draft: {draft}\n  k_max: {args.k_max}\n"
            f"router:\n  rules_file: {ROOT / 'bench/prompts/router-rules.json'}\n"
            f"kv:\n  mode: {args.kv_mode}\n")
    proc, port = start_node(args.specnode, args.model, args.threads, body, log, args.mpirun_tp)
    from openai import OpenAI
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0,
                    timeout=600)
    served = Path(args.model).name.removesuffix(".gguf")
    rows = []
    try:
        for i, p in enumerate(prompts):
            print(f"{name}: prompt {i + 1}/{len(prompts)}", file=sys.stderr)
            out = client.chat.completions.create(
                model=served, max_tokens=args.max_tokens, temperature=0,
                messages=[{"role": "user", "content": p["prompt"]}])
            st = out.model_extra["specnode"]
            rows.append({"set": p["domain"], "domain": st.get("domain", ""),
                         "text": out.choices[0].message.content,
                         "tokens": st["completion_tokens"], "drafted": st["drafted"],
                         "accepted": st["accepted"], "passes": st["target_passes"],
                         "decode_ms": st["total_ms"] - st["ttft_ms"]})
    finally:
        stop_node(proc)
    return rows


def summarise(results: dict, domains: list[str]) -> dict:
    base = results["target"]
    table = {}
    for name, rows in results.items():
        per = {}
        for d in domains:
            mine = [r for r in rows if r["set"] == d]
            ref = [r for r in base if r["set"] == d]
            tokens = sum(r["tokens"] for r in mine)
            drafted = sum(r["drafted"] for r in mine)
            # Decode time per token; the first token comes with the prefill (TTFT).
            ms_per_token = sum(r["decode_ms"] for r in mine) / max(1, tokens - len(mine))
            ref_ms = sum(r["decode_ms"] for r in ref) / max(1, sum(r["tokens"] for r in ref) - len(ref))
            per[d] = {
                "acceptance": sum(r["accepted"] for r in mine) / drafted if drafted else 0.0,
                "tokens_per_pass": tokens / max(1, sum(r["passes"] for r in mine)),
                "speedup": ref_ms / ms_per_token if ms_per_token > 0 else 0.0,
                "identical": sum(a["text"] == b["text"] for a, b in zip(mine, ref)),
                "n": len(mine),
                "routed_domains": sorted({r["domain"] for r in mine}),
            }
        table[name] = per
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the target")
    ap.add_argument("--draft", required=True, help="the draft model")
    ap.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"))
    ap.add_argument("--mpirun-tp", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="per rank")
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--kv-mode", default="auto")
    args = ap.parse_args()
    if args.mpirun_tp < 1:
        sys.exit("--mpirun-tp must be >= 1 (this benchmark measures the mpirun path)")
    prompts = load_prompts(args.per_domain)
    domains = sorted({p["domain"] for p in prompts})
    results = {}
    with open(os.devnull, "w") as log:
        results["target"] = run_config(args, "target", "none", prompts, log)
        results["draft"] = run_config(args, "draft", args.draft, prompts, log)
        results["ngram"] = run_config(args, "ngram", "ngram", prompts, log)
        results["target (A/A)"] = run_config(args, "target (A/A)", "none", prompts, log)
    table = summarise(results, domains)
    print(f"{'config':14s} {'domain':10s} {'accept':>7s} {'tok/pass':>8s} {'speedup':>8s} same")
    for name, per in table.items():
        for d, r in per.items():
            print(f"{name:14s} {d:10s} {100 * r['acceptance']:6.1f}% {r['tokens_per_pass']:8.2f} "
                  f"{r['speedup']:7.2f}x {r['identical']}/{r['n']}")
    report = {"date": dt.datetime.now().isoformat(timespec="seconds"),
              "model": Path(args.model).name, "draft": Path(args.draft).name,
              "mpirun_tp": args.mpirun_tp, "threads_per_rank": args.threads,
              "max_tokens": args.max_tokens, "kv_mode": args.kv_mode, "table": table,
              "requests": results}
    out = ROOT / "bench" / "results" / f"spec-cluster-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
