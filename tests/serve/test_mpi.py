"""`specnode serve` as an mpirun job on localhost (docs/serving.md, "Cluster (mpirun)"):
rank 0 = coordinator + front end + n-gram draft, ranks 1..T = tensor-parallel target shards.

  * greedy and seeded sampled output through the TP-3 job equal the single-process node's,
    with speculation on;
  * a target rank killed mid-request: the client gets an `unavailable` error naming the rank
    and the job exits non-zero, quickly;
  * a tiny model at TP 2 (always runs; no real model needed), with its prefix cache on the
    shards: a prompt sharing whole pages takes them from the shards' caches and the job
    publishes the same KV events as one process;
  * several groups, a draft model on a rank of its own, ranks hung or killed while idle,
    Ctrl-C on mpirun.

Mistakes refused at start and the MPI layer's start-up check: test_mpi_startup.py.
Registered in ctest with it as serve_mpi_pytest (skipped without mpirun); every wait is
bounded.
"""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mpi_helpers import (DRAIN_MCA, MPIRUN, TP3, MpiNode, groups_config, mpi_env, mpirun_cmd,
                         tp_config)
from serve_helpers import ROOT, Node, free_port, health

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (apt-get install openmpi-bin)")

PROMPTS = [
    "The capital of France is",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
]


def single_config(tmp_path, source: Path) -> Path:
    """The same config without its topology: what one process serves."""
    text = source.read_text()
    text = text[:text.index("topology:")]
    out = tmp_path / "single.yaml"
    out.write_text(text)
    return out


# Seeded sampling (issue 16): the same seed gives the same text at any TP size.
SAMPLED = dict(temperature=0.8, top_k=40, top_p=0.9, seed=7)


def greedy(endpoint, prompts, max_tokens, sampled=False):
    """Each prompt greedily; with `sampled`, each prompt again with SAMPLED after them."""
    from specnode_client import SpecnodeClient

    results = []
    with SpecnodeClient(endpoint, timeout_s=120) as c:
        for p in prompts:
            r = c.generate(prompt=p, max_tokens=max_tokens, temperature=0)
            results.append(r)
        if sampled:
            for p in prompts:
                results.append(c.generate(prompt=p, max_tokens=max_tokens, **SAMPLED))
    return results


def single_process_greedy(specnode, model, tmp_path, cfg, prompts, max_tokens, sampled=False):
    """What one process serving `cfg` without its topology answers, greedily (and sampled)."""
    single = Node(specnode, model, tmp_path / "single.log",
                  extra=["--config", str(single_config(tmp_path, cfg)), "--threads", "1"])
    try:
        single.wait_ready()
        return greedy(single.endpoint, prompts, max_tokens, sampled)
    finally:
        single.stop()


@pytest.mark.layer_matrix
def test_tp3_greedy_matches_single_process(specnode, real_model, tmp_path):
    want = single_process_greedy(specnode, real_model, tmp_path, TP3, PROMPTS, 24, sampled=True)
    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 4, TP3)
    try:
        h = node.wait_ready(180)
        assert h["status"] == "ok"
        assert [r["rank"] for r in h["ranks"]] == [0, 1, 2, 3], h
        assert [r["role"] for r in h["ranks"]] == ["coordinator"] + ["target"] * 3
        got = greedy(node.endpoint, PROMPTS, 24, sampled=True)
        log = node.log()
    finally:
        node.stop()
    for p, w, g in zip(PROMPTS + [f"{p} (sampled)" for p in PROMPTS], want, got):
        assert g.token_ids == w.token_ids, (p, w.text, g.text)
        assert g.text == w.text
    # Speculation ran (the n-gram drafter proposes on the repetitive prompt), so the
    # all-logits verification path went through the shards too.
    assert sum(r.stats["drafted"] for r in got) > 0, [r.stats for r in got]
    assert "target on 3 ranks" in log


