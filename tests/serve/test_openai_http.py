"""The node's own OpenAI-compatible HTTP API (`serve --http-bind`, docs/openai-api.md), driven
by the official `openai` SDK and by raw HTTP where the SDK hides the details: chat and text
completions, streaming, sampling fields, errors from the one error table, bearer auth, body
limits, /metrics and /health on the same port, the ZeroMQ front end beside it, and a client
that abandons a stream having its request cancelled."""
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import openai
import pytest

from serve_helpers import Node, free_port


class HttpNode:
    """`specnode serve` with --http-bind on a free loopback port."""

    def __init__(self, specnode, model, tmp_path, extra=(), api_key=None):
        self.port = free_port()
        env = dict(os.environ)
        env.pop("SPECNODE_API_KEY", None)
        if api_key is not None:
            env["SPECNODE_API_KEY"] = api_key
        self.node = Node(specnode, model, tmp_path / "serve.log",
                         extra=["--http-bind", str(self.port), *extra], env=env)
        self.node.wait_ready(180)
        self.base = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the HTTP listener starts right after ZeroMQ's
            try:
                self.get("/health")
                break
            except OSError:
                time.sleep(0.05)
        self.model = Path(model).name.removesuffix(".gguf")

    def client(self, api_key="none", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, max_retries=0,
                             timeout=120, **kw)

    def get(self, path, headers=None):
        req = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def post(self, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data,
                                     headers={"Content-Type": "application/json",
                                              **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.headers, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read().decode()

    def metrics(self):
        status, _, text = self.get("/metrics")
        assert status == 200
        return text

    def stop(self):
        return self.node.stop()


@pytest.fixture(scope="module")
def http_node(specnode, tiny_model, tmp_path_factory):
    n = HttpNode(specnode, tiny_model, tmp_path_factory.mktemp("http"), extra=["--threads", "1"])
    yield n
    assert n.stop() == 0


MESSAGES = [{"role": "user", "content": "hello there"}]


def test_models_and_chat_completion_through_the_sdk(http_node):
    c = http_node.client()
    models = c.models.list()
    assert [m.id for m in models.data] == [http_node.model]
    out = c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=12,
                                    temperature=0)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.model == http_node.model
    choice = out.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert out.usage.completion_tokens > 0
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    # The node's own per-request stats ride along.
    assert out.model_extra["specnode"]["completion_tokens"] == out.usage.completion_tokens


def test_streamed_chat_equals_the_whole_reply(http_node):
    c = http_node.client()
    whole = c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=16,
                                      temperature=0)
    stream = c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=16,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({ch.id for ch in chunks}) == 1
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    with_choices = [ch for ch in chunks if ch.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in with_choices)
    assert text == whole.choices[0].message.content  # greedy: the same tokens either way
    assert with_choices[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    # include_usage: a last chunk with no choices and the usage.
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
        whole.usage.completion_tokens


def test_a_repeated_prefix_is_served_from_the_prefix_cache(http_node):
    """kv.prefix_cache (on by default): the second request with the same long prompt takes
    its whole pages from the cache (usage.prompt_tokens_details.cached_tokens) and greedy
    output does not change."""
    c = http_node.client()
    prompt = "Tell me about the weather. " * 12
    a = c.completions.create(model=http_node.model, prompt=prompt, max_tokens=6, temperature=0)
    b = c.completions.create(model=http_node.model, prompt=prompt, max_tokens=6, temperature=0)
    assert b.choices[0].text == a.choices[0].text
    cached = b.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 8 == 0 and cached < b.usage.prompt_tokens, b.usage
    m = http_node.metrics()
    assert _counter(m, "specnode_prefix_cache_hit_tokens_total") >= cached


def test_text_completions_stop_and_seed(http_node):
    c = http_node.client()
    out = c.completions.create(model=http_node.model, prompt="the cat", max_tokens=8,
                               temperature=0, stop=["\n\n"])
    assert out.object == "text_completion" and isinstance(out.choices[0].text, str)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=http_node.model, prompt="the cat", max_tokens=8, temperature=0, stop=["\n\n"],
        stream=True) if ch.choices)
    assert streamed == out.choices[0].text
    # Sampled with a seed: the same text again (and the default max_tokens is OpenAI's 16).
    a = c.completions.create(model=http_node.model, prompt="once", temperature=0.9, seed=7)
    b = c.completions.create(model=http_node.model, prompt="once", temperature=0.9, seed=7)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.completion_tokens <= 16


