"""Fixtures for the deploy/ checks: the specnode binary is optional here (--specnode, or
$SPECNODE_BIN); the checks that run it skip without it."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pytest_fixtures import add_specnode_option  # noqa: E402


def pytest_addoption(parser):
    add_specnode_option(parser)
