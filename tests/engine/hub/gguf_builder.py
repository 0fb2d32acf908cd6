"""Test helpers: write GGUF files byte by byte (any ggml type, crafted headers), quantize
with llama.cpp's block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the K-quants Q4_K, Q5_K,
Q6_K), and build tiny llama/qwen2/qwen3/qwen3moe/gemma3/phi3 models both as GGUF (named and
transformed as llama.cpp's convert_hf_to_gguf writes them) and as Hugging Face-layout
folders to compare against.

The quantizers are simple (min/max, not llama.cpp's search for the best scales) but write
valid blocks; the values they return come from a separate, literal transcription of
ggml-quants.c's dequantize_row_* loops, not from the packing code."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, BF16 = 0, 1, 2, 3, 6, 7, 8, 30
Q4_K, Q5_K, Q6_K, IQ2_XS = 12, 13, 14, 17
K_QUANTS = (Q4_K, Q5_K, Q6_K)


# ---- writing ---------------------------------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


@dataclass(frozen=True)
class Raw:
    """A metadata value written as given: its GGUF value type and bytes (crafted headers)."""
    vtype: int
    body: bytes


def nested_arrays(depth: int) -> Raw:
    """An array of an array of ... `depth` arrays deep, an empty int32 array innermost."""
    body = struct.pack("<IQ", 5, 0)
    for _ in range(depth - 1):
        body = struct.pack("<IQ", 9, 1) + body
    return Raw(9, body)


def _value(v: Any) -> tuple[int, bytes]:
    if isinstance(v, Raw):
        return v.vtype, v.body
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return (4, struct.pack("<I", v)) if 0 <= v < 2**32 else (11, struct.pack("<q", v))
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, str):
        return 8, _str(v)
    if isinstance(v, list):
        if all(isinstance(x, str) for x in v):
            itype, body = 8, b"".join(_str(x) for x in v)
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            itype, body = 5, struct.pack(f"<{len(v)}i", *v)
        else:
            itype, body = 6, struct.pack(f"<{len(v)}f", *v)
        return 9, struct.pack("<IQ", itype, len(v)) + body
    raise TypeError(type(v))


def write_gguf(path: Path, metadata: dict[str, Any],
               tensors: list[tuple[str, int, tuple[int, ...], bytes]],
               *, alignment: int = 32, magic: bytes = b"GGUF", version: int = 3) -> Path:
    """tensors: (name, ggml type, row-major shape, raw bytes)."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, v in metadata.items():
        vtype, body = _value(v)
        out += _str(key) + struct.pack("<I", vtype) + body
    offset, blobs = 0, []
    for name, gtype, shape, data in tensors:
        dims = tuple(reversed(shape))
        out += _str(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, gtype, offset)
        pad = -len(data) % alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    out += b"\0" * (-len(out) % alignment)
    for blob in blobs:
        out += blob
    Path(path).write_bytes(bytes(out))
    return Path(path)


# ---- llama.cpp block quantization (returns raw bytes and the exact dequantized values) ----

