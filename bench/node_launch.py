"""Starts and stops a `specnode serve` node for the benchmarks that drive one over HTTP, as a
user would: in one process, or as an mpirun job of 1 + T ranks (rank 0 the coordinator, the
front ends and the group's draft; ranks 1..T the target's tensor-parallel shards).
Used by bench/bench_prefix_cache.py and bench/bench_spec_cluster.py."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(specnode: str, model: str, threads: int, yaml_body: str, log, tp: int = 0,
               timeout_s: float = 300):
    """Serves `model` with the config `yaml_body` (YAML sections other than serve's binds and
    the topology) and returns (process, http port) once /health answers. tp > 0: an mpirun
    job whose group has its draft on rank 0 and its target over ranks 1..tp."""
    port = free_port()
    cfg = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    cfg.write(f"version: 1\nserve:\n  bind: tcp://127.0.0.1:{free_port()}\n"
              f"  http_bind: 127.0.0.1:{port}\n{yaml_body}")
    if tp > 0:
        cfg.write("topology:\n  timeout_s: 120\n  groups:\n    - name: cpu\n"
                  "      draft: {rank: 0, device: cpu}\n      target:\n" +
                  "".join(f"        - {{rank: {r}, device: cpu}}\n" for r in range(1, tp + 1)))
    cfg.close()
    env = dict(os.environ)
    env.pop("SPECNODE_API_KEY", None)
    cmd = [specnode, "serve", "--config", cfg.name, "--model", model, "--threads", str(threads)]
    if tp > 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "-np", str(tp + 1), "--oversubscribe", "--mca", "mpi_yield_when_idle",
               "1", "--mca", "odls_base_sigkill_timeout", "16", *cmd]
    proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc, port
        except OSError:
            if proc.poll() is not None:
                sys.exit(f"specnode serve exited with {proc.returncode}")
            time.sleep(0.2)
    proc.kill()
    sys.exit("specnode serve did not come up")


def stop_node(proc) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
