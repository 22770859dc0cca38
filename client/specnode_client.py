"""Python client for `specnode serve` (ZeroMQ + JSON, docs/protocol.md). Needs pyzmq.

    from specnode_client import SpecnodeClient, SpecnodeError

    with SpecnodeClient("tcp://127.0.0.1:5555", timeout_s=60) as client:
        for chunk in client.stream(messages=[{"role": "user", "content": "Hi"}], max_tokens=64):
            print(chunk, end="", flush=True)
        result = client.generate(prompt="The capital of France is", max_tokens=8, temperature=0)
        print(result.text, result.finish_reason, result.stats["ttft_ms"])
        print(client.health()["status"], client.stats()["metrics"])

One client = one DEALER socket = one connection. Request ids are scoped to the connection,
so `cancel(id)` reaches only requests submitted through the same client. A client is not
thread-safe: give each thread its own.

Errors: an `error` reply raises `SpecnodeError` (`.code`, `.message`, `.id`); no node at
the endpoint, or no message for `timeout_s`, raises `SpecnodeTimeout` (code "timeout").
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, Iterator, List, Optional

import zmq

# The node's error codes (code -> {"http", "meaning"}): client/error_codes.json, written by
# `specnode error-codes --json` from the node's one table (coordinator/request_error.h) and
# checked equal to it by the tests. "timeout" is this client's own (no reply in time).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "error_codes.json"),
          encoding="utf-8") as _f:
    ERROR_CODES: Dict[str, Dict[str, Any]] = json.load(_f)

__all__ = ["SpecnodeClient", "SpecnodeError", "SpecnodeTimeout", "Result"]

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
TERMINAL_TYPES = ("done", "error")


class SpecnodeError(Exception):
    """The node answered with an `error` reply (or the client could not talk to it)."""

    def __init__(self, code: str, message: str, id: Optional[str] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.id = id


class SpecnodeTimeout(SpecnodeError):
    """No node at the endpoint, or no message from it within the timeout."""

    def __init__(self, message: str, id: Optional[str] = None):
        super().__init__("timeout", message, id)


@dataclass
class Result:
    """The outcome of one request: the full text, why it ended, and the node's stats."""

    id: str
    text: str
    finish_reason: str
    stats: Dict[str, Any]
    token_ids: List[int] = field(default_factory=list)
    client_ttft_ms: Optional[float] = None  # send -> first `tokens`, measured here
    wall_ms: float = 0.0


