"""`specnode serve --check-config`: the config parsed and validated as serve does, the
model's GGUF header checked (architecture, shapes, vocabulary, draft), a summary printed —
without loading weights, binding a socket or mpirun. Exit 0 when fine, else 1 with the
error (file:line: key for config mistakes), 2 for a usage error."""
import os
import re
import shlex
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = ("model:", "arch:", "layers:", "tokenizer:", "compute:", "kv:", "draft:",
                "router:", "bind:", "http:", "metrics:", "kv events:", "limits:")


def check(specnode, *args, env=None, timeout=120):
    return subprocess.run([specnode, "serve", "--check-config", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


def assert_ok(res):
    assert res.returncode == 0, res.stderr
    assert "--check-config:" in res.stdout and ": ok" in res.stdout.splitlines()[0], res.stdout
    lines = [line.strip() for line in res.stdout.splitlines()[1:]]
    for key in SUMMARY_KEYS:
        assert any(line.startswith(key) for line in lines), (key, res.stdout)


def assert_fails(res, *needles):
    assert res.returncode == 1, (res.returncode, res.stdout, res.stderr)
    assert res.stdout == "", res.stdout  # no summary for a config that would not start
    for needle in needles:
        assert needle in res.stderr, res.stderr


def summary_line(res, key):
    return next(line.strip() for line in res.stdout.splitlines() if line.strip().startswith(key))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help_documents_check_config(specnode):
    res = subprocess.run([specnode, "serve", "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    assert "--check-config" in res.stdout


def test_good_config_with_the_real_model_prints_the_summary(specnode, real_model, tmp_path):
    cfg = tmp_path / "node.yaml"
    cfg.write_text(f"version: 1\nmodel:\n  target: {real_model}\n  threads: 2\n"
                   "serve:\n  bind: tcp://127.0.0.1:5599\n  metrics_bind: 127.0.0.1:9499\n"
                   "kv:\n  mode: mixed\n  capacity_mb: 256\n"
                   "speculation:\n  draft: self:4\n")
    t0 = time.monotonic()
    res = check(specnode, "--config", str(cfg))
    assert_ok(res)
    assert time.monotonic() - t0 < 30  # a header, not the weights
    assert real_model in summary_line(res, "model:")
    assert summary_line(res, "layers:").split()[1].rstrip(",").isdigit()
    assert "context" in summary_line(res, "layers:")
    assert summary_line(res, "kv:").startswith("kv:        mixed, 256 MiB")
    assert "2 threads" in summary_line(res, "compute:")
    assert summary_line(res, "draft:").startswith("draft:     self:4")
    assert "tcp://127.0.0.1:5599" in summary_line(res, "bind:")
    assert "http://127.0.0.1:9499/metrics" in summary_line(res, "metrics:")
    assert "drain 30 s" in summary_line(res, "limits:")


def test_embedded_config_and_flags_with_the_real_model(specnode, real_model):
    res = check(specnode, "--model", real_model, "--bind", "tcp://127.0.0.1:5598",
                "--kv-mode", "int8", "--draft", "none")
    assert_ok(res)
    assert "local-cpu.yaml: ok" in res.stdout.splitlines()[0]
    assert summary_line(res, "kv:").startswith("kv:        int8,")
    assert summary_line(res, "draft:").startswith("draft:     none")


@pytest.mark.parametrize("config", sorted(p.name for p in (ROOT / "cluster-configs").glob("*.yaml")))
def test_shipped_cluster_configs_check_without_mpirun(specnode, real_model, config):
    """Every shipped config passes with the real model (multi-rank ones without mpirun:
    rank layout, devices, TP fit); GPU layouts fail here naming why: no CUDA in the build,
    or (a CUDA build) what they need that this machine lacks — the draft model they name
    under /models, a target whose KV heads split over their TP width — or, first, the GPUs
    this machine lacks (the layout check)."""
    res = check(specnode, "--config", str(ROOT / "cluster-configs" / config), "--model", real_model)
    if config.startswith("gpu-") and res.returncode != 0:
        assert res.returncode == 1, res.stderr
        assert any(why in res.stderr for why in ("the GPU layout fails", "CUDA",
                                                 "/models/draft.gguf", "tensor parallelism")), \
            res.stderr
        return
    assert_ok(res)
    if config.startswith("mpirun-"):
        assert "mpirun -np" in summary_line(res, "compute:")


def test_tiny_model_summary(specnode, tiny_model):
    res = check(specnode, "--model", tiny_model, "--draft", "self:1")
    assert_ok(res)
    assert summary_line(res, "arch:").startswith("arch:      llama 2L")
    assert summary_line(res, "layers:").startswith("layers:    2, context 512 tokens")


@pytest.mark.parametrize("body,where", [
    ("version: 1\nserve:\n  max_activ: 3\n", "bad.yaml:3: serve.max_activ: unknown key"),
    ("version: 1\nserve:\n  max_active: 0\n", "bad.yaml:3: serve.max_active: expected an integer"),
    ("version: 1\nkv:\n  mode: fp8\n", 'bad.yaml:3: kv.mode: unknown KV mode "fp8"'),
    ("version: 1\nspeculation:\n  k_max: 4\n  draft: self:x\n", "bad.yaml:4: speculation.draft"),
])
def test_bad_key_or_value_names_file_line_and_key(specnode, tiny_model, tmp_path, body, where):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(body)
    assert_fails(check(specnode, "--config", str(cfg), "--model", tiny_model), where)


def test_missing_model_is_named(specnode, tmp_path):
    missing = tmp_path / "nowhere" / "model.gguf"
    assert_fails(check(specnode, "--model", str(missing)), "target model", str(missing),
                 "No such file")


def test_missing_draft_model_is_named(specnode, tiny_model, tmp_path):
    missing = tmp_path / "draft.gguf"
    assert_fails(check(specnode, "--model", tiny_model, "--draft", str(missing)), "draft model",
                 str(missing))


def test_non_gguf_files_are_refused(specnode, tiny_model, tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("hello, not a model\n")
    assert_fails(check(specnode, "--model", str(text)), str(text), "not a GGUF file")
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(Path(tiny_model).read_bytes()[:200])
    assert_fails(check(specnode, "--model", str(truncated)), str(truncated))
    assert_fails(check(specnode, "--model", str(tmp_path)), "not a regular file")


def test_self_draft_layers_checked_against_the_target(specnode, tiny_model):
    assert_fails(check(specnode, "--model", tiny_model, "--draft", "self:2"),
                 "self-draft layers must be in [1, 2)")


def test_draft_model_must_share_the_vocabulary(specnode, tiny_model, real_model):
    assert_fails(check(specnode, "--model", tiny_model, "--draft", real_model),
                 "must share the target's vocabulary")


def test_unknown_option_is_a_usage_error(specnode):
    res = check(specnode, "--check-confgi")
    assert res.returncode == 2, res.stderr
    assert "unknown option" in res.stderr


def test_does_not_bind_the_ports(specnode, tiny_model):
    """The ZeroMQ and metrics ports held by another socket: --check-config still passes (it
    binds nothing)."""
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen(1)
        res = check(specnode, "--model", tiny_model, "--bind", f"tcp://127.0.0.1:{port}",
                    "--metrics-bind", f"127.0.0.1:{port}")
        assert_ok(res)
        assert f"tcp://127.0.0.1:{port}" in summary_line(res, "bind:")


def test_multi_rank_layout_is_checked_without_mpirun(specnode, tiny_model):
    res = check(specnode, "--config", str(ROOT / "cluster-configs" / "mpirun-cpu-2groups.yaml"),
                "--model", tiny_model)
    assert_ok(res)
    assert "3 ranks (mpirun -np 3)" in summary_line(res, "compute:")
    # SmolLM2's 3 KV heads fit TP 3; the tiny model's 2 do not: refused, naming the group.
    assert_fails(check(specnode, "--config",
                       str(ROOT / "cluster-configs" / "mpirun-cpu-tp3.yaml"), "--model",
                       tiny_model),
                 "mpirun-cpu-tp3.yaml: group", "does not fit")


# --- GPU layout: where each rank of a topology lands and which GPU it opens --------------

TWO_NODES = ROOT / "cluster-configs" / "gpu-2node-16gpu.yaml"
MAPPING_LINE = ("16 ranks on 2 nodes, 8 per node (from the config's hosts): mpirun --map-by "
                "ppr:8:node puts rank r on node r / 8 as local rank r % 8")


def env_without_cuda_visible_devices(**extra):
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(extra)
    return env


def two_node_rank_lines(gpu):
    """The placement lines of cluster-configs/gpu-2node-16gpu.yaml; gpu(rank, node, cuda)
    gives what follows `cuda:N` on the line."""
    lines = []
    for r in range(16):
        node, local = divmod(r, 8)
        host = ("nodeA", "nodeB")[node]
        group, first, size = (host, 0, 4) if local < 5 else (f"{host}-2", 5, 2)
        role = ("coordinator + draft of group nodeA" if r == 0 else
                f"draft of group {group}" if local == first else
                f"target of group {group} (TP rank {local - first - 1} of {size})")
        lines.append(f"rank {r}: node {node} (host {host}), local rank {local}, {role}, "
                     f"cuda:{local}{gpu(r, node, local)}")
    return lines


def missing(r, node, cuda):
    return f": does not exist on node {node} (0 GPUs visible)"


def assert_no_gpu_layout(res):
    """The whole message for the 2-node config where each node shows 0 GPUs."""
    assert_fails(res)
    lines = res.stderr.splitlines()
    assert lines[0] == f"specnode serve: {TWO_NODES}: the GPU layout fails for ranks 0-15:"
    assert lines[1] == "  " + MAPPING_LINE
    assert lines[2].startswith("  each node: 0 GPUs visible (this host: "), lines[2]
    assert lines[3:19] == ["  " + line for line in two_node_rank_lines(missing)]
    assert lines[19:] == ["  (every node is taken to show what this host shows; "
                          "--gpus-per-node N checks the layout for nodes of N GPUs each)"]
    return lines[2]


@pytest.fixture(scope="module")
def kv2_models(specnode, tmp_path_factory):
    """A target whose 2 KV heads split over TP 2 and are replicated over TP 4 (8 query
    heads), and a draft with its vocabulary."""
    d = tmp_path_factory.mktemp("kv2")
    target, draft = d / "kv2.gguf", d / "draft.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(target), "--layers", "1", "--d-model",
                    "256", "--heads", "8", "--kv-heads", "2", "--ff", "512"], check=True,
                   capture_output=True)
    subprocess.run([specnode, "tiny-model", "--out", str(draft)], check=True,
                   capture_output=True)
    return str(target), str(draft)


def test_help_documents_the_layout_flags_as_the_docs_do(specnode):
    res = subprocess.run([specnode, "serve", "--help"], capture_output=True, text=True)
    assert res.returncode == 0
    docs = (ROOT / "docs" / "serving.md").read_text() + (ROOT / "docs" / "configs.md").read_text()
    for flag in ("--ranks-per-node", "--gpus-per-node"):
        assert f"  {flag} " in res.stdout, res.stdout
        assert flag in docs, flag
    assert "ppr:R:node" in res.stdout


def test_two_node_layout_on_a_host_without_gpus(specnode, tiny_model):
    """Without GPUs every rank of the 2 x 8 config is named with its node, local rank, role
    and device, and why it fails; nothing crashes, no model is opened."""
    res = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                env=env_without_cuda_visible_devices())
    if "each node: 0 GPUs visible (this host: " not in res.stderr:
        pytest.skip(f"this host shows GPUs: {res.stderr.splitlines()[2:3]}")
    origin = assert_no_gpu_layout(res)
    assert ("no CUDA device" in origin or "built without the CUDA backend" in origin), origin


def test_empty_cuda_visible_devices_hides_every_gpu(specnode, tiny_model):
    res = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                env=env_without_cuda_visible_devices(CUDA_VISIBLE_DEVICES=""))
    assert assert_no_gpu_layout(res).endswith(", CUDA_VISIBLE_DEVICES=)")


def test_gpus_per_node_plans_the_two_node_layout(specnode, kv2_models):
    """--gpus-per-node 8: the layout passes on a machine without the GPUs and the summary
    lists it; a build without CUDA then stops at the devices, after the layout."""
    target, draft = kv2_models
    res = check(specnode, "--config", str(TWO_NODES), "--model", target, "--draft", draft,
                "--gpus-per-node", "8", env=env_without_cuda_visible_devices())
    if res.returncode != 0:
        assert_fails(res, "built without the CUDA backend")
        assert "GPU layout" not in res.stderr
        return
    assert_ok(res)
    lines = res.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  gpus:"))
    assert lines[at] == "  gpus:      " + MAPPING_LINE
    assert lines[at + 1] == "             each node: 8 GPUs visible (--gpus-per-node 8)"
    assert lines[at + 2:at + 18] == [
        " " * 13 + line for line in two_node_rank_lines(lambda r, n, c: f" = GPU {c}")]
    assert lines[at + 18].startswith("  kv:")


def test_cuda_visible_devices_subset_fails_the_ranks_beyond_it(specnode, tiny_model):
    res = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                "--gpus-per-node", "8",
                env=env_without_cuda_visible_devices(CUDA_VISIBLE_DEVICES="4,5,6,7"))
    assert_fails(res, f"{TWO_NODES}: the GPU layout fails for ranks 4-7, 12-15:\n",
                 "\n  each node: 4 GPUs visible: 4,5,6,7 (--gpus-per-node 8, "
                 "CUDA_VISIBLE_DEVICES=4,5,6,7)\n",
                 "\n  rank 8: node 1 (host nodeB), local rank 0, draft of group nodeB, "
                 "cuda:0 = GPU 4\n",
                 "\n  rank 12: node 1 (host nodeB), local rank 4, target of group nodeB "
                 "(TP rank 3 of 4), cuda:4: does not exist on node 1 (4 GPUs visible)\n")
    assert "checks the layout for nodes of N GPUs" not in res.stderr  # N was given
    # A GPU listed twice is refused as such.
    res = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                "--gpus-per-node", "8",
                env=env_without_cuda_visible_devices(CUDA_VISIBLE_DEVICES="0,1,1"))
    assert_fails(res, "CUDA_VISIBLE_DEVICES=0,1,1 lists 1 twice")


