"""The clients against a real `specnode serve` over real ZeroMQ sockets: specnode-client
(streaming, --no-stream, --json, stats, health, cancel, exit codes) and the Python module
client/specnode_client.py; an end-to-end reply from the real model; a short run of
bench/bench_load.py."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from serve_helpers import ROOT, Node
from specnode_client import SpecnodeClient, SpecnodeError, SpecnodeTimeout

GREEDY = ["--temperature", "0", "--max-tokens", "12"]


def run(cmd, timeout=120, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def client(specnode_client, node, *args, timeout=120):
    return run([specnode_client, "--endpoint", node.endpoint, *args], timeout=timeout)


def last_json(stdout: str) -> dict:
    lines = [l for l in stdout.splitlines() if l.strip()]
    assert lines, "no output"
    return json.loads(lines[-1])


# --- specnode-client ----------------------------------------------------------------------

def test_health_and_stats(specnode_client, tiny_node):
    res = client(specnode_client, tiny_node, "health")
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok "), res.stdout
    h = last_json(client(specnode_client, tiny_node, "health", "--json").stdout)
    assert h["type"] == "health" and h["status"] == "ok"
    for key in ("model", "uptime_s", "active", "queued"):
        assert key in h

    res = client(specnode_client, tiny_node, "stats")
    assert res.returncode == 0, res.stderr
    assert "# TYPE specnode_" in res.stdout, res.stdout[:500]
    s = last_json(client(specnode_client, tiny_node, "stats", "--json").stdout)
    assert s["type"] == "stats" and isinstance(s["metrics"], str) and "requests" in s


def test_submit_streams_text_and_stats(specnode_client, tiny_node):
    res = client(specnode_client, tiny_node, "submit", "--prompt", "hello there", *GREEDY,
                 "--id", "stream-1")
    assert res.returncode == 0, res.stderr
    # Stats line on stderr: id, finish reason, TTFT, TPOT, token counts.
    assert "--- stream-1: " in res.stderr and "TTFT" in res.stderr and "TPOT" in res.stderr
    assert "completion" in res.stderr

    js = client(specnode_client, tiny_node, "submit", "--prompt", "hello there", *GREEDY,
                "--json")
    assert js.returncode == 0, js.stderr
    done = last_json(js.stdout)
    assert done["type"] == "done"
    assert done["finish_reason"] in ("length", "stop", "stop_string")
    st = done["stats"]
    for key in ("prompt_tokens", "completion_tokens", "drafted", "accepted", "target_passes",
                "queue_ms", "ttft_ms", "tpot_ms", "total_ms", "domain", "sla"):
        assert key in st, key
    assert 0 <= st["completion_tokens"] <= 12
    if done["finish_reason"] == "length":
        assert st["completion_tokens"] == 12
    assert done["client"]["index_gaps"] == 0
    # Streaming, text is "" in done; the client adds what it streamed. Greedy: the same text
    # as the plain run printed (plus the newline the CLI ends its output with).
    assert done["text"] == ""
    streamed = done["client"]["text"]
    assert res.stdout in (streamed, streamed + "\n")


def test_no_stream_returns_whole_text(specnode_client, tiny_node):
    a = last_json(client(specnode_client, tiny_node, "submit", "--prompt", "hello there",
                         *GREEDY, "--json").stdout)
    b = last_json(client(specnode_client, tiny_node, "submit", "--prompt", "hello there",
                         *GREEDY, "--no-stream", "--json").stdout)
    assert b["type"] == "done" and b["client"]["chunks"] == 0
    assert b["text"] == a["client"]["text"]
    assert b["stats"]["completion_tokens"] == a["stats"]["completion_tokens"]
    plain = client(specnode_client, tiny_node, "submit", "--prompt", "hello there", *GREEDY,
                   "--no-stream", "--quiet")
    assert plain.returncode == 0 and plain.stderr == ""
    assert plain.stdout in (b["text"], b["text"] + "\n")


def test_chat_and_sampling_options_pass_through(specnode_client, tiny_node):
    res = client(specnode_client, tiny_node, "submit", "--chat", "Hi!", "--system", "Be brief.",
                 "--max-tokens", "6", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20",
                 "--seed", "3", "--stop", "\n\n", "--stop", "###", "--json")
    assert res.returncode == 0, res.stderr
    assert last_json(res.stdout)["stats"]["completion_tokens"] <= 6


@pytest.mark.parametrize("args,code", [
    (["--max-tokens", "0"], "bad_request"),
    (["--max-tokens", "-5"], "bad_request"),
    (["--top-p", "0"], "bad_request"),
    (["--temperature", "-1"], "bad_request"),
    (["--sla", "no-such-class"], "unknown_sla"),
    (["--max-tokens", "100000"], None),  # over limits.max_tokens or the context: some error
])
def test_error_reply_exits_1(specnode_client, tiny_node, args, code):
    res = client(specnode_client, tiny_node, "submit", "--prompt", "hi", *args)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert "specnode-client: error " in res.stderr
    if code:
        assert f"error {code}:" in res.stderr, res.stderr
    js = client(specnode_client, tiny_node, "submit", "--prompt", "hi", *args, "--json")
    assert js.returncode == 1
    err = last_json(js.stdout)
    assert err["type"] == "error" and err["message"]
    if code:
        assert err["code"] == code


def test_usage_errors_exit_2(specnode_client, tiny_node):
    for args in ([], ["frobnicate"], ["submit"], ["submit", "--prompt", "a", "--chat", "b"],
                 ["submit", "--prompt", "a", "--max-tokens", "many"], ["submit", "--promt", "a"],
                 ["cancel"], ["stats", "--prompt", "x"]):
        res = client(specnode_client, tiny_node, *args)
        assert res.returncode == 2, (args, res.returncode, res.stderr)
        assert "specnode-client:" in res.stderr
    res = run([specnode_client, "--help"])
    assert res.returncode == 0 and "submit" in res.stdout and "exit codes" in res.stdout


def test_no_server_exits_3_quickly(specnode_client, dead_endpoint):
    for args in (["health"], ["stats"], ["submit", "--prompt", "hi"], ["cancel", "--id", "x"]):
        t0 = time.monotonic()
        res = run([specnode_client, "--endpoint", dead_endpoint, "--timeout-s", "1", *args],
                  timeout=30)
        assert res.returncode == 3, (args, res.returncode, res.stderr)
        assert "no connection" in res.stderr or "timed out" in res.stderr
        assert time.monotonic() - t0 < 10


def test_cancel_from_another_process_is_unknown_id(specnode_client, tiny_node):
    res = client(specnode_client, tiny_node, "cancel", "--id", "nobody")
    assert res.returncode == 1
    assert "unknown_id" in res.stderr and "Ctrl-C" in res.stderr


def test_ctrl_c_cancels_and_exits_130(specnode_client, tiny_node):
    proc = subprocess.Popen([specnode_client, "--endpoint", tiny_node.endpoint, "submit",
                             "--prompt", "Once upon a time", "--max-tokens", "480",
                             "--temperature", "1.0", "--seed", "11", "--id", "long-1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.read(1)  # the first streamed byte: the request is running
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    err = err.decode(errors="replace")
    # The tiny model can finish (EOS after a few ms) before the interrupt, or before the
    # cancel it sends reaches the node: the reply is then the finished one, whatever the
    # exit code; only a reply still running when the cancel arrives can say "cancelled".
    finished = any(f"--- long-1: {r}" in err for r in ("stop", "length"))
    if proc.returncode == 0 or finished:
        pytest.skip(f"the generation ended before the cancel arrived ({first!r}): {err[-200:]}")
    assert proc.returncode == 130, err
    assert "cancelling long-1" in err
    assert "--- long-1: cancelled" in err


# --- the Python client ----------------------------------------------------------------

def test_python_generate_and_stream(tiny_node, specnode_client):
    with SpecnodeClient(tiny_node.endpoint, timeout_s=60) as c:
        h = c.health()
        assert h["status"] == "ok"
        r = c.generate(prompt="hello there", max_tokens=12, temperature=0)
        assert r.finish_reason in ("length", "stop", "stop_string")
        assert r.stats["completion_tokens"] == len(r.token_ids)
        chunks = list(c.stream(prompt="hello there", max_tokens=12, temperature=0))
        assert "".join(chunks) == c.last_result.text == r.text
        whole = c.generate(prompt="hello there", max_tokens=12, temperature=0, stream=False)
        assert whole.text == r.text
        st = c.stats()
        assert st["type"] == "stats" and "specnode_" in st["metrics"]
    # The same greedy text as the C++ client's.
    js = last_json(client(specnode_client, tiny_node, "submit", "--prompt", "hello there",
                          *GREEDY, "--json").stdout)
    assert js["client"]["text"] == r.text


def test_python_events_are_well_formed(tiny_node):
    with SpecnodeClient(tiny_node.endpoint, timeout_s=60) as c:
        events = list(c.submit(messages=[{"role": "user", "content": "Hi"}], max_tokens=10,
                               id="ev-1"))
    assert events[0]["type"] == "accepted" and events[0]["id"] == "ev-1"
    assert events[-1]["type"] == "done"
    tokens = [e for e in events[1:-1]]
    assert all(e["type"] == "tokens" for e in tokens)
    index = 0
    for e in tokens:
        assert e["index"] == index
        index += len(e["token_ids"])
    assert index == events[-1]["stats"]["completion_tokens"]


def test_python_errors(tiny_node):
    with SpecnodeClient(tiny_node.endpoint, timeout_s=60) as c:
        with pytest.raises(SpecnodeError) as e:
            c.generate(prompt="hi", max_tokens=0)
        assert e.value.code == "bad_request" and e.value.message
        with pytest.raises(SpecnodeError) as e:
            c.generate(prompt="hi", sla="no-such-class")
        assert e.value.code == "unknown_sla"
        with pytest.raises(SpecnodeError) as e:
            c.generate(prompt="hi", frobnicate=1)  # unknown field, passed through
        assert e.value.code == "bad_request"
        with pytest.raises(SpecnodeError) as e:
            c.cancel("nobody")
        assert e.value.code == "unknown_id"
        # The connection still works after errors.
        assert c.generate(prompt="hi", max_tokens=2).stats["completion_tokens"] <= 2


def test_python_cancel(tiny_node):
    with SpecnodeClient(tiny_node.endpoint, timeout_s=60) as c:
        events = c.submit(prompt="Once upon a time", max_tokens=480, temperature=1.0, seed=5,
                          id="cancel-me")
        last = None
        for ev in events:
            if ev["type"] == "tokens":
                c.cancel("cancel-me")
                break
        for ev in events:  # the rest, up to done
            last = ev
        assert last is not None and last["type"] == "done"
        assert last["finish_reason"] in ("cancelled", "stop", "length")
        if last["finish_reason"] == "cancelled":
            assert last["stats"]["completion_tokens"] < 480


def test_python_timeout_without_server(dead_endpoint):
    t0 = time.monotonic()
    with SpecnodeClient(dead_endpoint, timeout_s=1) as c:
        with pytest.raises(SpecnodeTimeout):
            c.health()
    assert time.monotonic() - t0 < 10


def test_ids_are_per_connection_and_requests_run_concurrently(tiny_node):
    clients = [SpecnodeClient(tiny_node.endpoint, timeout_s=60) for _ in range(4)]
    try:
        # The same id on four connections, all in flight at once.
        streams = [c.submit(prompt=f"request {i}", max_tokens=16, id="same") for i, c in
                   enumerate(clients)]
        results = [list(s) for s in streams]
    finally:
        for c in clients:
            c.close()
    for events in results:
        assert [e["type"] for e in events].count("done") == 1
        assert events[-1]["type"] == "done" and events[-1]["id"] == "same"


def test_python_example_runs(tiny_node):
    res = run([sys.executable, str(ROOT / "client/example.py"), "--endpoint", tiny_node.endpoint,
               "--max-tokens", "8", "hello"])
    assert res.returncode == 0, res.stderr
    assert "expected error: bad_request" in res.stdout


# --- the load generator ----------------------------------------------------------------

def test_bench_load_short_run(tiny_node, tmp_path):
    res = run([sys.executable, str(ROOT / "bench/bench_load.py"), "--endpoint",
               tiny_node.endpoint, "--clients", "3", "--duration", "2", "--max-tokens", "8",
               "--sla-mix", "interactive:1,batch:1", "--domains", "chat,code", "--out", str(tmp_path), "--no-plot",
               "--drain-s", "60"], timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    out = json.loads(next(tmp_path.glob("load-*.json")).read_text())
    run_ = out["runs"]["n3"]
    assert run_["integrity"]["ok"], run_["integrity"]
    assert run_["completed"] >= 3
    assert run_["throughput"]["tokens_per_s"] > 0
    assert set(run_["sla"]) == {"interactive", "batch"}
    for e in run_["sla"].values():
        if e.get("attainment") is not None:
            assert e["refused_overloaded"] >= 0
            assert e["attainment_accepted"] is None or 0 <= e["attainment_accepted"] <= 1


# --- end to end on the real model ------------------------------------------------------

def test_real_model_streams_a_reply(specnode, specnode_client, real_model, tmp_path):
    node = Node(specnode, real_model, tmp_path / "serve.log", extra=["--threads", "2"])
    try:
        node.wait_ready(timeout_s=180)
        res = client(specnode_client, node, "submit", "--chat", "What is the capital of France?",
                     "--max-tokens", "24", "--temperature", "0", timeout=300)
        assert res.returncode == 0, res.stderr + node.log()
        assert "Paris" in res.stdout, res.stdout
        assert "TTFT" in res.stderr
    finally:
        assert node.stop() == 0, node.log()


# The request of issue 16 (item 1): the same seed gives the same text, on a fresh node with
# the default config (n-gram speculation, which learns from earlier requests), when sent
# again, with batch mates, with a model drafter, and without speculation.
SEEDED = dict(prompt="Explain what a hash table is in one paragraph.", max_tokens=48,
              temperature=0.8, top_k=40, top_p=0.9, seed=7)


def _seeded_texts(endpoint, concurrent_mates=0):
    """SEEDED three times in a row, then once beside `concurrent_mates` other requests."""
    from concurrent.futures import ThreadPoolExecutor

    with SpecnodeClient(endpoint, timeout_s=300) as c:
        texts = [c.generate(**SEEDED).text for _ in range(3)]
    if concurrent_mates:
        def one(i):
            with SpecnodeClient(endpoint, timeout_s=300) as c:
                if i == 0:
                    return c.generate(**SEEDED).text
                return c.generate(prompt=f"Write a list of {i + 2} fruits.", max_tokens=40,
                                  temperature=0.9, seed=i).text
        with ThreadPoolExecutor(concurrent_mates + 1) as pool:
            texts.append(list(pool.map(one, range(concurrent_mates + 1)))[0])
    return texts


def test_seeded_sampling_gives_the_same_text_whatever_speculation_does(specnode, real_model,
                                                                       tmp_path):
    runs = {}
    for name, extra in [("default", []), ("self:8", ["--draft", "self:8"]),
                        ("self:8+ngram", ["--draft", "self:8", "--draft-alternatives", "ngram"]),
                        ("suffix-trees", ["--draft", "suffix", "--tree-nodes", "8"]),
                        ("recycle-trees", ["--draft", "recycle", "--tree-nodes", "8"]),
                        ("none", ["--draft", "none"])]:
        node = Node(specnode, real_model,
                    tmp_path / f"serve-{name.replace(':', '').replace('+', '-')}.log",
                    extra=["--threads", "2", *extra])
        try:
            node.wait_ready(timeout_s=180)
            runs[name] = _seeded_texts(node.endpoint, concurrent_mates=3 if name == "default" else 0)
        finally:
            assert node.stop() == 0, node.log()
    want = runs["none"][0]
    assert len(want) > 40, want
    for name, texts in runs.items():
        for i, t in enumerate(texts):
            assert t == want, (name, i, t, want)
    # The ratio rule is the classic one: its text depends on the drafts, so it need not be
    # the same; it still serves.
    node = Node(specnode, real_model, tmp_path / "serve-ratio.log",
                extra=["--threads", "2", "--acceptance", "ratio"])
    try:
        node.wait_ready(timeout_s=180)
        with SpecnodeClient(node.endpoint, timeout_s=300) as c:
            assert c.generate(**SEEDED).finish_reason in ("stop", "length")
    finally:
        assert node.stop() == 0, node.log()


# Issue 16, item 10: under KV pressure with no host tier (preemption recomputes), every
# admitted request finishes, with the text it has alone. The store (9 MiB, mixed) holds one
# of these ~350-token prompts settled (f16 window + demoted rest: 5-7 MiB with its output)
# but not the whole prompt at f16 (~12 MiB with the demotion reserve) — what a fresh
# prompt or a recompute in one reservation used to need — and not two of them at once.
PRESSURE_CONFIG = """\
speculation:
  draft: none
