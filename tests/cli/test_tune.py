"""`specnode tune` as users run it: a base config and a prompt workload in, a tuned config
(that `tune` and `serve` accept) and a report out; bad input gets a clear error."""
import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ",".join(str(ROOT / "bench/prompts" / f) for f in ("chat.jsonl", "edit.jsonl"))


def run(cmd, timeout=900):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def tune(specnode, model, tmp_path, *extra, name="tuned"):
    out, report = tmp_path / f"{name}.yaml", tmp_path / f"{name}.json"
    res = run([specnode, "tune", "--model", model, "--prompts", PROMPTS, "--per-domain", "1",
               "--max-tokens", "16", "--rounds", "1", "--threads", "2", "--out", str(out),
               "--report", str(report), *extra])
    return res, out, report


def check_report(report, yaml_text):
    steps = report["steps"]
    names = [s["option"] for s in steps]
    assert names[0] == "speculation.draft=ngram", names
    assert "kv.mode=mixed" in names and "model.activations=int8" in names
    for s in steps:
        if s["tried"]:
            assert s["reason"] and isinstance(s["kept"], bool)
            assert 0.0 <= s["top1_agreement"] <= 1.0
            assert s["tokens_per_s"]["current"] > 0 and s["tokens_per_s"]["candidate"] > 0
            assert len(s["speedups"]) == report["criteria"]["rounds"]
            if not s["changes_output"]:
                # Speculation cannot change the target's greedy tokens (and the stack tries
                # it before anything that can).
                assert s["top1_agreement"] == 1.0
        else:
            assert s["skipped"]
    # Kept options, a later one on the same key replacing an earlier one.
    kept = {}
    for s in steps:
        if s.get("kept"):
            kept.pop(s["option"].split("=")[0], None)
            kept[s["option"].split("=")[0]] = s["option"]
    assert report["tuned"]["kept"] == list(kept.values())
    assert report["baseline"]["settings"] == \
        "draft=none k_max=4 disable=0.4 kv=full activations=int16"
    assert report["baseline"]["kv_bytes_per_token"] > 0
    noise = report["noise"]
    assert noise["baseline_vs_itself"] >= 0
    assert noise["min_gain_applied"] == max(report["criteria"]["min_gain"],
                                            min(0.5, noise["baseline_vs_itself"]))
    header = yaml_text.splitlines()[1]
    assert header.startswith("# kept: ")
    for k in report["tuned"]["kept"]:
        assert k in header


def test_tune_on_a_tiny_model_writes_a_config_that_loads(specnode, tiny_model, tmp_path):
    res, out, report_path = tune(specnode, tiny_model, tmp_path)
    assert res.returncode == 0, res.stderr
    assert "tune: baseline" in res.stderr and "tune: wrote" in res.stderr
    report = json.loads(report_path.read_text())
    text = out.read_text()
    check_report(report, text)
    assert f"target: {tiny_model}" in text
    # The tuned config is a valid base config for another run (parsed and checked the same
    # way `serve --config` does), and keeps the embedded default's other settings.
    assert "max_active: 16" in text
    res2, _, report2 = tune(specnode, tiny_model, tmp_path, "--config", str(out), name="again")
    assert res2.returncode == 0, res2.stderr
    assert json.loads(report2.read_text())["base_config"] == str(out)


def test_tune_prints_the_report_without_report_flag(specnode, tiny_model, tmp_path):
    out = tmp_path / "t.yaml"
    res = run([specnode, "tune", "--model", tiny_model, "--prompts", PROMPTS, "--per-domain",
               "1", "--max-tokens", "8", "--rounds", "1", "--out", str(out)])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["tuned"]["config"] == str(out)


@pytest.mark.parametrize("args,needle", [
    ([], "--prompts is required"),
    (["--prompts", "PROMPTS"], "--out is required"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--accuracy", "2"], "--accuracy"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--rounds", "0"], "--rounds"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--config", "/nonexistent.yaml"], "cannot open"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--config", "TP3"], "single-process"),
    (["--prompts", "BADPROMPTS", "--out", "OUT"], "bad.jsonl:2"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--config", "BADYAML"], "bad.yaml:"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--max-tokens", "100000000"], "--max-tokens"),
    (["--prompts", "PROMPTS", "--out", "/nonexistent-dir/t.yaml"], "cannot write"),
    (["--prompts", "PROMPTS", "--out", "OUT", "--report", "/nonexistent-dir/r.json"],
     "cannot write"),
])
def test_tune_bad_input(specnode, tiny_model, tmp_path, args, needle):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"domain": "chat", "prompt": "fine"}\n{"domain": 3}\n')
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("version: 1\nserve:\n  max_active: lots\n")
    subst = {"PROMPTS": PROMPTS, "BADPROMPTS": str(bad), "OUT": str(tmp_path / "o.yaml"),
             "TP3": str(ROOT / "cluster-configs/mpirun-cpu-tp3.yaml"), "BADYAML": str(bad_yaml)}
    args = [subst.get(a, a) for a in args]
    res = run([specnode, "tune", "--model", tiny_model] + args)
    assert res.returncode in (1, 2), res.stderr
    assert needle in res.stderr, res.stderr
    assert not (tmp_path / "o.yaml").exists()


def test_tune_on_smollm2(specnode, real_model, tmp_path):
    """On the real model: every option of the stack is measured or skipped with a reason,
    the options that change numerics get a top-1 agreement, and the tuned config loads."""
    res, out, report_path = tune(specnode, real_model, tmp_path)
    assert res.returncode == 0, res.stderr
    report = json.loads(report_path.read_text())
    check_report(report, out.read_text())
    names = [s["option"] for s in report["steps"]]
    assert "speculation.draft=self:20" in names
    for s in report["steps"]:
        if s["tried"] and s["changes_output"]:
            assert 0.5 < s["top1_agreement"] <= 1.0, s  # int8 / mixed KV stay close
