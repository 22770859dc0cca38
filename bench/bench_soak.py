#!/usr/bin/env python3
"""Bounded soak of `specnode serve`: N clients for T minutes of random traffic (docs/testing.md).

Each client is its own ZeroMQ DEALER connection running a closed loop of requests with
random seeds, temperatures, lengths and prompts (bench/prompts/), and random faults:

  * cancel: a `cancel` for the request after a random number of streamed chunks;
  * disconnect: the client closes its socket mid-stream and opens a new connection (the
    node must cancel the orphan and free its KV);
  * bad input: now and then a malformed frame, which must get exactly one `error`.

Checked throughout: every request whose client stayed connected gets exactly one terminal
reply (done or error) and nothing after it; a cancelled request ends `cancelled` (or done,
if it finished first). Sampled every --sample-s: the node's RSS (/proc/PID/status) and,
from the stats reply's Prometheus text, `specnode_kv_used_bytes`,
`specnode_active_sequences` and `specnode_queue_depth`. At the end the node must come back to idle: no active or queued request
and KV bytes in use back to zero; RSS must be flat (the median of the last tenth of the
samples within --rss-slack of the median of the second tenth, after warm-up).

  ~/.cache/specnode/venv/bin/python bench/bench_soak.py --clients 64 --minutes 10 \\
      --serve ~/.cache/specnode/models/SmolLM2-135M-Instruct.Q4_1.gguf

Writes bench/results/soak-<date>.json. Exit status 0 when every check holds, 1 otherwise,
2 on usage errors, 3 when no node answers. Not a CI test: minutes long, by design.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import ROOT, free_port, load_prompts, one_shot, wait_health, zmq  # noqa: E402

BAD_FRAMES = [b"{not json", b"[]", b'{"type":"submit"}', b'{"type":"nope","id":"x"}',
              b'{"type":"submit","id":"b","prompt":""}', b'{"type":"submit","id":"b","prompt":"x",'
              b'"max_tokens":-1}', b"\xff\xfe", b'{"type":"submit","id":"b","prompt":"x","top_p":0}']


@dataclass
class Req:
    id: str
    kind: str                    # "normal", "cancel", "disconnect", "bad"
    cancel_after: int = 0        # chunks before the cancel / disconnect
    chunks: int = 0
    terminals: List[dict] = field(default_factory=list)
    after_terminal: int = 0
    cancel_sent: bool = False
    abandoned: bool = False      # its connection was closed on purpose


def metric(text: str, name: str) -> Optional[float]:
    """Sum of every sample of `name` (any labels) in a Prometheus exposition."""
    total, seen = 0.0, False
    for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, re.M):
        total += float(m.group(1))
        seen = True
    return total if seen else None


def node_sample(ctx, endpoint: str, pid: Optional[int]) -> dict:
    out = {"t": time.monotonic()}
    if pid is not None:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            out["rss_kb"] = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
        except (OSError, AttributeError):
            pass
    st = one_shot(ctx, endpoint, {"type": "stats"}, 5.0)
    text = (st or {}).get("metrics", "")
    for key, name in (("kv_used_bytes", "specnode_kv_used_bytes"),
                      ("kv_tokens", "specnode_kv_tokens"),
                      ("active", "specnode_active_sequences"),
                      ("queued", "specnode_queue_depth")):
        out[key] = metric(text, name)
    return out


class Client:
    def __init__(self, ctx, endpoint, poller, index):
        self.ctx, self.endpoint, self.poller, self.index = ctx, endpoint, poller, index
        self.sock = None
        self.current: Optional[Req] = None
        self.connect()

    def connect(self):
        if self.sock is not None:
            self.poller.unregister(self.sock)
            self.sock.close(linger=0)
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.connect(self.endpoint)
        self.poller.register(self.sock, zmq.POLLIN)

    def send(self, msg) -> None:
        self.sock.send(msg if isinstance(msg, bytes) else json.dumps(msg).encode())


def run(args) -> int:
    ctx = zmq.Context()
    proc, pid, log = None, None, None
    endpoint = args.endpoint
    if args.serve:
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        cmd = [args.specnode, "serve", "--http-bind", "off", "--model", args.serve, "--bind", endpoint,
               "--max-active", str(args.max_active), *args.serve_arg]
        log = open(args.log, "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        pid = proc.pid
    elif args.pid:
        pid = args.pid
    if wait_health(ctx, endpoint, 180, proc) is None:
        print(f"no node answers at {endpoint}", file=sys.stderr)
        return 3

    rng = random.Random(args.seed)
    prompts = [p for ps in load_prompts(ROOT / "bench" / "prompts", None).values() for p in ps]
    poller = zmq.Poller()
    clients = [Client(ctx, endpoint, poller, i) for i in range(args.clients)]
    by_sock = {}
    reqs: Dict[str, Req] = {}
    counts = {"normal": 0, "cancel": 0, "disconnect": 0, "bad": 0}
    samples = [node_sample(ctx, endpoint, pid)]
    seq = 0

    def start(c: Client):
        nonlocal seq
        seq += 1
        r = rng.random()
        if r < args.p_bad:
            counts["bad"] += 1
            c.send(rng.choice(BAD_FRAMES))
            c.current = Req(id=f"bad-{seq}", kind="bad")
            reqs[c.current.id] = c.current
            return
        kind = ("cancel" if r < args.p_bad + args.p_cancel else
                "disconnect" if r < args.p_bad + args.p_cancel + args.p_disconnect else "normal")
        counts[kind] += 1
        rid = f"c{c.index}-{seq}"
        msg = {"type": "submit", "id": rid, "prompt": rng.choice(prompts),
               "max_tokens": rng.randint(4, args.max_tokens), "seed": rng.randrange(1 << 31),
               "temperature": rng.choice([0.0, 0.7, 1.0]), "top_p": rng.choice([1.0, 0.9])}
        c.current = Req(id=rid, kind=kind, cancel_after=rng.randint(0, 8))
        reqs[rid] = c.current
        c.send(msg)

    strays = {"unknown_id": 0, "no_such_id": 0}

    def on_message(c: Client, body: bytes):
        try:
            m = json.loads(body)
        except ValueError:
            return
        rid, typ = m.get("id"), m.get("type")
        cur = c.current
        if cur is not None and cur.kind == "bad" and typ == "error" and rid not in reqs:
            cur.terminals.append(m)  # a malformed frame's one error
            c.current = None
            return
        if typ == "error" and m.get("code") == "unknown_id":
            strays["unknown_id"] += 1  # answers a cancel that came after the done: not terminal
            return
        r = reqs.get(rid) if isinstance(rid, str) else None
        if r is None:
            strays["no_such_id"] += 1
            return
        if r.terminals:
            r.after_terminal += 1
            return
        if typ == "tokens":
            r.chunks += 1
            if r.kind == "cancel" and not r.cancel_sent and r.chunks > r.cancel_after:
                c.send({"type": "cancel", "id": r.id})
                r.cancel_sent = True
            elif r.kind == "disconnect" and r.chunks > r.cancel_after:
                r.abandoned = True
                c.current = None
                c.connect()
                by_sock.clear()
                by_sock.update({cl.sock: cl for cl in clients})
        elif typ in ("done", "error"):
            r.terminals.append(m)
            if c.current is r:
                c.current = None

    def pump():
        """Handles whatever arrived within 50 ms, socket by socket."""
        for s, _ in poller.poll(50):
            c = by_sock.get(s)
            while c is not None:
                try:
                    frames = c.sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                sock_before = c.sock
                on_message(c, next((f for f in reversed(frames) if f), b""))
                if c.sock is not sock_before:  # it disconnected on purpose
                    break

    by_sock.update({c.sock: c for c in clients})
    t0 = time.monotonic()
    t_end = t0 + args.minutes * 60
    next_sample = t0 + args.sample_s
    while time.monotonic() < t_end:
        for c in clients:
            if c.current is None:
                start(c)
        pump()
        if time.monotonic() >= next_sample:
            samples.append(node_sample(ctx, endpoint, pid))
            next_sample += args.sample_s
            if proc is not None and proc.poll() is not None:
                break
    # Drain: no new requests; wait for the in-flight ones (bounded).
    drain_end = time.monotonic() + args.drain_s
    while any(c.current is not None for c in clients) and time.monotonic() < drain_end:
        pump()
    stuck = [c.current.id for c in clients if c.current is not None]
    time.sleep(2.0)  # the orphans of the last disconnects are cancelled and freed
    idle = node_sample(ctx, endpoint, pid)
    samples.append(idle)
    for c in clients:
        c.sock.close(linger=0)

    problems = []
    kept = [r for r in reqs.values() if not r.abandoned]
    for r in kept:
        if len(r.terminals) != 1:
            problems.append(f"{r.id} ({r.kind}): {len(r.terminals)} terminal replies")
        if r.after_terminal:
            problems.append(f"{r.id}: {r.after_terminal} messages after its terminal reply")
    if strays["no_such_id"]:
        problems.append(f"{strays['no_such_id']} messages for ids nobody sent")
    if stuck:
        problems.append(f"{len(stuck)} requests without a terminal reply after the drain")
    if (idle.get("active") or 0) != 0 or (idle.get("queued") or 0) != 0:
        problems.append(f"not idle at the end: active {idle.get('active')}, "
                        f"queued {idle.get('queued')}")
    if (idle.get("kv_used_bytes") or 0) != 0:
        problems.append(f"KV bytes in use when idle: {idle.get('kv_used_bytes')}")
    rss = [s["rss_kb"] for s in samples if "rss_kb" in s]
    rss_report = {}
    if len(rss) >= 20:
        tenth = len(rss) // 10
        early = statistics.median(rss[tenth:2 * tenth])
        late = statistics.median(rss[-tenth:])
        rss_report = {"early_median_kb": early, "late_median_kb": late,
                      "max_kb": max(rss), "growth": late / early - 1}
        if late > early * (1 + args.rss_slack):
            problems.append(f"RSS grew {100 * (late / early - 1):.1f}% "
                            f"({early} -> {late} KiB; slack {100 * args.rss_slack:.0f}%)")
    finish = {}
    for r in kept:
        if r.terminals:
            t = r.terminals[0]
            key = t.get("finish_reason") if t.get("type") == "done" else f"error:{t.get('code')}"
            finish[key] = finish.get(key, 0) + 1
    if proc is not None:
        proc.send_signal(2)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            problems.append("the node did not exit within 60 s of SIGINT")
        if proc.returncode not in (0, None):
            problems.append(f"the node exited {proc.returncode}")
        log.close()

    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "clients": args.clients, "minutes": args.minutes, "seed": args.seed,
        "requests": counts, "finish": finish, "strays": strays, "abandoned": sum(r.abandoned for r in reqs.values()),
        "rss": rss_report, "idle": idle, "problems": problems,
        "samples": [{k: v for k, v in s.items()} for s in samples],
    }
    out = Path(args.out or ROOT / "bench" / "results" /
               f"soak-{dt.datetime.now():%Y%m%d-%H%M%S}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"soak: {args.clients} clients x {args.minutes} min: requests {counts}, "
          f"abandoned {result['abandoned']}")
    print(f"  terminal replies: {finish}")
    if rss_report:
        print(f"  RSS: {rss_report['early_median_kb'] / 1024:.1f} MiB early, "
              f"{rss_report['late_median_kb'] / 1024:.1f} MiB late "
              f"({100 * rss_report['growth']:+.1f}%), max {rss_report['max_kb'] / 1024:.1f} MiB")
    print(f"  idle at the end: active {idle.get('active')}, queued {idle.get('queued')}, "
          f"KV bytes in use {idle.get('kv_used_bytes')}")
    print(f"  {'OK' if not problems else 'PROBLEMS:'} " + "; ".join(problems[:10]))
    print(f"  -> {out}")
    return 0 if not problems else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoint", default="tcp://127.0.0.1:5555")
    p.add_argument("--pid", type=int, help="the node's pid, for RSS (with --endpoint)")
    p.add_argument("--serve", metavar="MODEL", help="start `specnode serve` on this model")
    p.add_argument("--specnode", default=str(ROOT / "build" / "node" / "specnode"))
    p.add_argument("--serve-arg", action="append", default=[], help="extra serve flag")
    p.add_argument("--max-active", type=int, default=16)
    p.add_argument("--log", default="/tmp/specnode-soak.log")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--p-cancel", type=float, default=0.15)
    p.add_argument("--p-disconnect", type=float, default=0.10)
    p.add_argument("--p-bad", type=float, default=0.05)
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--drain-s", type=float, default=120.0)
    p.add_argument("--rss-slack", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out")
    args = p.parse_args()
    if args.clients < 1 or args.minutes <= 0:
        p.error("--clients >= 1 and --minutes > 0")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
