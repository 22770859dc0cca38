#!/usr/bin/env python3
"""An OpenAI-compatible HTTP front for a specnode node: tools that speak the OpenAI API
(SDKs, LangChain, curl scripts written for vLLM / SGLang / llama.cpp's server) talk to
specnode unchanged. Every HTTP request becomes one ZeroMQ `submit` through
specnode_client.py (docs/protocol.md); nothing here runs a model.

  ~/.cache/specnode/venv/bin/python client/openai_gateway.py \\
      --listen 127.0.0.1:8000 --endpoint tcp://127.0.0.1:5555

Routes:
  GET  /v1/models             the one model the node serves
  POST /v1/chat/completions   messages -> chat template on the node; stream=true: SSE chunks
  POST /v1/completions        a raw prompt (string); stream=true: SSE chunks
  GET  /health                the node's health reply

Request fields used: model (echoed back, not checked), messages / prompt, max_tokens (or
max_completion_tokens), temperature, top_p, top_k, seed, stop (string or list), stream,
and specnode's own `domain` and `sla` (pass them as extra body fields). n > 1, logprobs,
tools and response_format are refused with 400 rather than ignored. Node errors map to
HTTP: bad_request / prompt_too_long / unknown_sla -> 400, frame_too_large -> 413,
overloaded -> 429, shutting_down / unavailable -> 503, no node or a silent one -> 504. A client that disconnects mid-stream has
its request cancelled on the node.

Threads: one per HTTP connection, each with its own ZeroMQ connection (sockets are not
shared across threads). Authentication: `--api-key KEY` (or $SPECNODE_API_KEY) makes every
/v1 route require `Authorization: Bearer KEY` (401 otherwise), as vLLM's --api-key does;
without it, keep the gateway on loopback or behind a proxy that authenticates.
"""
from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from specnode_client import ERROR_CODES, SpecnodeClient, SpecnodeError  # noqa: E402

MAX_BODY_BYTES = 4 << 20
# Node error codes -> HTTP status, from the node's own table (client/error_codes.json), plus
# the client's "timeout"; anything else is 502.
HTTP_OF_CODE = {code: info["http"] for code, info in ERROR_CODES.items()}
HTTP_OF_CODE["timeout"] = 504
UNSUPPORTED = ("logprobs", "top_logprobs", "tools", "tool_choice", "functions",
               "function_call", "response_format", "logit_bias", "suffix", "echo", "best_of")


class BadRequest(Exception):
    pass


def finish_reason(specnode_reason: str) -> str:
    return "length" if specnode_reason == "length" else "stop"


def submit_params(body: Dict[str, Any]) -> Dict[str, Any]:
    """The OpenAI request's generation fields as specnode submit fields."""
    for key in UNSUPPORTED:
        if body.get(key) not in (None, False, 0, [], {}):
            raise BadRequest(f"'{key}' is not supported by specnode")
    if body.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    p: Dict[str, Any] = {}
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        p["max_tokens"] = max_tokens
    for key in ("temperature", "top_p", "top_k", "seed", "domain", "sla"):
        if body.get(key) is not None:
            p[key] = body[key]
    stop = body.get("stop")
    if stop is not None:
        p["stop"] = [stop] if isinstance(stop, str) else stop
    return p


