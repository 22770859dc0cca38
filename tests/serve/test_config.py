"""`specnode serve --config`: the YAML schema is checked before anything loads, and every
error names the file, the line and the key."""
import json
import subprocess
import time

import pytest

from serve_helpers import ROOT, Node

BAD = [
    ("serve:\n  max_activ: 3\n", "bad.yaml:2: serve.max_activ: unknown key"),
    ("serve:\n  max_active: lots\n", "bad.yaml:2: serve.max_active: expected an integer"),
    ("kv:\n  capacity_mb: -1\n", "bad.yaml:2: kv.capacity_mb"),
    ("sla:\n  default: gold\n", "sla.default: names no class"),
    ("sla:\n  classes:\n    - {name: a, ttft_p99_ms: 5}\n    - {name: a}\n",
     "bad.yaml:4: sla.classes[1].name: duplicate class"),
    ("speculation:\n  free_threshold: 0.3\n  disable_threshold: 0.5\n",
     "speculation.disable_threshold: must be <= free_threshold"),
    ("serve: [1, 2\n", "bad.yaml:2: not valid YAML"),
    ("version: 2\n", "bad.yaml:1: .version"),
    ("modle:\n  target: x\n", "bad.yaml:1: modle: unknown key"),
    ("model:\n  device: tpu:0\n", 'bad.yaml:2: model.device: expected cpu or cuda:N, got "tpu:0"'),
    ("model:\n  device: cuda:0\ntopology:\n  groups:\n    - draft: {rank: 0}\n"
     "      target: [{rank: 1}]\n", "model.device: applies to a single-process node"),
    ("model:\n  activations: int4\n",
     'bad.yaml:2: model.activations: expected int16 or int8, got "int4"'),
    ("topology:\n  groups:\n    - draft: {rank: 0}\n      target: [{rank: 0}]\n",
     "rank 0 is placed twice"),
    ("topology:\n  groups:\n    - draft: {rank: 0}\n      target: [{rank: 2}]\n",
     "ranks must be exactly 0..1"),
    ("topology:\n  groups:\n    - draft: {rank: 0, device: gpu0}\n      target: [{rank: 1}]\n",
     "bad.yaml:3: topology.groups[0].draft.device"),
    ("topology:\n  groups:\n    - draft: {rank: 1}\n      target: [{rank: 0}]\n",
     "rank 0 is the coordinator"),
    ("topology:\n  groups:\n    - draft: {rank: 0}\n", "topology.groups[0].target"),
    ("topology:\n  timeout_s: 0\n  groups:\n    - draft: {rank: 0}\n      target: [{rank: 1}]\n",
     "bad.yaml:2: topology.timeout_s: expected a number in [0.1, 3600]"),
    ("serve:\n  metrics_bind: localhost:9464\n", "bad.yaml:2: serve.metrics_bind: expected IPV4:PORT"),
    ("sla:\n  classes:\n    - {name: a, shed: maybe}\n  default: a\n",
     "bad.yaml:3: sla.classes[0].shed: expected true or false"),
    ("serve:\n  metrics_bind: 127.0.0.1:99999\n", "bad.yaml:2: serve.metrics_bind"),
    # KV mode, draft spec and device are parsed where they are read (file, line, key).
    ("kv:\n  mode: fp8\n", 'bad.yaml:2: kv.mode: unknown KV mode "fp8"'),
    ("kv:\n  mode: [full]\n", "bad.yaml:2: kv.mode: expected a string"),
    ("kv:\n  rotate: sometimes\n", "bad.yaml:2: kv.rotate: expected true or false"),
    ("kv:\n  window_tokens: 64\n  evict_window: 16\n",
     "bad.yaml:3: kv.evict_window: must be >= kv.window_tokens"),
    ("kv:\n  mode: full\n  bytes_per_token: 5000\n",
     "bad.yaml:3: kv.bytes_per_token: a byte budget needs kv.mode mixed (or auto), not full"),
    ("kv:\n  cold_threshold: 9\n", "bad.yaml:2: kv.cold_threshold: must be <= kv.critical_threshold"),
    ("kv:\n  budget_rank: lru\n", 'bad.yaml:2: kv.budget_rank: unknown budget rank "lru"'),
    ("speculation:\n  draft: self:x\n",
     'bad.yaml:2: speculation.draft: draft spec "self:x": expected a positive integer'),
    ("speculation:\n  draft: ngram:0\n", "bad.yaml:2: speculation.draft"),
    ("speculation:\n  alternatives: [ngram, none]\n",
     "bad.yaml:2: speculation.alternatives: none is not a drafter"),
    ("speculation:\n  alternatives: [self:x]\n", "bad.yaml:2: speculation.alternatives: self:x"),
    ("topology:\n  groups:\n    - draft: {rank: 0}\n      target: [{rank: 1}]\n"
     "speculation:\n  alternatives: [self:4]\n",
     "bad.yaml:6: speculation.alternatives: self:4: with a topology only model-free drafters"),
    ("speculation:\n  draft: none\n  alternatives: [ngram]\n",
     "bad.yaml:3: speculation.alternatives: needs a speculation.draft, which is none"),
    # A device that cannot do what the config asks refuses before the model is opened.
    ("model:\n  device: cuda:0\nkv:\n  mode: dense\n", "cuda:0"),
]


