"""Block decoding, checked block by block: what MLX computes from the imported
(weight, scales, biases) against a literal numpy transcription of ggml's dequantize_row_*."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf_builder import Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, quantize

import engine.hub.gguf_quants as quants
from engine.hub.gguf_quants import HANDLING, SUPPORTED_TYPES, Quantized, decode, pack
from engine.hub.gguf_reader import ggml_type_name

EXACT = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K]


def _weights(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape).astype(np.float32) * 0.2
    w.reshape(-1, 32)[::7] += 0.5  # some groups entirely positive: a min above zero
    w.reshape(-1, 32)[3::11] = 0  # and some all zero: a zero scale
    return w


def _mlx_values(q: Quantized) -> np.ndarray:
    out = mx.dequantize(mx.array(q.weight), mx.array(q.scales), mx.array(q.biases),
                        group_size=32, bits=q.bits)
    return np.array(out)


@pytest.mark.parametrize("gtype", EXACT, ids=ggml_type_name)
@pytest.mark.parametrize("shape", [(3, 512), (2, 3, 256)], ids=["2d", "3d-experts"])
def test_kept_types_reproduce_every_weight(gtype: int, shape: tuple[int, ...]) -> None:
    raw, reference = quantize(_weights(shape), gtype)
    out = decode(np.frombuffer(raw, np.uint8), ggml_type_name(gtype), shape)
    assert isinstance(out, Quantized) and out.weight.dtype == np.uint32
    assert out.scales.shape == (*shape[:-1], shape[-1] // 32)
    np.testing.assert_array_equal(_mlx_values(out), reference)
    assert HANDLING[ggml_type_name(gtype)].exact


def test_q6_k_is_requantized_to_8_bit_within_its_bound() -> None:
    shape = (4, 512)
    raw, reference = quantize(_weights(shape), Q6_K)
    out = decode(np.frombuffer(raw, np.uint8), "Q6_K", shape)
    assert isinstance(out, Quantized) and out.bits == 8
    got = _mlx_values(out)
    groups = reference.reshape(-1, 32)
    bound = (groups.max(1) - groups.min(1)) / 255 / 2 + 1e-6  # half a step of 256 levels
    assert (np.abs(got - reference).reshape(-1, 32).max(1) <= bound).all()
    assert np.abs(got - reference).max() > 0  # not exact, and the docs say so
    assert not HANDLING["Q6_K"].exact and "8-bit" in HANDLING["Q6_K"].stored_as


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_pack_matches_mlx_layout(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2**bits, (5, 64)).astype(np.uint8)
    ones, zeros = mx.ones((5, 2)), mx.zeros((5, 2))
    out = mx.dequantize(mx.array(pack(codes, bits)), ones, zeros, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(out), codes)
    np.testing.assert_array_equal(quants.unpack(pack(codes, bits), bits), codes)


@pytest.mark.parametrize("gtype", [Q4_K, Q6_K, Q8_0], ids=ggml_type_name)
def test_large_tensors_decode_in_chunks_to_the_same_values(
        gtype: int, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (7, 512)
    raw = np.frombuffer(quantize(_weights(shape, 4), gtype)[0], np.uint8)
    whole = decode(raw, ggml_type_name(gtype), shape)
    monkeypatch.setattr(quants, "_CHUNK", 1024)  # two rows at a time, then a last one
    parts = decode(raw, ggml_type_name(gtype), shape)
    assert isinstance(whole, Quantized) and isinstance(parts, Quantized)
    for a, b in zip((whole.weight, whole.scales, whole.biases),
                    (parts.weight, parts.scales, parts.biases)):
        np.testing.assert_array_equal(a, b)


def test_every_supported_type_says_what_it_becomes() -> None:
    assert set(SUPPORTED_TYPES) == set(HANDLING)
    assert {t for t, h in HANDLING.items() if not h.exact} == {"Q6_K"}
