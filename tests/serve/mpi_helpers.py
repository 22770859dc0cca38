"""mpirun jobs of `specnode serve` for the pytest suites (test_mpi.py, test_mpi_startup.py):
the launch line, a running job (MpiNode), a job run to its end (run_job) and small configs."""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from serve_helpers import ROOT, Node, free_port

MPIRUN = shutil.which("mpirun")
TP3 = ROOT / "cluster-configs" / "mpirun-cpu-tp3.yaml"


def mpi_env():
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    return env


# What the documented launch lines add so that Ctrl-C on mpirun leaves time for the drain
# (docs/serving.md, "Ctrl-C on mpirun").
DRAIN_MCA = ["--mca", "odls_base_sigkill_timeout", "16"]


def mpirun_cmd(np_, specnode, *args, mpirun_extra=()):
    return [MPIRUN, "-np", str(np_), "--oversubscribe", "--mca", "mpi_yield_when_idle", "1",
            *mpirun_extra, specnode, "serve", "--http-bind", "off", *args]


class MpiNode(Node):
    """`mpirun -np N specnode serve ...` in its own process group, on a free port."""

    def __init__(self, specnode, model, log_path: Path, np_, config, extra=(), mpirun_extra=()):
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.cmd = mpirun_cmd(np_, specnode, "--config", str(config), "--model", model,
                              "--bind", self.endpoint, "--threads", "1", *extra,
                              mpirun_extra=mpirun_extra)
        self.log_path = log_path
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env=mpi_env(), start_new_session=True)

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def run_job(np_, specnode, args, timeout=90, env_extra=None):
    t0 = time.monotonic()
    res = subprocess.run(mpirun_cmd(np_, specnode, *args), capture_output=True, text=True,
                         env={**mpi_env(), **(env_extra or {})}, timeout=timeout)
    return res, time.monotonic() - t0


def tp_config(tmp_path, tp, name="tp.yaml"):
    targets = "\n".join(f"        - {{rank: {r}, device: cpu}}" for r in range(1, tp + 1))
    cfg = tmp_path / name
    cfg.write_text("version: 1\nmodel:\n  threads: 1\nspeculation:\n  draft: ngram\n"
                   "kv:\n  mode: full\n  capacity_mb: 64\n"
                   "topology:\n  timeout_s: 30\n  groups:\n    - name: cpu\n"
                   f"      draft: {{rank: 0, device: cpu}}\n      target:\n{targets}\n")
    return cfg


def groups_config(tmp_path, groups, draft="ngram", name="groups.yaml"):
    """groups: [(name, draft_rank, [target ranks])] -> a several-group config."""
    lines = ["version: 1", "model:", "  threads: 1", "speculation:", f"  draft: {draft}",
             "kv:", "  mode: full", "  capacity_mb: 64", "topology:", "  timeout_s: 30",
             "  groups:"]
    for gname, draft_rank, targets in groups:
        lines += [f"    - name: {gname}", f"      draft: {{rank: {draft_rank}, device: cpu}}",
                  "      target:"]
        lines += [f"        - {{rank: {r}, device: cpu}}" for r in targets]
    cfg = tmp_path / name
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def start_up_log(specnode, tiny_model, tmp_path) -> str:
    """The log of a 3-rank TP-2 job on the tiny model, up to ready (then stopped)."""
    node = MpiNode(specnode, tiny_model, tmp_path / "mpi.log", 3, tp_config(tmp_path, 2))
    try:
        node.wait_ready(120)
        return node.log()
    finally:
        node.stop()
