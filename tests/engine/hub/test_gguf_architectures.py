"""GGUF files of the architectures LM Studio and Ollama ship (qwen3, qwen3moe, gemma3, phi3,
llama) with the K-quant mixes they ship: the imported folder must compute, in mlx-lm, what
the same weights compute when built straight into mlx-lm's model class from a Hugging
Face-layout folder (per-expert MoE weights, Gemma's raw norm weights, fused phi3 weights)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from gguf_builder import (
    BF16,
    F16,
    F32,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_0,
    gguf_metadata,
    tiny_config,
    tiny_gguf_tensors,
    tiny_hf_weights,
    write_gguf,
    write_hf_folder,
    write_tiny_gguf,
)

from engine.hub.gguf import import_gguf

IDS = [[1, 5, 80, 100, 2, 7, 263, 264, 30, 31, 40, 41]]
Q4_K_M = {"attn_v": Q6_K, "ffn_down": Q6_K, "output.": Q6_K}  # llama.cpp's Q4_K_M mix


def _load(folder: Path) -> Any:
    from mlx_lm.utils import load_model

    return load_model(folder)[0]


def _logits(folder: Path) -> np.ndarray:
    return np.array(_load(folder)(mx.array(IDS)).astype(mx.float32))


def _greedy(folder: Path, n: int = 6) -> list[int]:
    from mlx_lm.generate import generate_step

    model = _load(folder)
    steps = generate_step(mx.array(IDS[0]), model, sampler=lambda x: mx.argmax(x, -1))
    return [int(tok) for (tok, _), _ in zip(steps, range(n))]


def _build(tmp_path: Path, arch: str, linear: int, embed: int | None = None, *,
           tie: bool = False, overrides: dict[str, int] | None = None
           ) -> tuple[Path, Path, dict[str, Any]]:
    config = tiny_config(arch, tie=tie, wide=True)
    gguf, exact = write_tiny_gguf(tmp_path / f"{arch}.gguf", config, tiny_hf_weights(config),
                                  linear, embed, overrides=overrides)
    imported = import_gguf(gguf, tmp_path / "models")
    if linear in (F16, BF16):  # compute in the file's precision on both sides
        dtype = mx.float16 if linear == F16 else mx.bfloat16
        exact = {k: mx.array(v).astype(dtype) if v.ndim > 1 else v for k, v in exact.items()}
    ref = write_hf_folder(tmp_path / "ref", config, exact, tokenizer_from=imported)
    return imported, ref, config


EXACT_CASES = [
    pytest.param("qwen3", Q4_K, None, True, None, id="qwen3-q4_k-tied"),
    pytest.param("qwen3_moe", Q4_K, None, False, {"ffn_down_exps": Q5_K, "attn_": Q8_0},
                 id="qwen3moe-q4_k-q5_k-experts"),
    pytest.param("gemma3_text", Q5_K, Q8_0, True, None, id="gemma3-q5_k-q8_0-embed"),
    pytest.param("phi3", Q4_K, None, False, {"attn_qkv": Q5_K}, id="phi3-q4_k-q5_k-qkv"),
    pytest.param("llama", Q4_K, Q5_K, False, None, id="llama-q4_k-permuted"),
    pytest.param("gemma3_text", F16, None, True, None, id="gemma3-f16"),
    pytest.param("qwen3_moe", F32, None, True, None, id="qwen3moe-f32"),
    pytest.param("qwen3", BF16, None, False, None, id="qwen3-bf16"),
    pytest.param("phi3", F32, None, True, None, id="phi3-f32-tied"),
]


@pytest.mark.parametrize("arch,linear,embed,tie,overrides", EXACT_CASES)
def test_k_quants_kept_exactly_compute_like_the_weights(
        tmp_path: Path, arch: str, linear: int, embed: int | None, tie: bool,
        overrides: dict[str, int] | None) -> None:
    imported, ref, _ = _build(tmp_path, arch, linear, embed, tie=tie, overrides=overrides)
    a, b = _logits(imported), _logits(ref)
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max())
    assert _greedy(imported) == _greedy(ref)
    rows = json.loads((imported / "config.json").read_text())["shoal_import"]["tensor_types"]
    assert all(r["exact"] for r in rows)


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe", "gemma3_text", "phi3", "llama"])
def test_q4_k_m_mix_computes_like_the_weights_within_requantization(
        tmp_path: Path, arch: str) -> None:
    """Q6_K has no exact MLX layout: it becomes 8-bit affine, close to the file's values."""
    overrides = Q4_K_M | ({"ffn_down_exps": Q6_K} if arch == "qwen3_moe" else {}) \
        | ({"ffn_up": Q6_K} if arch == "phi3" else {})
    imported, ref, config = _build(tmp_path, arch, Q4_K, Q6_K, overrides=overrides)
    original = write_hf_folder(tmp_path / "original", config, tiny_hf_weights(config))
    a, b = _logits(imported), _logits(ref)
    # Requantizing moves the logits far less than the file's own quantization did.
    assert np.abs(a - b).max() < 0.25 * np.abs(_logits(original) - b).max()  # ~0.06-0.09
    shoal = json.loads((imported / "config.json").read_text())["shoal_import"]
    by_type = {r["gguf_type"]: r for r in shoal["tensor_types"]}
    assert by_type["Q4_K"]["exact"] and by_type["Q4_K"]["stored_as"].startswith("4-bit affine")
    assert not by_type["Q6_K"]["exact"] and "8-bit affine" in by_type["Q6_K"]["stored_as"]
    assert by_type["F32"]["stored_as"] == "float32"  # the norms


