"""Faults across hosts: `specnode serve` as an mpirun job over two "hosts" on one machine
(docs/serving.md, "Faults across hosts").

Each host is a network namespace with its own hostname (a UTS namespace), joined by a veth
pair (10.77.0.1 <-> 10.77.0.2); OpenMPI starts the second host's daemon through an rsh agent
that enters that namespace, and everything between the hosts goes over TCP (oob and btl).
The TP-3 SmolLM2 target has ranks on both hosts (ranks 0-2 on host A, rank 3 on host B). A
third veth joins the test's own namespace to host A, where the front end listens.

  * the link between the hosts is cut mid-stream (no FIN, no RST: what a dead switch or a
    powered-off machine looks like);
  * every process of host B is killed mid-stream (a host that crashed);

and in both cases every in-flight request gets an error within 1.5 x topology.timeout_s
(plus a margin), the job ends in bounded time, and no process is left in either namespace.

Needs root, iproute2 (`ip netns`), util-linux `unshare`, mpirun and the real model; skips
with the reason otherwise. Registered in ctest as serve_netns_pytest.
"""
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

MPIRUN = shutil.which("mpirun")
IP = shutil.which("ip")
UNSHARE = shutil.which("unshare")

TIMEOUT_S = 2.0          # topology.timeout_s of the job
REPLY_WAIT_S = 1.5 * TIMEOUT_S  # what rank 0 waits for a step's replies (docs/configs.md)
SIGKILL_TIMEOUT = 3      # odls_base_sigkill_timeout: mpirun's teardown is 2 x this
KEEPALIVE = ["--mca", "oob_tcp_keepalive_time", "2", "--mca", "oob_tcp_keepalive_intvl", "1",
             "--mca", "oob_tcp_keepalive_probes", "3"]


def _run(*args, check=True):
    return subprocess.run(args, capture_output=True, text=True, check=check)


