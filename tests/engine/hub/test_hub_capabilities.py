"""What each model does (generate, vision, embed, rerank) on the model list, the node's
model cards and the catalog, read from the model's own config and files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.hub.catalog import browse, load_catalog
from engine.hub.local import list_local_models


def _folder(root: Path, name: str, config: dict, *extra: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    for file in extra:
        (folder / file).write_text("[]")


@pytest.fixture
def models_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    root = tmp_path / "models"
    _folder(root, "chat", {"model_type": "llama", "num_hidden_layers": 2})
    _folder(root, "eyes", {"model_type": "gemma3", "text_config": {"num_hidden_layers": 2},
                           "vision_config": {"model_type": "siglip_vision_model"}})
    _folder(root, "minilm", {"model_type": "bert", "num_hidden_layers": 6}, "modules.json")
    _folder(root, "ranker", {"model_type": "bert",
                             "architectures": ["BertForSequenceClassification"]})
    return root


def test_local_models_say_what_they_do(models_dir: Path) -> None:
    got = {m.id: m.capabilities for m in list_local_models(models_dir)}
    assert got == {"chat": ["generate"], "eyes": ["generate", "vision"],
                   "minilm": ["embed", "rerank"], "ranker": ["rerank"]}


def test_model_cards_and_catalog_carry_them(models_dir: Path) -> None:
    from engine.api.openai_chat import _model_card
    from engine.records import ModelCard
    cards = {m.id: ModelCard.from_json(_model_card(m)) for m in list_local_models(models_dir)}
    assert cards["eyes"].shoal.capabilities == ["generate", "vision"]
    assert cards["minilm"].shoal.capabilities == ["embed", "rerank"]
    listed = {m.id: m.capabilities for m in browse(models_dir).models}
    assert listed["eyes"] == ["generate", "vision"] and listed["chat"] == ["generate"]
    from engine.protocol import CAPABILITIES
    curated = [m for m in browse(models_dir).models if m.source == "catalog"]
    assert curated and all(m.capabilities is None or set(m.capabilities) <= set(CAPABILITIES)
                           for m in curated)  # a row that doesn't say: unknown, not a guess


def test_catalog_rows_keep_only_known_capabilities(tmp_path: Path) -> None:
    path = tmp_path / "catalog.json"
    row = {"id": "org/m", "parameters": 1, "size_bytes": 1, "layers": 1, "context_length": 1}
    path.write_text(json.dumps({"models": [
        {**row, "id": "org/plain"}, {**row, "id": "org/eyes", "capabilities": ["generate",
                                                                              "vision"]},
        {**row, "id": "org/odd", "capabilities": ["teleport", "embed"]},
        {**row, "id": "org/bad", "capabilities": "vision"}]}))
    got = {e.id: e.capabilities for e in load_catalog(path)}
    assert got == {"org/plain": None, "org/eyes": ["generate", "vision"],
                   "org/odd": ["embed"], "org/bad": None}