@pytest.mark.parametrize("kwargs,error,code", [
    (dict(n=2), openai.BadRequestError, "bad_request"),
    (dict(logprobs=True), openai.BadRequestError, "bad_request"),
    # Tool calling is not implemented: refused, not rendered through a template's tools branch.
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
     openai.BadRequestError, "bad_request"),
    (dict(max_tokens=0), openai.BadRequestError, "bad_request"),
    (dict(temperature=-1), openai.BadRequestError, "bad_request"),
    (dict(max_tokens=4096), openai.BadRequestError, "prompt_too_long"),
    (dict(extra_body={"sla": "gold"}), openai.BadRequestError, "unknown_sla"),
    (dict(model="gpt-4o"), openai.NotFoundError, "unknown_model"),
])
def test_errors_are_openai_errors_with_the_tables_codes(http_node, kwargs, error, code):
    c = http_node.client()
    args = dict(model=http_node.model, messages=MESSAGES, max_tokens=4, temperature=0)
    args.update(kwargs)
    with pytest.raises(error) as e:
        c.chat.completions.create(**args)
    assert e.value.body["code"] == code, e.value.body
    assert e.value.response.headers["X-Specnode-Error-Code"] == code
    # The node goes on serving.
    assert c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=2,
                                     temperature=0).usage.completion_tokens > 0


@pytest.mark.parametrize("path,body,raw,status,code,needle", [
    ("/v1/chat/completions", None, b"{not json", 400, "bad_json", "malformed"),
    ("/v1/chat/completions", {"messages": []}, None, 400, "bad_request", "'messages'"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, None, 400,
     "bad_request", "role"),
    ("/v1/completions", {"prompt": 3}, None, 400, "bad_request", "'prompt'"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, None, 400, "bad_request", "'stream'"),
    ("/v1/embeddings", {"input": "x"}, None, 404, "not_found", "route"),
])
def test_bad_bodies_and_routes(http_node, path, body, raw, status, code, needle):
    got, headers, text = http_node.post(path, body, raw)
    assert got == status, text
    assert headers["Content-Type"].startswith("application/json")
    err = json.loads(text)["error"]
    assert err["code"] == code and needle in err["message"], err
    assert err["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413_unread(http_node):
    """A client that sends its whole body before reading (urllib) still reads the 413."""
    t0 = time.monotonic()
    status, headers, text = http_node.post("/v1/completions",
                                           {"prompt": "x" * (5 << 20), "max_tokens": 1})
    assert status == 413, text
    assert json.loads(text)["error"]["code"] == "frame_too_large"
    assert headers["X-Specnode-Error-Code"] == "frame_too_large"
    assert time.monotonic() - t0 < 10


def _read_response(s):
    """One response (headers and Content-Length bytes of body) from socket `s`."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(l.split(b":", 1)[1]) for l in head.split(b"\r\n")
                   if l.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def _read_rest(s):
    """Whatever else arrives until the connection ends (or the socket's timeout)."""
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return data


def test_content_length_over_the_limit_is_refused_at_once_and_closes(http_node):
    """The 413 comes from the headers, before any body byte, and the connection closes:
    bytes after the headers (a request here) are never read as a request."""
    smuggled = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", http_node.port), timeout=10) as s:
        t0 = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (5 << 20)
                  + smuggled)
        out = _read_response(s)
        assert time.monotonic() - t0 < 1, out[:300]
        assert out.startswith(b"HTTP/1.1 413"), out[:300]
        assert b"X-Specnode-Error-Code: frame_too_large\r\n" in out
        assert b"Connection: close\r\n" in out
        try:
            s.sendall(smuggled)  # more body bytes, after the answer
        except OSError:
            pass
        rest = _read_rest(s)
    assert (out + rest).count(b"HTTP/1.1 ") == 1, rest[:300]
    assert http_node.get("/health")[0] == 200


@pytest.mark.parametrize("request_bytes,status,code", [
    (b"GET /v1/nope HTTP/1.1\r\nHost: x\r\n\r\n", 404, "not_found"),
    (b"GET /v1/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405, "not_found"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n", 400,
     "bad_request"),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "bad_request"),
    (b"BREW /pot HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad_request"),
    (b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", 400,
     "bad_request"),
])
def test_errors_httplib_answers_carry_the_code_header(http_node, request_bytes, status, code):
    """Errors that cpp-httplib produces itself (routing, requests it cannot read) carry the
    X-Specnode-Error-Code header and the JSON body like the node's own."""
    with socket.create_connection(("127.0.0.1", http_node.port), timeout=10) as s:
        s.sendall(request_bytes)
        out = _read_response(s)
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status), out[:300]
    assert b"\r\nX-Specnode-Error-Code: " + code.encode() + b"\r\n" in head + b"\r\n", head
    assert json.loads(body)["error"]["code"] == code


