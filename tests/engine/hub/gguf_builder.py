"""Test helpers: write GGUF files byte by byte (any ggml type, crafted headers), quantize
with llama.cpp's Q4_0/Q4_1/Q8_0 block formats, and build tiny llama/qwen2 models both as
GGUF and as Hugging Face-layout folders to compare against."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

F32, F16, Q4_0, Q4_1, Q8_0, Q5_K, BF16 = 0, 1, 2, 3, 8, 13, 30


# ---- writing ---------------------------------------------------------------------------

def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(v: Any) -> tuple[int, bytes]:
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

def tiny_config(arch: str = "llama", *, tie: bool = False) -> dict[str, Any]:
    return {"model_type": arch, "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 256,
            "vocab_size": len(tiny_tokenizer_metadata()["tokenizer.ggml.tokens"]),
            "tie_word_embeddings": tie}


def tiny_hf_weights(config: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights with mlx-lm / HF names (float32)."""
    rng = np.random.default_rng(seed)
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    d = h // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (v, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,),
                       p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                       p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                       p + "mlp.gate_proj.weight": (f, h), p + "mlp.up_proj.weight": (f, h),
                       p + "mlp.down_proj.weight": (h, f)})
        if config["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": (h,), p + "self_attn.k_proj.bias": (kv,),
                           p + "self_attn.v_proj.bias": (kv,)})
    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            out[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (0.2 * rng.standard_normal(shape)).astype(np.float32)
    return out


_TO_GGUF = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
            "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
            "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
            "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf: str) -> str:
    glob = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    base, _, suffix = hf.rpartition(".")
    if base in glob:
        return f"{glob[base]}.{suffix}"
    _, _, layer, rest = base.split(".", 3)
    return f"blk.{layer}.{_TO_GGUF[rest]}.{suffix}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute for Q/K rows."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def gguf_metadata(config: dict[str, Any], arch: str | None = None) -> dict[str, Any]:
    a = arch or config["model_type"]
    return {"general.architecture": a, "general.name": "tiny",
            f"{a}.block_count": config["num_hidden_layers"],
            f"{a}.context_length": config["max_position_embeddings"],
            f"{a}.embedding_length": config["hidden_size"],
            f"{a}.feed_forward_length": config["intermediate_size"],
            f"{a}.attention.head_count": config["num_attention_heads"],
            f"{a}.attention.head_count_kv": config["num_key_value_heads"],
            f"{a}.attention.layer_norm_rms_epsilon": config["rms_norm_eps"],
            f"{a}.rope.freq_base": config["rope_theta"],
            **tiny_tokenizer_metadata()}


def tiny_gguf_tensors(config: dict[str, Any], weights: dict[str, np.ndarray],
                      linear_type: int = F32, embed_type: int | None = None,
                      ) -> tuple[list[tuple[str, int, tuple[int, ...], bytes]],
                                 dict[str, np.ndarray]]:
    """The model's tensors as llama.cpp writes them (Q/K rows permuted for llama), and
    the weights as the file holds them after dequantization, in HF row order: the
    reference a correct importer must reproduce."""
    tensors, exact = [], {}
    for name, w in weights.items():
        gw, heads = w, 0
        if config["model_type"] == "llama" and ("q_proj" in name or "k_proj" in name):
            heads = config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            gw = llamacpp_permute(w, heads)
        gtype = F32
        if w.ndim == 2:
            gtype = linear_type
            if "embed_tokens" in name and embed_type is not None:
                gtype = embed_type
        raw, deq = quantize(gw, gtype)
        if heads:
            deq = np.ascontiguousarray(_unpermute(deq, heads))
        tensors.append((gguf_name(name), gtype, w.shape, raw))
        exact[name] = deq
    return tensors, exact


def write_tiny_gguf(path: Path, config: dict[str, Any], weights: dict[str, np.ndarray],
                    linear_type: int = F32, embed_type: int | None = None,
                    arch: str | None = None) -> tuple[Path, dict[str, np.ndarray]]:
    """Write the model as llama.cpp would; returns the file and the reference weights."""
    tensors, exact = tiny_gguf_tensors(config, weights, linear_type, embed_type)
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
