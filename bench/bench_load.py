#!/usr/bin/env python3
"""Load generator for `specnode serve`: N concurrent clients for T seconds over loopback.

Each client is its own ZeroMQ DEALER socket (its own connection). Requests arrive as a
Poisson process at --rate requests/s in total (each client at rate/N), or closed-loop with
--rate 0 (each client sends its next request as soon as the previous one ends). Prompts
come from bench/prompts/*.jsonl (mixed domains); SLA classes follow --sla-mix. At T the
generator stops submitting and waits (at most --drain-s) for the requests in flight.

Reports throughput (completed requests/s, generated tokens/s), TTFT and TPOT p50/p99
measured here (from the send time and token arrival times) and as the node reports them
(done.stats), SLA attainment per class (the fraction of that class's requests that met
both its p99 TTFT and TPOT targets), and an integrity check: every request got exactly one
terminal reply (done or error), nothing arrived after it, the streamed `tokens` chunks are
contiguous by `index` and add up to done.stats.completion_tokens, no message for an id
nobody sent. Writes bench/results/load-<date>.json and a latency CDF plot (.png, needs
matplotlib: pip install -r bench/requirements.txt).

  ~/.cache/specnode/venv/bin/python bench/bench_load.py --endpoint tcp://127.0.0.1:5555 \\
      --clients 16 --duration 30 --rate 0 --max-tokens 32 --sla-mix interactive:0.5,batch:0.5
  # the issue's criterion: the same closed-loop workload with 1 client, then 16
  ~/.cache/specnode/venv/bin/python bench/bench_load.py --compare-single --clients 16 \\
      --serve ~/.cache/specnode/models/SmolLM2-135M-Instruct.Q4_1.gguf

Exit status: 0 when the integrity check passes (and --min-ratio, if given, is met), 1
otherwise, 2 on usage errors, 3 when no node answers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

try:
    import zmq
except ImportError:  # pragma: no cover
    print("bench_load.py needs pyzmq (scripts/setup installs it into the venv)", file=sys.stderr)
    sys.exit(2)

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------
# Requests and their record
# ----------------------------------------------------------------------------------------

@dataclass
class Rec:
    id: str
    client: int
    domain: str
    sla: Optional[str]
    t_send: float
    accepted: int = 0
    chunks: List[Tuple[float, int, int]] = field(default_factory=list)  # (t, index, n_tokens)
    text_len: int = 0
    terminals: int = 0
    t_terminal: Optional[float] = None
    terminal: Optional[dict] = None
    after_terminal: int = 0
    text_only_chunks: int = 0
    t_last_msg: float = 0.0
    problems: List[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.terminal is not None and self.terminal.get("type") == "done"

    def tokens(self) -> int:
        return sum(n for _, _, n in self.chunks)

    def client_ttft_ms(self) -> Optional[float]:
        return (self.chunks[0][0] - self.t_send) * 1000 if self.chunks else None

    def client_tpot_ms(self) -> Optional[float]:
        n = self.tokens()
        if len(self.chunks) < 1 or n < 2:
            return None
        return (self.chunks[-1][0] - self.chunks[0][0]) * 1000 / (n - 1)


def load_prompts(directory: Path, domains: Optional[List[str]]) -> Dict[str, List[str]]:
    by_domain: Dict[str, List[str]] = {}
    for f in sorted(directory.glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            obj = json.loads(line)
            by_domain.setdefault(obj["domain"], []).append(obj["prompt"])
    if domains:
        missing = [d for d in domains if d not in by_domain]
        if missing:
            raise SystemExit(f"bench_load.py: no prompts for domain(s) {missing} in {directory}")
        by_domain = {d: by_domain[d] for d in domains}
    if not by_domain:
        raise SystemExit(f"bench_load.py: no prompts in {directory}/*.jsonl")
    return by_domain


def parse_mix(text: str) -> List[Tuple[str, float]]:
    """'interactive:0.5,batch:0.5' -> [(name, weight)]."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, w = part.partition(":")
        try:
            weight = float(w) if w else 1.0
        except ValueError:
            raise SystemExit(f"bench_load.py: --sla-mix: bad weight in '{part}'")
        if not name or weight < 0:
            raise SystemExit(f"bench_load.py: --sla-mix: bad entry '{part}'")
        out.append((name, weight))
    if out and sum(w for _, w in out) <= 0:
        raise SystemExit("bench_load.py: --sla-mix weights add up to 0")
    return out


