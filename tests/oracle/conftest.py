"""pytest wiring for the oracle tests.

  --specnode PATH   the engine binary (ctest passes $<TARGET_FILE:specnode>). Without it,
                    tests that run the engine are skipped; the oracle's own tests still run.
  SPECNODE_MODEL    path of SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-model). Unset:
                    SmolLM2 tests skip, or fail when SPECNODE_REQUIRE_MODEL=1 (scripts/test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from numpy_llama import load_cached  # noqa: E402

ENGINE_TIMEOUT_S = 600


def pytest_addoption(parser):
    parser.addoption("--specnode", action="store", default=None,
                     help="path of the specnode binary to test against the oracle")


class Specnode:
    """Runs the engine's CLI and reports failures with its output."""

    def __init__(self, path: str):
        self.path = path

    def run(self, *args, timeout: float = ENGINE_TIMEOUT_S) -> str:
        cmd = [self.path, *map(str, args)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"timed out after {timeout}s: {' '.join(cmd)}")
        if p.returncode != 0:
            pytest.fail(f"exit {p.returncode}: {' '.join(cmd)}\n--- stdout\n{p.stdout[-4000:]}"
                        f"\n--- stderr\n{p.stderr[-4000:]}")
        return p.stdout

    def json(self, *args, **kw) -> dict:
        """Run and parse the last non-empty stdout line as JSON."""
        out = self.run(*args, **kw)
        lines = [ln for ln in out.splitlines() if ln.strip()]
        if not lines:
            pytest.fail(f"no output from specnode {' '.join(map(str, args))}")
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError as e:
            pytest.fail(f"last stdout line is not JSON ({e}): {lines[-1][:500]!r}")

    def logits(self, model: str, tokens, out_path: Path, *extra) -> np.ndarray:
        """`specnode logits` -> float32 little-endian [n_tokens, vocab], raw, no header.
        extra: more arguments (--chunk N, --kv-mode M)."""
        self.run("logits", "--model", model, "--tokens", ",".join(map(str, tokens)), "--out", out_path,
                 *extra)
        raw = np.fromfile(out_path, dtype="<f4")
        n = len(tokens)
        if raw.size == 0 or raw.size % n:
            pytest.fail(f"{out_path}: {raw.size} floats is not a multiple of {n} tokens")
        return raw.reshape(n, raw.size // n).astype(np.float64)

    def tokenize(self, model: str, text: str, chat: bool = False) -> dict:
        args = ["tokenize", "--model", model, "--text", text] + (["--chat"] if chat else [])
        return self.json(*args)


@pytest.fixture(scope="session")
def specnode(request) -> Specnode:
    path = request.config.getoption("--specnode")
    if not path:
        pytest.skip("no --specnode PATH given (ctest passes it); engine comparisons skipped")
    if not os.access(path, os.X_OK):
        pytest.fail(f"--specnode {path} is not an executable file")
    return Specnode(os.path.abspath(path))


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    path = os.environ.get("SPECNODE_MODEL", "")
    required = os.environ.get("SPECNODE_REQUIRE_MODEL", "") == "1"
    if not path:
        msg = "SPECNODE_MODEL is unset (run scripts/fetch-model and export its path)"
        if required:
            pytest.fail(msg + " but SPECNODE_REQUIRE_MODEL=1")
        pytest.skip(msg)
    if not os.path.isfile(path):
        pytest.fail(f"SPECNODE_MODEL={path} does not exist")
    return path


def _required_model(var: str, fetch: str) -> str:
    """The model file named by environment variable `var` (fetched by `scripts/fetch-model
    --model <fetch>`; scripts/test sets it): skipped when unset, failed under
    SPECNODE_REQUIRE_MODEL=1 or when the file is missing."""
    path = os.environ.get(var, "")
    if not path:
        msg = f"{var} is unset (scripts/fetch-model --model {fetch})"
        if os.environ.get("SPECNODE_REQUIRE_MODEL", "") == "1":
            pytest.fail(msg + " but SPECNODE_REQUIRE_MODEL=1")
        pytest.skip(msg)
    if not os.path.isfile(path):
        pytest.fail(f"{var}={path} does not exist")
    return path


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    """Gemma 3 270M (SPECNODE_GEMMA_MODEL)."""
    return _required_model("SPECNODE_GEMMA_MODEL", "gemma3-270m")


@pytest.fixture(scope="session")
def qwen_target_path() -> str:
    """Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the real pair's target (SPECNODE_QWEN_MODEL)."""
    return _required_model("SPECNODE_QWEN_MODEL", "qwen2.5-coder-1.5b")


@pytest.fixture(scope="session")
def qwen_draft_path() -> str:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the real pair's draft (SPECNODE_QWEN_DRAFT_MODEL)."""
    return _required_model("SPECNODE_QWEN_DRAFT_MODEL", "qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def gemma3_oracle(gemma3_path):
    """The dequantised Gemma 3 oracle, loaded once per session (~0.7 GB in float32, ~16 s)."""
    return load_cached(gemma3_path, "float32")


@pytest.fixture(scope="session")
def smollm2_oracle(smollm2_path):
    """The dequantised SmolLM2 oracle, loaded once per session (~0.6 GB in float32)."""
    return load_cached(smollm2_path, "float32")


@pytest.fixture(scope="session")
def tiny_model(specnode, tmp_path_factory):
    """tiny_model(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=1,
    head_dim=0, arch="llama", window=0) -> path (head_dim 0: d_model / heads; arch: llama,
    qwen2, qwen3, gemma3; window: --sliding-window; rope_freqs: --rope-freqs).

    Written once per argument set by `specnode tiny-model` into a session temp dir."""
    root = tmp_path_factory.mktemp("tiny-models")
    made: dict[tuple, str] = {}

    def make(layers=2, d_model=64, heads=4, kv_heads=2, ff=128, type="f32", seed=1,
             head_dim=0, arch="llama", window=0, rope_freqs=False, rope_scale=0) -> str:
        key = (layers, d_model, heads, kv_heads, ff, type, seed, head_dim, arch, window,
               rope_freqs, rope_scale)
        if key not in made:
            out = root / ("tiny-" + "-".join(map(str, key)) + ".gguf")
            specnode.run("tiny-model", "--out", out, "--layers", layers, "--d-model", d_model,
                         "--heads", heads, "--kv-heads", kv_heads, "--ff", ff, "--type", type,
                         "--seed", seed, "--head-dim", head_dim, "--arch", arch,
                         "--sliding-window", window, "--rope-scale", rope_scale,
                         *(["--rope-freqs"] if rope_freqs else []))
            if not out.is_file():
                pytest.fail(f"specnode tiny-model did not write {out}")
            made[key] = str(out)
        return made[key]

    return make
