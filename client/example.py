#!/usr/bin/env python3
"""Example: stream a chat reply from `specnode serve`, then show stats and health.

    ~/.cache/specnode/venv/bin/python client/example.py [--endpoint tcp://127.0.0.1:5555] \\
        "Explain what a KV cache is in two sentences."
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from specnode_client import SpecnodeClient, SpecnodeError  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("question", nargs="?", default="Write a haiku about GPUs.")
    ap.add_argument("--endpoint", default=os.environ.get("SPECNODE_ENDPOINT", "tcp://127.0.0.1:5555"))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--timeout-s", type=float, default=60)
    args = ap.parse_args()

    try:
        with SpecnodeClient(args.endpoint, timeout_s=args.timeout_s) as client:
            print("node:", client.health())
            # Stream a chat reply chunk by chunk.
            for chunk in client.stream(messages=[{"role": "user", "content": args.question}],
                                       max_tokens=args.max_tokens):
                print(chunk, end="", flush=True)
            r = client.last_result
            print(f"\n[{r.finish_reason}] {r.stats.get('completion_tokens')} tokens, "
                  f"TTFT {r.stats.get('ttft_ms', 0):.1f} ms, TPOT {r.stats.get('tpot_ms', 0):.1f} ms")

            # Or wait for the whole text (greedy, so the same every time).
            r = client.generate(prompt="The capital of France is", max_tokens=8, temperature=0)
            print(f"generate: {r.text!r} ({r.finish_reason})")

            # Errors come back as SpecnodeError with the node's code.
            try:
                client.generate(prompt="hi", max_tokens=0)
            except SpecnodeError as e:
                print(f"expected error: {e.code}: {e.message}")

            metrics = client.stats().get("metrics", "")
            print(f"stats: {len(metrics.splitlines())} lines of Prometheus metrics")
    except SpecnodeError as e:
        print(f"error: {e.code}: {e.message}", file=sys.stderr)
        return 3 if e.code == "timeout" else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