def parse_targets(items: List[str]) -> Dict[str, Dict[str, float]]:
    """['interactive=1000/200'] -> {'interactive': {'ttft_p99_ms': 1000, 'tpot_p99_ms': 200}}"""
    out = {}
    for item in items:
        m = re.fullmatch(r"([A-Za-z0-9_.:-]+)=([0-9.]+)/([0-9.]+)", item.strip())
        if not m:
            raise SystemExit(f"bench_load.py: --sla-target wants NAME=TTFT_MS/TPOT_MS, got '{item}'")
        out[m.group(1)] = {"ttft_p99_ms": float(m.group(2)), "tpot_p99_ms": float(m.group(3))}
    return out


def targets_from_stats(stats: dict) -> Dict[str, Dict[str, float]]:
    """SLA targets from a `stats` reply, if the node publishes them: a JSON `sla_classes`
    (dict name -> {ttft_p99_ms, tpot_p99_ms} or list of {name, ...}), or metrics lines
    `specnode_sla_target_ms{sla="X",metric="ttft"|"tpot"} V`."""
    out: Dict[str, Dict[str, float]] = {}
    classes = stats.get("sla_classes") or stats.get("slas")
    if isinstance(classes, dict):
        classes = [dict(v, name=k) for k, v in classes.items() if isinstance(v, dict)]
    if isinstance(classes, list):
        for c in classes:
            if not isinstance(c, dict) or "name" not in c:
                continue
            ttft = next((v for k, v in c.items() if "ttft" in k and isinstance(v, (int, float))), None)
            tpot = next((v for k, v in c.items() if "tpot" in k and isinstance(v, (int, float))), None)
            if ttft is not None and tpot is not None:
                out[str(c["name"])] = {"ttft_p99_ms": float(ttft), "tpot_p99_ms": float(tpot)}
    if not out and isinstance(stats.get("metrics"), str):
        pat = re.compile(r'^specnode_sla_target_ms\{([^}]*)\}\s+([0-9.eE+-]+)', re.M)
        for labels, value in pat.findall(stats["metrics"]):
            lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
            if "sla" in lab and lab.get("metric") in ("ttft", "tpot"):
                out.setdefault(lab["sla"], {})[f"{lab['metric']}_p99_ms"] = float(value)
        out = {k: v for k, v in out.items() if len(v) == 2}
    return out


# ----------------------------------------------------------------------------------------
# Talking to the node
# ----------------------------------------------------------------------------------------

def one_shot(ctx: zmq.Context, endpoint: str, msg: dict, timeout_s: float) -> Optional[dict]:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IMMEDIATE, 1)
    s.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    s.connect(endpoint)
    try:
        s.send(json.dumps(msg).encode())
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not s.poll(int(left * 1000) + 1):
                return None
            frames = s.recv_multipart()
            body = next((f for f in reversed(frames) if f), b"")
            try:
                reply = json.loads(body)
            except ValueError:
                continue
            if isinstance(reply, dict) and reply.get("type") in (msg["type"], "error"):
                return reply
    except zmq.Again:
        return None
    finally:
        s.close(linger=0)


