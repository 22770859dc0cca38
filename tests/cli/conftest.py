"""Fixtures for CLI tests: the specnode binary (--specnode, passed by ctest) and models."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_fixtures import add_specnode_option, real_model, specnode, tiny_model  # noqa: E402,F401


def pytest_addoption(parser):
    add_specnode_option(parser)