def _why_not() -> str:
    """'' when two namespaces can be made here, else the reason to skip."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for name, path in (("mpirun", MPIRUN), ("ip (iproute2)", IP), ("unshare", UNSHARE)):
        if path is None:
            return f"{name} not found"
    probe = f"sn-test-probe{os.getpid()}"
    res = _run(IP, "netns", "add", probe, check=False)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()}"
    _run(IP, "netns", "del", probe, check=False)
    return ""


WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


class TwoHosts:
    """Namespaces A and B (10.77.0.1 / 10.77.0.2) and a client link to A (10.78.0.2)."""

    HOST_A, HOST_B, FRONT = "10.77.0.1", "10.77.0.2", "10.78.0.2"

    def __init__(self, tmp: Path):
        tag = str(os.getpid())
        self.ns_a, self.ns_b = f"sn-test-{tag}a", f"sn-test-{tag}b"
        self.link_a, self.link_b = f"sna{tag}"[:15], f"snb{tag}"[:15]
        self.client_link, self.client_peer = f"snr{tag}"[:15], f"snq{tag}"[:15]
        self._clean_stale()
        for ns in (self.ns_a, self.ns_b):
            _run(IP, "netns", "add", ns)
            _run(IP, "-n", ns, "link", "set", "lo", "up")
        _run(IP, "link", "add", self.link_a, "type", "veth", "peer", "name", self.link_b)
        _run(IP, "link", "set", self.link_a, "netns", self.ns_a)
        _run(IP, "link", "set", self.link_b, "netns", self.ns_b)
        _run(IP, "-n", self.ns_a, "addr", "add", f"{self.HOST_A}/24", "dev", self.link_a)
        _run(IP, "-n", self.ns_b, "addr", "add", f"{self.HOST_B}/24", "dev", self.link_b)
        self.set_link(True)
        _run(IP, "-n", self.ns_b, "link", "set", self.link_b, "up")
        _run(IP, "link", "add", self.client_link, "type", "veth", "peer", "name", self.client_peer)
        _run(IP, "link", "set", self.client_peer, "netns", self.ns_a)
        _run(IP, "addr", "add", "10.78.0.1/24", "dev", self.client_link)
        _run(IP, "link", "set", self.client_link, "up")
        _run(IP, "-n", self.ns_a, "addr", "add", f"{self.FRONT}/24", "dev", self.client_peer)
        _run(IP, "-n", self.ns_a, "link", "set", self.client_peer, "up")
        # OpenMPI's rsh agent: "agent [options] HOST COMMAND..." runs COMMAND on HOST, here
        # in that host's namespace under its own hostname.
        self.agent = tmp / "netns-agent.sh"
        self.agent.write_text(
            "#!/bin/sh\n"
            'while [ "${1#-}" != "$1" ]; do shift; done\n'
            'host=$1; shift\n'
            f'case "$host" in {self.HOST_A}) ns={self.ns_a}; h=host-a;; '
            f'{self.HOST_B}) ns={self.ns_b}; h=host-b;; '
            '*) echo "netns-agent: unknown host $host" >&2; exit 1;; esac\n'
            f'exec {IP} netns exec "$ns" {UNSHARE} --uts sh -c "hostname $h; $*"\n')
        self.agent.chmod(0o755)

    @staticmethod
    def _clean_stale():
        """Namespaces and links a killed earlier run of this test left behind."""
        for line in _run(IP, "netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if name.startswith("sn-test-"):
                _run(IP, "netns", "del", name, check=False)
        for line in _run(IP, "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
            if name.startswith("snr") and name[3:].isdigit():
                _run(IP, "link", "del", name, check=False)

    def set_link(self, up: bool):
        _run(IP, "-n", self.ns_a, "link", "set", self.link_a, "up" if up else "down")

    def pids(self, ns) -> list:
        out = _run(IP, "netns", "pids", ns, check=False).stdout.split()
        return [int(p) for p in out]

    def kill_host_b(self):
        for pid in self.pids(self.ns_b):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self):
        for ns in (self.ns_a, self.ns_b):
            for pid in self.pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        _run(IP, "link", "del", self.client_link, check=False)
        for ns in (self.ns_a, self.ns_b):
            _run(IP, "netns", "del", ns, check=False)


@pytest.fixture
def hosts(tmp_path):
    h = TwoHosts(tmp_path)
    yield h
    h.close()


def tp3_config(tmp_path) -> Path:
    cfg = tmp_path / "netns-tp3.yaml"
    ranks = "\n".join(f"        - {{rank: {r}, device: cpu}}" for r in (1, 2, 3))
    cfg.write_text("version: 1\nmodel:\n  threads: 1\nspeculation:\n  draft: ngram\n"
                   "serve:\n  drain_timeout_s: 2\nkv:\n  mode: full\n  capacity_mb: 128\n"
                   f"topology:\n  timeout_s: {TIMEOUT_S}\n  groups:\n    - name: tp3\n"
                   f"      draft: {{rank: 0, device: cpu}}\n      target:\n{ranks}\n")
    return cfg


class NetnsJob:
    """mpirun -np 4 in host A's namespace: ranks 0-2 on host A, rank 3 on host B."""

    def __init__(self, hosts: TwoHosts, specnode, model, cfg: Path, log_path: Path):
        self.hosts = hosts
        self.endpoint = f"tcp://{hosts.FRONT}:5601"
        mpirun = [MPIRUN, "-np", "4", "--host", f"{hosts.HOST_A}:3,{hosts.HOST_B}:1",
                  "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
                  "--mca", "plm_rsh_agent", str(hosts.agent),
                  "--mca", "oob_tcp_if_include", "10.77.0.0/24",
                  "--mca", "btl_tcp_if_include", "10.77.0.0/24", "--mca", "btl", "self,vader,tcp",
                  "--mca", "odls_base_sigkill_timeout", str(SIGKILL_TIMEOUT), *KEEPALIVE,
                  "-x", "OMPI_ALLOW_RUN_AS_ROOT", "-x", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
                  specnode, "serve", "--config", str(cfg), "--model", model,
                  "--bind", "tcp://0.0.0.0:5601", "--threads", "1", "--http-bind", "off"]
        script = "hostname host-a; exec " + " ".join(f"'{a}'" for a in mpirun)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([IP, "netns", "exec", hosts.ns_a, UNSHARE, "--uts", "sh",
                                      "-c", script], stdout=self._log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s=180) -> dict:
        import zmq  # noqa: F401  (the client needs it; a clear skip otherwise)
        from specnode_client import SpecnodeClient, SpecnodeError

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the job exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with SpecnodeClient(self.endpoint, timeout_s=2) as c:
                    h = c.health()
                if h.get("status") == "ok":
                    return h
            except (SpecnodeError, OSError):
                pass
            time.sleep(0.5)
        pytest.fail(f"the job did not answer health within {timeout_s} s:\n{self.log()}")

    def close(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._log.close()


def stream_and_fault(job: NetnsJob, fault, n_requests=2):
    """n greedy long requests; once each has streamed a few chunks, `fault()`. Returns
    (seconds from the fault to each request's terminal error, the errors)."""
    from specnode_client import SpecnodeClient, SpecnodeError

    errors = [None] * n_requests
    ended_at = [None] * n_requests
    streaming = threading.Barrier(n_requests + 1, timeout=120)

    def run(i):
        with SpecnodeClient(job.endpoint, timeout_s=60) as c:
            seen = 0
            try:
                for m in c.submit(prompt=f"Once upon a time, in town {i},", max_tokens=2000,
                                  temperature=0):
                    if m["type"] == "tokens":
                        seen += 1
                        if seen == 3:
                            streaming.wait()
            except SpecnodeError as e:
                errors[i] = e
            ended_at[i] = time.monotonic()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_requests)]
    for t in threads:
        t.start()
    streaming.wait()
    fault_at = time.monotonic()
    fault()
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a client is still waiting"
    return [e - fault_at for e in ended_at], errors


