"""Helpers for the serve tests: a `specnode serve` subprocess on a free loopback port."""
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "client") not in sys.path:
    sys.path.insert(0, str(ROOT / "client"))  # specnode_client.py


def free_port() -> int:
    """A loopback port free now, below Linux's ephemeral range (32768-60999): a port the
    kernel hands out by bind(0) can be taken as the local port of some client's outgoing
    connection before the node binds it (seen in CI: "Address already in use")."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # everything tried was taken: fall back to the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(endpoint: str, timeout_s: float = 1.0):
    """The node's health reply, or None when nothing answers within timeout_s."""
    import zmq

    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.IMMEDIATE, 1)
    s.setsockopt(zmq.SNDTIMEO, int(timeout_s * 1000))
    s.connect(endpoint)
    try:
        s.send(b'{"type": "health"}')
        if s.poll(int(timeout_s * 1000)):
            return json.loads(s.recv_multipart()[-1])
    except zmq.Again:
        return None
    finally:
        s.close(linger=0)
    return None


class Node:
    """`specnode serve` as a subprocess on a free loopback port (HTTP API off unless `extra`
    turns it on)."""

    def __init__(self, specnode: str, model: str, log_path: Path, extra=(), env=None):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        # The OpenAI API is on by default at 127.0.0.1:8000; tests that want it pass
        # --http-bind PORT or --port PORT in `extra` (later flags win).
        self.cmd = [specnode, "serve", "--http-bind", "off", "--model", model, "--bind",
                    self.endpoint, *extra]
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"specnode serve exited with {self.proc.returncode}:\n{self.log()}")
            h = health(self.endpoint, 1.0)
            # "loading": the endpoint is bound but the model is not served yet.
            if h is not None and h.get("type") == "health" and h.get("status") != "loading":
                return h
            time.sleep(0.2)
        log = self.log()  # before stop() closes the log file
        self.stop()
        pytest.fail(f"specnode serve did not answer health within {timeout_s} s:\n{log}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # graceful: drain, exit 0
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