def _stream_then_ctrl_c(node, max_tokens):
    """Streams a greedy request, sends SIGINT to mpirun itself (Ctrl-C in its terminal, not
    rank 0) once tokens flow, submits again 0.5 s later. Returns (terminal message of the
    stream, the late submit's error, seconds from the signal to the terminal message,
    mpirun's exit code, log)."""
    import threading

    from specnode_client import SpecnodeClient, SpecnodeError

    result, first_tokens = {}, threading.Event()

    def stream():
        try:
            with SpecnodeClient(node.endpoint, timeout_s=180) as c:
                n = 0
                for m in c.submit(prompt="Once upon a time", max_tokens=max_tokens,
                                  temperature=0):
                    if m["type"] == "tokens":
                        n += len(m.get("token_ids", []))
                        first_tokens.set()
                    elif m["type"] == "done":
                        result["done"] = (m["finish_reason"], n)
                        result["at"] = time.monotonic()
        except Exception as e:  # reported by the caller's asserts
            result["error"] = repr(e)
            first_tokens.set()
    t = threading.Thread(target=stream)
    t.start()
    assert first_tokens.wait(120), node.log()
    signalled = time.monotonic()
    os.kill(node.proc.pid, signal.SIGINT)  # mpirun, not its process group
    time.sleep(0.5)
    late = None
    try:
        with SpecnodeClient(node.endpoint, timeout_s=20) as c:
            c.generate(prompt="late", max_tokens=4, temperature=0)
    except SpecnodeError as e:
        late = e
    t.join(180)
    rc = node.proc.wait(120)
    return result, late, result.get("at", signalled) - signalled, rc, node.log()


@pytest.mark.layer_matrix
def test_ctrl_c_on_mpirun_drains(specnode, real_model, tmp_path):
    """Issue 16, item 2, with the documented launch line (odls_base_sigkill_timeout 16):
    the running stream finishes with its terminal reply, a submit after the signal gets
    shutting_down, rank 0 drains and every rank exits 0 (mpirun itself reports 1 for an
    interrupted job: OpenMPI's convention, docs/serving.md)."""
    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 4, TP3, mpirun_extra=DRAIN_MCA)
    try:
        node.wait_ready(180)
        assert "odls_base_sigkill_timeout" not in node.log()  # no warning: it is set
        result, late, _, rc, log = _stream_then_ctrl_c(node, 120)
    finally:
        node.stop()
    assert result.get("done") == ("length", 120), (result, log)
    assert late is not None and late.code == "shutting_down", (late, log)
    assert "drained, exiting" in log, log
    assert rc in (0, 1), log


def test_ctrl_c_on_plain_mpirun_ends_streams_with_a_reply(specnode, real_model, tmp_path):
    """Without the flag OpenMPI SIGKILLs the ranks 2 s after Ctrl-C: a long stream cannot
    finish, but it ends with a terminal `cancelled` reply before that (nothing is lost
    silently), and new submits are refused at once."""
    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 4, TP3)
    try:
        node.wait_ready(180)
        result, late, after_s, rc, log = _stream_then_ctrl_c(node, 1000)
    finally:
        node.stop()
    assert result.get("done", (None,))[0] == "cancelled", (result, log)
    assert after_s < 2.0, (after_s, log)
    assert late is not None and late.code == "shutting_down", (late, log)
    assert "drained, exiting" in log, log


@pytest.mark.layer_matrix
def test_killed_target_rank_fails_requests_and_ends_the_job(specnode, real_model, tmp_path):
    from specnode_client import SpecnodeClient, SpecnodeError

    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 4, TP3)
    try:
        h = node.wait_ready(180)
        victim = next(r for r in h["ranks"] if r["rank"] == 2)
        with SpecnodeClient(node.endpoint, timeout_s=30) as c:
            seen = 0
            killed_at = None
            with pytest.raises(SpecnodeError) as err:
                for m in c.submit(prompt="Once upon a time", max_tokens=1000, temperature=0):
                    if m["type"] == "tokens":
                        seen += 1
                        if seen == 3:
                            os.kill(victim["pid"], signal.SIGKILL)
                            killed_at = time.monotonic()
            assert killed_at is not None
            assert time.monotonic() - killed_at < 10
        assert err.value.code == "unavailable", err.value
        assert "target rank 2" in err.value.message, err.value.message
        node.proc.wait(timeout=30)
        assert node.proc.returncode != 0
        log = node.log()
        assert "the target failed: target rank 2" in log, log
    finally:
        node.stop()


