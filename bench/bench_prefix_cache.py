#!/usr/bin/env python3
"""What the prefix cache buys: TTFT of requests sharing a long system prompt, with
`kv.prefix_cache` on vs off, side by side on one machine (two nodes started in turn,
rounds alternating; the ratio is what counts, not the milliseconds). Drives each node
through its own OpenAI-compatible HTTP API with the `openai` SDK, as a user would.

  ~/.cache/specnode/venv/bin/python bench/bench_prefix_cache.py \\
      --model ~/.cache/specnode/models/SmolLM2-135M-Instruct.Q4_1.gguf --rounds 3

With --mpirun-tp T the nodes are mpirun jobs of 1 + T ranks (rank 0 the front end, ranks
1..T the target's tensor-parallel shards, each keeping the prefix cache of its KV heads:
docs/kv-events.md), e.g. --mpirun-tp 3 for SmolLM2 (3 KV heads); --threads is then per rank.

Each round: one warm-up request (fills the cache with the shared prefix), then --requests
chat requests with the shared system prompt and a different question each, one at a time,
max_tokens 1 (TTFT is the prefill). Reports the node's own TTFT (done stats) median per
mode, the on/off ratio, and the cached tokens per request; writes
bench/results/prefix-cache-<date>.json.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path

from node_launch import start_node, stop_node

ROOT = Path(__file__).resolve().parents[1]
SYSTEM = ("You are a careful assistant for a hardware store. " +
          "Answer briefly and name the aisle where each item is found. " * 40)


def start_prefix_node(specnode: str, model: str, threads: int, prefix_cache: bool, log,
                      tp: int = 0):
    body = (f"speculation:\n  draft: none\n"
            f"kv:\n  prefix_cache: {'true' if prefix_cache else 'false'}\n")
    return start_node(specnode, model, threads, body, log, tp, timeout_s=180)


def run_round(port: int, model: str, n: int, round_index: int):
    from openai import OpenAI
    c = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    ask = lambda q: c.chat.completions.create(
        model=model, max_tokens=1, temperature=0,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
    ask("Where are the hammers?")  # warm-up: the shared prefix is now cached (when on)
    ttft, cached, prompt = [], [], []
    for i in range(n):
        out = ask(f"Question {round_index}-{i}: where do I find item number {i * 7 + 3}?")
        ttft.append(out.model_extra["specnode"]["ttft_ms"])
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
        prompt.append(out.usage.prompt_tokens)
    return ttft, cached, prompt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--mpirun-tp", type=int, default=0,
                    help="serve as an mpirun job with a target over this many ranks")
    args = ap.parse_args()
    served = Path(args.model).name.removesuffix(".gguf")
    results = {True: [], False: []}
    cached_seen, prompt_len = [], 0
    with open(os.devnull, "w") as log:
        for r in range(args.rounds):
            for mode in ((True, False) if r % 2 == 0 else (False, True)):
                proc, port = start_prefix_node(args.specnode, args.model, args.threads, mode,
                                               log, args.mpirun_tp)
                try:
                    ttft, cached, prompt = run_round(port, served, args.requests, r)
                finally:
                    stop_node(proc)
                results[mode].extend(ttft)
                prompt_len = max(prompt)
                if mode:
                    cached_seen.extend(cached)
                else:
                    assert not any(cached), "prefix cache off, yet cached tokens reported"
    on, off = statistics.median(results[True]), statistics.median(results[False])
    report = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "model": served, "threads": args.threads, "rounds": args.rounds,
        "target": f"mpirun, TP {args.mpirun_tp}" if args.mpirun_tp else "one process",
        "requests_per_round": args.requests, "prompt_tokens": prompt_len,
        "cached_tokens_median": statistics.median(cached_seen),
        "ttft_ms_median": {"prefix_cache_on": on, "prefix_cache_off": off},
        "ttft_ratio_off_over_on": off / on,
    }
    print(json.dumps(report, indent=2))
    tag = f"-tp{args.mpirun_tp}" if args.mpirun_tp else ""
    out = ROOT / "bench" / "results" / f"prefix-cache{tag}-{dt.date.today().isoformat()}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
