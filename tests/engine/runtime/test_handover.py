"""The KV of a prompt made on one node and used on another (engine/runtime/handover.py),
in one process: the prefill side's file, read back on the decode side, decodes the same
greedy tokens as a prefill of its own, for a dense model, an MLA model (DeepSeek V3's
latent KV), sliding-window families (Gemma 3, Ministral 3) and 8-bit quantized KV, with a
prompt longer than a chunk. A file that isn't this model's cache for those tokens is
refused with a 400, never kept."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine.errors import BadRequest
from engine.runtime.handover import layout_of, prefill_file, read_file
from engine.runtime.load import load_model
from engine.runtime.quant_kv import KV
from families import make_family_model
from tiny import make_tiny_model

CHUNK = 48  # the prefill's chunk: the prompt below is longer than three of them


def greedy(model, cache, last: int, n: int = 12) -> list[int]:
    import mlx.core as mx
    out, tok = [], last
    for _ in range(n):
        logits = model(mx.array([[tok]]), cache=cache)
        tok = int(mx.argmax(logits[0, -1]).item())
        out.append(tok)
    return out


@pytest.mark.parametrize("family,bits", [("llama", None), ("deepseek_v3", None),
                                         ("gemma3_text", None), ("ministral3", None),
                                         ("llama", 8)])
def test_the_handed_over_kv_decodes_as_a_prefill_of_its_own(tmp_path: Path, family, bits):
    import mlx.core as mx

    if bits:  # head_dim 64: quantized KV's groups are 64 (or 32) wide
        folder = make_tiny_model(tmp_path / family, hidden_size=256, num_attention_heads=4,
                                 num_key_value_heads=2)
    else:
        folder = make_family_model(tmp_path / family, family)
    model, _, _ = load_model(folder)
    kv = KV.for_model(model, bits)
    prompt = [(i * 37 + 11) % 200 + 3 for i in range(170)]
    tokens = prompt[:-1]
    size, _ = prefill_file(model, kv, tokens, tmp_path / "kv.safetensors",
                           threading.Event(), chunk=CHUNK, made_by="same")
    assert size > 0
    adopted = read_file(model, kv, tokens, tmp_path / "kv.safetensors", "same",
                        layout_of(model, kv))
    own = kv.make(model)
    for i in range(0, len(tokens), CHUNK):
        model(mx.array([tokens[i:i + CHUNK]]), cache=own)
    assert greedy(model, adopted, prompt[-1]) == greedy(model, own, prompt[-1])


def test_a_file_that_is_not_this_models_cache_for_the_tokens_is_refused(tmp_path: Path):
    a = make_family_model(tmp_path / "a", "llama")
    b = make_family_model(tmp_path / "b", "deepseek_v3")
    model_a, _, _ = load_model(a)
    model_b, _, _ = load_model(b)
    kv = KV.for_model(model_a, None)
    tokens = list(range(3, 60))
    path = tmp_path / "kv.safetensors"
    prefill_file(model_a, kv, tokens, path, threading.Event(), chunk=CHUNK, made_by="a")
    with pytest.raises(BadRequest, match="another model"):
        read_file(model_b, KV.for_model(model_b, None), tokens, path, "b")
    kv_b = KV.for_model(model_b, None)
    with pytest.raises(BadRequest, match="not as this model keeps it"):  # a peer that lies
        read_file(model_b, kv_b, tokens, path, "a", layout_of(model_b, kv_b))
    with pytest.raises(BadRequest, match="other tokens"):
        read_file(model_a, kv, tokens[:-1] + [tokens[-1] + 1], path, "a")
    path.write_bytes(path.read_bytes()[:200])  # cut short on the way
    with pytest.raises(BadRequest, match="can't be read"):
        read_file(model_a, kv, tokens, path, "a")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(BadRequest, match="can't be read"):
        read_file(model_a, kv, tokens, tmp_path / "junk.safetensors", "a")


def test_a_cache_in_another_float_dtype_is_taken_in_this_nodes(tmp_path: Path):
    """A Mac keeps its KV in float16, a CPU node in float32: the hand-over converts."""
    import mlx.core as mx
    from mlx.utils import tree_map

    folder = make_family_model(tmp_path / "llama", "llama")
    model, _, _ = load_model(folder)
    kv = KV.for_model(model, None)
    tokens = [(i * 13) % 200 + 3 for i in range(100)]
    path = tmp_path / "kv.safetensors"
    prefill_file(model, kv, tokens, path, threading.Event(), chunk=CHUNK, made_by="m")
    half = tmp_path / "half.safetensors"
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache
    cache, meta = load_prompt_cache(str(path), return_metadata=True)
    for c in cache:
        c.keys = tree_map(lambda a: a.astype(mx.float16), c.keys)
        c.values = tree_map(lambda a: a.astype(mx.float16), c.values)
    save_prompt_cache(str(half), cache, meta)
    layout = layout_of(model, kv)
    got = read_file(model, kv, tokens, half, "m", layout)
    assert all(c.keys.dtype == mx.float32 for c in got)
    own = read_file(model, kv, tokens, path, "m", layout)
    assert greedy(model, got, 7, 6) == greedy(model, own, 7, 6)
