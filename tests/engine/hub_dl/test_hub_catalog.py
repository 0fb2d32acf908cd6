"""The catalog shipped in resources/, merged with local models and Hub search."""

from __future__ import annotations

from pathlib import Path

from hub_models import SHARDED

from engine.hub.catalog import browse, load_catalog
from engine.hub.download import pull


def test_the_curated_catalog_is_complete() -> None:
    entries = load_catalog()
    assert len(entries) >= 20
    for e in entries:
        assert e.parameters and e.size_bytes and e.layers and e.context_length and e.licence
        if e.capabilities and "generate" not in e.capabilities:
            # embedding and reranker models: their own repositories, at their own precision
            assert e.quantization in ("f32", "bf16") and "/" in e.id
            continue
        assert e.id.startswith("mlx-community/")
        assert e.quantization in ("4bit", "8bit", "bf16", "mxfp4")
        assert "size_bytes" in e.approximate  # written offline: said so
    assert len({e.id for e in entries}) == len(entries)


def test_browse_merges_catalog_local_and_hub(hub, hf_env: Path, tmp_path: Path,
                                             monkeypatch) -> None:
    pull(SHARDED)
    found = browse(tmp_path / "models", None, memory_bytes=16 * 10**9)
    by_id = {m.id: m for m in found.models}
    assert by_id[SHARDED].local[0].source == "hf-cache"
    assert by_id[SHARDED].layers == 4
    assert by_id["mlx-community/Qwen3-8B-4bit"].fits is True
    assert by_id["mlx-community/Qwen3-235B-A22B-4bit"].fits is False
    found = browse(tmp_path / "models", "tiny", online=True)
    ids = [m.id for m in found.models]
    assert found.hub_error is None and ids[0] == SHARDED  # local first
    assert "test-org/tiny-big" in ids  # from the Hub search
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.reset_counters()
    found = browse(tmp_path / "models", "tiny", online=True)
    assert [m.id for m in found.models] == [SHARDED] and hub.requests == []
    hub.stop()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    found = browse(tmp_path / "models", "qwen3 8b", online=True)
    assert found.hub_error and "mlx-community/Qwen3-8B-4bit" in [m.id for m in found.models]
