#!/usr/bin/env python3
"""Decode benchmark: specnode vs llama.cpp (llama-cpp-python) on the same GGUF.

One run measures, in interleaved rounds (specnode, llama.cpp, specnode, llama.cpp, ...):
  * specnode prefill and decode tokens/s at batch 1, 4, 16, via
      specnode bench --model M --threads T --batch 1,4,16 --prompt-tokens P --decode-tokens D --json
  * llama.cpp's batched prefill and decode at every batch size through its own
    llama-batched-bench (--llama-tools DIR, default $SPECNODE_LLAMA_TOOLS/bin or
    ~/.cache/specnode/llama-tools/bin, built by bench/setup-llama-cpp; skipped with a note
    when missing): -npp P -ntg D -npl <batches>, prompts not shared, --output-format jsonl
  * llama.cpp decode tokens/s at batch 1 through llama-cpp-python (n_threads =
    n_threads_batch = T): a P-token prompt, then D greedy tokens; only the decode loop is
    timed (prefill is reported separately). Each llama.cpp round runs in a fresh child
    process so its worker threads cannot linger into specnode's turn.
It reports medians and the median of the per-round ratio specnode/llama.cpp (decode,
batch 1), writes JSON to bench/results/decode-<date>.json and prints a table. With
bench_peak built (build/bench/bench_peak; --peak PATH, --no-peak to skip), it first measures
this machine's limits on the same threads and states each specnode row as a fraction of
them: decode at batch 1 against read bandwidth (weight bytes read per token x tokens/s),
prefill and batched decode against the multiply-add peak of the activation path in use
(int16 vpmaddwd or int8; 2 x multiply-adds per token x tokens/s).

llama-cpp-python is installed by bench/setup-llama-cpp (benchmarks only, never tests).
Run with the venv's python:  ~/.cache/specnode/venv/bin/python bench/bench_decode.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------ llama.cpp side


def llama_worker(model: str, threads: int, prompt_tokens: int, decode_tokens: int) -> dict:
    """Runs in a child process: one llama.cpp prefill + greedy decode, timed."""
    import numpy as np
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model, n_ctx=prompt_tokens + decode_tokens + 16,
                          n_batch=max(prompt_tokens, 32), n_threads=threads, n_threads_batch=threads,
                          logits_all=False, verbose=False)
    prompt = synthetic_prompt(llm, prompt_tokens)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    n_vocab = llm.n_vocab()
    generated = []
    for _ in range(decode_tokens):
        # Last position's logits straight from the context (llm.scores is only filled
        # when logits_all=True, which would also make prefill compute every row's head).
        logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
        tok = int(np.argmax(logits))
        generated.append(tok)
        llm.eval([tok])
    t2 = time.perf_counter()
    return {"prefill_tokens_per_s": prompt_tokens / (t1 - t0),
            "decode_tokens_per_s": decode_tokens / (t2 - t1),
            "llama_cpp_python_version": llama_cpp.__version__,
            "generated_head": generated[:8]}


def synthetic_prompt(llm, n: int) -> list[int]:
    """n tokens of ordinary English (repeated), so prefill behaves like a real prompt."""
    text = ("A key-value cache stores the attention keys and values of tokens already seen, "
            "so each new token attends to them without recomputing the whole prefix. ")
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    return (ids * (n // len(ids) + 1))[:n]


def run_llama(args) -> dict:
    cmd = [sys.executable, __file__, "--_llama-worker", "--model", args.model,
           "--threads", str(args.threads), "--prompt-tokens", str(args.prompt_tokens),
           "--decode-tokens", str(args.decode_tokens)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"llama.cpp worker failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def llama_tools_dir(args) -> Path:
    if args.llama_tools:
        return Path(args.llama_tools)
    env = os.environ.get("SPECNODE_LLAMA_TOOLS")
    base = Path(env) if env else Path.home() / ".cache" / "specnode" / "llama-tools"
    return base / "bin"


def run_llama_batched(args) -> list[dict] | None:
    """llama-batched-bench at args.batch (prompts not shared), or None when not built."""
    exe = llama_tools_dir(args) / "llama-batched-bench"
    if not os.access(exe, os.X_OK):
        return None
    ctx = max(args.batch) * (args.prompt_tokens + args.decode_tokens) + 16
    cmd = [str(exe), "-m", args.model, "-t", str(args.threads), "-tb", str(args.threads),
           "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(args.prompt_tokens),
           "-ntg", str(args.decode_tokens), "-npl", ",".join(map(str, args.batch)),
           "--output-format", "jsonl"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    rows = []
    for line in p.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows.append({"batch": int(r["pl"]), "prefill_tokens_per_s": float(r["speed_pp"]),
                         "decode_tokens_per_s": float(r["speed_tg"])})
    if not rows:
        raise RuntimeError(f"llama-batched-bench printed no JSONL rows:\n{p.stdout[-2000:]}")
    return rows


# ------------------------------------------------------------------ specnode side


def run_peak(args) -> dict | None:
    """bench_peak --threads T --json, or None when it is not built / not wanted."""
    if args.no_peak or not os.access(args.peak, os.X_OK):
        return None
    p = subprocess.run([args.peak, "--threads", str(args.threads), "--json"], capture_output=True,
                       text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{args.peak} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def peak_gops(peak: dict, activations: str) -> float | None:
    """The all-threads multiply-add peak of the activation path (int16 or int8)."""
    best = None
    for loop in peak.get("loops", []):
        if loop["name"].startswith(activations + " "):
            best = max(best or 0.0, float(loop["gops_all"]))
    return best


def fractions(row: dict, meta: dict, peak: dict | None) -> dict:
    """A specnode row's fraction of this machine's limits (None when unknown)."""
    out = {"decode_of_bandwidth": None, "decode_of_compute": None, "prefill_of_compute": None}
    if not peak or not meta.get("matmul_macs_per_token"):
        return out
    gops = peak_gops(peak, meta.get("activations", "int16"))
    read = float(peak.get("read_gbs_all") or 0.0)
    ops = 2.0 * meta["matmul_macs_per_token"]
    if read > 0 and row["batch"] == 1:
        out["decode_of_bandwidth"] = meta["matmul_bytes_per_token"] * row["decode_tokens_per_s"] / (read * 1e9)
    if gops:
        # decode_tokens_per_s counts every sequence's tokens of the batch
        out["decode_of_compute"] = ops * row["decode_tokens_per_s"] / (gops * 1e9)
        out["prefill_of_compute"] = ops * row["prefill_tokens_per_s"] / (gops * 1e9)
    return out


def run_specnode(args) -> list[dict]:
    cmd = [args.specnode, "bench", "--model", args.model, "--threads", str(args.threads),
           "--batch", ",".join(map(str, args.batch)), "--prompt-tokens", str(args.prompt_tokens),
           "--decode-tokens", str(args.decode_tokens), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    obj = json.loads(lines[-1])
    rows = find_rows(obj)
    if not rows:
        raise RuntimeError(f"specnode bench JSON has no list of {{batch, ...}} rows: {lines[-1][:500]}")
    args.specnode_meta = {k: obj.get(k) for k in ("activations", "matmul_bytes_per_token",
                                                  "matmul_macs_per_token", "kernels")}
    return [{"batch": int(r["batch"]), "prefill_tokens_per_s": float(r["prefill_tokens_per_s"]),
             "decode_tokens_per_s": float(r["decode_tokens_per_s"])} for r in rows]


def find_rows(obj) -> list[dict]:
    """The list of per-batch rows, whatever key the engine puts it under."""
    if isinstance(obj, list) and obj and all(isinstance(r, dict) and "batch" in r for r in obj):
        return obj
    if isinstance(obj, dict):
        for v in obj.values():
            rows = find_rows(v)
            if rows:
                return rows
    return []


# ------------------------------------------------------------------ driver


def default_model() -> str:
    env = os.environ.get("SPECNODE_MODEL")
    if env:
        return env
    out = subprocess.run([str(ROOT / "scripts" / "fetch-model")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median(xs):
    return statistics.median(xs) if xs else None


def summarise(rounds: list[dict], batches: list[int], meta: dict | None = None,
              peak: dict | None = None) -> dict:
    summary: dict = {"specnode": {}, "llama_cpp": {}}
    for b in batches:
        rows = [r for rd in rounds for r in rd.get("specnode") or [] if r["batch"] == b]
        med = {"batch": b,
               "prefill_tokens_per_s": median([r["prefill_tokens_per_s"] for r in rows]),
               "decode_tokens_per_s": median([r["decode_tokens_per_s"] for r in rows])}
        if med["decode_tokens_per_s"] is not None and med["prefill_tokens_per_s"] is not None:
            med["of_limit"] = fractions(med, meta or {}, peak)
        del med["batch"]
        summary["specnode"][str(b)] = med
    ll = [rd["llama_cpp"] for rd in rounds if rd.get("llama_cpp")]
    summary["llama_cpp"]["1"] = {
        "prefill_tokens_per_s": median([r["prefill_tokens_per_s"] for r in ll]),
        "decode_tokens_per_s": median([r["decode_tokens_per_s"] for r in ll])}
    ratios = []
    for rd in rounds:
        sn = [r for r in rd.get("specnode") or [] if r["batch"] == 1]
        if sn and rd.get("llama_cpp"):
            ratios.append(sn[0]["decode_tokens_per_s"] / rd["llama_cpp"]["decode_tokens_per_s"])
    summary["decode_ratio_specnode_over_llama_cpp_batch1"] = {"per_round": ratios, "median": median(ratios)}
    # llama-batched-bench, per batch size: medians and per-round ratios specnode / llama.cpp.
    summary["llama_cpp_batched"] = {}
    for b in batches:
        lb = [r for rd in rounds for r in rd.get("llama_batched") or [] if r["batch"] == b]
        if not lb:
            continue
        decode_ratios, prefill_ratios = [], []
        for rd in rounds:
            sn = [r for r in rd.get("specnode") or [] if r["batch"] == b]
            ll = [r for r in rd.get("llama_batched") or [] if r["batch"] == b]
            if sn and ll:
                decode_ratios.append(sn[0]["decode_tokens_per_s"] / ll[0]["decode_tokens_per_s"])
                prefill_ratios.append(sn[0]["prefill_tokens_per_s"] / ll[0]["prefill_tokens_per_s"])
        summary["llama_cpp_batched"][str(b)] = {
            "prefill_tokens_per_s": median([r["prefill_tokens_per_s"] for r in lb]),
            "decode_tokens_per_s": median([r["decode_tokens_per_s"] for r in lb]),
            "decode_ratio": {"per_round": decode_ratios, "median": median(decode_ratios)},
            "prefill_ratio": {"per_round": prefill_ratios, "median": median(prefill_ratios)}}
    return summary


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def print_table(summary: dict, args) -> None:
    print(f"\nmodel {Path(args.model).name}, threads {args.threads}, prompt {args.prompt_tokens}, "
          f"decode {args.decode_tokens}, rounds {args.rounds} (medians)")
    print(f"{'engine':<12}{'batch':>6}{'prefill tok/s':>16}{'decode tok/s':>15}   of the limit")
    for b, r in summary["specnode"].items():
        if r["decode_tokens_per_s"] is None and r["prefill_tokens_per_s"] is None:
            continue
        lim = r.get("of_limit") or {}
        parts = []
        if lim.get("prefill_of_compute") is not None:
            parts.append(f"prefill {100 * lim['prefill_of_compute']:.0f}% of compute")
        if lim.get("decode_of_bandwidth") is not None:
            parts.append(f"decode {100 * lim['decode_of_bandwidth']:.0f}% of bandwidth")
        elif lim.get("decode_of_compute") is not None:
            parts.append(f"decode {100 * lim['decode_of_compute']:.0f}% of compute")
        print(f"{'specnode':<12}{b:>6}{fmt(r['prefill_tokens_per_s']):>16}"
              f"{fmt(r['decode_tokens_per_s']):>15}   {', '.join(parts)}")
    r = summary["llama_cpp"]["1"]
    if r["decode_tokens_per_s"] is not None:
        print(f"{'llama.cpp':<12}{1:>6}{fmt(r['prefill_tokens_per_s']):>16}{fmt(r['decode_tokens_per_s']):>15}")
    for b, r in summary.get("llama_cpp_batched", {}).items():
        print(f"{'llama.cpp*':<12}{b:>6}{fmt(r['prefill_tokens_per_s']):>16}{fmt(r['decode_tokens_per_s']):>15}"
              f"   specnode/llama.cpp: decode {fmt(r['decode_ratio']['median'], '.2f')}x, "
              f"prefill {fmt(r['prefill_ratio']['median'], '.2f')}x")
    if summary.get("llama_cpp_batched"):
        print("  (* llama-batched-bench, prompts not shared; ratios are medians of per-round ratios)")
    ratio = summary["decode_ratio_specnode_over_llama_cpp_batch1"]["median"]
    print(f"decode ratio specnode/llama.cpp at batch 1 (median of per-round ratios): {fmt(ratio, '.3f')}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="GGUF file (default: $SPECNODE_MODEL, else scripts/fetch-model)")
    ap.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"), help="engine binary")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16],
                    help="specnode batch sizes, comma-separated (default 1,4,16)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--peak", default=str(ROOT / "build" / "bench" / "bench_peak"),
                    help="bench_peak binary (this machine's limits)")
    ap.add_argument("--no-peak", action="store_true", help="do not measure the machine's limits")
    ap.add_argument("--skip-specnode", action="store_true", help="measure llama.cpp only")
    ap.add_argument("--skip-llama", action="store_true", help="measure specnode only")
    ap.add_argument("--llama-tools", help="folder with llama-batched-bench (default "
                    "$SPECNODE_LLAMA_TOOLS/bin or ~/.cache/specnode/llama-tools/bin)")
    ap.add_argument("--out", help="JSON output (default bench/results/decode-<date>.json)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per engine run")
    ap.add_argument("--_llama-worker", dest="llama_worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.llama_worker:
        print(json.dumps(llama_worker(args.model, args.threads, args.prompt_tokens, args.decode_tokens)))
        return 0
    args.model = args.model or default_model()
    if not args.skip_llama:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            print("llama-cpp-python is not installed in this interpreter; run bench/setup-llama-cpp "
                  "and use the venv's python (or pass --skip-llama)", file=sys.stderr)
            return 2
    if not args.skip_specnode and not os.access(args.specnode, os.X_OK):
        print(f"no specnode binary at {args.specnode} (build first, or --specnode PATH / --skip-specnode)",
              file=sys.stderr)
        return 2

    rounds, errors = [], []
    args.specnode_meta = {}
    peak = None
    try:
        peak = run_peak(args)
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
        errors.append(f"bench_peak: {e}")
        print(f"error: bench_peak: {e}", file=sys.stderr)
    if peak:
        print("limits: " + json.dumps(peak), file=sys.stderr)
    runners = {"specnode": run_specnode, "llama_cpp": run_llama, "llama_batched": run_llama_batched}
    if not args.skip_llama and not os.access(llama_tools_dir(args) / "llama-batched-bench", os.X_OK):
        print(f"note: no llama-batched-bench in {llama_tools_dir(args)} (bench/setup-llama-cpp builds "
              "it): no batched comparison", file=sys.stderr)
    for i in range(args.rounds):
        rd: dict = {"round": i + 1}
        for side in ("specnode", "llama_cpp", "llama_batched"):
            if (side == "specnode" and args.skip_specnode) or (side != "specnode" and args.skip_llama):
                continue
            try:
                got = runners[side](args)
                if got is not None:
                    rd[side] = got
            except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as e:
                errors.append(f"round {i + 1} {side}: {e}")
                print(f"error: round {i + 1} {side}: {e}", file=sys.stderr)
        print(f"round {i + 1}: " + json.dumps({k: v for k, v in rd.items() if k != "round"}), file=sys.stderr)
        rounds.append(rd)

    summary = summarise(rounds, args.batch, args.specnode_meta, peak)
    now = dt.datetime.now()
    result = {
        "date": now.isoformat(timespec="seconds"),
        "host": {"cpu": cpu_name(), "nproc": os.cpu_count(), "platform": platform.platform()},
        "model": args.model,
        "threads": args.threads, "batches": args.batch,
        "prompt_tokens": args.prompt_tokens, "decode_tokens": args.decode_tokens,
        "rounds": rounds, "summary": summary, "errors": errors,
        "limits": peak, "specnode": args.specnode_meta,
    }
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / f"decode-{now:%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(summary, args)
    print(f"wrote {out}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
