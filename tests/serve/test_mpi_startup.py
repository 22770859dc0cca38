"""`specnode serve` as an mpirun job, at start (docs/serving.md, "Cluster (mpirun)" and "MPI
transports"): mistakes in the launch or the config stop every rank with one clear message
before any weights load (wrong -np, device placements, a TP size the model cannot take, an
n-gram draft off rank 0, a GPU group without a GPU); the kill-timeout warning; and the MPI
layer's start-up check: rank 0 logs the layer that passed, a layer that fails is refused
naming it and `--mca pml ob1`.

Registered in ctest with test_mpi.py as serve_mpi_pytest (and its layer_matrix tests under
every MPI layer: docs/testing.md, "MPI layer matrix"); skipped without mpirun.
"""
import os
import re
import subprocess

import pytest

from mpi_helpers import MPIRUN, TP3, groups_config, run_job, start_up_log, tp_config
from serve_helpers import free_port

pytestmark = pytest.mark.skipif(MPIRUN is None, reason="mpirun not found (apt-get install openmpi-bin)")


def test_mpirun_without_the_kill_timeout_is_warned(specnode, tiny_model, tmp_path):
    log = start_up_log(specnode, tiny_model, tmp_path)
    assert "--mca odls_base_sigkill_timeout 16" in log, log  # for drain_timeout_s 30


def test_wrong_np_is_refused_before_loading(specnode, tmp_path):
    res, _ = run_job(3, specnode, ["--config", str(TP3), "--model", str(tmp_path / "none.gguf")])
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "needs 4 ranks, mpirun started 3 (use mpirun -np 4)" in out, out
    assert out.count("needs 4 ranks") == 1, out  # one message, from rank 0
    assert "none.gguf" not in out


def test_bad_device_placements_are_refused_before_loading(specnode, tmp_path):
    """A TP group mixing cpu and cuda ranks, and an n-gram coordinator on a GPU, are refused
    by every rank before any file is opened (one message, from rank 0)."""
    cases = [
        ("- {rank: 2, device: cpu}", '- {rank: 2, device: "cuda:0"}',
         ("mixes cpu and cuda target ranks",)),
        ("draft: {rank: 0, device: cpu}", 'draft: {rank: 0, device: "cuda:0"}',
         ("places rank 0 on cuda:0",)),
    ]
    for i, (old, new, needles) in enumerate(cases):
        cfg = tmp_path / f"device{i}.yaml"
        cfg.write_text(TP3.read_text().replace(old, new))
        res, _ = run_job(4, specnode, ["--config", str(cfg), "--model", str(tmp_path / "none.gguf")])
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert any(n in out for n in needles), out
        assert "none.gguf" not in out


