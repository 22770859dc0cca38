"""KV events from a real node (`serve.kv_events_bind`, docs/kv-events.md), read the way a
vLLM consumer reads them: a pyzmq subscriber / replay client decoding every batch with
msgspec structs mirroring vLLM's (kv_events_decode.py). What a KV-aware router needs: the
start-up AllBlocksCleared, BlockStored with the prompt's token ids, a second prompt sharing
a prefix chained to it, BlockRemoved for stored blocks after eviction, replay with its end
marker, AllBlocksCleared at shutdown; and the config's refusals."""
import json
import signal
import subprocess
import time

import pytest
import zmq

from kv_events_decode import event_types, replay, subscribe
from serve_helpers import Node, free_port
from specnode_client import SpecnodeClient


def write_config(tmp_path, pub, rep, encoding="array", capacity_mb=1, extra_kv=""):
    cfg = tmp_path / "kv-events.yaml"
    cfg.write_text(f"""\
version: 1
serve:
  kv_events_bind: {pub}
  kv_events_replay_bind: {rep}
  kv_events_topic: kv@node-a@tiny
  kv_events_encoding: {encoding}
speculation:
  draft: none
kv:
  mode: full
  capacity_mb: {capacity_mb}
  host_capacity_mb: 0
  page_tokens: 8
{extra_kv}""")
    return cfg


class EventNode:
    def __init__(self, specnode, model, tmp_path, encoding="array", capacity_mb=1):
        self.pub = f"tcp://127.0.0.1:{free_port()}"
        self.rep = f"tcp://127.0.0.1:{free_port()}"
        cfg = write_config(tmp_path, self.pub, self.rep, encoding, capacity_mb)
        self.array_like = encoding == "array"
        self.node = Node(specnode, model, tmp_path / "serve.log",
                         extra=["--config", str(cfg), "--threads", "1"])
        self.node.wait_ready()

    def events(self, start=0):
        """Every event replayed from `start`: [(seq, event)] in order."""
        out = []
        for seq, batch in replay(self.rep, start, array_like=self.array_like):
            out.extend((seq, e) for e in batch.events)
        return out

    def wait_for(self, pred, timeout_s=30):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            evs = self.events()
            if pred(evs):
                return evs
            time.sleep(0.05)
        pytest.fail(f"events never matched: {self.events()}")


