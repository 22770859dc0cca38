"""Fixtures for tests of `specnode serve` and its clients: the binaries (--specnode and
--specnode-client, passed by ctest), a tiny model, and a real node running as a subprocess
on a free loopback port."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_fixtures import (add_specnode_option, gemma_model, real_model, specnode,  # noqa: E402,F401
                             tiny_model)
from serve_helpers import Node, free_port  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "layer_matrix: an mpirun test that ctest also runs under the cm-ofi and ucx "
                   "MPI layers (tests/support/mpi_layer_run, docs/testing.md)")


def pytest_addoption(parser):
    add_specnode_option(parser)
    try:
        parser.addoption("--specnode-client", action="store", default=None,
                         help="path to the specnode-client binary (default: "
                              "client/specnode-client next to specnode's build dir)")
    except ValueError:  # already added by another conftest in the same run
        pass


@pytest.fixture(scope="session")
def specnode_client(request, specnode):
    path = (request.config.getoption("--specnode-client")
            or os.environ.get("SPECNODE_CLIENT_BIN")
            or str(Path(specnode).resolve().parent.parent / "client" / "specnode-client"))
    if not os.path.exists(path):
        pytest.fail(f"no specnode-client at {path}: pass --specnode-client PATH")
    return path


@pytest.fixture(scope="module")
def tiny_node(specnode, tiny_model, tmp_path_factory):
    """A node serving the tiny model (1 thread); yields it, stops it after the module."""
    node = Node(specnode, tiny_model, tmp_path_factory.mktemp("serve") / "serve.log",
                extra=["--threads", "1"])
    node.wait_ready()
    yield node
    node.stop()


@pytest.fixture
def dead_endpoint():
    """A loopback endpoint where nothing listens."""
    return f"tcp://127.0.0.1:{free_port()}"
