"""GGUF import: tiny models written as llama.cpp writes them must load in mlx-lm and
compute what the same weights compute from a plain Hugging Face-layout folder."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_builder import (
    BF16,
    F16,
    F32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    gguf_metadata,
    tiny_config,
    tiny_gguf_tensors,
    tiny_hf_weights,
    write_gguf,
    write_hf_folder,
    write_tiny_gguf,
)

from engine.hub.gguf import default_name, import_gguf

IDS = [[1, 5, 80, 100, 2, 7, 263, 264, 30, 31, 40]]


def _logits(folder: Path) -> np.ndarray:
    import mlx_lm

    model, _ = mlx_lm.load(str(folder))
    return np.array(model(mx.array(IDS)).astype(mx.float32))


def _greedy(folder: Path, n: int = 8) -> list[int]:
    import mlx_lm
    from mlx_lm.generate import generate_step

    model, _ = mlx_lm.load(str(folder))
    out = []
    for (token, _), _ in zip(generate_step(mx.array(IDS[0]), model,
                                           sampler=lambda x: mx.argmax(x, -1)), range(n)):
        out.append(int(token))
    return out


def _import_and_reference(tmp_path: Path, arch: str, linear: int, embed: int | None = None,
                          tie: bool = False) -> tuple[Path, Path]:
    # Mistral GGUFs are llama models under another architecture name.
    config = tiny_config("llama" if arch == "mistral" else arch, tie=tie)
    gguf, exact = write_tiny_gguf(tmp_path / "tiny.gguf", config, tiny_hf_weights(config),
                                  linear, embed, arch=arch)
    imported = import_gguf(gguf, tmp_path / "models")
    ref = write_hf_folder(tmp_path / "ref", config, exact, tokenizer_from=imported)
    return imported, ref


@pytest.mark.parametrize("arch,linear,embed,tie", [
    pytest.param("llama", F32, None, False, id="llama-f32"),
    # The SmolLM2 mix: Q4_1 layers, a Q8_0 embedding tied to the output.
    pytest.param("llama", Q4_1, Q8_0, True, id="llama-q4_1-q8_0-tied"),
    pytest.param("llama", Q4_0, F16, False, id="llama-q4_0-f16"),
    pytest.param("mistral", Q8_0, None, False, id="mistral-q8_0"),
    pytest.param("qwen2", Q4_1, None, False, id="qwen2-q4_1"),  # biases, no Q/K permutation
    pytest.param("llama", BF16, None, True, id="llama-bf16-tied"),
    # Fallbacks llama.cpp writes inside K-quant files for rows not a multiple of 256.
    pytest.param("qwen2", Q5_0, Q5_1, False, id="qwen2-q5_0-q5_1-embed"),
])
def test_imported_model_computes_like_hf_weights(tmp_path: Path, arch: str, linear: int,
                                                 embed: int | None, tie: bool) -> None:
    imported, ref = _import_and_reference(tmp_path, arch, linear, embed, tie)
    a, b = _logits(imported), _logits(ref)
    np.testing.assert_allclose(a, b, atol=2e-3 * np.abs(b).max())
    assert _greedy(imported) == _greedy(ref)


def test_config_maps_gguf_metadata(tmp_path: Path) -> None:
    imported, _ = _import_and_reference(tmp_path, "llama", Q4_1, Q8_0, tie=True)
    config = json.loads((imported / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["rope_theta"] == 50000.0 and "rope_parameters" not in config
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"],
            config["num_attention_heads"], config["num_key_value_heads"]) == (64, 2, 128, 4, 2)
    assert config["rms_norm_eps"] == 1e-5 and config["max_position_embeddings"] == 256
    assert config["tie_word_embeddings"] is True
    assert config["quantization"] == {"group_size": 32, "bits": 4,
                                      "model.embed_tokens": {"group_size": 32, "bits": 8}}
    assert config["eos_token_id"] == [2, 0] and config["bos_token_id"] == 1
    weights = mx.load(str(imported / "model.safetensors"))
    assert weights["model.layers.0.self_attn.q_proj.scales"].dtype == mx.float32
    assert weights["model.norm.weight"].dtype == mx.float32
    tok_config = json.loads((imported / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"]
    assert (tok_config["bos_token"], tok_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")


def test_qwen2_config_has_biases_and_own_type(tmp_path: Path) -> None:
    imported, _ = _import_and_reference(tmp_path, "qwen2", F32)
    config = json.loads((imported / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is False
    assert "model.layers.1.self_attn.k_proj.bias" in mx.load(str(imported / "model.safetensors"))


def test_file_written_by_mx_save_gguf_imports(tmp_path: Path) -> None:
    config = tiny_config("llama")
    weights = tiny_hf_weights(config)
    _, exact = write_tiny_gguf(tmp_path / "ref.gguf", config, weights)
    # Same tensors through MLX's own writer (metadata ints must be mx arrays there).
    raw = mx.load(str(tmp_path / "ref.gguf"))
    meta = {k: (mx.array(v, dtype=mx.uint32) if isinstance(v, int) and not isinstance(v, bool)
                else mx.array(v) if isinstance(v, (float, bool))
                else mx.array(v, dtype=mx.int32) if isinstance(v, list) and isinstance(v[0], int)
                else v) for k, v in gguf_metadata(config).items()}
    mx.save_gguf(str(tmp_path / "mlx.gguf"), raw, meta)
    imported = import_gguf(tmp_path / "mlx.gguf", tmp_path / "models", name="via-mlx")
    ref = write_hf_folder(tmp_path / "ref", config, exact, tokenizer_from=imported)
    np.testing.assert_allclose(_logits(imported), _logits(ref), atol=1e-4)


def test_default_name_and_collision(tmp_path: Path) -> None:
    from engine.errors import BadRequest

    assert default_name(Path("SmolLM2-135M-Instruct.Q4_1.gguf")) == "SmolLM2-135M-Instruct-Q4_1"
    assert default_name(Path("Llama-3.2-1B-Instruct-Q8_0.gguf")) == "Llama-3.2-1B-Instruct-Q8_0"
    config = tiny_config("llama")
    gguf, _ = write_tiny_gguf(tmp_path / "tiny.Q8_0.gguf", config, tiny_hf_weights(config), Q8_0)
    first = import_gguf(gguf, tmp_path / "models")
    assert first.name == "tiny-Q8_0"
    with pytest.raises(BadRequest, match="already exists"):
        import_gguf(gguf, tmp_path / "models")
    with pytest.raises(BadRequest, match="not a usable model name"):
        import_gguf(gguf, tmp_path / "models", name="../evil")
    assert import_gguf(gguf, tmp_path / "models", overwrite=True) == first
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-Q8_0"]


def _llamacpp_rope_factors(base: float, dims: int, factor: float, low: float, high: float,
                           context: int) -> list[float]:
    """convert_hf_to_gguf.py's LlamaModel rope_freqs for Llama 3.1+ checkpoints."""
    out = []
    for i in range(0, dims, 2):
        wavelen = 2 * np.pi * base ** (i / dims)
        if wavelen < context / high:
            out.append(1.0)
        elif wavelen > context / low:
            out.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