def test_gpu_target_group_without_a_gpu_fails_cleanly(specnode, tiny_model, tmp_path):
    """A whole TP-2 group on cuda devices: on a machine without a GPU (or a build without
    CUDA / NCCL) the shards fail to load, rank 0 reports why, and the job ends non-zero
    without hanging. With GPUs the group serves (docs/gpu.md)."""
    probe = subprocess.run([specnode, "generate", "--model", tiny_model, "--prompt", "hi",
                            "--max-tokens", "1", "--device", "cuda:0", "--quiet"],
                           capture_output=True, text=True, timeout=60)
    if probe.returncode == 0:
        pytest.skip("a GPU is usable here: the failure path needs a machine without one")
    cfg = tp_config(tmp_path, 2)
    cfg.write_text(cfg.read_text().replace("- {rank: 1, device: cpu}", '- {rank: 1, device: "cuda:0"}')
                   .replace("- {rank: 2, device: cpu}", '- {rank: 2, device: "cuda:1"}'))
    assert "cuda:1" in cfg.read_text()
    res, elapsed = run_job(3, specnode, ["--config", str(cfg), "--model", tiny_model], timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert any(why in out for why in ("no CUDA device", "without the CUDA backend",
                                      "built without it", "not available", "does not exist")), out
    assert elapsed < 90, elapsed


def test_tp2_on_smollm2_is_refused_from_the_header(specnode, real_model, tmp_path):
    res, elapsed = run_job(3, specnode, ["--config", str(tp_config(tmp_path, 2)),
                                         "--model", real_model])
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "tensor-parallel target over 2 ranks does not fit" in out, out
    assert out.count("does not fit") == 1, out
    assert "specnode serve: " + real_model + " on" not in out  # never served


def test_tiny_model_tp3_is_refused(specnode, tiny_model, tmp_path):
    res, _ = run_job(4, specnode, ["--config", str(tp_config(tmp_path, 3)), "--model", tiny_model])
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "tensor-parallel target over 3 ranks does not fit" in out, out


def test_ngram_draft_off_rank_0_is_refused(specnode, tiny_model, tmp_path):
    cfg = groups_config(tmp_path, [("a", 0, [1]), ("b", 2, [3])])
    res, _ = run_job(4, specnode, ["--config", str(cfg), "--model", tiny_model])
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert "group b places its draft on rank 2, but the draft 'ngram' runs inside the " \
           "coordinator" in out, out


# The MPI layer's start-up check (issue 34; node/cluster/transport_check.h). Under the
# layer matrix OMPI_MCA_pml names the layer ctest chose (tests/support/mpi_layer_run).
START_UP_CHECK = re.compile(r"specnode serve: MPI: (Open MPI v[\d.]+)[^;\n]*; pml (\w+)"
                            r"(?: \(mtl (\w+)\))?[^:\n]*: 3 ranks passed the start-up check")


@pytest.mark.layer_matrix
def test_start_up_says_which_mpi_layer_passed_the_check(specnode, tiny_model, tmp_path):
    log = start_up_log(specnode, tiny_model, tmp_path)
    m = START_UP_CHECK.search(log)
    assert m, log
    if os.environ.get("OMPI_MCA_pml"):
        assert m.group(2) == os.environ["OMPI_MCA_pml"], log
    if m.group(2) == "cm":
        assert m.group(3) == os.environ.get("OMPI_MCA_mtl", m.group(3)), log


@pytest.mark.layer_matrix
def test_a_layer_failing_the_start_up_check_is_refused_before_loading(specnode, tiny_model,
                                                                     tmp_path):
    """A layer that changes data in flight (here rank 2's echo of the 4 MiB frame, by the
    testing fault) is refused before any weights load, naming the layer and --mca pml ob1,
    and the job ends at once instead of serving."""
    args = ["--config", str(tp_config(tmp_path, 2)), "--model", tiny_model,
            "--bind", f"tcp://127.0.0.1:{free_port()}", "--threads", "1"]
    res, elapsed = run_job(3, specnode, args, env_extra={"SPECNODE_TRANSPORT_CHECK_FAULT": "2"})
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert ("failed specnode's start-up check: the frame echoed by rank 2: byte 2097152 of "
            "4194304 arrived changed") in out, out
    layer = os.environ.get("OMPI_MCA_pml", "")
    assert f"specnode serve: the MPI point-to-point layer (pml {layer}" in out, out
    assert "Relaunch with `mpirun --mca pml ob1 ...` (or OMPI_MCA_pml=ob1" in out, out
    assert "specnode serve: " + tiny_model + " on" not in out  # never served
    assert elapsed < 30, (elapsed, out)


def test_a_bad_transport_fault_setting_is_refused(specnode, tiny_model, tmp_path):
    args = ["--config", str(tp_config(tmp_path, 2)), "--model", tiny_model]
    res, _ = run_job(3, specnode, args, env_extra={"SPECNODE_TRANSPORT_CHECK_FAULT": "x"})
    out = res.stdout + res.stderr
    assert res.returncode != 0, out
    assert out.count("SPECNODE_TRANSPORT_CHECK_FAULT=x: expected a rank from 1 to 2") == 1, out