def quantize(w: np.ndarray, gtype: int) -> tuple[bytes, np.ndarray]:
    w = np.asarray(w, dtype=np.float32)
    if gtype == F32:
        return w.tobytes(), w
    if gtype == F16:
        h = w.astype(np.float16)
        return h.tobytes(), h.astype(np.float32)
    if gtype == BF16:
        bits = (w.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for tests
        return bits.tobytes(), (bits.astype(np.uint32) << 16).view(np.float32)
    if gtype in _K_QUANTIZERS:
        raw_blocks = _K_QUANTIZERS[gtype](w.reshape(-1, 256))
        return raw_blocks.tobytes(), _K_REFERENCE[gtype](raw_blocks).reshape(w.shape)
    if gtype in (Q5_0, Q5_1):
        raw_blocks = _q5_legacy(w.reshape(-1, 32), gtype)
        return raw_blocks.tobytes(), _q5_legacy_reference(raw_blocks, gtype).reshape(w.shape)
    blocks = w.reshape(-1, 32)
    if gtype == Q8_0:
        d = (np.abs(blocks).max(1) / 127).astype(np.float16)
        df = np.where(d == 0, 1, d).astype(np.float32)[:, None]
        q = np.clip(np.round(blocks / df), -127, 127).astype(np.int8)
        raw = b"".join(d[i].tobytes() + q[i].tobytes() for i in range(len(q)))
        return raw, (d.astype(np.float32)[:, None] * q).reshape(w.shape)
    if gtype == Q4_0:
        idx = np.abs(blocks).argmax(1)
        d = (blocks[np.arange(len(blocks)), idx] / -8).astype(np.float16)
        df = np.where(d == 0, 1, d).astype(np.float32)[:, None]
        q = np.clip(np.round(blocks / df + 8), 0, 15).astype(np.uint8)
        deq, heads = (q.astype(np.float32) - 8) * d.astype(np.float32)[:, None], [d]
    elif gtype == Q4_1:
        lo, hi = blocks.min(1), blocks.max(1)
        d = ((hi - lo) / 15).astype(np.float16)
        m = lo.astype(np.float16)
        df = np.where(d == 0, 1, d).astype(np.float32)[:, None]
        q = np.clip(np.round((blocks - m.astype(np.float32)[:, None]) / df), 0, 15)
        q = q.astype(np.uint8)
        deq = q * d.astype(np.float32)[:, None] + m.astype(np.float32)[:, None]
        heads = [d, m]
    else:
        raise ValueError(gtype)
    packed = q[:, :16] | (q[:, 16:] << 4)  # element j in the low nibble, j+16 in the high
    raw = b"".join(b"".join(h[i].tobytes() for h in heads) + packed[i].tobytes()
                   for i in range(len(q)))
    return raw, deq.reshape(w.shape)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _safe(x: np.ndarray) -> np.ndarray:
    return np.where(x == 0, 1, x)


def _q5_legacy(blocks: np.ndarray, gtype: int) -> np.ndarray:
    """Q5_0 (d, qh, qs: w = d*(q-16)) or Q5_1 (d, m, qh, qs: w = d*q + m) blocks."""
    if gtype == Q5_0:
        idx = np.abs(blocks).argmax(1)
        d = _f16(blocks[np.arange(len(blocks)), idx] / -16)
        q = np.clip(np.round(blocks / _safe(d.astype(np.float32))[:, None] + 16), 0, 31)
        head = [d.view(np.uint8).reshape(-1, 2)]
    else:
        lo, hi = blocks.min(1), blocks.max(1)
        d, m = _f16((hi - lo) / 31), _f16(lo)
        q = np.clip(np.round((blocks - m.astype(np.float32)[:, None])
                             / _safe(d.astype(np.float32))[:, None]), 0, 31)
        head = [d.view(np.uint8).reshape(-1, 2), m.view(np.uint8).reshape(-1, 2)]
    q = q.astype(np.uint32)
    qh = ((q >> 4) << np.arange(32, dtype=np.uint32)).sum(1).astype("<u4")
    qs = ((q[:, :16] & 15) | ((q[:, 16:] & 15) << 4)).astype(np.uint8)
    return np.concatenate(head + [qh.view(np.uint8).reshape(-1, 4), qs], axis=1)


def _q5_legacy_reference(raw: np.ndarray, gtype: int) -> np.ndarray:
    """dequantize_row_q5_0 / _q5_1, loop for loop (each line over all blocks at once)."""
    out = np.zeros((len(raw), 32), np.float32)
    d = raw[:, 0:2].copy().view(np.float16)[:, 0].astype(np.float32)
    m = raw[:, 2:4].copy().view(np.float16)[:, 0].astype(np.float32) if gtype == Q5_1 else 0
    at = 4 if gtype == Q5_1 else 2
    qh = raw[:, at:at + 4].copy().view("<u4")[:, 0].astype(np.int64)
    qs = raw[:, at + 4:at + 20].astype(np.int64)
    for j in range(16):
        xh_0 = ((qh >> j) << 4) & 0x10
        xh_1 = (qh >> (j + 12)) & 0x10
        x0, x1 = (qs[:, j] & 0x0F) | xh_0, (qs[:, j] >> 4) | xh_1
        if gtype == Q5_0:
            out[:, j], out[:, j + 16] = (x0 - 16) * d, (x1 - 16) * d
        else:
            out[:, j], out[:, j + 16] = x0 * d + m, x1 * d + m
    return out


def _k_pack_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """8 six-bit scale and min codes per block into ggml's 12 bytes (get_scale_min_k4)."""
    out = np.zeros((len(sc), 12), np.uint8)
    for j in range(4):
        out[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        out[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        out[:, j + 8] = (sc[:, j + 4] & 15) | ((mn[:, j + 4] & 15) << 4)
    return out


def _k_affine(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Q4_K/Q5_K: per sub-block of 32, w ~ d*sc*q - dmin*m (min clamped to <= 0)."""
    x = blocks.reshape(-1, 8, 32)
    lo, hi = np.minimum(x.min(2), 0), x.max(2)
    scale = (hi - lo) / levels
    d, dmin = _f16(scale.max(1) / 63), _f16((-lo).max(1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(scale / _safe(df)), 0, 63).astype(np.uint8)
    mn = np.clip(np.round(-lo / _safe(dminf)), 0, 63).astype(np.uint8)
    s, o = df * sc, dminf * mn
    q = np.clip(np.round((x + o[..., None]) / _safe(s)[..., None]), 0, levels)
    return d, dmin, _k_pack_scales(sc, mn), q.astype(np.uint8)


def _q4_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _k_affine(blocks, 15)
    c = q.reshape(-1, 4, 2, 32)  # chunk of 64: sub-block 2c low nibbles, 2c+1 high
    qs = (c[:, :, 0] | (c[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, qs], axis=1)


def _q5_k(blocks: np.ndarray) -> np.ndarray:
    d, dmin, scales, q = _k_affine(blocks, 31)
    c = q.reshape(-1, 4, 2, 32)
    qs = ((c[:, :, 0] & 15) | ((c[:, :, 1] & 15) << 4)).reshape(-1, 128)
    qh = ((q >> 4) << np.arange(8, dtype=np.uint8)[None, :, None]).sum(1).astype(np.uint8)
    return np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                           scales, qh, qs], axis=1)


def _q6_k(blocks: np.ndarray) -> np.ndarray:
    """16 sub-blocks of 16, w = d*sc*(q-32), sc signed (signs alternate to test them)."""
    x = blocks.reshape(-1, 16, 16)
    scale = np.abs(x).max(2) / 31
    d = _f16(scale.max(1) / 127)
    df = d.astype(np.float32)[:, None]
    sign = np.where(np.arange(16) % 3 == 1, -1, 1)
    sc = (sign * np.clip(np.round(scale / _safe(df)), 1, 127)).astype(np.int8)
    q = np.clip(np.round(x / (df * sc)[..., None]) + 32, 0, 63).astype(np.uint8).reshape(-1, 256)
    ql, qh = np.zeros((len(q), 128), np.uint8), np.zeros((len(q), 64), np.uint8)
    for n in range(2):
        y = q[:, 128 * n:128 * (n + 1)]
        for l in range(32):
            ql[:, 64 * n + l] = (y[:, l] & 15) | ((y[:, l + 64] & 15) << 4)
            ql[:, 64 * n + l + 32] = (y[:, l + 32] & 15) | ((y[:, l + 96] & 15) << 4)
            qh[:, 32 * n + l] = ((y[:, l] >> 4) | ((y[:, l + 32] >> 4) << 2)
                                 | ((y[:, l + 64] >> 4) << 4) | ((y[:, l + 96] >> 4) << 6))
    return np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)


def _scale_min_k4(j: int, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = q.astype(np.int64)
    if j < 4:
        return q[:, j] & 63, q[:, j + 4] & 63
    return ((q[:, j + 4] & 0xF) | ((q[:, j - 4] >> 6) << 4),
            (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4))


def _q45_k_reference(raw: np.ndarray, five: bool) -> np.ndarray:
    """dequantize_row_q4_K / _q5_K, loop for loop (each line over all blocks at once)."""
    out = np.zeros((len(raw), 256), np.float32)
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32)
    scales = raw[:, 4:16]
    qh = raw[:, 16:48].astype(np.int64) if five else None
    ql = (raw[:, 48:176] if five else raw[:, 16:144]).astype(np.int64)
    u1, u2 = 1, 2
    for c, j in enumerate(range(0, 256, 64)):
        sc, m = _scale_min_k4(2 * c, scales)
        d1, m1 = d * sc[:, None], dmin * m[:, None]
        sc, m = _scale_min_k4(2 * c + 1, scales)
        d2, m2 = d * sc[:, None], dmin * m[:, None]
        q = ql[:, 32 * c:32 * c + 32]
        lo, hi = q & 0xF, q >> 4
        if qh is not None:
            lo = lo + np.where(qh & u1, 16, 0)
            hi = hi + np.where(qh & u2, 16, 0)
        out[:, j:j + 32] = d1 * lo - m1
        out[:, j + 32:j + 64] = d2 * hi - m2
        u1, u2 = u1 << 2, u2 << 2
    return out


def _q6_k_reference(raw: np.ndarray) -> np.ndarray:
    """dequantize_row_q6_K, loop for loop (each line over all blocks at once)."""
    out = np.zeros((len(raw), 256), np.float32)
    ql, qh = raw[:, 0:128].astype(np.int64), raw[:, 128:192].astype(np.int64)
    sc = raw[:, 192:208].copy().view(np.int8).astype(np.float64)
    d = raw[:, 208:210].copy().view(np.float16)[:, 0].astype(np.float64)
    for n in range(2):
        y, L, H, S = out[:, 128 * n:], ql[:, 64 * n:], qh[:, 32 * n:], sc[:, 8 * n:]
        for l in range(32):
            is_ = l // 16
            q1 = ((L[:, l] & 0xF) | (((H[:, l] >> 0) & 3) << 4)) - 32
            q2 = ((L[:, l + 32] & 0xF) | (((H[:, l] >> 2) & 3) << 4)) - 32
            q3 = ((L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4)) - 32
            q4 = ((L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)) - 32
            y[:, l] = d * S[:, is_] * q1
            y[:, l + 32] = d * S[:, is_ + 2] * q2
            y[:, l + 64] = d * S[:, is_ + 4] * q3
            y[:, l + 96] = d * S[:, is_ + 6] * q4
    return out


_K_QUANTIZERS = {Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k}
_K_REFERENCE = {Q4_K: lambda r: _q45_k_reference(r, False),
                Q5_K: lambda r: _q45_k_reference(r, True), Q6_K: _q6_k_reference}


# ---- a tiny byte-level BPE vocabulary ---------------------------------------------------

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i s", "Ġ a", "Ġ c", "a p", "Ġc ap"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
          "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def tiny_tokenizer_metadata(pre: str = "smollm") -> dict[str, Any]:
    tokens = SPECIALS + byte_chars() + ["".join(m.split(" ")) for m in MERGES]
    return {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHATML,
    }


# ---- tiny models -------------------------------------------------------------------------

# Hugging Face model_type -> GGUF general.architecture
GGUF_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3moe",
             "gemma3_text": "gemma3", "phi3": "phi3"}


def tiny_config(arch: str = "llama", *, tie: bool = False, wide: bool = False
                ) -> dict[str, Any]:
    """A tiny model of a Hugging Face model_type. `wide` makes every row a multiple of 256
    (hidden 256), which the K-quants need; the others use hidden 64."""
    h = 256 if wide or arch not in ("llama", "qwen2") else 64
    config: dict[str, Any] = {
        "model_type": arch, "hidden_size": h, "num_hidden_layers": 2,
        "intermediate_size": 2 * h, "num_attention_heads": 4, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 256,
        "vocab_size": len(tiny_tokenizer_metadata()["tokenizer.ggml.tokens"]),
        "tie_word_embeddings": tie}
    if arch in ("qwen3", "qwen3_moe", "gemma3_text"):
        config["head_dim"] = 128  # not hidden/heads: the importer must read it from the file
    if arch == "qwen3_moe":
        config |= {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True}
    if arch == "gemma3_text":
        # 6 layers: five sliding-window ones (window 4, base 10000) and one global one.
        config |= {"num_hidden_layers": 6, "rms_norm_eps": 1e-6, "rope_theta": 1e6,
                   "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 128,
                   "sliding_window": 4, "sliding_window_pattern": 6}
    if arch == "phi3":
        config |= {"original_max_position_embeddings": 256}
    return config


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    t = config["model_type"]
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = config.get("head_dim") or h // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h),
                                          "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.o_proj.weight": (h, q)}
        if t == "phi3":
            shapes |= {p + "self_attn.qkv_proj.weight": (q + 2 * kv, h),
                       p + "mlp.gate_up_proj.weight": (2 * f, h),
                       p + "mlp.down_proj.weight": (h, f)}
            continue
        shapes |= {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h)}
        if t == "qwen2":
            shapes |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                       p + "self_attn.v_proj.bias": (kv,)}
        if t in ("qwen3", "qwen3_moe", "gemma3_text"):
            shapes |= {p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)}
        if t == "gemma3_text":
            shapes |= {p + "pre_feedforward_layernorm.weight": (h,),
                       p + "post_feedforward_layernorm.weight": (h,)}
        if t == "qwen3_moe":
            e, m = config["num_experts"], config["moe_intermediate_size"]
            shapes[p + "mlp.gate.weight"] = (e, h)
            for j in range(e):  # per-expert, as HF checkpoints hold them
                shapes |= {p + f"mlp.experts.{j}.gate_proj.weight": (m, h),
                           p + f"mlp.experts.{j}.up_proj.weight": (m, h),
                           p + f"mlp.experts.{j}.down_proj.weight": (h, m)}
        else:
            shapes |= {p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)}
    return shapes


def tiny_hf_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with mlx-lm / HF names (float32). Gemma's norms hold w of (1 + w)."""
    rng = np.random.default_rng(seed)
    gemma = config["model_type"] == "gemma3_text"
    out = {}
    for name, shape in _shapes(config).items():
        if name.endswith("norm.weight"):
            out[name] = ((0 if gemma else 1) + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return out


_TO_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
            "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
            "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up",
            "mlp.gate": "ffn_gate_inp",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
_GEMMA3_TO_GGUF = _TO_GGUF | {"post_attention_layernorm": "post_attention_norm",
                              "pre_feedforward_layernorm": "ffn_norm",
                              "post_feedforward_layernorm": "post_ffw_norm"}


def gguf_name(hf: str, model_type: str = "llama") -> str:
    glob = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, _, suffix = hf.rpartition(".")
    if base in glob:
        return f"{glob[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)
    names = _GEMMA3_TO_GGUF if model_type == "gemma3_text" else _TO_GGUF
    return f"blk.{layer}.{names[rest]}.{suffix}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute for Q/K rows."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_metadata(config: dict[str, Any], arch: str | None = None) -> dict[str, Any]:
    a = arch or GGUF_ARCH[config["model_type"]]
    meta = {"general.architecture": a, "general.name": "tiny",
            f"{a}.block_count": config["num_hidden_layers"],
            f"{a}.context_length": config["max_position_embeddings"],
            f"{a}.embedding_length": config["hidden_size"],
            f"{a}.feed_forward_length": config["intermediate_size"],
            f"{a}.attention.head_count": config["num_attention_heads"],
            f"{a}.attention.head_count_kv": config["num_key_value_heads"],
            f"{a}.attention.layer_norm_rms_epsilon": config["rms_norm_eps"],
            f"{a}.rope.freq_base": config["rope_theta"],
            **tiny_tokenizer_metadata()}
    if "head_dim" in config:
        meta |= {f"{a}.attention.key_length": config["head_dim"],
                 f"{a}.attention.value_length": config["head_dim"],
                 f"{a}.rope.dimension_count": config["head_dim"]}
    if a == "qwen3moe":
        meta |= {f"{a}.expert_count": config["num_experts"],
                 f"{a}.expert_used_count": config["num_experts_per_tok"],
                 f"{a}.expert_feed_forward_length": config["moe_intermediate_size"]}
    if a == "gemma3":
        meta[f"{a}.attention.sliding_window"] = config["sliding_window"]
    if a == "phi3":
        d = config["hidden_size"] // config["num_attention_heads"]
        meta |= {f"{a}.rope.dimension_count": d,
                 f"{a}.rope.scaling.original_context_length":
                     config["original_max_position_embeddings"]}
    return meta


def _as_gguf(config: dict[str, Any], weights: dict[str, np.ndarray]
             ) -> list[tuple[str, str, np.ndarray]]:
    """(HF name, GGUF name, tensor as llama.cpp's converter stores it)."""
    t = config["model_type"]
    out = []
    for name, w in weights.items():
        if ".mlp.experts." in name:
            continue
        if t == "gemma3_text" and name.endswith("norm.weight"):
            w = w + np.float32(1)  # Gemma3Model.modify_tensors: norm_shift
        if t == "llama" and ("q_proj" in name or "k_proj" in name):
            w = llamacpp_permute(w, config["num_attention_heads" if "q_proj" in name
                                        else "num_key_value_heads"])
        out.append((name, gguf_name(name, t), w))
    if t == "qwen3_moe":  # Qwen2MoeModel.modify_tensors: experts stacked per projection
        for i in range(config["num_hidden_layers"]):
            for proj, part in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                               ("down_proj", "ffn_down_exps")):
                keys = [f"model.layers.{i}.mlp.experts.{j}.{proj}.weight"
                        for j in range(config["num_experts"])]
                out.append((f"model.layers.{i}.mlp.experts.*.{proj}.weight",
                            f"blk.{i}.{part}.weight", np.stack([weights[k] for k in keys])))
    return out


def tiny_gguf_tensors(config: dict[str, Any], weights: dict[str, np.ndarray],
                      linear_type: int = F32, embed_type: int | None = None,
                      overrides: dict[str, int] | None = None,
                      ) -> tuple[list[tuple[str, int, tuple[int, ...], bytes]],
                                 dict[str, np.ndarray]]:
    """The model's tensors as llama.cpp writes them, and the weights as the file holds them
    after dequantization, in HF names, layout and conventions: the reference a correct
    importer must reproduce. `overrides` maps a GGUF-name fragment to its type (the first
    match wins), e.g. {"attn_v": Q6_K, "ffn_down": Q6_K} for a Q4_K_M-like mix."""
    t = config["model_type"]
    tensors, exact = [], {}
    for name, gname, gw in _as_gguf(config, weights):
        gtype = F32
        if gw.ndim >= 2:
            gtype = linear_type
            if "embed_tokens" in name and embed_type is not None:
                gtype = embed_type
            for fragment, override in (overrides or {}).items():
                if fragment in gname:
                    gtype = override
                    break
        raw, deq = quantize(gw, gtype)
        if t == "gemma3_text" and name.endswith("norm.weight"):
            deq = deq - np.float32(1)
        if t == "llama" and ("q_proj" in name or "k_proj" in name):
            deq = np.ascontiguousarray(_unpermute(deq, config[
                "num_attention_heads" if "q_proj" in name else "num_key_value_heads"]))
        tensors.append((gname, gtype, gw.shape, raw))
        if ".experts.*." in name:
            for j in range(config["num_experts"]):
                exact[name.replace("*", str(j))] = deq[j]
        else:
            exact[name] = deq
    return tensors, exact


def write_tiny_gguf(path: Path, config: dict[str, Any], weights: dict[str, np.ndarray],
                    linear_type: int = F32, embed_type: int | None = None,
                    arch: str | None = None, overrides: dict[str, int] | None = None,
                    ) -> tuple[Path, dict[str, np.ndarray]]:
    """Write the model as llama.cpp would; returns the file and the reference weights."""
    tensors, exact = tiny_gguf_tensors(config, weights, linear_type, embed_type, overrides)
    return write_gguf(path, gguf_metadata(config, arch), tensors), exact


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_hf_folder(folder: Path, config: dict[str, Any], weights: dict[str, np.ndarray],
                    tokenizer_from: Path | None = None) -> Path:
    """A plain float Hugging Face-layout model folder (config.json + model.safetensors)."""
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"),
                        {k: mx.array(v) for k, v in weights.items()})
    if tokenizer_from is not None:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).write_bytes((tokenizer_from / name).read_bytes())
    return folder