@pytest.mark.layer_matrix
def test_tiny_model_tp2_matches_single_process(specnode, tiny_model, tmp_path):
    cfg = tp_config(tmp_path, 2)
    prompts = ["hello world", "the the the the the the"]
    want = single_process_greedy(specnode, tiny_model, tmp_path, cfg, prompts, 16)
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 3, cfg)
    try:
        node.wait_ready(120)
        got = greedy(node.endpoint, prompts, 16)
        # Idle past the heartbeat (1 s): the pings (empty steps) leave the node healthy.
        time.sleep(2.5)
        again = greedy(node.endpoint, prompts, 16)
        assert health(node.endpoint)["status"] == "ok"
        # A graceful stop: rank 0 drains, tells the shards to shut down.
    finally:
        node.stop()
    for w, g, a in zip(want, got, again):
        assert g.token_ids == w.token_ids, (w.text, g.text)
        assert a.token_ids == w.token_ids, (w.text, a.text)


def test_tiny_model_tp2_draft_trees_match_single_process(specnode, tiny_model, tmp_path):
    """Draft trees over mpirun (control protocol v6: tree entries, KeepRows ops): with token
    recycling (its trees branch over the target's own candidates), tree_nodes and
    tree_choice: always, the TP-2 job verified trees and its greedy and seeded text equal one
    process's."""
    cfg = tp_config(tmp_path, 2)
    cfg.write_text(cfg.read_text().replace(
        "  draft: ngram\n", "  draft: recycle\n  tree_nodes: 8\n  tree_choice: always\n"))
    prompts = ["the the the the the the", "hello world hello world hello"]
    want = single_process_greedy(specnode, tiny_model, tmp_path, cfg, prompts, 24, sampled=True)
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 3, cfg)
    try:
        node.wait_ready(120)
        got = greedy(node.endpoint, prompts, 24, sampled=True)
    finally:
        node.stop()
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
    # Every tree drafted was verified (tree_choice: always), through the shards.
    assert sum(r.stats["tree_steps"] for r in got) > 0, [r.stats for r in got]


def test_tp4_over_two_kv_heads_replicates_them_and_matches_single_process(specnode, tmp_path):
    """TP 4 of a model with 2 KV heads: each kv head lives on two target ranks (vLLM's
    replication), each rank a quarter of the query heads; greedy and seeded text equal one
    process's, and each rank reports its one kv head's store."""
    model = tmp_path / "kv2.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(model), "--d-model", "256", "--heads",
                    "8", "--kv-heads", "2", "--ff", "512"], check=True, capture_output=True)
    cfg = tp_config(tmp_path, 4)
    prompts = ["hello world", "the the the the the the"]
    want = single_process_greedy(specnode, model, tmp_path, cfg, prompts, 16, sampled=True)
    node = MpiNode(specnode, model, tmp_path / "mpi.log", 5, cfg)
    try:
        h = node.wait_ready(180)
        assert [r["role"] for r in h["ranks"]] == ["coordinator"] + ["target"] * 4, h
        got = greedy(node.endpoint, prompts, 16, sampled=True)
        log = node.log()
    finally:
        node.stop()
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
    line = next(l for l in log.splitlines() if "group cpu target, TP 4" in l)
    assert "per rank 2 heads, 1 kv heads (each on 2 ranks), 128 ffn units" in line, line
    assert len(re.findall(r"rank \d cpu on \S+: weights [\d.]+ MiB, KV 64 MiB", line)) == 4, line


def kv_events(rep, array_like=True):
    """Every event the node published, replayed from seq 0, as comparable tuples."""
    from kv_events_decode import event_types, replay

    _, stored, removed, _ = event_types(array_like)
    out = []
    for _, batch in replay(rep, 0, array_like=array_like):
        for e in batch.events:
            if isinstance(e, stored):
                out.append(("stored", tuple(e.block_hashes), e.parent_block_hash,
                            tuple(e.token_ids), e.block_size, e.medium))
            elif isinstance(e, removed):
                out.append(("removed", tuple(e.block_hashes), e.medium))
            else:
                out.append(("cleared",))
    return out


PREFIX = ("The quick brown fox jumps over the lazy dog while the cat watches from a sunny "
          "windowsill and the birds sing in the old oak tree behind the house")
PREFIX_PROMPTS = [PREFIX + " and one more thing", PREFIX + " but then something else happens"]