@pytest.mark.parametrize("factor,low,high,context", [
    pytest.param(32.0, 1.0, 4.0, 8192, id="llama-3.2-values"),
    pytest.param(8.0, 1.0, 64.0, 65536, id="fitted-band"),  # two points in the smooth band
])
def test_llama3_rope_freqs_become_rope_scaling(tmp_path: Path, factor: float, low: float,
                                               high: float, context: int) -> None:
    from mlx_lm.utils import load_model

    config = tiny_config("llama") | {"rope_theta": 500000.0}
    tensors, exact = tiny_gguf_tensors(config, tiny_hf_weights(config), Q8_0)
    freqs = np.array(_llamacpp_rope_factors(500000.0, 16, factor, low, high, context),
                     dtype=np.float32)
    tensors.append(("rope_freqs.weight", F32, freqs.shape, freqs.tobytes()))
    path = write_gguf(tmp_path / "l3.gguf", gguf_metadata(config), tensors)
    imported = import_gguf(path, tmp_path / "models")
    assert json.loads((imported / "config.json").read_text())["rope_scaling"]["rope_type"] \
        == "llama3"
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
               "high_freq_factor": high, "original_max_position_embeddings": context}
    ref = write_hf_folder(tmp_path / "ref", config | {"rope_scaling": scaling}, exact)
    unscaled = write_hf_folder(tmp_path / "unscaled", config, exact)
    ids = mx.array(np.random.default_rng(1).integers(0, config["vocab_size"], (1, 200)))
    out = {}
    for name, folder in (("imported", imported), ("ref", ref), ("unscaled", unscaled)):
        model, _ = load_model(folder)
        out[name] = np.array(model(ids).astype(mx.float32))
    np.testing.assert_allclose(out["imported"], out["ref"], atol=1e-3)
    assert np.abs(out["unscaled"] - out["ref"]).max() > 0.05  # the check can see RoPE


def test_large_models_are_sharded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.hub.gguf as gguf_module
    from engine.hub.local import find_local_model

    monkeypatch.setattr(gguf_module, "MAX_SHARD_BYTES", 40_000)
    config = tiny_config("llama")
    gguf, exact = write_tiny_gguf(tmp_path / "tiny.gguf", config, tiny_hf_weights(config), Q8_0)
    imported = import_gguf(gguf, tmp_path / "models")
    shards = sorted(p.name for p in imported.glob("model-*.safetensors"))
    assert len(shards) > 2 and not (imported / "model.safetensors").exists()
    index = json.loads((imported / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    # Shards are planned from the header before decoding; the plan's sizes are the real ones.
    written = [mx.load(str(imported / f)) for f in shards]
    assert index["metadata"]["total_size"] == sum(a.nbytes for w in written for a in w.values())
    assert all(sum(a.nbytes for a in w.values()) <= 40_000 for w in written if len(w) > 1)
    ref = write_hf_folder(tmp_path / "ref", config, exact, tokenizer_from=imported)
    np.testing.assert_allclose(_logits(imported), _logits(ref), atol=1e-3)
    assert find_local_model(tmp_path / "models", "tiny", tmp_path / "no-cache") is not None
