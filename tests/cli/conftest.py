"""Fixtures for CLI tests: the specnode binary (--specnode, passed by ctest) and models."""
import os
import subprocess
import pytest


def pytest_addoption(parser):
    parser.addoption("--specnode", action="store", default=None, help="path to the specnode binary")


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
