"""Import a GGUF model file into an MLX model folder that `mlx_lm.load(folder)` loads.

The header is checked first (architecture, tensor types, names, sizes) so an unsupported or
damaged file is refused before anything is written. Quantized Q4_0/Q4_1/Q8_0 blocks are kept
as they are: MLX's GGUF loader returns them as affine (weight, scales, biases) triplets with
group size 32, which is exactly what mlx-lm's quantized layers read.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, CorruptModel, ShoalError, UnsupportedModel
from engine.hub.gguf_reader import GGUFHeader, read_header
from engine.hub.gguf_tokenizer import build_tokenizer

log = logging.getLogger(__name__)

IMPORTER_VERSION = 1
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0")
GROUP_SIZE = 32  # every supported GGUF quantization stores blocks of 32 weights
MAX_SHARD_BYTES = 5 << 30
ROPE_FREQS = "rope_freqs.weight"  # Llama 3.1+ per-frequency RoPE factors

# GGUF tensor name (without .weight/.bias) -> mlx-lm module path.
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def import_gguf(path: Path, dest_root: Path, name: str | None = None, *,
                overwrite: bool = False) -> Path:
    """Import the GGUF file at `path` into `dest_root/<name>` and return that folder.

    The folder gets config.json, model*.safetensors, tokenizer.json and
    tokenizer_config.json. It is built in a hidden sibling folder and renamed into place
    at the end, so a failed import never leaves a half-written model behind.
    Raises UnsupportedModel / CorruptModel (before writing anything) for files Shoal
    can't import, BadRequest for a bad or taken name.
    """
    path, dest_root = Path(path), Path(dest_root)
    started = time.monotonic()
    name = _check_name(name if name is not None else default_name(path))
    dest = dest_root / name
    if dest.exists() and not overwrite:
        raise BadRequest(f"A model named {name!r} already exists in {dest_root}; delete it "
                         f"or import under another name.", param="name")
    header = read_header(path)
    arch = _check_architecture(header)
    _check_tensors(header, arch)
    config = build_config(header)
    tokenizer = build_tokenizer(header.metadata, path.name)
    config["bos_token_id"] = tokenizer.bos_token_id
    if tokenizer.eos_token_ids:
        eos = tokenizer.eos_token_ids
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos

    weights = _load_weights(header, config)
    _add_quantization(config, weights)

    tmp = dest_root / f".{name}.importing-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        _save_weights(tmp, weights)
        _write_json(tmp / "config.json", config)
        (tmp / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", tokenizer.config)
        _replace(tmp, dest, overwrite)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if dest.exists() and not overwrite:  # another process finished the same import first
            raise BadRequest(f"A model named {name!r} already exists in {dest_root}.",
                             param="name") from e
        raise ShoalError(f"Could not write the imported model to {dest_root}: "
                         f"{e.strerror or e}. Free disk space or choose another folder.") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("imported %s as %s in %.1f s", path.name, dest, time.monotonic() - started)
    return dest


def _replace(tmp: Path, dest: Path, overwrite: bool) -> None:
    """Move the finished import into place; an old model stays until the new one is in."""
    old = None
    if overwrite and dest.exists():
        old = dest.with_name(f".{dest.name}.replaced-{uuid.uuid4().hex[:8]}")
        os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except OSError:
        if old is not None:
            os.rename(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def default_name(path: Path) -> str:
    """"SmolLM2-135M-Instruct.Q4_1.gguf" -> "SmolLM2-135M-Instruct-Q4_1"."""
    stem = Path(path).name
    if stem.lower().endswith(".gguf"):
        stem = stem[:-5]
    base, dot, label = stem.rpartition(".")
    if dot and re.fullmatch(r"(?i)(i?q\d\w*|f16|f32|bf16)", label):
        stem = f"{base}-{label}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", stem).strip("-.") or "model"


def _check_name(name: str) -> str:
    if not name or name.startswith(".") or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        raise BadRequest(f"{name!r} is not a usable model name: use letters, digits, '.', "
                         f"'_' and '-', not starting with '.'.", param="name")
    return name


def _check_architecture(header: GGUFHeader) -> str:
    arch = header.architecture
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModel(
            f"{header.path.name} is a {arch or 'unknown'} model; Shoal can import GGUF "
            f"architectures {', '.join(SUPPORTED_ARCHITECTURES)}.")
    return arch


def _check_tensors(header: GGUFHeader, arch: str) -> None:
    name = header.path.name
    for t in header.tensors:
        if t.type_name not in SUPPORTED_TYPES:
            raise UnsupportedModel(
                f"{name} uses quantization {t.type_name} for {t.name}; Shoal can import "
                f"{', '.join(SUPPORTED_TYPES)}. Pick a Q4_0, Q4_1, Q8_0 or F16 file.")
        if t.name == ROPE_FREQS:
            continue  # becomes config.json's rope_scaling, see _llama3_rope_scaling
        if _mlx_name(t.name) is None:
            raise UnsupportedModel(f"{name} has tensor {t.name}, which a plain {arch} model "
                                   f"does not have; Shoal can't import this variant.")
    n_layers = _int(header, "block_count")
    required = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{part}.weight" for i in range(n_layers) for part in _LAYER_NAMES]
    present = {t.name for t in header.tensors}
    missing = [n for n in required if n not in present]
    if missing:
        raise CorruptModel(f"{name} lacks tensors its header promises, e.g. "
                           f"{', '.join(missing[:3])} ({len(missing)} missing).")


def _mlx_name(gguf_name: str) -> str | None:
    """The mlx-lm parameter name for a GGUF tensor name (including MLX's .scales/.biases)."""
    base, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias", "scales", "biases"):
        return None
    if base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{suffix}"
    m = _LAYER_RE.fullmatch(base)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{suffix}"
    return None


def _int(header: GGUFHeader, key: str, default: int | None = None) -> int:
    full = f"{header.architecture}.{key}"
    value = header.get(full, default)
    if isinstance(value, list):
        raise UnsupportedModel(f"{header.path.name} sets {full} per layer; Shoal imports "
                               f"models whose layers all have the same shape.")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CorruptModel(f"{header.path.name} lacks a valid {full} ({value!r}).")
    return value


def build_config(header: GGUFHeader) -> dict[str, Any]:
    """The Hugging Face / mlx-lm config.json for a llama-family GGUF header."""
    a = arch = _check_architecture(header)
    model_type = "qwen2" if arch == "qwen2" else "llama"
    hidden, heads = _int(header, "embedding_length"), _int(header, "attention.head_count")
    kv_heads = _int(header, "attention.head_count_kv", heads)
    names = {t.name: t for t in header.tensors}
    tokens = header.get("tokenizer.ggml.tokens")
    vocab = header.get(f"{a}.vocab_size") or (len(tokens) if isinstance(tokens, list) else None)
    if not vocab and "token_embd.weight" in names:
        vocab = names["token_embd.weight"].dims[1]
    eps = header.get(f"{a}.attention.layer_norm_rms_epsilon", 1e-5)
    config: dict[str, Any] = {
        "architectures": [_HF_CLASSES[model_type]],
        "model_type": model_type,
        "hidden_size": hidden,
        "num_hidden_layers": _int(header, "block_count"),
        "intermediate_size": _int(header, "feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": float(f"{eps:.6g}"),  # float32 in the file: 9.9999997e-06 -> 1e-05
        # llama.cpp's default when the key is absent; mlx-lm reads rope_theta only.
        "rope_theta": float(header.get(f"{a}.rope.freq_base", 10000.0)),
        "max_position_embeddings": _int(header, "context_length", 4096),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in names,
        "hidden_act": "silu",
        "shoal_import": {"importer_version": IMPORTER_VERSION, "source": header.path.name,
                         "gguf_architecture": arch, "name": header.get("general.name")},
    }
    head_dim = header.get(f"{a}.attention.key_length")
    rope_dim = header.get(f"{a}.rope.dimension_count")
    natural = hidden // heads
    if isinstance(head_dim, int) and head_dim != natural:
        if model_type != "llama":
            raise UnsupportedModel(f"{header.path.name} has head size {head_dim} != "
                                   f"{hidden}/{heads}; Shoal imports that only for llama.")
        config["head_dim"] = head_dim
    if isinstance(rope_dim, int) and rope_dim != (config.get("head_dim") or natural):
        raise UnsupportedModel(f"{header.path.name} rotates only {rope_dim} dims per head "
                               f"(partial RoPE), which Shoal's importer does not support.")
    scaling = header.get(f"{a}.rope.scaling.type")
    if ROPE_FREQS in names:
        config["rope_scaling"] = _llama3_rope_scaling(
            header, float(config["rope_theta"]), rope_dim or config.get("head_dim") or natural)
    elif scaling == "linear":
        config["rope_scaling"] = {"type": "linear",
                                  "factor": float(header.get(f"{a}.rope.scaling.factor", 1.0))}
    elif scaling not in (None, "none"):
        raise UnsupportedModel(f"{header.path.name} uses RoPE scaling {scaling!r}; Shoal's "
                               f"importer supports none and linear.")
    if model_type == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
        config["mlp_bias"] = False
    return config


def _llama3_rope_scaling(header: GGUFHeader, base: float, dims: int) -> dict[str, Any]:
    """Recover Llama 3's rope_scaling from the per-frequency factors llama.cpp stores.

    mlx-lm rebuilds the factors from (factor, low/high_freq_factor, original context);
    only their ratios matter, so the original context is fixed at 8192 and the two
    frequency factors are fitted on the smoothly scaled band, then checked on all."""
    import numpy as np

    t = next(t for t in header.tensors if t.name == ROPE_FREQS)
    if t.type_name != "F32" or t.n_elements != dims // 2:
        raise UnsupportedModel(f"{header.path.name} has {t.type_name} rope_freqs with "
                               f"{t.n_elements} values; Shoal expects {dims // 2} F32 ones.")
    ff = np.fromfile(header.path, dtype="<f4", count=t.n_elements,
                     offset=header.data_offset + t.offset).astype(np.float64)
    factor, context = float(ff.max()), 8192
    inv_wavelen = 1 / (2 * np.pi * base ** (np.arange(0, dims, 2) / dims))
    low, high = 1.0, 4.0  # Meta's values, used when the band has under two points
    band = (ff > 1 + 1e-4) & (ff < factor * (1 - 1e-4))
    if factor > 1 and band.sum() >= 2:
        smooth = (1 / ff[band] - 1 / factor) / (1 - 1 / factor)  # = (ctx/wl - low)/(high-low)
        slope, intercept = np.polyfit(inv_wavelen[band], smooth, 1)
        low = -intercept * context / slope
        high = low + context / slope
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": float(low),
               "high_freq_factor": float(high), "original_max_position_embeddings": context}
    if factor <= 1 or not np.allclose(_llama3_factors(scaling, inv_wavelen), ff, rtol=1e-3):
        raise UnsupportedModel(f"{header.path.name} has RoPE frequency factors that don't "
                               f"follow Llama 3's rule; Shoal can't map them to mlx-lm.")
    return scaling


def _llama3_factors(scaling: dict[str, Any], inv_wavelen: Any) -> Any:
    """The per-frequency factors mlx-lm's Llama3RoPE applies (as in rope_utils.py)."""
    import numpy as np

    ctx, factor = scaling["original_max_position_embeddings"], scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    wl = 1 / inv_wavelen
    smooth = (ctx / wl - low) / (high - low)
    medium = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wl > ctx / low, factor, np.where(wl < ctx / high, 1.0, medium))


