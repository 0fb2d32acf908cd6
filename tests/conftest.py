"""Shared fixtures: tiny models and real node processes (see nodes.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Test nodes never multicast on the machine's real network; mDNS tests opt in, inside
# network namespaces of their own.
os.environ["SHOAL_MDNS"] = "off"
os.environ["SHOAL_CLUSTER_HOST"] = "127.0.0.1"  # and open no port beyond loopback
os.environ["SHOAL_CALIBRATE"] = "0"  # a second of full CPU per node start; tests opt in
sys.path.insert(0, str(Path(__file__).parent))
from nodes import NodeProcess, home_with  # noqa: E402
from tiny import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_node(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
              ) -> Iterator[NodeProcess]:
    """One node serving tiny-llama for the whole session (read-only tests share it)."""
    home = home_with(tmp_path_factory.mktemp("tiny-node"), tiny_model_dir)
    node = NodeProcess(home, "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


@pytest.fixture
def fresh_node(tmp_path: Path, tiny_model_dir: Path) -> Iterator[NodeProcess]:
    """A node of this test's own, for tests that break things (kill workers, ...)."""
    node = NodeProcess(home_with(tmp_path, tiny_model_dir), "tiny-llama").wait_healthy()
    try:
        node.wait_ready()
        yield node
    finally:
        node.stop()


