"""The Models tab says what each model does, as the node read it from the model's own
config: a vision badge on models that take images, an embedding badge on embedding
models (which have no chat to open), and the 'Takes images' filter shows only the
models that take them. Against a real node with models on its disk."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cluster_state import ClusterState
from app.models_view import ModelsView
from app.tasks import Tasks
from nodes import NodeProcess


def _folder(root: Path, name: str, config: dict, *extra: str) -> None:
    """A model folder the node lists (its weights are never loaded here)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    for file in extra:
        (folder / file).write_text("[]")


@pytest.fixture
def node(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    models = tmp_path / "home" / "models"
    shutil.copytree(tiny_model_dir, models / "tiny-llama")
    _folder(models, "eyes-gemma3", {
        "model_type": "gemma3", "text_config": {"num_hidden_layers": 2},
        "vision_config": {"model_type": "siglip_vision_model"}})
    _folder(models, "minilm", {"model_type": "bert", "num_hidden_layers": 6}, "modules.json")
    proc = NodeProcess(tmp_path / "home", "none").wait_healthy()
    yield proc
    proc.stop()


def test_vision_and_embedding_badges_and_the_images_filter(qtbot, node):
    tasks = Tasks()
    view = ModelsView(node.client, tasks, ClusterState(tasks, node.client))
    qtbot.addWidget(view)
    view.resize(1000, 700)
    view.show()
    view.refresh()
    qtbot.waitUntil(lambda: {"eyes-gemma3", "minilm", "tiny-llama"} <= set(view.items),
                    timeout=20000)
    assert "vision" in view.badges_of("eyes-gemma3")
    assert "embedding" in view.badges_of("minilm")
    assert not {"vision", "embedding"} & set(view.badges_of("tiny-llama"))
    serves = view.action_button("minilm")
    assert serves.text() == "Serves search" and not serves.isEnabled()
    assert view.action_button("eyes-gemma3").text() == "Chat"

    view.filter_boxes["vision"].setChecked(True)
    shown = view.shown_models()
    assert "eyes-gemma3" in shown and "tiny-llama" not in shown and "minilm" not in shown
    assert all("vision" in view.badges_of(m) for m in shown)
    view.filter_boxes["vision"].setChecked(False)
    assert "tiny-llama" in view.shown_models()
    assert tasks.wait(10000)


def test_what_the_node_read_wins_over_the_name():
    from app.catalog import Variant, tags_of
    from engine.records import CatalogModel
    # a name that says vision, but the node read a config whose vision Shoal doesn't run
    assert tags_of(CatalogModel("x/Qwen2.5-VL-7B", capabilities=["generate"])) == ()
    assert tags_of(CatalogModel("x/gemma-3-4b-it", capabilities=None)) == ("vision",)
    assert tags_of(CatalogModel("x/Qwen3-Embedding-0.6B",
                                capabilities=["embed", "rerank"])) == ("embedding",)
    assert tags_of(CatalogModel("x/Qwen3-Reranker", capabilities=["rerank"])) == ("reranker",)
    guessed = Variant(CatalogModel("x/gemma-3-4b-it"), None, ("vision",), False)
    known = Variant(CatalogModel("y", capabilities=["generate", "vision"]), None,
                    ("vision",), False)
    assert "can't tell" in guessed.badges()[-1].tip and "attach" in known.badges()[-1].tip


def test_a_node_that_sends_nonsense_capabilities_changes_no_badge_and_breaks_nothing():
    from app.catalog import capabilities_of, tags_of
    from engine.records import CatalogModel
    assert capabilities_of(5) is None and capabilities_of("vision") is None
    assert capabilities_of(["vision", 3, None]) == ["vision"]
    # "vision" as a string is not a list saying so: the name decides, as when unknown
    assert tags_of(CatalogModel("x/Plain-7B", capabilities="vision")) == ()
    assert tags_of(CatalogModel("x/Plain-7B", capabilities=5)) == ()