def _raw_exchange(port, head, body=b""):
    """One request over a fresh connection; the whole answer (the server closes after it, or
    the request says Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    return data


def test_bodies_are_bounded_after_decoding(http_node):
    """The body limit (4 MiB) holds for what the route reads, not only the Content-Length: a
    chunked body, a gzip body that inflates past it; a small gzip body and a large body sent
    as a form (curl -d without a Content-Type) are read as JSON."""
    import gzip

    limit = 4 << 20
    big = json.dumps({"prompt": "x " * (limit // 2 + 10), "max_tokens": 1}).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(big[i:i + 65536]), big[i:i + 65536])
                      for i in range(0, len(big), 65536)) + b"0\r\n\r\n"
    out = _raw_exchange(http_node.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                        b"Connection: close\r\n\r\n", chunks)
    assert out.startswith(b"HTTP/1.1 413"), out[:300]
    assert b'"frame_too_large"' in out
    bomb = gzip.compress(json.dumps({"prompt": "a" * (64 << 20)}).encode())
    assert len(bomb) < limit // 8
    status, _, text = http_node.post("/v1/completions", raw=bomb,
                                     headers={"Content-Encoding": "gzip"})
    assert status == 413 and json.loads(text)["error"]["code"] == "frame_too_large", text
    small = gzip.compress(json.dumps({"prompt": "the cat", "max_tokens": 2,
                                      "temperature": 0}).encode())
    status, _, text = http_node.post("/v1/completions", raw=small,
                                     headers={"Content-Encoding": "gzip"})
    assert status == 200, text
    form = json.dumps({"prompt": "the cat", "max_tokens": 1, "user": "u" * 9000}).encode()
    assert len(form) > 8192  # httplib's own limit for form bodies
    status, _, text = http_node.post("/v1/completions", raw=form,
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 200, text


def test_wrong_method_is_405_and_health_names_the_served_model(http_node):
    status, headers, text = http_node.get("/v1/completions")
    assert status == 405 and headers["Allow"] == "POST", text
    assert json.loads(text)["error"]["code"] == "not_found"
    status, headers, _ = http_node.post("/health", {})
    assert status == 405 and headers["Allow"] == "GET"
    assert json.loads(http_node.get("/health")[2])["model"] == http_node.model


def test_unseeded_sampling_differs_between_requests(http_node):
    """No seed: each request samples afresh, as with OpenAI and vLLM (a loop asking for
    several samples must not get copies); a seed still repeats."""
    c = http_node.client()
    texts = {c.completions.create(model=http_node.model, prompt="once upon", max_tokens=16,
                                  temperature=1.5).choices[0].text for _ in range(4)}
    assert len(texts) > 1, texts


def test_special_tokens_in_a_raw_prompt_are_tokens(http_node):
    """A prompt with a chat template applied by the client: its special tokens are single
    tokens (as vLLM's and llama.cpp's servers read them), not their spelling."""
    c = http_node.client()
    n = {p: c.completions.create(model=http_node.model, prompt=p, max_tokens=1,
                                 temperature=0).usage.prompt_tokens
         for p in ("hi", "<|im_start|>hi", "<|endoftext|>hi")}
    assert n["<|im_start|>hi"] == n["<|endoftext|>hi"] == n["hi"] + 1, n


def test_fields_set_to_their_off_value_are_accepted(http_node):
    """Clients such as LiteLLM send unimplemented fields at their defaults: accepted; any
    other value is refused by name."""
    c = http_node.client()
    ok = c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=2,
                                   temperature=0, response_format={"type": "text"},
                                   tool_choice="none", tools=[], logprobs=False,
                                   presence_penalty=0, frequency_penalty=0.0)
    assert ok.usage.completion_tokens > 0
    ok = c.completions.create(model=http_node.model, prompt="x", max_tokens=2, temperature=0,
                              best_of=1, suffix="", echo=False)
    assert ok.usage.completion_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=http_node.model, messages=MESSAGES, max_tokens=2,
                                  response_format={"type": "json_object"})
    assert "'response_format'" in e.value.body["message"]


def test_usage_counts_tokens_through_the_one_that_completes_the_stop(http_node):
    """completion_tokens after a stop string: exactly the tokens through the one completing
    it — a greedy run of that many tokens ends with the stop string, one fewer does not —
    the same whether streamed or not and however speculation stepped."""
    c = http_node.client()
    prompt = "The capital of France is Paris. The capital of Spain is"
    free = c.completions.create(model=http_node.model, prompt=prompt, max_tokens=24,
                                temperature=0).choices[0].text
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop.strip() and len(free) > 6, free
    counts = set()
    for _ in range(3):
        out = c.completions.create(model=http_node.model, prompt=prompt, max_tokens=24,
                                   temperature=0, stop=[stop])
        assert out.choices[0].finish_reason == "stop"
        counts.add(out.usage.completion_tokens)
    chunks = list(c.completions.create(model=http_node.model, prompt=prompt, max_tokens=24,
                                       temperature=0, stop=[stop], stream=True,
                                       stream_options={"include_usage": True}))
    counts.add(chunks[-1].usage.completion_tokens)
    assert len(counts) == 1, counts
    n = counts.pop()
    upto = lambda k: c.completions.create(model=http_node.model, prompt=prompt, max_tokens=k,
                                          temperature=0).choices[0].text
    assert stop in upto(n) and stop not in upto(n - 1), (stop, n)


def test_metrics_and_health_on_the_same_port(http_node):
    status, headers, text = http_node.get("/health")
    assert status == 200 and json.loads(text)["status"] == "ok"
    http_node.post("/v1/embeddings", {"input": "x"})  # a not_found to count
    m = http_node.metrics()
    assert "# TYPE specnode_requests_total counter" in m
    assert 'specnode_errors_total{code="not_found"}' in m
    line = next(l for l in m.splitlines() if l.startswith('specnode_errors_total{code="not_found"}'))
    assert int(float(line.split()[-1])) >= 1


def test_zeromq_and_http_share_one_scheduler(http_node):
    from specnode_client import SpecnodeClient

    with SpecnodeClient(http_node.node.endpoint, timeout_s=60) as z:
        before = z.stats()["requests"]["completed"]
        z.generate("hello", max_tokens=3, temperature=0)
        http_node.client().completions.create(model=http_node.model, prompt="hello",
                                              max_tokens=3, temperature=0)
        assert z.stats()["requests"]["completed"] == before + 2


def test_api_key(specnode, tiny_model, tmp_path):
    n = HttpNode(specnode, tiny_model, tmp_path, extra=["--threads", "1"], api_key="s3cret")
    try:
        with pytest.raises(openai.AuthenticationError) as e:
            n.client(api_key="wrong").models.list()
        assert e.value.body["code"] == "unauthorized"
        with pytest.raises(openai.AuthenticationError):
            n.client(api_key="wrong").chat.completions.create(
                model=n.model, messages=MESSAGES, max_tokens=2)
        out = n.client(api_key="s3cret").chat.completions.create(
            model=n.model, messages=MESSAGES, max_tokens=2, temperature=0)
        assert out.usage.completion_tokens > 0
        # Scrapes and health checks need no key.
        assert n.get("/health")[0] == 200 and n.get("/metrics")[0] == 200
        assert "no key" not in n.node.log() and "s3cret" not in n.node.log()
    finally:
        assert n.stop() == 0


def test_vllm_flags_port_served_model_names_and_max_model_len(specnode, tiny_model, tmp_path):
    """vLLM's everyday flags: --port turns the API on (over --http-bind off), every
    --served-model-name is listed and accepted (a request is answered under the name it
    gave; one naming none under the first), and --max-model-len caps prompt + completion
    below the model's context (issue 37)."""
    port = free_port()
    env = dict(os.environ)
    env.pop("SPECNODE_API_KEY", None)
    n = Node(specnode, tiny_model, tmp_path / "serve.log", env=env,
             extra=["--threads", "1", "--port", str(port), "--served-model-name", "smol",
                    "alias", "--max-model-len", "48"])
    try:
        n.wait_ready(180)
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none",
                          max_retries=0, timeout=120)
        models = c.models.list().data
        assert [m.id for m in models] == ["smol", "alias"]
        assert all(m.model_extra["max_model_len"] == 48 for m in models)
        r = c.completions.create(model="alias", prompt="a b", max_tokens=3, temperature=0)
        assert r.model == "alias" and r.usage.completion_tokens > 0
        with urllib.request.urlopen(urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/completions",
                data=json.dumps({"prompt": "a b", "max_tokens": 2}).encode(),
                headers={"Content-Type": "application/json"}), timeout=60) as resp:
            assert json.loads(resp.read())["model"] == "smol"
        with pytest.raises(openai.NotFoundError) as e:
            c.completions.create(model="other", prompt="a", max_tokens=2)
        assert "'smol', 'alias'" in e.value.body["message"], e.value.body
        # 48 positions: a 40-token completion after a short prompt fits, 60 does not.
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model="smol", prompt="a b", max_tokens=60)
        assert "context length 48" in e.value.body["message"], e.value.body
        assert "smol" in n.log() and "alias" in n.log()
    finally:
        assert n.stop() == 0