def prefix_run(endpoint, rep):
    """Both prompts in turn, then the events once they stop changing: a TP target's shards
    publish a finished request's blocks with the next step, at the latest the idle
    heartbeat's (1 s)."""
    got = greedy(endpoint, PREFIX_PROMPTS, 8)
    deadline = time.monotonic() + 30
    events, since = kv_events(rep), time.monotonic()
    while time.monotonic() - since < 2.5 and time.monotonic() < deadline:
        time.sleep(0.1)
        now = kv_events(rep)
        if now != events:
            events, since = now, time.monotonic()
    return got, events


def test_tiny_model_tp2_prefix_cache_and_kv_events(specnode, tiny_model, tmp_path):
    """The prefix cache on TP shards: the second prompt takes the first's shared whole pages
    from both shards' caches (cached_tokens as one process has them), the text is the single
    process's, and the job's KV events (replayed as a vLLM consumer reads them) are the
    single process's, block for block."""
    def config(name, topology):
        pub, rep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
        text = tp_config(tmp_path, 2, name).read_text()
        if not topology:
            text = text[:text.index("topology:")]
        text = text.replace("version: 1\n", "version: 1\nserve:\n"
                            f"  kv_events_bind: {pub}\n  kv_events_replay_bind: {rep}\n", 1)
        text = text.replace("kv:\n", "kv:\n  page_tokens: 8\n", 1)
        (tmp_path / name).write_text(text)
        return tmp_path / name, rep

    single_cfg, single_rep = config("single.yaml", False)
    single = Node(specnode, tiny_model, tmp_path / "single.log",
                  extra=["--config", str(single_cfg), "--threads", "1"])
    try:
        single.wait_ready()
        want, want_events = prefix_run(single.endpoint, single_rep)
    finally:
        single.stop()
    mpi_cfg, mpi_rep = config("tp2.yaml", True)
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 3, mpi_cfg)
    try:
        node.wait_ready(120)
        got, events = prefix_run(node.endpoint, mpi_rep)
        from specnode_client import SpecnodeClient
        with SpecnodeClient(node.endpoint, timeout_s=30) as c:
            metrics = c.metrics()
    finally:
        node.stop()
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
        assert g.stats["cached_tokens"] == w.stats["cached_tokens"]
    assert got[0].stats["cached_tokens"] == 0
    assert got[1].stats["cached_tokens"] >= 16, got[1].stats  # two pages of 8, at least
    hits = re.search(r"^specnode_prefix_cache_hit_tokens_total (\S+)$", metrics, re.M)
    assert hits and float(hits.group(1)) == got[1].stats["cached_tokens"], metrics
    assert events[0] == ("cleared",)
    stored = [e for e in events if e[0] == "stored"]
    assert len(stored) >= 2 and stored[0][2] is None and stored[1][2] is not None
    assert events == want_events


def concurrent_greedy(endpoint, prompts, max_tokens):
    """Every prompt submitted at once (one client each), so the router sees load."""
    import threading

    from specnode_client import SpecnodeClient

    results = [None] * len(prompts)

    def run(i):
        with SpecnodeClient(endpoint, timeout_s=120) as c:
            results[i] = c.generate(prompt=prompts[i], max_tokens=max_tokens, temperature=0)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert all(r is not None for r in results), results
    return results


def group_gauge(endpoint, family, group):
    from specnode_client import SpecnodeClient

    with SpecnodeClient(endpoint, timeout_s=10) as c:
        text = c.metrics()
    m = re.search(rf'^{family}{{group="{group}"}} (\S+)$', text, re.M)
    assert m, text
    return float(m.group(1))


GROUP_PROMPTS = ["hello world", "the the the the the the", "one two three one two three",
                 "a b c d a b c d", "zebra", "hello hello world world"]