def tokenize(specnode, model, text):
    r = subprocess.run([specnode, "tokenize", "--model", model, "--text", text],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["ids"]


def generate(node, prompt):
    with SpecnodeClient(node.node.endpoint, timeout_s=60) as c:
        return c.generate(prompt, max_tokens=2, temperature=0)


PREFIX = ("The quick brown fox jumps over the lazy dog while the cat watches from a sunny "
          "windowsill and the birds sing in the old oak tree behind the house")


@pytest.fixture
def event_node(specnode, tiny_model, tmp_path):
    n = EventNode(specnode, tiny_model, tmp_path)
    yield n
    n.node.stop()


def test_stored_blocks_carry_the_prompt_and_chain_across_prompts(event_node, specnode,
                                                                 tiny_model):
    Batch, Stored, Removed, Cleared = event_types(True)
    # A (re)started node says its cache is empty first (its publisher thread may send that
    # just after the node answers health: wait for it).
    first = event_node.wait_for(lambda e: bool(e))
    assert isinstance(first[0][1], Cleared) and first[0][0] == 0

    ids1 = tokenize(specnode, tiny_model, PREFIX + " and one more thing")
    generate(event_node, PREFIX + " and one more thing")
    evs = event_node.wait_for(lambda e: any(isinstance(x, Stored) for _, x in e))
    stored = [x for _, x in evs if isinstance(x, Stored)]
    s0 = stored[0]
    assert s0.block_size == 8 and s0.parent_block_hash is None and s0.medium == "CPU"
    n = len(s0.block_hashes)
    assert n == len(ids1) // 8  # the prompt's whole blocks
    assert s0.token_ids == ids1[:8 * n]
    assert s0.lora_id is None and all(0 <= h < 2 ** 63 for h in s0.block_hashes)
    known = [h for s in stored for h in s.block_hashes]

    # A second prompt sharing the first blocks: only its new blocks are stored, chained to
    # the last block the two share.
    ids2 = tokenize(specnode, tiny_model, PREFIX + " but then something else entirely happens")
    shared = 0
    while shared < min(len(ids1), len(ids2)) and ids1[shared] == ids2[shared]:
        shared += 1
    shared_blocks = shared // 8
    assert shared_blocks >= 2, "the prompts must share whole blocks"
    before = len(evs)
    generate(event_node, PREFIX + " but then something else entirely happens")
    evs = event_node.wait_for(lambda e: any(isinstance(x, Stored) for _, x in e[before:]))
    new = [x for _, x in evs[before:] if isinstance(x, Stored)][0]
    assert new.parent_block_hash == s0.block_hashes[shared_blocks - 1]
    assert new.token_ids[:8] == ids2[8 * shared_blocks:8 * shared_blocks + 8]
    assert not set(new.block_hashes) & set(s0.block_hashes[:shared_blocks])
    # Sequence numbers run without gaps from 0.
    seqs = sorted({seq for seq, _ in evs})
    assert seqs == list(range(len(seqs)))
    del known


def test_eviction_removes_stored_blocks(event_node):
    Batch, Stored, Removed, Cleared = event_types(True)
    # 1 MiB of KV fills after a few dozen distinct prompts: cached pages are then evicted.
    for i in range(200):
        generate(event_node, f"request {i}: " + PREFIX * 2)
        evs = event_node.events()
        if any(isinstance(x, Removed) for _, x in evs):
            break
    else:
        pytest.fail("no BlockRemoved after 200 distinct prompts in 1 MiB of KV")
    stored, removed = set(), []
    for _, x in evs:
        if isinstance(x, Stored):
            stored.update(x.block_hashes)
        elif isinstance(x, Removed):
            assert x.medium == "CPU"
            removed.extend(x.block_hashes)
            assert set(x.block_hashes) <= stored, "removed blocks were stored before"
    assert removed


def test_live_stream_and_shutdown_clear(specnode, tiny_model, tmp_path):
    n = EventNode(specnode, tiny_model, tmp_path)
    Batch, Stored, Removed, Cleared = event_types(True)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, "kv@")
    sub.connect(n.pub)
    time.sleep(0.3)  # ZeroMQ's slow joiner: the subscription reaches the PUB socket
    generate(n, PREFIX)
    from kv_events_decode import vllm_decoder
    dec = vllm_decoder(True)
    got = []
    deadline = time.monotonic() + 30
    while not any(isinstance(e, Stored) for e in got) and time.monotonic() < deadline:
        if sub.poll(1000):
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv@node-a@tiny" and len(seq) == 8
            got.extend(dec.decode(payload).events)
    assert any(isinstance(e, Stored) for e in got)
    n.node.proc.send_signal(signal.SIGINT)
    cleared = False
    deadline = time.monotonic() + 30
    while not cleared and time.monotonic() < deadline:
        if sub.poll(1000):
            cleared = any(isinstance(e, Cleared)
                          for e in dec.decode(sub.recv_multipart()[2]).events)
    sub.close()
    assert cleared, "no AllBlocksCleared at shutdown"
    assert n.node.stop() == 0


def test_map_encoding(specnode, tiny_model, tmp_path):
    n = EventNode(specnode, tiny_model, tmp_path, encoding="map")
    try:
        Batch, Stored, Removed, Cleared = event_types(False)
        generate(n, PREFIX)
        evs = n.wait_for(lambda e: any(isinstance(x, Stored) for _, x in e))
        assert isinstance(evs[0][1], Cleared)
        # An array decoder refuses map events: the two layouts really differ.
        with pytest.raises(Exception):
            replay(n.rep, 0, array_like=True)
    finally:
        assert n.node.stop() == 0


@pytest.mark.parametrize("serve_keys,kv_keys,needle", [
    ("  kv_events_replay_bind: tcp://127.0.0.1:1\n", "", "needs serve.kv_events_bind"),
    ("  kv_events_bind: tcp://127.0.0.1:1\n", "  prefix_cache: false\n", "kv.prefix_cache"),
    ("  kv_events_bind: nope\n", "", "ZeroMQ endpoint"),
    ("  kv_events_bind: tcp://127.0.0.1:1\n  kv_events_encoding: json\n", "",
     "kv_events_encoding"),
])
def test_config_refusals(specnode, tiny_model, tmp_path, serve_keys, kv_keys, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(f"version: 1\nserve:\n{serve_keys}kv:\n  mode: full\n{kv_keys}")
    r = subprocess.run([specnode, "serve", "--config", str(cfg), "--model", tiny_model],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and needle in r.stderr, r.stderr
    assert "bad.yaml:" in r.stderr  # file:line of the key
