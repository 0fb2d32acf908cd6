"""The forcing model's node (see forcing.py), shared by the protocol tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from forcing import make_forcing_model  # noqa: E402

from nodes import NodeProcess, home_with  # noqa: E402

FORCING = "forcing"


@pytest.fixture(scope="session")
def forcing_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    model = make_forcing_model(tmp_path_factory.mktemp("models") / FORCING)
    node = NodeProcess(home_with(tmp_path_factory.mktemp("forcing-node"), model), FORCING)
    try:
        node.wait_healthy().wait_ready()
        yield node
    finally:
        node.stop()
