"""Decode GGUF tensor data (llama.cpp's ggml block formats) into what mlx-lm loads.

Every format whose blocks are affine groups of 32 is kept quantized, exactly: an MLX affine
group computes w = scale * q + bias, and
- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 are one group of 32 per block (scale d, bias -offset·d or m);
- Q4_K and Q5_K split each 256-weight super-block into 8 sub-blocks of 32 whose 6-bit scale
  and min codes times the block's d/dmin give the group's scale (d·sc) and bias (-dmin·m).
Q6_K has 16 sub-blocks of 16 with their own scales, and MLX has no group size 16, so it is
dequantized and requantized to 8-bit affine groups of 32: close, not exact.

MLX's own `mx.load` of a .gguf is not used: in mlx 0.32.4 it dequantizes Q4_K, Q6_K and
Q2_K to float16 (four times the memory, with float16 rounding) and fails the whole file on
Q5_K, Q3_K, Q5_0 and every IQ type. Format: ggml-common.h / ggml-quants.c in ggml.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP_SIZE = 32  # MLX affine groups written by this importer
REQUANT_BITS = 8  # for Q6_K, which has no exact MLX layout
_CHUNK = 1 << 20  # weights decoded at a time: bounds the numpy temporaries


@dataclass(frozen=True)
class Handling:
    stored_as: str  # what the imported folder holds, in words
    exact: bool  # True when every weight is reproduced bit for bit


HANDLING: dict[str, Handling] = {
    "F32": Handling("float32", True),
    "F16": Handling("float16", True),
    "BF16": Handling("bfloat16", True),
    "Q4_0": Handling("4-bit affine, group 32", True),
    "Q4_1": Handling("4-bit affine, group 32", True),
    "Q5_0": Handling("5-bit affine, group 32", True),
    "Q5_1": Handling("5-bit affine, group 32", True),
    "Q8_0": Handling("8-bit affine, group 32", True),
    "Q4_K": Handling("4-bit affine, group 32 (its 8 sub-blocks of 32)", True),
    "Q5_K": Handling("5-bit affine, group 32 (its 8 sub-blocks of 32)", True),
    "Q6_K": Handling("dequantized and requantized to 8-bit affine, group 32 (MLX has no "
                     "group of 16)", False),
}
SUPPORTED_TYPES = tuple(HANDLING)

# name -> (weights per block, bytes per block)
_BLOCKS = {"Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24),
           "Q8_0": (32, 34), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}
_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}


def stored_bits(type_name: str) -> int | None:
    """Bits per weight of the MLX affine layout a type is stored in; None for floats."""
    if type_name == "Q6_K":
        return REQUANT_BITS
    return _BITS.get(type_name)


@dataclass(frozen=True)
class Quantized:
    """An MLX affine-quantized tensor: packed uint32 weight, float32 scales and biases."""
    weight: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int


def decode(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray | Quantized:
    """Turn a tensor's raw bytes into a float array or a Quantized triplet (row-major shape)."""
    if type_name == "F32":
        return raw.view("<f4").reshape(shape)
    if type_name == "F16":
        return raw.view("<f2").reshape(shape)
    if type_name == "BF16":
        return raw.view("<u2").reshape(shape)  # the caller views it as bfloat16 in MLX
    if type_name not in _BLOCKS:
        raise ValueError(f"no decoder for {type_name}")
    rows, row_len = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
    per_block, block_bytes = _BLOCKS[type_name]
    blocks = raw.reshape(rows, row_len // per_block, block_bytes)
    step = max(1, _CHUNK // row_len)
    if type_name == "Q6_K":
        return _requantize(blocks, shape, step)
    bits = _BITS[type_name]
    weight = np.empty((rows, row_len * bits // 32), np.uint32)
    scales = np.empty((rows, row_len // GROUP_SIZE), np.float32)
    biases = np.empty_like(scales)
    for r in range(0, rows, step):
        chunk = blocks[r:r + step]
        q, s, b = _GROUPS[type_name](chunk.reshape(-1, block_bytes))
        n = len(chunk)
        weight[r:r + n] = pack(q.reshape(n, row_len), bits)
        scales[r:r + n], biases[r:r + n] = s.reshape(n, -1), b.reshape(n, -1)
    lead = shape[:-1]
    return Quantized(weight.reshape(*lead, -1), scales.reshape(*lead, -1),
                     biases.reshape(*lead, -1), bits)


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """Float32 values of any supported tensor (for small ones that must be plain floats)."""
    out = decode(raw, type_name, shape)
    if isinstance(out, Quantized):
        q = unpack(out.weight, out.bits).reshape(*shape[:-1], -1, GROUP_SIZE)
        return (q * out.scales[..., None] + out.biases[..., None]).reshape(shape)
    if type_name == "BF16":
        return (out.astype(np.uint32) << 16).view(np.float32)
    return out.astype(np.float32)


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Pack integer codes along the last axis as MLX does: a little-endian bit stream,
    element i at bit i*bits, 32 codes filling exactly `bits` uint32 words."""
    out_shape = (*q.shape[:-1], q.shape[-1] * bits // 32)
    if bits == 8:  # byte-aligned: the bit stream is the bytes themselves
        return np.ascontiguousarray(q, dtype=np.uint8).view("<u4").reshape(out_shape)
    if bits == 4:
        b = q.astype(np.uint8).reshape(-1, 2)
        return (b[:, 0] | (b[:, 1] << 4)).view("<u4").reshape(out_shape)
    # Any width up to 8: 8 codes fill exactly `bits` bytes of a little-endian uint64.
    g = q.reshape(-1, 8).astype(np.uint64) << (np.arange(8, dtype=np.uint64) * np.uint64(bits))
    v = np.bitwise_or.reduce(g, axis=1).astype("<u8")
    stream = np.ascontiguousarray(v.view(np.uint8).reshape(-1, 8)[:, :bits])
    return stream.reshape(-1, 4 * bits).view("<u4").reshape(out_shape)


def unpack(w: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of pack: uint32 words back to codes (float32, for arithmetic)."""
    words = w.reshape(-1, bits).astype(np.uint64)
    out = np.empty((len(words), 32), np.float32)
    mask = np.uint64((1 << bits) - 1)
    for i in range(32):
        wi, s = divmod(i * bits, 32)
        v = words[:, wi] >> np.uint64(s)
        if s + bits > 32:
            v |= words[:, wi + 1] << np.uint64(32 - s)
        out[:, i] = v & mask
    return out.reshape(*w.shape[:-1], w.shape[-1] * 32 // bits)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view("<f2").astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """16 bytes -> 32 codes: byte j's low nibble is weight j, its high nibble weight j+16."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 32-bit qh word: bit j is the fifth bit of weight j."""
    word = np.ascontiguousarray(qh).view("<u4")
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


Groups = tuple[np.ndarray, np.ndarray, np.ndarray]  # codes (n, 32), scales (n,), biases (n,)


def _q4_0(b: np.ndarray) -> Groups:
    d = _f16(b[:, 0:2])[:, 0]
    return _nibbles(b[:, 2:18]), d, -8 * d


def _q4_1(b: np.ndarray) -> Groups:
    return _nibbles(b[:, 4:20]), _f16(b[:, 0:2])[:, 0], _f16(b[:, 2:4])[:, 0]


def _q5_0(b: np.ndarray) -> Groups:
    d = _f16(b[:, 0:2])[:, 0]
    return _nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]) << 4), d, -16 * d


def _q5_1(b: np.ndarray) -> Groups:
    q = _nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]) << 4)
    return q, _f16(b[:, 0:2])[:, 0], _f16(b[:, 2:4])[:, 0]


def _q8_0(b: np.ndarray) -> Groups:
    d = _f16(b[:, 0:2])[:, 0]
    q = (np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(np.int16) + 128)
    return q.astype(np.uint8), d, -128 * d


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K's 12 bytes of 6-bit (scale, min) codes for 8 sub-blocks
    (ggml's get_scale_min_k4): sub-blocks 0-3 sit in the low 6 bits of bytes 0-3 / 4-7;
    sub-blocks 4-7 take their low 4 bits from bytes 8-11 and their top 2 from bytes 0-7."""
    s = b[:, 4:16]
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([lo & 63, (hi & 15) | ((lo >> 6) << 4)], axis=1)
    mn = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _k_groups(b: np.ndarray, q: np.ndarray) -> Groups:
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _k_scales(b)
    return q.reshape(-1, 32), (d * sc).reshape(-1), (-dmin * mn).reshape(-1)


def _k_low_nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes -> (n, 8, 32): chunk c of 32 bytes holds sub-block 2c in its low nibbles
    and sub-block 2c+1 in its high ones."""
    c = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([c & 15, c >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> Groups:
    return _k_groups(b, _k_low_nibbles(b[:, 16:144]))


def _q5_k(b: np.ndarray) -> Groups:
    qh = b[:, 16:48]  # bit k of qh[l] is the fifth bit of weight l of sub-block k
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    return _k_groups(b, _k_low_nibbles(b[:, 48:176]) | (high << 4))


def _q6_k_values(b: np.ndarray) -> np.ndarray:
    """Q6_K blocks -> float32 (n, 256): w = d * scale[sub-block of 16] * (q - 32)."""
    ql, qh = b[:, 0:128].reshape(-1, 2, 1, 64), b[:, 128:192].reshape(-1, 2, 1, 32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(np.float32)
    d = _f16(b[:, 208:210])
    low = np.concatenate([ql & 15, ql >> 4], axis=2).reshape(-1, 2, 4, 32)
    high = (qh >> np.array([0, 2, 4, 6], np.uint8)[None, None, :, None]) & 3
    q = (low | (high << 4)).astype(np.float32).reshape(-1, 16, 16) - 32
    return (q * (d * sc)[:, :, None]).reshape(-1, 256)


def _requantize(blocks: np.ndarray, shape: tuple[int, ...], step: int) -> Quantized:
    """Q6_K -> 8-bit affine groups of 32 spanning each group's min..max: every weight
    within half a step ((max - min) / 510) of the file's value."""
    rows, row_len = blocks.shape[0], shape[-1]
    weight = np.empty((rows, row_len * REQUANT_BITS // 32), np.uint32)
    scales = np.empty((rows, row_len // GROUP_SIZE), np.float32)
    biases = np.empty_like(scales)
    top = (1 << REQUANT_BITS) - 1
    for r in range(0, rows, step):
        chunk = blocks[r:r + step]
        g = _q6_k_values(chunk.reshape(-1, chunk.shape[-1])).reshape(-1, GROUP_SIZE)
        lo, hi = g.min(1), g.max(1)
        s = (hi - lo) / top
        q = np.clip(np.round((g - lo[:, None]) / np.where(s == 0, 1, s)[:, None]), 0, top)
        n = len(chunk)
        weight[r:r + n] = pack(q.astype(np.uint8).reshape(n, row_len), REQUANT_BITS)
        scales[r:r + n], biases[r:r + n] = s.reshape(n, -1), lo.reshape(n, -1)
    lead = shape[:-1]
    return Quantized(weight.reshape(*lead, -1), scales.reshape(*lead, -1),
                     biases.reshape(*lead, -1), REQUANT_BITS)


_GROUPS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
           "Q4_K": _q4_k, "Q5_K": _q5_k}