def assert_job_ends_cleanly(job: NetnsJob, hosts: TwoHosts):
    """mpirun exits non-zero within its teardown bound and no process is left on A or B."""
    bound = 2 * SIGKILL_TIMEOUT + 2 * TIMEOUT_S + 20  # teardown + keepalive + slack
    try:
        job.proc.wait(timeout=bound)
    except subprocess.TimeoutExpired:
        pytest.fail(f"mpirun still running {bound} s after the fault:\n{job.log()}")
    assert job.proc.returncode != 0, job.log()
    deadline = time.monotonic() + 15  # host B's daemon notices through its keepalive
    while time.monotonic() < deadline and (hosts.pids(hosts.ns_a) or hosts.pids(hosts.ns_b)):
        time.sleep(0.5)
    left = {ns: hosts.pids(ns) for ns in (hosts.ns_a, hosts.ns_b)}
    assert not any(left.values()), (left, job.log())


def named_ranks(message: str) -> set:
    """The ranks an `unavailable` message names: "target rank 3 ..." or "target ranks 1,
    2, 3 did not answer ..." (every silent rank)."""
    m = re.search(r"target ranks? ([0-9, ]+)", message)
    return {int(x) for x in m.group(1).replace(",", " ").split()} if m else set()


def check_errors(delays, errors, log):
    """Every request got `unavailable` within the step wait (+ a margin), naming rank 3,
    the one on host B, among the silent ranks."""
    for d, e in zip(delays, errors):
        assert e is not None, f"a request ended without an error after the fault:\n{log}"
        assert e.code == "unavailable", (e.code, e.message)
        assert 3 in named_ranks(e.message), e.message
        assert d < REPLY_WAIT_S + 3.0, (d, e.message)


def test_cut_link_between_hosts_fails_every_request_and_ends_the_job(
        specnode, real_model, tmp_path, hosts):
    job = NetnsJob(hosts, specnode, real_model, tp3_config(tmp_path), tmp_path / "job.log")
    try:
        h = job.wait_ready()
        assert {r["host"] for r in h["ranks"]} == {"host-a", "host-b"}, h
        assert next(r for r in h["ranks"] if r["rank"] == 3)["host"] == "host-b", h
        delays, errors = stream_and_fault(job, lambda: hosts.set_link(False))
        check_errors(delays, errors, job.log())
        assert_job_ends_cleanly(job, hosts)
    finally:
        job.close()


def test_host_killed_mid_stream_fails_every_request_and_ends_the_job(
        specnode, real_model, tmp_path, hosts):
    job = NetnsJob(hosts, specnode, real_model, tp3_config(tmp_path), tmp_path / "job.log")
    try:
        job.wait_ready()
        delays, errors = stream_and_fault(job, hosts.kill_host_b)
        check_errors(delays, errors, job.log())
        assert_job_ends_cleanly(job, hosts)
    finally:
        job.close()