def test_max_model_len_beyond_the_context_is_refused(specnode, tiny_model):
    import subprocess

    r = subprocess.run([specnode, "serve", "--model", tiny_model, "--http-bind", "off", "--bind",
                        f"tcp://127.0.0.1:{free_port()}", "--max-model-len", "16000000"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "longer than the model's context length" in r.stderr, r.stderr
    r = subprocess.run([specnode, "serve", "--model", tiny_model, "--served-model-name", "a b"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--served-model-name" in r.stderr, r.stderr


def test_health_answers_loading_while_the_model_loads(specnode, tmp_path):
    """The HTTP address and the ZeroMQ endpoint are bound before the weights are read: while
    the load is under way (here it waits forever: the model is a FIFO nobody writes),
    /health answers 503 "loading" and the /v1 routes 503 `unavailable` with Retry-After,
    ZeroMQ `health` "loading" and submits `unavailable`, instead of refusing the connection
    or never answering (issue 37)."""
    import subprocess

    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([specnode, "serve", "--model", str(fifo), "--port", str(port),
                             "--bind", endpoint],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=5)
                assert False, "200 while loading"
            except urllib.error.HTTPError as e:
                assert e.code == 503
                assert json.loads(e.read())["status"] == "loading"
                assert e.headers["X-Specnode-Error-Code"] == "unavailable"
                break
            except OSError:
                assert time.monotonic() < deadline, "the listener never came up"
                time.sleep(0.05)
        req = urllib.request.Request(base + "/v1/completions", data=b'{"prompt": "x"}',
                                     headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=5)
        assert e.value.code == 503 and e.value.headers["Retry-After"] == "5"
        assert json.loads(e.value.read())["error"]["code"] == "unavailable"
        # The ZeroMQ endpoint too: health says loading, a submit is refused `unavailable`
        # with its id, a bad frame gets the usual error.
        import zmq

        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.connect(endpoint)
        try:
            sock.send_json({"type": "health"})
            h = sock.recv_json()
            assert h["type"] == "health" and h["status"] == "loading", h
            assert h["model"] == "model" and h["active"] == 0, h
            sock.send_json({"type": "submit", "id": "a", "prompt": "x"})
            r = sock.recv_json()
            assert r == {"type": "error", "id": "a", "code": "unavailable",
                         "message": "the model is loading; retry shortly"}, r
            sock.send(b"{not json")
            assert sock.recv_json()["code"] == "bad_json"
        finally:
            sock.close()
            ctx.term()
        assert proc.poll() is None  # still loading
    finally:
        proc.kill()
        proc.wait()


def test_bad_http_bind_is_a_clear_error(specnode, tiny_model):
    import subprocess

    r = subprocess.run([specnode, "serve", "--model", tiny_model, "--http-bind", "host:80"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--http-bind" in r.stderr and "IPv4" in r.stderr
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        r = subprocess.run([specnode, "serve", "--model", tiny_model, "--bind",
                            f"tcp://127.0.0.1:{free_port()}", "--http-bind", str(port)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and f"127.0.0.1:{port}" in r.stderr, r.stderr


def _raw_stream(port, body):
    s = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(data) + data)
    return s


def _counter(metrics, series):
    for line in metrics.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _assert_cancelled_not_completed(n, timeout_s=60):
    """The node's one request ends cancelled (within timeout_s), not completed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        m = n.metrics()
        if _counter(m, 'specnode_requests_total{outcome="cancelled"}') == 1:
            break
        time.sleep(0.1)
    assert _counter(m, 'specnode_requests_total{outcome="cancelled"}') == 1, m
    assert _counter(m, 'specnode_requests_total{outcome="completed"}') == 0


def test_abandoned_stream_cancels_its_request(specnode, real_model, tmp_path):
    """On the real model (slow enough to leave mid-generation): closing the connection after a
    few SSE events cancels the request on the node, instead of generating on."""
    n = HttpNode(specnode, real_model, tmp_path, extra=["--threads", "2"])
    try:
        s = _raw_stream(n.port, {"messages": [{"role": "user", "content": "Write a long story."}],
                                 "max_tokens": 400, "temperature": 0, "stream": True})
        data = b""
        while data.count(b"data:") < 3:
            chunk = s.recv(4096)
            assert chunk, data
            data += chunk
        assert b"text/event-stream" in data
        s.close()
        _assert_cancelled_not_completed(n)
    finally:
        assert n.stop() == 0


def test_abandoned_non_streaming_request_cancels(specnode, real_model, tmp_path):
    """A non-streaming request has nothing to write until it ends; its client closing the
    connection still cancels it (the handler watches the socket)."""
    n = HttpNode(specnode, real_model, tmp_path, extra=["--threads", "2"])
    try:
        s = _raw_stream(n.port, {"messages": [{"role": "user", "content": "Write a long story."}],
                                 "max_tokens": 400, "temperature": 0})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until it runs
            if _counter(n.metrics(), "specnode_active_sequences") >= 1:
                break
            time.sleep(0.05)
        s.close()
        _assert_cancelled_not_completed(n)
    finally:
        assert n.stop() == 0


def test_sigterm_lets_a_running_stream_finish(specnode, tiny_model, tmp_path):
    """The drain: a stream in flight when SIGTERM arrives ends normally ([DONE]) and the node
    exits 0."""
    n = HttpNode(specnode, tiny_model, tmp_path, extra=["--threads", "1"])
    s = _raw_stream(n.port, {"messages": MESSAGES, "max_tokens": 200, "temperature": 0,
                             "stream": True})
    s.recv(1)  # the response has begun
    n.node.proc.send_signal(signal.SIGTERM)
    data = b""
    s.settimeout(60)
    while b"data: [DONE]" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    assert b"data: [DONE]" in data, data[-500:]
    assert b'"error"' not in data
    assert n.node.proc.wait(timeout=60) == 0