@pytest.mark.parametrize("text,needle", BAD)
def test_bad_configs_name_file_line_and_key(specnode, tmp_path, text, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    # The model path does not exist: the config must be rejected before it is opened.
    res = subprocess.run([specnode, "serve", "--config", str(path), "--model",
                          str(tmp_path / "missing.gguf")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 1, res.stderr
    assert needle in res.stderr, res.stderr
    assert "missing.gguf" not in res.stderr


def test_a_directory_or_duplicate_keys_are_refused(specnode, tmp_path):
    """A directory passed as --config is not an empty config, and a key given twice is an
    error at its line (issue 16, item 12)."""
    res = subprocess.run([specnode, "serve", "--config", str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "is a directory" in res.stderr, res.stderr
    dup = tmp_path / "dup.yaml"
    dup.write_text("serve:\n  max_active: 2\n  max_active: 3\n")
    res = subprocess.run([specnode, "serve", "--config", str(dup)], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "dup.yaml:3: serve.max_active: duplicate key" in res.stderr, res.stderr


def test_shipped_local_config_serves(specnode, tiny_model, tmp_path):
    node = Node(specnode, tiny_model, tmp_path / "serve.log",
                extra=["--config", str(ROOT / "cluster-configs/local-cpu.yaml"),
                       "--threads", "1"])
    try:
        h = node.wait_ready()
        assert h["status"] == "ok"
        assert "local-cpu.yaml" in node.log()
    finally:
        assert node.stop() == 0


@pytest.mark.parametrize("name,ranks", [("mpirun-cpu-tp3.yaml", 4), ("mpirun-cpu-2groups.yaml", 3),
                                        ("gpu-1node-8gpu.yaml", 8),
                                        ("gpu-2node-16gpu.yaml", 16)])
def test_shipped_multirank_configs_pass_the_schema(specnode, tmp_path, name, ranks):
    """Their schema is valid; outside mpirun they are refused with a message naming the
    rank count and the mpirun command, before any model loads (tests/serve/test_mpi.py runs
    them under mpirun)."""
    res = subprocess.run([specnode, "serve", "--config", str(ROOT / "cluster-configs" / name),
                          "--model", str(tmp_path / "missing.gguf")],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert f"{ranks}-rank layout" in res.stderr, res.stderr
    assert f"mpirun -np {ranks}" in res.stderr, res.stderr


def test_curve_authentication(specnode, tiny_model, tmp_path):
    """serve.curve_secret_key turns on CurveZMQ: a client with the server's public key is
    served; a plain client gets nothing."""
    import zmq
    from specnode_client import SpecnodeClient, SpecnodeError

    public, secret = zmq.curve_keypair()
    cfg = tmp_path / "curve.yaml"
    cfg.write_text(f'serve:\n  curve_secret_key: "{secret.decode()}"\n')
    node = Node(specnode, tiny_model, tmp_path / "serve.log",
                extra=["--config", str(cfg), "--threads", "1"])
    try:
        deadline_ok = False
        for _ in range(100):
            try:
                with SpecnodeClient(node.endpoint, timeout_s=1.0,
                                    curve_server_key=public.decode()) as c:
                    # "loading" (the endpoint answers before the model is in): ask again.
                    deadline_ok = c.health()["status"] == "ok"
                    if not deadline_ok:
                        time.sleep(0.1)
                        continue
                    r = c.generate(prompt="hello", max_tokens=4, temperature=0)
                    assert r.stats["completion_tokens"] == 4
                    break
            except SpecnodeError:
                if node.proc.poll() is not None:
                    pytest.fail(node.log())
        assert deadline_ok
        with SpecnodeClient(node.endpoint, timeout_s=1.0) as plain:
            with pytest.raises(SpecnodeError):
                plain.health()
    finally:
        node.stop()


def test_http_metrics_endpoint(specnode, tiny_model, tmp_path):
    """serve.metrics_bind / --metrics-bind: Prometheus scrapes GET /metrics over HTTP and sees
    the same counters as the `stats` reply, fresh on every scrape."""
    import urllib.error
    import urllib.request

    from serve_helpers import free_port
    from specnode_client import SpecnodeClient

    port = free_port()
    node = Node(specnode, tiny_model, tmp_path / "serve.log",
                extra=["--threads", "1", "--metrics-bind", f"127.0.0.1:{port}"])
    try:
        node.wait_ready()
        assert f"metrics on http://127.0.0.1:{port}/metrics" in node.log()
        url = f"http://127.0.0.1:{port}"

        def scrape():
            with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
                assert r.status == 200
                assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return r.read().decode()

        before = scrape()
        assert 'specnode_requests_total{outcome="completed"} 0' in before
        with SpecnodeClient(node.endpoint, timeout_s=60) as c:
            c.generate(prompt="hello there", max_tokens=6, temperature=0)
            stats = c.stats()
        after = scrape()
        assert 'specnode_requests_total{outcome="completed"} 1' in after
        assert 'specnode_time_to_first_token_seconds_count{sla="interactive"} 1' in after
        assert "specnode_queue_depth" in after
        # The same exposition as the stats reply (families and series names).
        names = lambda text: {l.split("{")[0].split(" ")[0] for l in text.splitlines()
                              if l and not l.startswith("#")}
        assert names(after) == names(stats["metrics"])
        with urllib.request.urlopen(url + "/health", timeout=10) as r:
            assert json.loads(r.read())["status"] == "ok"
        try:
            urllib.request.urlopen(url + "/nope", timeout=10)
            assert False, "404 expected"
        except urllib.error.HTTPError as e:
            assert e.code == 404
    finally:
        assert node.stop() == 0


def test_draft_alternatives_serve_and_report_each_drafter(specnode, tiny_model, tmp_path):
    """speculation.alternatives / --draft-alternatives: the router's drafters beside the draft
    on one target. The start-up line names them all; prompt lookup's controller learns the
    domain whichever drafter served (shadow scoring)."""
    from specnode_client import SpecnodeClient

    node = Node(specnode, tiny_model, tmp_path / "serve.log",
                extra=["--threads", "1", "--draft", "self:1", "--draft-alternatives", "ngram"])
    try:
        node.wait_ready()
        assert "draft self:1 + ngram:4" in node.log(), node.log()
        with SpecnodeClient(node.endpoint, timeout_s=60) as c:
            for i in range(3):
                out = c.generate(prompt=f"one two three one two three {i}", max_tokens=24,
                                 temperature=0)
                assert out.finish_reason in ("stop", "length")
            metrics = c.stats()["metrics"]
        # Prompt lookup learns the domain whichever drafter served (shadow scoring); the
        # self-draft only where the router gave it a first try (timing-dependent here).
        assert 'specnode_spec_k{drafter="ngram:4",domain="default"}' in metrics, metrics
    finally:
        assert node.stop() == 0


def test_http_metrics_port_taken_is_a_clear_error(specnode, tiny_model, tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        res = subprocess.run([specnode, "serve", "--model", tiny_model, "--bind",
                              "tcp://127.0.0.1:0", "--metrics-bind", f"127.0.0.1:{port}"],
                             capture_output=True, text=True, timeout=60)
    finally:
        s.close()
    assert res.returncode == 1, res.stderr
    assert f"metrics endpoint 127.0.0.1:{port}" in res.stderr, res.stderr


def test_kv_budget_from_device_memory_and_the_startup_summary(specnode, tiny_model, tmp_path):
    """--gpu-memory-utilization F sizes the KV store from the device's memory with the model
    loaded (the host's on the CPU) instead of --kv-capacity-mb; the start-up summary states
    the budget in MiB, tokens and sequences of the served length, and the metrics agree.
    A fraction that leaves no room stops the start with the flags to change (issue 37)."""
    import re

    from specnode_client import SpecnodeClient

    node = Node(specnode, tiny_model, tmp_path / "serve.log",
                extra=["--threads", "1", "--gpu-memory-utilization", "0.9",
                       "--max-model-len", "64"])
    try:
        node.wait_ready()
        m = re.search(r"ready in [0-9.]+ s; weights ([0-9.]+) MiB; KV ([0-9]+) MiB "
                      r"\(([0-9]+) tokens at f16: ([0-9.]+) sequences of 64 tokens, "
                      r"max_active 16", node.log())
        assert m, node.log()
        kv_mib = int(m.group(2))
        assert kv_mib != 1024 and kv_mib > 0
        assert float(m.group(1)) > 0
        with SpecnodeClient(node.endpoint, timeout_s=60) as c:
            metrics = c.stats()["metrics"]
        cap = next(float(l.split()[-1]) for l in metrics.splitlines()
                   if l.startswith("specnode_kv_capacity_bytes "))
        assert cap == kv_mib << 20
    finally:
        assert node.stop() == 0
    res = subprocess.run([specnode, "serve", "--model", tiny_model, "--http-bind", "off",
                          "--bind", "tcp://127.0.0.1:0", "--gpu-memory-utilization", "0.0000001"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1, res.stderr
    assert "cpu: " in res.stderr and "--gpu-memory-utilization" in res.stderr, res.stderr
    res = subprocess.run([specnode, "serve", "--model", tiny_model, "--gpu-memory-utilization",
                          "1.5"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "--gpu-memory-utilization" in res.stderr, res.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv:\n  memory_utilization: 2\n")
    res = subprocess.run([specnode, "serve", "--config", str(bad), "--model", tiny_model],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "bad.yaml:2: kv.memory_utilization" in res.stderr, res.stderr


# --- one map between the YAML keys and the flags (node/serve/config_keys.h) ---------------

def _flag_table(specnode):
    res = subprocess.run([specnode, "serve", "--print-flag-table"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    rows = []
    for line in res.stdout.splitlines()[2:]:
        key, flag, _ = [c.strip() for c in line.strip("|").split("|")]
        rows.append((key.strip("`"), None if flag == "—" else flag.strip("`")))
    return res.stdout, rows


def test_docs_quote_the_flag_table_and_help_has_every_flag(specnode):
    """docs/configs.md quotes `serve --print-flag-table` verbatim, and every flag in it is
    one `serve --help` documents."""
    text, rows = _flag_table(specnode)
    assert text in (ROOT / "docs" / "configs.md").read_text(), "regenerate the table in docs"
    assert len(rows) > 50
    helptext = subprocess.run([specnode, "serve", "--help"], capture_output=True, text=True,
                              timeout=60).stdout
    for key, flag in rows:
        if flag:
            assert flag in helptext, (key, flag)


# key -> (YAML value, the flag's arguments): a value other than the default.
EXAMPLES = {
    "model.target": ("/tmp/x.gguf", ["/tmp/x.gguf"]),
    "model.threads": ("3", ["3"]),
    "model.activations": ("int8", ["int8"]),
    "model.chat_template": ("chatml", ["chatml"]),
    "serve.bind": ("tcp://127.0.0.1:5599", ["tcp://127.0.0.1:5599"]),
    "serve.max_active": ("8", ["8"]),
    "serve.max_queue": ("9", ["9"]),
    "serve.max_tokens": ("100", ["100"]),
    "serve.max_frame_bytes": ("4096", ["4096"]),
    "serve.drain_timeout_s": ("7", ["7"]),
    "serve.metrics_bind": ("127.0.0.1:9999", ["127.0.0.1:9999"]),
    "serve.http_bind": ("127.0.0.1:8123", ["127.0.0.1:8123"]),
    "serve.http_api_key_env": ("MY_KEY", ["MY_KEY"]),
    "serve.http_max_body_bytes": ("5000", ["5000"]),
    "serve.http_threads": ("7", ["7"]),
    "serve.served_model_name": ("[a, b]", ["a", "b"]),
    "serve.max_model_len": ("100", ["100"]),
    "serve.kv_events_bind": ("tcp://127.0.0.1:5601", ["tcp://127.0.0.1:5601"]),
    "serve.kv_events_topic": ("t1", ["t1"]),
    "serve.kv_events_encoding": ("map", ["map"]),
    "speculation.draft": ("none", ["none"]),
    "speculation.alternatives": ("[ngram, self:1]", ["ngram,self:1"]),
    "speculation.k_max": ("3", ["3"]),
    "speculation.tree_nodes": ("8", ["8"]),
    "speculation.acceptance": ("ratio", ["ratio"]),
    "router.default_domain": ("code", ["code"]),
    "kv.mode": ("int8", ["int8"]),
    "kv.capacity_mb": ("512", ["512"]),
    "kv.memory_utilization": ("0.5", ["0.5"]),
    "kv.host_capacity_mb": ("100", ["100"]),
    "kv.page_tokens": ("16", ["16"]),
    "kv.sink_tokens": ("2", ["2"]),
    "kv.window_tokens": ("32", ["32"]),
    "kv.critical_threshold": ("2", ["2"]),
    "kv.cold_threshold": ("1", ["1"]),
    "kv.bytes_per_token": ("6000", ["6000"]),
    "kv.budget_rank": ("recency", ["recency"]),
    "kv.mass_sample_every": ("2", ["2"]),
    "kv.demote_every": ("32", ["32"]),
    "kv.evict_window": ("128", ["128"]),
    "kv.rotate": ("false", []),
    "kv.prefix_cache": ("false", []),
}


def _print_config(specnode, tmp_path, yaml, flags):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("version: 1\n" + yaml)
    res = subprocess.run([specnode, "serve", "--print-config", "--config", str(cfg), *flags],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, (yaml, flags, res.stderr)
    return dict(line.split(": ", 1) if ": " in line else (line.rstrip(":"), "")
                for line in res.stdout.splitlines())


def test_each_flag_sets_what_its_key_sets(specnode, tmp_path):
    """For every key with a flag: the flag and the key give the same effective value
    (`serve --print-config`), and one other than the default."""
    _, rows = _flag_table(specnode)
    rules = tmp_path / "rules.json"
    rules.write_text('{"rules": []}')
    examples = dict(EXAMPLES, **{"router.rules_file": (str(rules), [str(rules)])})
    base = _print_config(specnode, tmp_path, "", [])
    checked = set()
    for key, flag in rows:
        if not flag or key not in examples:
            continue
        value, args = examples[key]
        section, name = key.split(".", 1)
        from_yaml = _print_config(specnode, tmp_path, f"{section}:\n  {name}: {value}\n", [])
        from_flag = _print_config(specnode, tmp_path, "", [flag, *args])
        assert from_flag[key] == from_yaml[key], (key, flag, from_flag[key], from_yaml[key])
        assert from_flag[key] != base[key], (key, "the example is the default")
        checked.add(key)
    # Every key with a flag is checked, but the aliases and those only a GPU build takes.
    unchecked = {k for k, f in rows if f} - checked
    assert unchecked <= {"serve.model_name", "model.device", "serve.kv_events_replay_bind"}, \
        unchecked