def test_ranks_per_node_against_the_configs_hosts(specnode, tiny_model):
    """Every rank on one node: nodeB's ranks take nodeA's GPUs and contradict its host."""
    res = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                "--ranks-per-node", "16", "--gpus-per-node", "16")
    assert_fails(res, "the GPU layout fails for ranks 0-15:\n",
                 "\n  16 ranks on 1 node, 16 per node (--ranks-per-node 16)",
                 "\n  rank 9: node 0 (host nodeB), local rank 9, target of group nodeB (TP rank "
                 "0 of 4), cuda:1 = GPU 1: GPU 1 of node 0 is opened by rank 1 too (one GPU per "
                 "rank); host nodeB, but it lands on node 0, whose rank 0 names host nodeA\n",
                 "\n  (the config's hosts hold 8 ranks each: check with --ranks-per-node 8 and "
                 "launch with mpirun --map-by ppr:8:node)\n")


def test_layout_flags_go_with_check_config(specnode):
    res = subprocess.run([specnode, "serve", "--config", str(TWO_NODES), "--gpus-per-node", "8"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1
    assert "--ranks-per-node and --gpus-per-node go with --check-config" in res.stderr


def documented_launch(config):
    """The hostfile and mpirun arguments the config's comment gives."""
    comment = [line[1:].strip() for line in config.read_text().splitlines()
               if line.startswith("#")]
    printf = next(line for line in comment if line.startswith("printf "))
    hostfile = shlex.split(printf)[1].replace("\\n", "\n")
    start = next(i for i, line in enumerate(comment) if line.startswith("mpirun "))
    command = []
    for line in comment[start:]:
        command.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return hostfile, shlex.split(" ".join(command))


def test_documented_launch_places_ranks_as_check_config_does(specnode, tiny_model, tmp_path):
    """The mpirun line in gpu-2node-16gpu.yaml's comment, run with --display-map
    --do-not-launch (nothing starts; eth0 swapped for lo, which every host has): OpenMPI's
    map puts each rank on the host check-config says."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    hostfile, argv = documented_launch(TWO_NODES)
    assert "--map-by" in argv and argv[argv.index("--map-by") + 1] == "ppr:8:node", argv
    program = argv.index("specnode")
    assert argv[program:] == ["specnode", "serve", "--config",
                              "cluster-configs/gpu-2node-16gpu.yaml"], argv
    (tmp_path / "hosts").write_text(hostfile)
    options = [a.replace("eth0", "lo") for a in argv[1:program]]
    res = subprocess.run([mpirun, *options, "--display-map", "--do-not-launch", "true"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1",
                                  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
    mapped, node = {}, None
    for line in res.stdout.splitlines():
        if m := re.search(r"Data for node: (\S+)", line):
            node = m.group(1)
        elif m := re.search(r"Process rank: (\d+)", line):
            mapped[int(m.group(1))] = node
    assert len(mapped) == 16, (res.stdout, res.stderr)
    # Nodes of 0 GPUs: the layout fails, listing every rank with its host.
    layout = check(specnode, "--config", str(TWO_NODES), "--model", tiny_model,
                   "--gpus-per-node", "0", env=env_without_cuda_visible_devices())
    placed = {int(m.group(1)): m.group(2)
              for m in re.finditer(r"rank (\d+): node \d+ \(host (\w+)\)", layout.stderr)}
    assert placed == mapped