class SpecnodeClient:
    """A connection to one node. Use as a context manager, or call close()."""

    _counter = itertools.count(1)

    def __init__(self, endpoint: str = DEFAULT_ENDPOINT, timeout_s: float = 60.0,
                 curve_server_key: Optional[str] = None,
                 curve_keypair: Optional[tuple] = None,
                 context: Optional[zmq.Context] = None):
        """timeout_s bounds how long any call waits for the node: to connect, and for
        each next message. curve_server_key (Z85) turns CurveZMQ on; curve_keypair is
        (public, secret) in Z85, default a fresh pair."""
        self.endpoint = endpoint
        self.timeout_s = float(timeout_s)
        self._ctx = context or zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # Only queue on a completed connection, so "no node" times out instead of queueing.
        self._sock.setsockopt(zmq.IMMEDIATE, 1)
        self._sock.setsockopt(zmq.SNDTIMEO, int(min(self.timeout_s, 5.0) * 1000))
        self._sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        self._sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        if curve_server_key:
            public, secret = curve_keypair or zmq.curve_keypair()
            self._sock.curve_serverkey = _bytes(curve_server_key)
            self._sock.curve_publickey = _bytes(public)
            self._sock.curve_secretkey = _bytes(secret)
        self._sock.connect(endpoint)
        self._queues: Dict[str, Deque[dict]] = {}   # active request id -> its messages
        self._replies: Deque[dict] = collections.deque()  # stats / health / id-less errors
        self._cancel_replies: Deque[dict] = collections.deque()  # unknown_id errors
        self._dup_errors: Deque[dict] = collections.deque()  # duplicate_id errors
        # Submits sent and not answered yet (no `accepted` / error with their id), oldest
        # first. The node answers frames in order; an error with id null (a frame too large
        # to read its id from) is the answer to the oldest of them.
        self._unanswered: Deque[str] = collections.deque()

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        if not self._sock.closed:
            self._sock.close(linger=0)

    def __enter__(self) -> "SpecnodeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------
    def submit(self, prompt: Optional[str] = None, messages: Optional[list] = None,
               id: Optional[str] = None, **params) -> Iterator[dict]:
        """Sends a submit and returns an iterator over this request's messages
        (`accepted`, `tokens`..., then `done`), ending after `done`. An `error` reply
        raises SpecnodeError. params: max_tokens, temperature, top_p, top_k, seed, stop,
        domain, sla, stream — sent as given (the node checks them; None is left out).

        The submit is sent before this returns; iterate to receive."""
        if (prompt is None) == (messages is None):
            raise ValueError("give exactly one of prompt= or messages=")
        rid = id if id is not None else f"py-{os.getpid()}-{next(self._counter)}"
        if not (isinstance(rid, str) and 1 <= len(rid) <= 128
                and all(0x20 < ord(c) < 0x7f for c in rid)):
            raise ValueError("a request id is 1..128 printable ASCII characters")
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is still active on this connection")
        msg = {"type": "submit", "id": rid}
        if prompt is not None:
            msg["prompt"] = prompt
        else:
            msg["messages"] = messages
        msg.update({k: v for k, v in params.items() if v is not None})
        self._queues[rid] = collections.deque()
        try:
            self._send(msg)
        except BaseException:
            del self._queues[rid]
            raise
        self._unanswered.append(rid)
        return self._events(rid)

    def _events(self, rid: str) -> Iterator[dict]:
        queue = self._queues[rid]
        try:
            while True:
                while not queue:
                    self._pump(rid)
                m = queue.popleft()
                if m.get("type") == "error":
                    raise SpecnodeError(str(m.get("code")), str(m.get("message")), rid)
                yield m
                if m.get("type") == "done":
                    return
        finally:
            # Finished, failed, or abandoned by the caller: forget it. (An abandoned request
            # still runs on the node until it ends or the client disconnects.)
            self._queues.pop(rid, None)

    def generate(self, prompt: Optional[str] = None, messages: Optional[list] = None,
                 **params) -> Result:
        """Runs one request to completion and returns its Result."""
        t0 = time.monotonic()
        text: List[str] = []
        token_ids: List[int] = []
        ttft = None
        for m in self.submit(prompt=prompt, messages=messages, **params):
            if m["type"] == "tokens":
                if ttft is None:
                    ttft = (time.monotonic() - t0) * 1000
                text.append(m.get("text", ""))
                token_ids.extend(m.get("token_ids", []))
            elif m["type"] == "done":
                full = "".join(text) if not m.get("text") else m["text"]
                return Result(id=m["id"], text=full, finish_reason=m.get("finish_reason", ""),
                              stats=m.get("stats", {}), token_ids=token_ids,
                              client_ttft_ms=ttft, wall_ms=(time.monotonic() - t0) * 1000)
        raise SpecnodeError("internal", "the request ended without a done reply")

    def stream(self, prompt: Optional[str] = None, messages: Optional[list] = None,
               **params) -> Iterator[str]:
        """Yields the reply's text chunks as they arrive; the generator's return value
        (StopIteration.value) and self.last_result hold the final Result."""
        t0 = time.monotonic()
        parts: List[str] = []
        token_ids: List[int] = []
        ttft = None
        self.last_result: Optional[Result] = None
        for m in self.submit(prompt=prompt, messages=messages, **params):
            if m["type"] == "tokens":
                if ttft is None:
                    ttft = (time.monotonic() - t0) * 1000
                piece = m.get("text", "")
                parts.append(piece)
                token_ids.extend(m.get("token_ids", []))
                if piece:
                    yield piece
            elif m["type"] == "done":
                if m.get("text"):  # stream=False: the whole text comes with done
                    parts = [m["text"]]
                    yield m["text"]
                self.last_result = Result(
                    id=m["id"], text="".join(parts), finish_reason=m.get("finish_reason", ""),
                    stats=m.get("stats", {}), token_ids=token_ids, client_ttft_ms=ttft,
                    wall_ms=(time.monotonic() - t0) * 1000)
                return self.last_result

    def cancel(self, id: str) -> None:
        """Cancels a request submitted through this client. If it is still active here, the
        cancel is sent and its iterator ends with `done` (finish_reason "cancelled").
        Otherwise waits for the node's answer and raises SpecnodeError("unknown_id")."""
        self._send({"type": "cancel", "id": id})
        if id in self._queues:
            return
        while True:
            while self._cancel_replies:
                m = self._cancel_replies.popleft()
                if m.get("id") == id:
                    raise SpecnodeError(str(m.get("code")), str(m.get("message")), id)
            self._pump(None)

    def stats(self) -> dict:
        """The node's `stats` reply: JSON counters plus `metrics` (Prometheus text)."""
        return self._one_shot({"type": "stats"}, "stats")

    def metrics(self) -> str:
        return self.stats().get("metrics", "")

    def health(self) -> dict:
        """The node's `health` reply: status ("ok" | "draining" | "failed" | "loading"),
        model, uptime_s, ..."""
        return self._one_shot({"type": "health"}, "health")

    # -- plumbing ------------------------------------------------------------------------
    def _one_shot(self, msg: dict, want: str) -> dict:
        self._send(msg)
        while True:
            while self._replies:
                m = self._replies.popleft()
                if m.get("type") == want:
                    return m
                if m.get("type") == "error":
                    raise SpecnodeError(str(m.get("code")), str(m.get("message")), None)
            self._pump(None)

    def _send(self, msg: dict) -> None:
        try:
            self._sock.send(json.dumps(msg).encode("utf-8"))
        except zmq.Again:
            raise SpecnodeTimeout(f"no connection to a specnode node at {self.endpoint} within "
                                  f"{min(self.timeout_s, 5.0):g} s") from None

    def _pump(self, rid: Optional[str]) -> None:
        """Receives one message (waiting at most timeout_s) and files it."""
        if not self._sock.poll(int(self.timeout_s * 1000), zmq.POLLIN):
            what = f"request {rid}" if rid else "a reply"
            raise SpecnodeTimeout(f"no message from {self.endpoint} for {self.timeout_s:g} s "
                                  f"(waiting for {what})", rid)
        frames = self._sock.recv_multipart()
        body = next((f for f in reversed(frames) if f), b"")
        try:
            m = json.loads(body)
        except ValueError:
            raise SpecnodeError("bad_reply", f"the node sent a frame that is not JSON "
                                             f"({len(body)} bytes)") from None
        if not isinstance(m, dict):
            raise SpecnodeError("bad_reply", "the node sent a JSON value that is not an object")
        mid = m.get("id")
        mtype = m.get("type")
        if mtype in ("accepted", "error") and isinstance(mid, str) and mid in self._unanswered:
            self._unanswered.remove(mid)
        elif mtype == "error" and mid is None and self._unanswered:
            mid = self._unanswered.popleft()
            m = dict(m, id=mid)
        if mtype == "error" and m.get("code") == "unknown_id":
            self._cancel_replies.append(m)  # only cancels earn unknown_id
        elif mtype == "error" and m.get("code") == "duplicate_id":
            self._dup_errors.append(m)  # about a rejected submit, not the active one
        elif isinstance(mid, str) and mid in self._queues:
            self._queues[mid].append(m)
        elif mtype in ("stats", "health") or (mtype == "error" and mid is None):
            self._replies.append(m)
        # else: a message for a request this client no longer tracks; drop it.


def _bytes(key) -> bytes:
    return key.encode("ascii") if isinstance(key, str) else key