def wait_health(ctx, endpoint: str, timeout_s: float, proc=None) -> Optional[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return None
        h = one_shot(ctx, endpoint, {"type": "health"}, 1.0)
        if h is not None and h.get("type") == "health" and h.get("status") != "loading":
            return h
        time.sleep(0.2)
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------

def run_load(ctx, endpoint: str, n_clients: int, duration: float, rate: float,
             prompts: Dict[str, List[str]], sla_mix: List[Tuple[str, float]], args,
             label: str) -> Tuple[List[Rec], dict]:
    rng = random.Random(args.seed)
    domains = sorted(prompts)
    socks = []
    poller = zmq.Poller()
    for c in range(n_clients):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDTIMEO, 5000)
        s.setsockopt(zmq.RCVHWM, 0)
        s.connect(endpoint)
        poller.register(s, zmq.POLLIN)
        socks.append(s)
    sock_index = {s: c for c, s in enumerate(socks)}

    recs: Dict[Tuple[int, str], Rec] = {}
    inflight = [0] * n_clients
    seq = [0] * n_clients
    stray: List[dict] = []
    bad_frames = 0
    send_failures = 0
    per_client_rate = rate / n_clients if rate > 0 else 0.0

    t0 = time.monotonic()
    t_end = t0 + duration
    next_send = [t0 + (rng.expovariate(per_client_rate) if per_client_rate else 0.0)
                 for _ in range(n_clients)]

    def submit(c: int, now: float) -> None:
        nonlocal send_failures
        domain = rng.choice(domains)
        prompt = rng.choice(prompts[domain])
        sla = None
        if sla_mix:
            sla = rng.choices([n for n, _ in sla_mix], weights=[w for _, w in sla_mix])[0]
        rid = f"{label}-c{c}-{seq[c]}"
        seq[c] += 1
        msg = {"type": "submit", "id": rid, "max_tokens": args.max_tokens}
        if args.raw:
            msg["prompt"] = prompt
        else:
            msg["messages"] = [{"role": "user", "content": prompt}]
        if not args.no_domain:
            msg["domain"] = domain
        if sla:
            msg["sla"] = sla
        if args.temperature is not None:
            msg["temperature"] = args.temperature
            msg["seed"] = rng.randrange(1 << 31)
        t = time.monotonic()
        try:
            socks[c].send(json.dumps(msg).encode())
        except zmq.Again:
            send_failures += 1
            return
        recs[(c, rid)] = Rec(id=rid, client=c, domain=domain, sla=sla, t_send=t, t_last_msg=t)
        inflight[c] += 1

    def receive(c: int, frames: List[bytes], t: float) -> None:
        nonlocal bad_frames
        body = next((f for f in reversed(frames) if f), b"")
        try:
            m = json.loads(body)
            assert isinstance(m, dict)
        except (ValueError, AssertionError):
            bad_frames += 1
            return
        rid = m.get("id")
        rec = recs.get((c, rid)) if isinstance(rid, str) else None
        if rec is None:
            stray.append(m)
            return
        rec.t_last_msg = t
        typ = m.get("type")
        if rec.terminals > 0:
            rec.after_terminal += 1
            rec.problems.append(f"{typ} after the terminal reply")
            if typ in ("done", "error"):
                rec.terminals += 1
            return
        if typ == "accepted":
            rec.accepted += 1
            if rec.accepted > 1:
                rec.problems.append("accepted twice")
        elif typ == "tokens":
            ids = m.get("token_ids")
            n = len(ids) if isinstance(ids, list) else 0
            index = m.get("index")
            expected = rec.tokens()
            if index != expected:
                rec.problems.append(f"tokens index {index}, expected {expected}")
            if n == 0:
                # Allowed: a text-only chunk (e.g. the node flushing the replacement character
                # for an incomplete UTF-8 tail at the end). Counted, not an error.
                rec.text_only_chunks += 1
            rec.chunks.append((t, index if isinstance(index, int) else -1, n))
            rec.text_len += len(m.get("text", ""))
        elif typ in ("done", "error"):
            rec.terminals = 1
            rec.terminal = m
            rec.t_terminal = t
            inflight[c] -= 1
            if typ == "done":
                st = m.get("stats") or {}
                want = st.get("completion_tokens")
                if want != rec.tokens():
                    rec.problems.append(
                        f"streamed {rec.tokens()} tokens, done.stats.completion_tokens {want}")
        else:
            rec.problems.append(f"unexpected message type {typ!r}")

    drain_deadline = None
    while True:
        now = time.monotonic()
        if now < t_end:
            for c in range(n_clients):
                if per_client_rate:
                    while next_send[c] <= now and next_send[c] < t_end:
                        submit(c, now)
                        next_send[c] += rng.expovariate(per_client_rate)
                elif inflight[c] == 0:
                    submit(c, now)
            wait = min(0.05, max(0.0, min(next_send) - now) if per_client_rate else 0.05,
                       max(0.0, t_end - now))
        else:
            if drain_deadline is None:
                drain_deadline = t_end + args.drain_s
            if sum(inflight) == 0 or now >= drain_deadline:
                break
            # A request that has been silent for --timeout-s is given up on (counted lost).
            stalled = [r for r in recs.values()
                       if r.terminals == 0 and now - r.t_last_msg > args.timeout_s]
            if stalled and len(stalled) == sum(inflight):
                break
            wait = 0.05
        for s, _ in poller.poll(int(wait * 1000)):
            c = sock_index[s]
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                receive(c, frames, time.monotonic())
    t_last = max([r.t_terminal for r in recs.values() if r.t_terminal] or [time.monotonic()])
    # Grace period: catch anything sent after a terminal reply.
    grace_end = time.monotonic() + args.grace_s
    while time.monotonic() < grace_end:
        for s, _ in poller.poll(50):
            c = sock_index[s]
            while True:
                try:
                    frames = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                receive(c, frames, time.monotonic())
    for s in socks:
        s.close(linger=0)
    info = {"t0": t0, "t_end": t_end, "t_last_terminal": t_last, "stray": stray[:20],
            "stray_count": len(stray), "bad_frames": bad_frames, "send_failures": send_failures}
    return list(recs.values()), info