def test_qwen3_moe_experts_land_in_switch_mlp(tmp_path: Path) -> None:
    imported, _, config = _build(tmp_path, "qwen3_moe", Q4_K, overrides={"ffn_gate_inp": F32})
    out = json.loads((imported / "config.json").read_text())
    assert out["model_type"] == "qwen3_moe" and out["norm_topk_prob"] is True
    assert (out["num_experts"], out["num_experts_per_tok"], out["moe_intermediate_size"],
            out["head_dim"], out["mlp_only_layers"]) == (4, 2, 256, 128, [])
    weights = mx.load(str(imported / "model.safetensors"))
    e, m, h = config["num_experts"], config["moe_intermediate_size"], config["hidden_size"]
    assert weights["model.layers.1.mlp.switch_mlp.gate_proj.weight"].shape == (e, m, h // 8)
    assert weights["model.layers.1.mlp.switch_mlp.down_proj.scales"].shape == (e, h, m // 32)
    assert weights["model.layers.0.mlp.gate.weight"].shape == (e, h)  # the router, F32
    assert not any(".experts." in k for k in weights)


def test_gemma3_config_and_norms(tmp_path: Path) -> None:
    imported, _, config = _build(tmp_path, "gemma3_text", F32, tie=True)
    out = json.loads((imported / "config.json").read_text())
    for key in ("model_type", "head_dim", "sliding_window", "sliding_window_pattern",
                "rope_local_base_freq", "query_pre_attn_scalar", "rope_theta"):
        assert out[key] == config[key], key
    weights = mx.load(str(imported / "model.safetensors"))
    hf = tiny_hf_weights(config)
    for name in ("model.layers.0.pre_feedforward_layernorm.weight",
                 "model.layers.5.self_attn.k_norm.weight", "model.norm.weight"):
        # The file holds 1 + w; mlx-lm's gemma3_text adds the 1 itself.
        np.testing.assert_allclose(np.array(weights[name]), hf[name], atol=1e-6)


def test_gemma3_vision_tower_is_skipped_and_said(tmp_path: Path) -> None:
    config = tiny_config("gemma3_text", tie=True)
    tensors, exact = tiny_gguf_tensors(config, tiny_hf_weights(config))
    vision = [("v.blk.0.attn_q.weight", F16, (8, 32), bytes(8 * 32 * 2)),
              ("mm.input_projection.weight", F16, (32, 8), bytes(8 * 32 * 2))]
    path = write_gguf(tmp_path / "g.gguf", gguf_metadata(config), tensors + vision)
    imported = import_gguf(path, tmp_path / "models")
    shoal = json.loads((imported / "config.json").read_text())["shoal_import"]
    assert shoal["skipped_tensors"]["count"] == 2 and "vision" in shoal["skipped_tensors"]["why"]
    ref = write_hf_folder(tmp_path / "ref", config, exact, tokenizer_from=imported)
    np.testing.assert_allclose(_logits(imported), _logits(ref), atol=1e-4)


def test_phi3_fused_weights_and_longrope(tmp_path: Path) -> None:
    config = tiny_config("phi3") | {"max_position_embeddings": 1024}
    tensors, exact = tiny_gguf_tensors(config, tiny_hf_weights(config), Q4_K)
    rng = np.random.default_rng(3)
    long, short = (1 + 3 * rng.random(32)).astype(np.float32), np.ones(32, np.float32)
    tensors += [("rope_factors_long.weight", F32, (32,), long.tobytes()),
                ("rope_factors_short.weight", F32, (32,), short.tobytes())]
    path = write_gguf(tmp_path / "phi.gguf", gguf_metadata(config), tensors)
    imported = import_gguf(path, tmp_path / "models")
    out = json.loads((imported / "config.json").read_text())
    assert out["rope_scaling"]["type"] == "longrope"
    np.testing.assert_allclose(out["rope_scaling"]["long_factor"], long, rtol=1e-7)
    assert out["original_max_position_embeddings"] == 256
    weights = mx.load(str(imported / "model.safetensors"))
    assert weights["model.layers.0.mlp.gate_up_proj.scales"].shape == (1024, 256 // 32)
    scaling = {"type": "longrope", "long_factor": long.tolist(), "short_factor": short.tolist()}
    ref = write_hf_folder(tmp_path / "ref", config | {"rope_scaling": scaling}, exact,
                          tokenizer_from=imported)
    plain = write_hf_folder(tmp_path / "plain", config, exact)
    a, b = _logits(imported), _logits(ref)
    np.testing.assert_allclose(a, b, atol=1e-4 * np.abs(b).max())
    assert np.abs(_logits(plain) - b).max() > 1e-3  # the check can see the factors


def test_chat_template_comes_from_the_file(tmp_path: Path) -> None:
    config = tiny_config("qwen3", wide=True)
    template = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
    tensors, _ = tiny_gguf_tensors(config, tiny_hf_weights(config), Q4_K)
    meta = gguf_metadata(config) | {"tokenizer.chat_template": template}
    imported = import_gguf(write_gguf(tmp_path / "t.gguf", meta, tensors), tmp_path / "models")
    tok = json.loads((imported / "tokenizer_config.json").read_text())
    assert tok["chat_template"] == template
    from mlx_lm.tokenizer_utils import load

    ids = load(imported).apply_chat_template([{"role": "user", "content": "the"}])
    assert ids[0] == 1 and ids[-1] == 2  # <|im_start|> ... <|im_end|>, as the template says
