"""Fixtures for the download tests: tiny repositories (one sharded tiny model, one bigger
model for resume tests, one that isn't MLX) served by tests/hubserver.py, and an
environment where every Hugging Face path points into the test's tmp folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_models import BIG, GATED, NOT_MLX, SHARDED, TOKEN, shard_model

from hubserver import HubServer
from tiny import LLAMA, make_tiny_model


@pytest.fixture(scope="session")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub-repos")
    sharded = shard_model(make_tiny_model(root / "sharded"), [
        ["model.embed_tokens", "model.layers.0.", "model.layers.1."],
        ["model.layers.2.", "model.layers.3."],
        ["model.norm", "lm_head"]])
    big = make_tiny_model(root / "big", {**LLAMA, "hidden_size": 256,
                                         "intermediate_size": 1024, "num_hidden_layers": 2})
    torch_only = root / "torch"
    torch_only.mkdir()
    (torch_only / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (torch_only / "pytorch_model.bin").write_bytes(os.urandom(4096))
    return {SHARDED: sharded, BIG: big, NOT_MLX: torch_only}


@pytest.fixture
def hf_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME/HF_HUB_CACHE in tmp; no token from the developer's machine; no keyring."""
    import huggingface_hub.constants as c
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(c, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SHOAL_KEYRING", "0")
    return tmp_path / "hf" / "hub"


@pytest.fixture
def hub(repos: dict[str, Path], hf_env: Path, monkeypatch: pytest.MonkeyPatch
        ) -> Iterator[HubServer]:
    server = HubServer()
    for repo_id, folder in repos.items():
        server.add_repo(repo_id, folder)
    server.add_repo(GATED, repos[SHARDED], gated="manual")
    server.add_token(TOKEN)
    with server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server