# ----------------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------------

def pct(values: List[float], q: float) -> Optional[float]:
    """Percentile by linear interpolation (q in 0..100); None for no values."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def dist(values: List[Optional[float]]) -> dict:
    v = [x for x in values if x is not None]
    return {"n": len(v), "p50": pct(v, 50), "p99": pct(v, 99),
            "mean": (sum(v) / len(v)) if v else None, "max": max(v) if v else None}


def meets(rec: Rec, target: Dict[str, float], node: bool) -> bool:
    if not rec.done:
        return False
    st = rec.terminal.get("stats") or {}
    if node:
        ttft, tpot = st.get("ttft_ms"), st.get("tpot_ms")
        if (st.get("completion_tokens") or 0) < 2:
            tpot = 0.0
    else:
        ttft, tpot = rec.client_ttft_ms(), rec.client_tpot_ms()
        if rec.tokens() < 2:
            tpot = 0.0
        if ttft is None:  # done without any token
            ttft = (rec.t_terminal - rec.t_send) * 1000
    if ttft is None or tpot is None:
        return False
    return ttft <= target["ttft_p99_ms"] and tpot <= target["tpot_p99_ms"]


def summarize(recs: List[Rec], info: dict, targets: Dict[str, Dict[str, float]],
              n_clients: int, duration: float, rate: float) -> dict:
    done = [r for r in recs if r.done]
    completed = [r for r in done if r.terminal.get("finish_reason") != "cancelled"]
    errors: Dict[str, int] = {}
    for r in recs:
        if r.terminal is not None and r.terminal.get("type") == "error":
            code = str(r.terminal.get("code"))
            errors[code] = errors.get(code, 0) + 1
    window = max(1e-9, info["t_last_terminal"] - info["t0"])
    gen_tokens = sum((r.terminal.get("stats") or {}).get("completion_tokens", 0) or 0
                     for r in completed)
    node_stats = [r.terminal.get("stats") or {} for r in done]
    steady_window = max(1e-9, info["t_end"] - info["t0"])
    steady_tokens = sum(n for r in recs for t, _, n in r.chunks if t <= info["t_end"])
    steady_requests = sum(1 for r in completed if r.t_terminal <= info["t_end"])

    lost = [r.id for r in recs if r.terminals == 0]
    duplicated = [r.id for r in recs if r.terminals > 1]
    after = [r.id for r in recs if r.after_terminal > 0]
    problems = {r.id: r.problems for r in recs if r.problems}
    integrity = {
        "requests": len(recs),
        "exactly_one_terminal": sum(1 for r in recs if r.terminals == 1),
        "lost": len(lost), "lost_ids": lost[:20],
        "duplicate_terminal": len(duplicated), "duplicate_ids": duplicated[:20],
        "message_after_terminal": len(after),
        "token_stream_problems": len(problems),
        "problems": dict(list(problems.items())[:20]),
        "text_only_chunks": sum(r.text_only_chunks for r in recs),
        "stray_messages": info["stray_count"],
        "bad_frames": info["bad_frames"],
        "send_failures": info["send_failures"],
    }
    integrity["ok"] = (len(recs) > 0 and not lost and not duplicated and not after and not problems
                       and info["stray_count"] == 0 and info["bad_frames"] == 0)

    per_class = {}
    classes = sorted({r.sla or "(default)" for r in recs})
    for cls in classes:
        rs = [r for r in recs if (r.sla or "(default)") == cls]
        ds = [r for r in rs if r.done]
        entry = {
            "requests": len(rs), "done": len(ds),
            "client_ttft_ms": dist([r.client_ttft_ms() for r in ds]),
            "client_tpot_ms": dist([r.client_tpot_ms() for r in ds]),
            "node_ttft_ms": dist([(r.terminal.get("stats") or {}).get("ttft_ms") for r in ds]),
            "node_tpot_ms": dist([(r.terminal.get("stats") or {}).get("tpot_ms") for r in ds
                                  if ((r.terminal.get("stats") or {}).get("completion_tokens") or 0) > 1]),
        }
        name = ds[0].terminal.get("stats", {}).get("sla") if (cls == "(default)" and ds) else cls
        target = targets.get(cls) or (targets.get(name) if name else None)
        if target:
            entry["target"] = target
            entry["attainment"] = sum(meets(r, target, node=False) for r in rs) / len(rs)
            entry["attainment_node"] = sum(meets(r, target, node=True) for r in rs) / len(rs)
            # Refused at once (`overloaded`: a full queue or a shedding class): attainment
            # above counts them as misses; among the accepted ones it is this.
            refused = [r for r in rs if r.terminal is not None and r.terminal.get("type") == "error"
                       and r.terminal.get("code") == "overloaded"]
            accepted = len(rs) - len(refused)
            entry["refused_overloaded"] = len(refused)
            entry["attainment_accepted"] = (
                sum(meets(r, target, node=False) for r in rs) / accepted if accepted else None)
            ttft99 = entry["client_ttft_ms"]["p99"]
            tpot99 = entry["client_tpot_ms"]["p99"]
            entry["p99_within_targets"] = (ttft99 is not None and ttft99 <= target["ttft_p99_ms"]
                                           and (tpot99 is None or tpot99 <= target["tpot_p99_ms"]))
        else:
            entry["attainment"] = None
        per_class[cls] = entry

    per_domain = {}
    for dom in sorted({r.domain for r in recs}):
        ds = [r for r in done if r.domain == dom]
        drafted = sum((r.terminal.get("stats") or {}).get("drafted", 0) or 0 for r in ds)
        accepted = sum((r.terminal.get("stats") or {}).get("accepted", 0) or 0 for r in ds)
        per_domain[dom] = {"requests": sum(1 for r in recs if r.domain == dom), "done": len(ds),
                           "drafted": drafted, "accepted": accepted,
                           "acceptance": (accepted / drafted) if drafted else None}

    return {
        "clients": n_clients, "duration_s": duration, "rate": rate,
        "mode": "poisson" if rate > 0 else "closed-loop",
        "window_s": window,
        "submitted": len(recs), "done": len(done), "completed": len(completed), "errors": errors,
        "throughput": {
            # Over the whole run: first send to the last terminal reply (includes the drain,
            # where fewer and fewer requests are left in flight).
            "requests_per_s": len(completed) / window,
            "tokens_per_s": gen_tokens / window, "generated_tokens": gen_tokens,
            # While submitting (first send to --duration): tokens streamed and requests
            # completed in that span. The steady state; what --compare-single compares.
            "steady_requests_per_s": steady_requests / steady_window,
            "steady_tokens_per_s": steady_tokens / steady_window},
        "client": {"ttft_ms": dist([r.client_ttft_ms() for r in done]),
                   "tpot_ms": dist([r.client_tpot_ms() for r in done])},
        "node": {"ttft_ms": dist([s.get("ttft_ms") for s in node_stats]),
                 "tpot_ms": dist([s.get("tpot_ms") for s in node_stats
                                  if (s.get("completion_tokens") or 0) > 1]),
                 "queue_ms": dist([s.get("queue_ms") for s in node_stats])},
        "sla": per_class,
        "domains": per_domain,
        "integrity": integrity,
        "samples": [{"id": r.id, "domain": r.domain, "sla": r.sla,
                     "terminal": (r.terminal or {}).get("type"),
                     "code": (r.terminal or {}).get("code"),
                     "finish": (r.terminal or {}).get("finish_reason"),
                     "tokens": r.tokens(), "client_ttft_ms": r.client_ttft_ms(),
                     "client_tpot_ms": r.client_tpot_ms(),
                     "node_ttft_ms": ((r.terminal or {}).get("stats") or {}).get("ttft_ms"),
                     "node_tpot_ms": ((r.terminal or {}).get("stats") or {}).get("tpot_ms")}
                    for r in recs],
    }


def fmt(v: Optional[float], unit: str = "") -> str:
    return "-" if v is None else f"{v:.1f}{unit}"


def print_summary(s: dict, title: str) -> None:
    t = s["throughput"]
    mode = s["mode"] if s["mode"] == "closed-loop" else f"Poisson at {s['rate']:g} req/s"
    print(f"== {title}: {s['clients']} client(s), {mode}, {s['duration_s']:g} s "
          f"(window to the last reply {s['window_s']:.1f} s)")
    print(f"   requests: {s['submitted']} submitted, {s['completed']} completed, errors {s['errors'] or 'none'}")
    print(f"   throughput: {t['steady_requests_per_s']:.2f} req/s, {t['steady_tokens_per_s']:.1f} "
          f"generated tokens/s while submitting; {t['requests_per_s']:.2f} req/s, "
          f"{t['tokens_per_s']:.1f} tokens/s including the drain")
    c, n = s["client"], s["node"]
    print(f"   client TTFT p50 {fmt(c['ttft_ms']['p50'])} p99 {fmt(c['ttft_ms']['p99'])} ms | "
          f"TPOT p50 {fmt(c['tpot_ms']['p50'])} p99 {fmt(c['tpot_ms']['p99'])} ms")
    print(f"   node   TTFT p50 {fmt(n['ttft_ms']['p50'])} p99 {fmt(n['ttft_ms']['p99'])} ms | "
          f"TPOT p50 {fmt(n['tpot_ms']['p50'])} p99 {fmt(n['tpot_ms']['p99'])} ms | "
          f"queue p99 {fmt(n['queue_ms']['p99'])} ms")
    for cls, e in s["sla"].items():
        if e.get("attainment") is None:
            att = "attainment: no targets (pass --sla-target NAME=TTFT_MS/TPOT_MS)"
        else:
            tg = e["target"]
            att = (f"attainment {100 * e['attainment']:.1f}% (node-measured "
                   f"{100 * e['attainment_node']:.1f}%) vs TTFT<={tg['ttft_p99_ms']:g} ms, "
                   f"TPOT<={tg['tpot_p99_ms']:g} ms")
            if e.get("refused_overloaded"):
                acc = e["attainment_accepted"]
                att += (f"; {e['refused_overloaded']} refused (overloaded), "
                        f"{'n/a' if acc is None else f'{100 * acc:.1f}%'} of the accepted met both")
        print(f"   sla {cls}: {e['requests']} req, TTFT p99 {fmt(e['client_ttft_ms']['p99'])} ms, "
              f"TPOT p99 {fmt(e['client_tpot_ms']['p99'])} ms, {att}")
    i = s["integrity"]
    verdict = "OK" if i["ok"] else "FAILED"
    print(f"   integrity {verdict}: {i['exactly_one_terminal']}/{i['requests']} with exactly one "
          f"terminal reply, lost {i['lost']}, duplicate terminal {i['duplicate_terminal']}, "
          f"after terminal {i['message_after_terminal']}, token-stream problems "
          f"{i['token_stream_problems']}, stray {i['stray_messages']}, bad frames {i['bad_frames']}")
    for rid, probs in list(i["problems"].items())[:5]:
        print(f"     {rid}: {'; '.join(probs[:3])}")


def plot(runs: Dict[str, dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: pip install -r bench/requirements.txt for the CDF plot; "
              "skipping it", file=sys.stderr)
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "client_ttft_ms", "TTFT (client-side)"),
                           (axes[1], "client_tpot_ms", "TPOT (client-side)")):
        for run_name, s in runs.items():
            classes = sorted({x["sla"] or "(default)" for x in s["samples"]})
            for cls in classes:
                v = sorted(x[key] for x in s["samples"]
                           if (x["sla"] or "(default)") == cls and x[key] is not None)
                if not v:
                    continue
                ys = [(i + 1) / len(v) for i in range(len(v))]
                ax.step(v, ys, where="post", label=f"{run_name} {cls} (n={len(v)})")
                tg = s["sla"].get(cls, {}).get("target")
                if tg:
                    ax.axvline(tg["ttft_p99_ms" if "ttft" in key else "tpot_p99_ms"],
                               linestyle="--", linewidth=0.8, color="grey")
        ax.axhline(0.99, color="black", linewidth=0.5, linestyle=":")
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.suptitle("specnode load: latency CDF (dashed: SLA p99 targets)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[1:]))
    ap.add_argument("--endpoint", default=os.environ.get("SPECNODE_ENDPOINT", "tcp://127.0.0.1:5555"))
    ap.add_argument("--clients", type=int, default=16, help="concurrent clients (connections)")
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of submitting")
    ap.add_argument("--rate", type=float, default=0.0,
                    help="total Poisson arrival rate, requests/s; 0 = closed loop (default)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=None,
                    help="sent with a random seed per request (default: the node's)")
    ap.add_argument("--sla-mix", default="",
                    help="e.g. interactive:0.5,batch:0.5 (default: the node's default class)")
    ap.add_argument("--sla-target", action="append", default=[], metavar="NAME=TTFT_MS/TPOT_MS",
                    help="p99 targets of a class (default: from the node's stats, if published)")
    ap.add_argument("--domains", default="", help="comma-separated subset of the prompt domains")
    ap.add_argument("--prompts", default=str(ROOT / "bench/prompts"), help="dir of *.jsonl")
    ap.add_argument("--raw", action="store_true", help="send prompts raw (default: chat messages)")
    ap.add_argument("--no-domain", action="store_true",
                    help="do not send the domain; let the node's router classify")
    ap.add_argument("--drain-s", type=float, default=120.0,
                    help="after --duration, wait at most this long for requests in flight")
    ap.add_argument("--timeout-s", type=float, default=60.0,
                    help="give up on a request silent this long (it counts as lost)")
    ap.add_argument("--grace-s", type=float, default=0.5,
                    help="keep listening this long at the end for messages after a terminal reply")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--compare-single", action="store_true",
                    help="run the workload with 1 client, then --clients, and report the "
                         "throughput ratio (with --rate R: 1 client at R/N vs N clients at R)")
    ap.add_argument("--min-ratio", type=float, default=0.0,
                    help="with --compare-single: exit 1 when the tokens/s ratio is below this")
    ap.add_argument("--serve", metavar="MODEL", default=None,
                    help="start `specnode serve --model MODEL` on a free loopback port for the "
                         "run (instead of --endpoint)")
    ap.add_argument("--serve-args", default="", help="more `specnode serve` flags with --serve")
    ap.add_argument("--specnode", default=str(ROOT / "build/node/specnode"))
    ap.add_argument("--out", default=str(ROOT / "bench/results"), help="directory for JSON + PNG")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    if args.clients < 1 or args.duration <= 0 or args.rate < 0 or args.max_tokens < 1:
        ap.error("--clients >= 1, --duration > 0, --rate >= 0 and --max-tokens >= 1")

    prompts = load_prompts(Path(args.prompts),
                           [d for d in args.domains.split(",") if d] or None)
    sla_mix = parse_mix(args.sla_mix)
    ctx = zmq.Context()

    proc = None
    endpoint = args.endpoint
    serve_log = None
    if args.serve:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        cmd = [args.specnode, "serve", "--http-bind", "off", "--model", args.serve, "--bind",
               endpoint] + args.serve_args.split()
        serve_log = Path(args.out) / "serve-last.log"
        serve_log.parent.mkdir(parents=True, exist_ok=True)
        print(f"starting: {' '.join(cmd)} (log: {serve_log})", file=sys.stderr)
        proc = subprocess.Popen(cmd, stdout=open(serve_log, "w"), stderr=subprocess.STDOUT)
    try:
        health = wait_health(ctx, endpoint, 120.0 if proc else 5.0, proc)
        if health is None:
            print(f"bench_load.py: no specnode node answers health at {endpoint}"
                  + (f" (see {serve_log})" if serve_log else ""), file=sys.stderr)
            return 3
        stats0 = one_shot(ctx, endpoint, {"type": "stats"}, 10.0) or {}
        targets = targets_from_stats(stats0)
        targets.update(parse_targets(args.sla_target))
        print(f"node at {endpoint}: {health.get('model')} ({health.get('status')}); SLA targets: "
              f"{targets or 'unknown (pass --sla-target NAME=TTFT_MS/TPOT_MS)'}", file=sys.stderr)

        runs: Dict[str, dict] = {}
        plan = [("single", 1, args.rate / args.clients if args.rate else 0.0)] if args.compare_single else []
        plan.append((f"n{args.clients}", args.clients, args.rate))
        for label, n, rate in plan:
            print(f"running {label}: {n} client(s) for {args.duration:g} s ...", file=sys.stderr)
            recs, info = run_load(ctx, endpoint, n, args.duration, rate, prompts, sla_mix, args, label)
            s = summarize(recs, info, targets, n, args.duration, rate)
            runs[label] = s
            print_summary(s, label)

        result = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "endpoint": endpoint, "node": health,
            "config": {k: v for k, v in vars(args).items()},
            "sla_targets": targets,
            "runs": runs,
            "node_stats_after": (one_shot(ctx, endpoint, {"type": "stats"}, 10.0) or {}).get("requests"),
        }
        ok = all(r["integrity"]["ok"] for r in runs.values())
        if args.compare_single:
            single, multi = runs["single"]["throughput"], runs[f"n{args.clients}"]["throughput"]
            def ratio(key):
                return multi[key] / single[key] if single[key] else None
            ratio_tok = ratio("steady_tokens_per_s")
            result["compare"] = {"tokens_per_s_ratio": ratio_tok,
                                 "requests_per_s_ratio": ratio("steady_requests_per_s"),
                                 "tokens_per_s_ratio_with_drain": ratio("tokens_per_s"),
                                 "min_ratio": args.min_ratio}
            print(f"== throughput {args.clients} clients vs 1 (while submitting): tokens/s "
                  f"x{fmt(ratio_tok)}, requests/s x{fmt(ratio('steady_requests_per_s'))} "
                  f"(including the drain: tokens/s x{fmt(ratio('tokens_per_s'))})")
            if args.min_ratio and (ratio_tok is None or ratio_tok < args.min_ratio):
                print(f"   below --min-ratio {args.min_ratio:g}", file=sys.stderr)
                ok = False
        out_dir = Path(args.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"load-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
        json_path = out_dir / f"{stem}.json"
        json_path.write_text(json.dumps(result, indent=1, default=str) + "\n")
        print(f"wrote {json_path}")
        if not args.no_plot and plot(runs, out_dir / f"{stem}.png"):
            print(f"wrote {out_dir / (stem + '.png')}")
        return 0 if ok else 1
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        ctx.destroy(linger=0)


if __name__ == "__main__":
    sys.exit(main())
