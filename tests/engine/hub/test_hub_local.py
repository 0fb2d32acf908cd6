"""The local model list: Shoal's models folder and the Hugging Face cache, with broken or
half-downloaded folders skipped instead of breaking the list."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_builder import Q4_1, tiny_config, tiny_hf_weights, write_hf_folder, write_tiny_gguf

from engine.hub.gguf import import_gguf
from engine.hub.local import LocalModel, default_hf_cache, find_local_model, list_local_models

REV = "0123456789abcdef0123456789abcdef01234567"


def _hf_weights_bf16(config: dict) -> dict:
    return {k: mx.array(v).astype(mx.bfloat16) for k, v in tiny_hf_weights(config).items()}


def _cache_repo(cache: Path, repo_id: str, config: dict, *, dangling: bool = False) -> Path:
    """A Hugging Face cache entry laid out like huggingface_hub writes it: blobs, a
    snapshot of symlinks to them, and refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    blobs, snap = repo / "blobs", repo / "snapshots" / REV
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    (blobs / "cfg").write_text(json.dumps(config))
    mx.save_safetensors(str(blobs / "weights.safetensors"), _hf_weights_bf16(config))
    os.symlink(blobs / "cfg", snap / "config.json")
    target = blobs / ("missing.incomplete" if dangling else "weights.safetensors")
    os.symlink(target, snap / "model.safetensors")
    return snap


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    models = tmp_path / "models"
    config = tiny_config("llama", tie=True)
    gguf, _ = write_tiny_gguf(tmp_path / "tiny.Q4_1.gguf", config, tiny_hf_weights(config),
                              Q4_1)
    import_gguf(gguf, models)
    plain = models / "plain-f32"
    write_hf_folder(plain, config, tiny_hf_weights(config))
    (models / "broken-json").mkdir()
    (models / "broken-json" / "config.json").write_text("{not json")
    (models / "no-weights").mkdir()
    (models / "no-weights" / "config.json").write_text(json.dumps(config))
    (models / ".half.importing-1234").mkdir()
    (models / ".half.importing-1234" / "config.json").write_text(json.dumps(config))
    (models / "notes.txt").write_text("not a model")
    return models


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    config = tiny_config("qwen2")
    _cache_repo(cache, "tiny-org/tiny-qwen", config)
    _cache_repo(cache, "tiny-org/half-downloaded", config, dangling=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_lists_shoal_and_cache_models_and_skips_the_rest(models_dir: Path, hf_cache: Path,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="engine.hub.local")
    models = list_local_models(models_dir)  # cache from HF_HUB_CACHE
    assert [(m.id, m.source) for m in models] == [
        ("plain-f32", "shoal"), ("tiny-Q4_1", "shoal"), ("tiny-org/tiny-qwen", "hf-cache")]
    plain, imported, cached = models
    assert imported == LocalModel(
        id="tiny-Q4_1", path=models_dir / "tiny-Q4_1", source="shoal",
        size_bytes=sum(p.stat().st_size for p in (models_dir / "tiny-Q4_1").iterdir()
                       if p.name != "source.gguf"),  # a link to the file, not counted twice
        layers=2, quantization="4-bit (group 32)", model_type="llama", context_length=256)
    assert (models_dir / "tiny-Q4_1" / "source.gguf").stat().st_nlink == 2  # (llama.cpp's)
    assert plain.quantization == "f32"
    assert cached.quantization == "bf16" and cached.model_type == "qwen2"
    assert cached.path == hf_cache / "models--tiny-org--tiny-qwen" / "snapshots" / REV
    assert cached.size_bytes > (cached.path / "model.safetensors").lstat().st_size  # blob size
    skipped = caplog.text
    for name in ("broken-json", "no-weights", "half-downloaded"):
        assert f"{name}" in skipped
    assert ".half.importing" not in skipped  # hidden temporary folders are not even looked at


def test_listed_models_really_load(models_dir: Path, hf_cache: Path) -> None:
    from mlx_lm.utils import load_model

    for m in list_local_models(models_dir, hf_cache):
        model, _ = load_model(m.path)
        logits = model(mx.array([[1, 2, 3]]))
        assert np.isfinite(np.array(logits.astype(mx.float32))).all()


def test_find_local_model(models_dir: Path, hf_cache: Path) -> None:
    assert find_local_model(models_dir, "tiny-Q4_1").source == "shoal"
    found = find_local_model(models_dir, "tiny-org/tiny-qwen")
    assert found is not None and found.source == "hf-cache" and found.layers == 2
    for missing in ("nope", "tiny-org/half-downloaded", "broken-json", "../models/tiny-Q4_1",
                    "", ".half.importing-1234", "a/b/c"):
        assert find_local_model(models_dir, missing) is None, missing


def test_missing_folders_give_an_empty_list(tmp_path: Path) -> None:
    assert list_local_models(tmp_path / "none", tmp_path / "no-cache") == []


def test_default_cache_honours_environment(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert default_hf_cache() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert default_hf_cache() == tmp_path / "c"