def test_two_groups_share_requests_and_match_single_process(specnode, tiny_model, tmp_path):
    """Group a: TP 2 on ranks 1-2; group b: TP 1 on rank 3; both drafts (n-gram) on rank 0."""
    cfg = groups_config(tmp_path, [("a", 0, [1, 2]), ("b", 0, [3])])
    want = single_process_greedy(specnode, tiny_model, tmp_path, cfg, GROUP_PROMPTS, 16)
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 4, cfg)
    try:
        h = node.wait_ready(120)
        assert [r["role"] for r in h["ranks"]] == ["coordinator"] + ["target"] * 3, h
        got = concurrent_greedy(node.endpoint, GROUP_PROMPTS, 16)
        started = {g: group_gauge(node.endpoint, "specnode_group_sequences_started_total", g)
                   for g in ("a", "b")}
        from specnode_client import SpecnodeClient
        with SpecnodeClient(node.endpoint, timeout_s=10) as c:
            metrics = c.metrics()
        log = node.log()
    finally:
        node.stop()
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
    assert started["a"] + started["b"] == len(GROUP_PROMPTS), started
    assert min(started.values()) >= 1, started  # the router used both groups
    assert "2 groups on 3 ranks" in log, log
    # KV bytes come from the shards' replies: every target rank's capacity (64 MiB), summed.
    cap = re.search(r"^specnode_kv_capacity_bytes (\S+)$", metrics, re.M)
    assert cap and float(cap.group(1)) == 3 * 64 * 2**20, metrics
    assert re.search(r"^specnode_kv_used_bytes (\S+)$", metrics, re.M), metrics
    assert re.search(r'^specnode_kv_bytes\{class="f16"\} \d', metrics, re.M), metrics
    # Tokens per class and the host tier come over the control protocol too (issue 16,
    # item 5): as in one process.
    for cls in ("f16", "int8", "int4"):
        assert re.search(rf'^specnode_kv_tokens\{{class="{cls}"\}} \d', metrics, re.M), metrics
    assert re.search(r"^specnode_kv_host_bytes \d", metrics, re.M), metrics


def test_rank0_failing_to_serve_ends_every_rank(specnode, tiny_model, tmp_path):
    """Rank 0 cannot bind its endpoint after connecting a target group and a draft model on a
    rank of its own: every rank must be told to stop and the job must end at once, non-zero,
    naming the cause. (The draft rank used to be left waiting forever: its runner was
    destroyed with ServeNode's groups before rank 0 shut the ranks down.)"""
    import socket

    draft = tmp_path / "draft.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(draft), "--perturb", "0.05"], check=True)
    cfg = groups_config(tmp_path, [("a", 0, [1]), ("b", 3, [2])], draft=str(draft))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    t0 = time.monotonic()
    try:
        res = subprocess.run(mpirun_cmd(4, specnode, "--config", str(cfg), "--model", tiny_model,
                                        "--bind", f"tcp://127.0.0.1:{port}", "--threads", "1"),
                             capture_output=True, text=True, env=mpi_env(), timeout=90,
                             start_new_session=True)
    finally:
        taken.close()
    assert res.returncode != 0
    assert f"cannot bind tcp://127.0.0.1:{port}" in res.stdout + res.stderr
    assert time.monotonic() - t0 < 45


def test_draft_model_on_its_own_rank(specnode, tiny_model, tmp_path):
    """Group b's draft model runs on rank 3 (a one-rank shard serving the draft file)."""
    draft = tmp_path / "draft.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(draft), "--perturb", "0.05"], check=True)
    cfg = groups_config(tmp_path, [("a", 0, [1]), ("b", 3, [2])], draft=str(draft))
    want = single_process_greedy(specnode, tiny_model, tmp_path, cfg, GROUP_PROMPTS, 16)
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 4, cfg)
    try:
        h = node.wait_ready(120)
        roles = {r["rank"]: r["role"] for r in h["ranks"]}
        assert roles == {0: "coordinator", 1: "target", 2: "target", 3: "draft"}, h
        got = concurrent_greedy(node.endpoint, GROUP_PROMPTS, 16)
        started_b = group_gauge(node.endpoint, "specnode_group_sequences_started_total", "b")
    finally:
        node.stop()
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids, (w.text, g.text)
    assert started_b >= 1
    # The close draft was verified through both groups' targets.
    assert sum(r.stats["drafted"] for r in got) > 0