class Gateway(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "specnode-openai-gateway"
    endpoint = "tcp://127.0.0.1:5555"
    model_name = "specnode"
    timeout_s = 300.0
    api_key = ""  # non-empty: /v1 routes need "Authorization: Bearer <api_key>"

    def _authorized(self) -> bool:
        if not self.api_key or not self.path.startswith("/v1"):
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
            return True
        self._error(401, "missing or wrong API key (Authorization: Bearer ...)", "unauthorized")
        return False

    def log_message(self, fmt, *args):  # one line per request on stderr, as http.server does
        sys.stderr.write("openai_gateway: %s %s\n" % (self.address_string(), fmt % args))

    # -- plumbing ---------------------------------------------------------------------
    def _send_json(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, code: str = "bad_request") -> None:
        kind = "invalid_request_error" if status < 500 else "server_error"
        self._send_json(status, {"error": {"message": message, "type": kind, "code": code}})

    def _body(self) -> Dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length <= 0:
            raise BadRequest("a JSON body is required")
        if length > MAX_BODY_BYTES:
            raise BadRequest(f"body over {MAX_BODY_BYTES} bytes")
        try:
            body = json.loads(self.rfile.read(length))
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"malformed JSON: {e}")
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    # -- routes -----------------------------------------------------------------------
    def do_GET(self):
        if not self._authorized():
            return
        if self.path.rstrip("/") == "/v1/models":
            self._send_json(200, {"object": "list", "data": [
                {"id": self.model_name, "object": "model", "created": 0, "owned_by": "specnode"}]})
        elif self.path == "/health":
            try:
                with SpecnodeClient(self.endpoint, timeout_s=5) as c:
                    self._send_json(200, c.health())
            except SpecnodeError as e:
                self._error(503, f"node: {e.message}", e.code)
        else:
            self._error(404, f"no route {self.path}", "not_found")

    def do_POST(self):
        if not self._authorized():
            # The body is not read: this connection cannot carry another request.
            self.close_connection = True
            return
        path = self.path.rstrip("/")
        if path not in ("/v1/chat/completions", "/v1/completions"):
            self._error(404, f"no route {self.path}", "not_found")
            return
        chat = path == "/v1/chat/completions"
        self._streaming = False
        try:
            body = self._body()
            params = submit_params(body)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise BadRequest("'messages' must be a non-empty list")
                # Content parts ([{"type": "text", "text": ...}]) become plain text.
                norm = []
                for m in messages:
                    if not isinstance(m, dict):
                        raise BadRequest("each message must be an object")
                    content = m.get("content")
                    if isinstance(content, list):
                        content = "".join(p.get("text", "") for p in content
                                          if isinstance(p, dict) and p.get("type") == "text")
                    norm.append({"role": m.get("role"), "content": content})
                request = {"messages": norm}
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise BadRequest("'prompt' must be a string")
                request = {"prompt": prompt}
        except BadRequest as e:
            self._error(400, str(e))
            return
        model = body.get("model") or self.model_name
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        try:
            with SpecnodeClient(self.endpoint, timeout_s=self.timeout_s) as c:
                if body.get("stream"):
                    self._stream(c, chat, rid, created, model, request, params)
                else:
                    r = c.generate(**request, **params, id=rid)
                    usage = {"prompt_tokens": r.stats.get("prompt_tokens", 0),
                             "completion_tokens": r.stats.get("completion_tokens", 0)}
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
                    choice = {"index": 0, "finish_reason": finish_reason(r.finish_reason)}
                    if chat:
                        choice["message"] = {"role": "assistant", "content": r.text}
                    else:
                        choice["text"] = r.text
                    self._send_json(200, {
                        "id": rid, "object": "chat.completion" if chat else "text_completion",
                        "created": created, "model": model, "choices": [choice],
                        "usage": usage, "specnode": r.stats})
        except SpecnodeError as e:  # SpecnodeTimeout too (code "timeout": 504)
            if self._streaming:
                self._sse({"error": {"message": e.message, "code": e.code}})
                self._sse_end()
            else:
                self._error(HTTP_OF_CODE.get(e.code, 502), f"node: {e.message}", e.code)

    # -- streaming --------------------------------------------------------------------
    def _sse(self, obj: Any) -> None:
        data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _sse_end(self) -> None:
        self._sse(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream(self, c: SpecnodeClient, chat: bool, rid: str, created: int, model: str,
                request: Dict[str, Any], params: Dict[str, Any]) -> None:
        events = c.submit(**request, **params, stream=True, id=rid)
        first = next(events)  # `accepted`, or SpecnodeError before any header is sent
        del first
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._streaming = True
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta: Optional[Dict[str, str]], text: str, reason: Optional[str]) -> dict:
            ch = {"index": 0, "finish_reason": reason}
            if chat:
                ch["delta"] = delta or {}
            else:
                ch["text"] = text
            return {"id": rid, "object": kind, "created": created, "model": model,
                    "choices": [ch]}

        try:
            if chat:
                self._sse(chunk({"role": "assistant", "content": ""}, "", None))
            for m in events:
                if m["type"] == "tokens" and m.get("text"):
                    self._sse(chunk({"content": m["text"]}, m["text"], None))
                elif m["type"] == "done":
                    last = chunk({}, "", finish_reason(m.get("finish_reason", "")))
                    stats = m.get("stats", {})
                    last["usage"] = {"prompt_tokens": stats.get("prompt_tokens", 0),
                                     "completion_tokens": stats.get("completion_tokens", 0)}
                    last["usage"]["total_tokens"] = sum(last["usage"].values())
                    self._sse(last)
            self._sse_end()
        except (BrokenPipeError, ConnectionResetError):
            # The HTTP client left: stop the generation on the node too.
            try:
                c.cancel(rid)
            except Exception:  # noqa: BLE001 - best effort; closing the socket also ends it
                pass


def parse_listen(text: str) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError("expected HOST:PORT, e.g. 127.0.0.1:8000")
    return host, int(port)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", type=parse_listen, default=("127.0.0.1", 8000),
                    help="HOST:PORT to serve HTTP on (default 127.0.0.1:8000)")
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5555", help="the node's ZeroMQ endpoint")
    ap.add_argument("--model-name", default="specnode", help="the id /v1/models reports")
    ap.add_argument("--timeout-s", type=float, default=300.0,
                    help="longest wait for the node's next message (default 300)")
    ap.add_argument("--api-key", default=os.environ.get("SPECNODE_API_KEY", ""),
                    help="require 'Authorization: Bearer KEY' on /v1 routes "
                         "(default: $SPECNODE_API_KEY, else none)")
    args = ap.parse_args()
    Gateway.endpoint = args.endpoint
    Gateway.model_name = args.model_name
    Gateway.timeout_s = args.timeout_s
    Gateway.api_key = args.api_key
    try:
        server = ThreadingHTTPServer(args.listen, Gateway)
    except OSError as e:
        print(f"openai_gateway: cannot listen on {args.listen[0]}:{args.listen[1]}: {e}",
              file=sys.stderr)
        return 1
    server.daemon_threads = True
    print(f"openai_gateway: http://{args.listen[0]}:{server.server_address[1]}/v1 -> "
          f"{args.endpoint}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