def _load_weights(header: GGUFHeader, config: dict[str, Any]) -> dict[str, Any]:
    import mlx.core as mx

    try:
        raw = mx.load(str(header.path))
    except (RuntimeError, ValueError) as e:
        raise CorruptModel(f"Could not read the tensors of {header.path.name}: {e}") from e
    if not isinstance(raw, dict):  # mx.load of a .gguf without metadata returns a dict
        raise CorruptModel(f"Could not read the tensors of {header.path.name}.")
    raw.update(_read_bf16(header))
    # llama.cpp permutes Q/K rows for its interleaved RoPE (llama only, not qwen2); undo
    # it on rows alone, which is exact for quantized weights, scales and biases alike.
    unpermute = config["model_type"] == "llama"
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights: dict[str, Any] = {}
    for gguf_name, w in raw.items():
        if gguf_name == ROPE_FREQS:
            continue  # already in config.json as rope_scaling
        target = _mlx_name(gguf_name)
        if target is None:
            raise UnsupportedModel(f"{header.path.name}: unexpected tensor {gguf_name}.")
        part = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        if unpermute and part in heads:
            if w.shape[0] % (2 * heads[part]):
                raise CorruptModel(f"{header.path.name}: {gguf_name} has {w.shape[0]} rows, "
                                   f"which {heads[part]} attention heads can't split.")
            w = _unpermute_rows(w, heads[part])
        if gguf_name.endswith((".scales", ".biases")):
            w = w.astype(mx.float32)  # float16 scales run ~10x slower on the CPU
        weights[target] = w
    return weights