def test_shipped_two_group_config_serves_smollm2(specnode, real_model, tmp_path):
    """cluster-configs/mpirun-cpu-2groups.yaml: two SmolLM2 replicas behind one front end."""
    cfg = ROOT / "cluster-configs" / "mpirun-cpu-2groups.yaml"
    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 3, cfg)
    try:
        h = node.wait_ready(180)
        assert [r["role"] for r in h["ranks"]] == ["coordinator", "target", "target"], h
        got = concurrent_greedy(node.endpoint, PROMPTS, 12)
        started = {g: group_gauge(node.endpoint, "specnode_group_sequences_started_total", g)
                   for g in ("a", "b")}
    finally:
        node.stop()
    assert all(len(r.token_ids) > 0 for r in got)
    assert sum(started.values()) == len(PROMPTS) and min(started.values()) >= 1, started


def test_killed_rank_of_one_group_fails_every_request(specnode, real_model, tmp_path):
    """Two SmolLM2 groups, one request on each; group b's target rank is killed: both
    clients get `unavailable` naming the rank, and the job exits non-zero, bounded."""
    import threading

    from specnode_client import SpecnodeClient, SpecnodeError

    cfg = groups_config(tmp_path, [("a", 0, [1]), ("b", 0, [2])])
    node = MpiNode(specnode, real_model, tmp_path / "mpi.log", 3, cfg)
    try:
        h = node.wait_ready(180)
        victim = next(r for r in h["ranks"] if r["rank"] == 2)
        errors = [None, None]
        streaming = threading.Barrier(3, timeout=60)

        def run(i):
            with SpecnodeClient(node.endpoint, timeout_s=30) as c:
                seen = 0
                try:
                    for m in c.submit(prompt=f"Once upon a time {i}", max_tokens=1000,
                                      temperature=0):
                        if m["type"] == "tokens":
                            seen += 1
                            if seen == 2:
                                streaming.wait()
                except SpecnodeError as e:
                    errors[i] = e

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        streaming.wait()  # both requests are running, one per group
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        for t in threads:
            t.join(timeout=30)
        assert time.monotonic() - killed_at < 15
        assert all(e is not None and e.code == "unavailable" for e in errors), errors
        assert any("target rank 2" in e.message for e in errors), errors
        node.proc.wait(timeout=30)
        assert node.proc.returncode != 0
    finally:
        node.stop()


def assert_stopped_rank_ends_job(node, pick, needle, warm_up=None):
    """On a ready node, SIGSTOPs the rank `pick(ranks)` returns (after `warm_up(endpoint)`);
    the job must exit non-zero within 15 s with `needle` in its log."""
    victim = None
    try:
        h = node.wait_ready(120)
        victim = pick(h["ranks"])
        if warm_up is not None:
            warm_up(node.endpoint)
        os.kill(victim["pid"], signal.SIGSTOP)
        stopped_at = time.monotonic()
        node.proc.wait(timeout=30)
        assert time.monotonic() - stopped_at < 15
        assert node.proc.returncode != 0
        log = node.log()
        assert needle in log, log
    finally:
        if victim is not None:
            try:
                os.kill(victim["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        node.stop()


def test_rank_hung_while_idle_ends_the_job(specnode, tiny_model, tmp_path):
    """A target rank that stops answering while no request runs (SIGSTOP) is found by the
    coordinator's heartbeat (an empty step every second) within heartbeat + timeout_s; the
    job exits non-zero naming the rank."""
    cfg = tmp_path / "hang.yaml"
    cfg.write_text(tp_config(tmp_path, 2).read_text().replace("timeout_s: 30", "timeout_s: 2"))
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 3, cfg)
    assert_stopped_rank_ends_job(
        node, lambda ranks: next(r for r in ranks if r["rank"] == 2),
        "target rank 2 did not answer within 3.0 s",  # 1.5 x timeout_s, as waited
        warm_up=lambda endpoint: greedy(endpoint, ["hello world"], 4))  # healthy first


def test_draft_rank_hung_while_idle_ends_the_job(specnode, tiny_model, tmp_path):
    """The heartbeat also covers a draft model on a rank of its own."""
    draft = tmp_path / "draft.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(draft), "--perturb", "0.05"], check=True)
    cfg = groups_config(tmp_path, [("a", 0, [1]), ("b", 3, [2])], draft=str(draft))
    cfg.write_text(cfg.read_text().replace("timeout_s: 30", "timeout_s: 2"))
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 4, cfg)
    assert_stopped_rank_ends_job(node, lambda ranks: next(r for r in ranks if r["role"] == "draft"),
                                 "draft rank 3 did not answer within 3.0 s")
