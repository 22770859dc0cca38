"""Decoding the KV events that node/serve/kv_event_publisher.h publishes, the way a vLLM
consumer does: msgspec structs mirroring vllm/distributed/kv_events.py, and pyzmq helpers
for the PUB stream and the ROUTER replay. A helper module for end-to-end tests (not a test
file itself).

    dec = vllm_decoder()              # array events (the publisher's default, vLLM <= 0.23)
    dec = vllm_decoder(array_like=False)  # map events (KvEventEncoding::kMap, current vLLM)
    for topic, seq, batch in subscribe("tcp://127.0.0.1:5557", "kv-events", count=3): ...
    for seq, batch in replay("tcp://127.0.0.1:5558", 0): ...
"""

from typing import Any, Iterator, Optional, Union

import msgspec
import zmq

END_SEQ = -1


def _structs(array_like: bool):
    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list[Any]
        data_parallel_rank: Optional[int] = None

    class KVCacheEvent(
        msgspec.Struct, array_like=array_like, omit_defaults=True, gc=False, tag=True
    ):
        """Base class of the events (tag: the class name)."""

    class BlockStored(KVCacheEvent):
        block_hashes: list[Union[int, bytes]]  # vLLM's ExternalBlockHash
        parent_block_hash: Optional[Union[int, bytes]]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list[Optional[tuple[Any, ...]]]] = None
        group_idx: Optional[int] = None
        kv_cache_spec_kind: Optional[str] = None
        kv_cache_spec_sliding_window: Optional[int] = None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[Union[int, bytes]]
        medium: Optional[str]
        group_idx: Optional[int] = None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[Union[BlockStored, BlockRemoved, AllBlocksCleared]]

    return KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared


# Built once per encoding so that isinstance checks against the returned types hold.
_TYPES = {True: _structs(True), False: _structs(False)}


def event_types(array_like: bool = True):
    """(KVEventBatch, BlockStored, BlockRemoved, AllBlocksCleared) for that encoding."""
    return _TYPES[array_like]


def vllm_decoder(array_like: bool = True) -> msgspec.msgpack.Decoder:
    """A decoder of one payload into a KVEventBatch (raises msgspec.ValidationError on a
    payload that does not match vLLM's schema)."""
    return msgspec.msgpack.Decoder(type=_TYPES[array_like][0])


def subscribe(
    endpoint: str,
    topic: str = "",
    count: Optional[int] = None,
    timeout_ms: int = 10000,
    array_like: bool = True,
    ctx: Optional[zmq.Context] = None,
) -> Iterator[tuple[str, int, Any]]:
    """Connects a SUB socket and yields (topic, seq, KVEventBatch) per message, until
    `count` messages or `timeout_ms` without one (then TimeoutError). Mind ZeroMQ's slow
    joiner: what is published before the subscription arrives is lost (use replay)."""
    dec = vllm_decoder(array_like)
    ctx = ctx or zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    try:
        n = 0
        while count is None or n < count:
            if not sub.poll(timeout_ms):
                raise TimeoutError(f"no KV event batch on {endpoint} for {timeout_ms} ms")
            parts = sub.recv_multipart()
            if len(parts) != 3 or len(parts[1]) != 8:
                raise ValueError(f"expected [topic, seq(8), payload], got {len(parts)} parts")
            yield parts[0].decode(), int.from_bytes(parts[1], "big"), dec.decode(parts[2])
            n += 1
    finally:
        sub.close()


def replay(
    endpoint: str,
    start_seq: int,
    timeout_ms: int = 10000,
    array_like: bool = True,
    ctx: Optional[zmq.Context] = None,
) -> list[tuple[int, Any]]:
    """Asks the replay ROUTER for every buffered batch from `start_seq` on; returns
    [(seq, KVEventBatch), ...] (the -1 end marker consumed, not returned). Uses a DEALER:
    a REQ socket (as vLLM's example has) can take only the first reply message."""
    dec = vllm_decoder(array_like)
    ctx = ctx or zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send(start_seq.to_bytes(8, "big"))
        got = []
        while True:
            if not sock.poll(timeout_ms):
                raise TimeoutError(f"replay from {endpoint} ended without the end marker")
            seq_bytes, payload = sock.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq == END_SEQ:
                if payload:
                    raise ValueError("end marker with a non-empty payload")
                return got
            got.append((int.from_bytes(seq_bytes, "big"), dec.decode(payload)))
    finally:
        sock.close()