def _read_bf16(header: GGUFHeader) -> dict[str, Any]:
    """BF16 tensors read straight from the file: mx.load turns them into float16, which
    overflows above 65504 and flushes tiny values."""
    import mlx.core as mx
    import numpy as np

    out: dict[str, Any] = {}
    for t in header.tensors:
        if t.type_name == "BF16":
            bits = np.fromfile(header.path, dtype="<u2", count=t.n_elements,
                               offset=header.data_offset + t.offset)
            out[t.name] = mx.array(bits.reshape(t.shape)).view(mx.bfloat16)
    return out


def _unpermute_rows(w: Any, n_head: int) -> Any:
    """Inverse of llama.cpp's convert_hf_to_gguf permute() along axis 0."""
    rows = w.shape[0]
    rest = tuple(w.shape[1:])
    return (w.reshape(n_head, rows // n_head // 2, 2, *rest).swapaxes(1, 2)
            .reshape(rows, *rest))


def _add_quantization(config: dict[str, Any], weights: dict[str, Any]) -> None:
    """Write mlx-lm's quantization block: the most common bit width as the default and
    a per-layer entry for layers that differ (Q8_0 embeddings next to Q4_1 layers)."""
    bits_of: dict[str, int] = {}
    for key, w in weights.items():
        if key.endswith(".scales"):
            layer = key[: -len(".scales")]
            in_dims = w.shape[-1] * GROUP_SIZE
            bits_of[layer] = weights[f"{layer}.weight"].shape[-1] * 32 // in_dims
    if not bits_of:
        return
    default = Counter(bits_of.values()).most_common(1)[0][0]
    quant: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": default}
    for layer, bits in sorted(bits_of.items()):
        if bits != default:
            quant[layer] = {"group_size": GROUP_SIZE, "bits": bits}
    config["quantization"] = quant
    config["quantization_config"] = quant


def _save_weights(folder: Path, weights: dict[str, Any]) -> None:
    import mlx.core as mx

    shards: list[dict[str, Any]] = [{}]
    size = 0
    for key in sorted(weights):
        nbytes = weights[key].nbytes
        if shards[-1] and size + nbytes > MAX_SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][key] = weights[key]
        size += nbytes
    if len(shards) == 1:
        mx.save_safetensors(str(folder / "model.safetensors"), shards[0],
                            metadata={"format": "mlx"})
        return
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        mx.save_safetensors(str(folder / file), shard, metadata={"format": "mlx"})
        weight_map.update({k: file for k in shard})
    total = sum(w.nbytes for w in weights.values())
    _write_json(folder / "model.safetensors.index.json",
                {"metadata": {"total_size": total}, "weight_map": weight_map})


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
