"""Fixtures shared by the pytest suites that run the specnode binary (tests/cli,
tests/serve): import them into a suite's conftest.py."""
import os
import subprocess

import pytest


def add_specnode_option(parser):
    try:
        parser.addoption("--specnode", action="store", default=None,
                         help="path to the specnode binary")
    except ValueError:  # already added by another conftest in the same run
        pass


@pytest.fixture(scope="session")
def specnode(request):
    path = request.config.getoption("--specnode") or os.environ.get("SPECNODE_BIN")
    if not path or not os.path.exists(path):
        pytest.fail("pass --specnode PATH (ctest does) or set SPECNODE_BIN")
    return path


@pytest.fixture(scope="session")
def tiny_model(specnode, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "tiny.gguf"
    subprocess.run([specnode, "tiny-model", "--out", str(out)], check=True)
    return str(out)


@pytest.fixture(scope="session")
def real_model():
    path = os.environ.get("SPECNODE_MODEL")
    if not path:
        if os.environ.get("SPECNODE_REQUIRE_MODEL") == "1":
            pytest.fail("SPECNODE_MODEL is unset but SPECNODE_REQUIRE_MODEL=1")
        pytest.skip("SPECNODE_MODEL is unset (scripts/fetch-model provides it)")
    return path


@pytest.fixture(scope="session")
def gemma_model():
    """The Gemma 3 270M GGUF (scripts/fetch-model --model gemma3-270m; scripts/test sets
    SPECNODE_GEMMA_MODEL): skipped when unset, failed when unset under
    SPECNODE_REQUIRE_MODEL=1 or when it names a missing file."""
    path = os.environ.get("SPECNODE_GEMMA_MODEL")
    if not path:
        if os.environ.get("SPECNODE_REQUIRE_MODEL") == "1":
            pytest.fail("SPECNODE_GEMMA_MODEL is unset but SPECNODE_REQUIRE_MODEL=1")
        pytest.skip("SPECNODE_GEMMA_MODEL is unset (scripts/fetch-model --model gemma3-270m)")
    if not os.path.isfile(path):
        pytest.fail(f"SPECNODE_GEMMA_MODEL={path} is not a file")
    return path