kv:
  mode: mixed
  capacity_mb: 9
  host_capacity_mb: 0
"""
NOTES = ("The lighthouse keeper wrote in the log that the storm had passed, that the lamp had "
         "burned through the night, and that the supply boat was three days late. ")


def test_kv_pressure_preemption_finishes_every_request(specnode, real_model, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cfg = tmp_path / "pressure.yaml"
    cfg.write_text(PRESSURE_CONFIG)
    prompts = [f"Note {i}. " + NOTES * 10 + "Summarize the notes." for i in range(6)]
    node = Node(specnode, real_model, tmp_path / "serve.log",
                extra=["--config", str(cfg), "--threads", "2"])
    try:
        node.wait_ready(timeout_s=180)

        def one(p):
            with SpecnodeClient(node.endpoint, timeout_s=600) as c:
                return c.generate(prompt=p, max_tokens=128, temperature=0)
        with ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(one, prompts))
        alone = [one(p) for p in prompts[:2]]
        with SpecnodeClient(node.endpoint, timeout_s=60) as c:
            stats = c.stats()
    finally:
        assert node.stop() == 0, node.log()
    assert all(r.stats["prompt_tokens"] > 300 for r in together), [r.stats for r in together]
    for r in together:
        assert r.finish_reason in ("length", "stop"), r
    # Greedy in mixed mode does not depend on preemption or batch mates (item 11).
    for a, t in zip(alone, together):
        assert t.token_ids == a.token_ids, (t.text, a.text)
    assert stats["requests"]["preemptions"] > 0, stats  # the pressure was real


def test_drain_limit_cancels_what_is_left_with_a_reply(specnode, real_model, tmp_path):
    """serve.drain_timeout_s: after SIGINT, a request still running at the limit ends with a
    terminal `cancelled` reply (its text so far streamed), and the node exits 0."""
    cfg = tmp_path / "drain.yaml"
    cfg.write_text("serve:\n  drain_timeout_s: 0.5\n")
    node = Node(specnode, real_model, tmp_path / "serve.log",
                extra=["--config", str(cfg), "--threads", "2"])
    try:
        node.wait_ready(timeout_s=180)
        with SpecnodeClient(node.endpoint, timeout_s=60) as c:
            n, done, signalled = 0, None, None
            for m in c.submit(prompt="Once upon a time", max_tokens=2000, temperature=0):
                if m["type"] == "tokens":
                    n += len(m.get("token_ids", []))
                    if n >= 4 and signalled is None:
                        node.proc.send_signal(signal.SIGINT)
                        signalled = time.monotonic()
                elif m["type"] == "done":
                    done = m
        elapsed = time.monotonic() - signalled
        rc = node.proc.wait(30)
        log = node.log()
    finally:
        node.stop()
    assert rc == 0, log
    assert done["finish_reason"] == "cancelled", done
    assert 0 < n < 2000
    assert elapsed < 5, elapsed
    assert "drain limit (0.5 s) reached" in log
