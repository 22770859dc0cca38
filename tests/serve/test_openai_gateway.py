"""client/openai_gateway.py: OpenAI-API requests (what SDKs and tools written for vLLM or
SGLang send) through the gateway to a real node over ZeroMQ, and back."""
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from serve_helpers import ROOT, free_port

GATEWAY = ROOT / "client" / "openai_gateway.py"


class Gateway:
    def __init__(self, endpoint, tmp_path, timeout_s=60, extra=()):
        self.port = free_port()
        self.log_path = tmp_path / "gateway.log"
        self.proc = subprocess.Popen(
            [sys.executable, str(GATEWAY), "--listen", f"127.0.0.1:{self.port}", "--endpoint",
             endpoint, "--model-name", "smol", "--timeout-s", str(timeout_s), *extra],
            stdout=subprocess.DEVNULL, stderr=open(self.log_path, "w"))
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.base + "/nope", timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answers (404)
            except OSError:
                if self.proc.poll() is not None:
                    pytest.fail(f"gateway exited: {self.log_path.read_text()}")
                time.sleep(0.1)
        pytest.fail("gateway did not start")

    def post(self, path, body, raw=None, headers=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def gateway(tiny_node, tmp_path):
    g = Gateway(tiny_node.endpoint, tmp_path)
    yield g
    g.stop()


CHAT = {"model": "any", "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 12, "temperature": 0}


def test_models_and_chat_completion(gateway):
    with urllib.request.urlopen(gateway.base + "/v1/models", timeout=10) as r:
        models = json.loads(r.read())
    assert models["object"] == "list" and models["data"][0]["id"] == "smol"
    status, _, text = gateway.post("/v1/chat/completions", CHAT)
    assert status == 200, text
    out = json.loads(text)
    assert out["object"] == "chat.completion" and out["id"].startswith("chatcmpl-")
    assert out["model"] == "any"
    choice = out["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in ("stop", "length")
    u = out["usage"]
    assert u["completion_tokens"] == out["specnode"]["completion_tokens"] > 0
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]


def test_streamed_chat_equals_the_whole_reply(gateway):
    _, _, whole = gateway.post("/v1/chat/completions", CHAT)
    want = json.loads(whole)["choices"][0]["message"]["content"]
    status, headers, text = gateway.post("/v1/chat/completions", dict(CHAT, stream=True))
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert got == want  # greedy: the same tokens streamed or not
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_text_completion_with_stop_list(gateway):
    status, _, text = gateway.post("/v1/completions", {"prompt": ["the cat"], "max_tokens": 6,
                                                       "temperature": 0, "stop": ["\n\n"]})
    assert status == 200, text
    out = json.loads(text)
    assert out["object"] == "text_completion" and isinstance(out["choices"][0]["text"], str)


@pytest.mark.parametrize("path,body,raw,status,needle", [
    ("/v1/chat/completions", None, b"{not json", 400, "malformed JSON"),
    ("/v1/chat/completions", {"messages": []}, None, 400, "'messages'"),
    ("/v1/chat/completions", dict(CHAT, n=2), None, 400, "n = 1"),
    ("/v1/chat/completions", dict(CHAT, logprobs=True), None, 400, "'logprobs'"),
    ("/v1/chat/completions", dict(CHAT, max_tokens=0), None, 400, "max_tokens"),
    ("/v1/chat/completions", dict(CHAT, temperature=-1), None, 400, "temperature"),
    ("/v1/chat/completions", dict(CHAT, sla="gold"), None, 400, "gold"),
    ("/v1/completions", {"prompt": 3}, None, 400, "'prompt'"),
    ("/v1/embeddings", {"input": "x"}, None, 404, "no route"),
])
def test_bad_requests_get_openai_style_errors(gateway, path, body, raw, status, needle):
    got, _, text = gateway.post(path, body, raw)
    assert got == status, text
    err = json.loads(text)["error"]
    assert needle in err["message"] and err["type"] and err["code"]
    # The gateway and the node are still fine afterwards.
    assert gateway.post("/v1/chat/completions", CHAT)[0] == 200


def test_a_request_over_the_nodes_frame_limit_is_413_at_once(gateway):
    """A body under the gateway's limit but over the node's frame limit (1 MiB by default):
    the node's frame_too_large (id null: it could not read the frame) answers this request,
    413 at once, not a timeout (issue 16, item 7)."""
    t0 = time.monotonic()
    status, _, text = gateway.post("/v1/completions", {"prompt": "x" * (1536 << 10),
                                                       "max_tokens": 4})
    assert status == 413, text
    assert json.loads(text)["error"]["code"] == "frame_too_large"
    assert time.monotonic() - t0 < 10
    assert gateway.post("/v1/chat/completions", CHAT)[0] == 200


def test_no_node_is_a_gateway_timeout(dead_endpoint, tmp_path):
    g = Gateway(dead_endpoint, tmp_path, timeout_s=1)
    try:
        status, _, text = g.post("/v1/chat/completions", CHAT)
        assert status == 504, text
        assert json.loads(text)["error"]["code"] == "timeout"
    finally:
        g.stop()


def test_client_leaving_a_stream_cancels_the_request(specnode, real_model, tmp_path):
    """On the real model (slow enough to leave mid-generation): closing the HTTP connection
    after a few SSE events cancels the request on the node instead of generating on."""
    import socket

    from serve_helpers import Node
    from specnode_client import SpecnodeClient

    node = Node(specnode, real_model, tmp_path / "serve.log", extra=["--threads", "2"])
    try:
        node.wait_ready(180)
        g = Gateway(node.endpoint, tmp_path)
        try:
            body = json.dumps({"messages": [{"role": "user", "content": "Write a long story."}],
                               "max_tokens": 400, "temperature": 0, "stream": True}).encode()
            s = socket.create_connection(("127.0.0.1", g.port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                      % len(body) + body)
            data = b""
            while data.count(b"data:") < 3:
                chunk = s.recv(4096)
                assert chunk, data
                data += chunk
            s.close()
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with SpecnodeClient(node.endpoint, timeout_s=10) as c:
                    metrics = c.stats()["metrics"]
                if 'specnode_requests_total{outcome="cancelled"} 1' in metrics:
                    break
                time.sleep(0.2)
            assert 'specnode_requests_total{outcome="cancelled"} 1' in metrics, metrics
            assert 'specnode_requests_total{outcome="completed"} 0' in metrics
        finally:
            g.stop()
    finally:
        assert node.stop() == 0


def test_api_key(tiny_node, tmp_path):
    g = Gateway(tiny_node.endpoint, tmp_path, extra=["--api-key", "s3cret"])
    try:
        status, _, text = g.post("/v1/chat/completions", CHAT)
        assert status == 401 and json.loads(text)["error"]["code"] == "unauthorized"
        status, _, _ = g.post("/v1/chat/completions", CHAT, headers={"Authorization": "Bearer no"})
        assert status == 401
        status, _, text = g.post("/v1/chat/completions", CHAT,
                                 headers={"Authorization": "Bearer s3cret"})
        assert status == 200, text
        req = urllib.request.Request(g.base + "/v1/models")
        try:
            urllib.request.urlopen(req, timeout=10)
            assert False, "401 expected"
        except urllib.error.HTTPError as e:
            assert e.code == 401
    finally:
        g.stop()

