"""Import a GGUF model file into an MLX model folder that `mlx_lm.load(folder)` loads.

Architectures: llama, mistral, qwen2, qwen3, qwen3moe, gemma3 (text part) and phi3
(gguf_arch.py). Tensor types (gguf_quants.py): F32, F16 and BF16 are copied; Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K and Q5_K are kept quantized as MLX affine groups of 32 with the
very same values; Q6_K (sub-blocks of 16, which MLX can't hold) is dequantized and
requantized to 8-bit affine groups of 32. What was done to each type is logged and
recorded in config.json under shoal_import.tensor_types.

The header is checked first (architecture, tensor types, names, sizes) so an unsupported or
damaged file is refused, naming what it can't take, before anything is written.
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
from engine.hub.gguf_arch import (SUPPORTED_ARCHITECTURES, ArchSpec, build_config,
                                  check_layers, layer_part, mlx_name, spec_for)
from engine.hub.gguf_quants import GROUP_SIZE, HANDLING, SUPPORTED_TYPES, Quantized, decode, \
    dequantize
from engine.hub.gguf_reader import GGUFHeader, TensorInfo, read_header
from engine.hub.gguf_tokenizer import build_tokenizer

log = logging.getLogger(__name__)

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "build_config", "default_name",
           "import_gguf"]
MAX_SHARD_BYTES = 5 << 30
_FLOATS = ("F32", "F16", "BF16")


def import_gguf(path: Path, dest_root: Path, name: str | None = None, *,
                overwrite: bool = False) -> Path:
    """Import the GGUF file at `path` into `dest_root/<name>` and return that folder.

    The folder gets config.json, model*.safetensors, tokenizer.json and
    tokenizer_config.json. It is built in a hidden sibling folder and renamed into place
    at the end, so a failed import never leaves a half-written model behind.
    config.json's shoal_import.tensor_types says, per GGUF tensor type, what the folder
    holds: kept quantized (exact) or requantized (not exact). Raises UnsupportedModel /
    CorruptModel (leaving nothing behind) for files Shoal can't import, naming the
    architecture or tensor type, BadRequest for a bad or taken name.
    """
    path, dest_root = Path(path), Path(dest_root)
    started = time.monotonic()
    name = _check_name(name if name is not None else default_name(path))
    dest = dest_root / name
    if dest.exists() and not overwrite:
        raise BadRequest(f"A model named {name!r} already exists in {dest_root}; delete it "
                         f"or import under another name.", param="name")
    header = read_header(path)
    spec = spec_for(header)
    plan, skipped = _plan(header, spec)
    check_layers(header, spec)
    config = build_config(header)
    tokenizer = build_tokenizer(header.metadata, path.name)
    config["bos_token_id"] = tokenizer.bos_token_id
    if tokenizer.eos_token_ids:
        eos = tokenizer.eos_token_ids
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos

    weights, stored = _load_weights(header, spec, config, plan)
    _add_quantization(config, weights)
    config["shoal_import"]["tensor_types"] = stored
    if skipped:
        config["shoal_import"]["skipped_tensors"] = skipped

    tmp = dest_root / f".{name}.importing-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        _save_weights(tmp, weights)
        _write_json(tmp / "config.json", config)
        (tmp / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", tokenizer.config)
        _check_loads(tmp, path.name)
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
    for row in stored:
        log.info("%s: %d %s tensors stored as %s%s", path.name, row["tensors"],
                 row["gguf_type"], row["stored_as"], "" if row["exact"] else " (not exact)")
    if skipped:
        log.info("%s: skipped %d tensors of another model in the file (%s)", path.name,
                 skipped["count"], skipped["why"])
    log.info("imported %s as %s in %.1f s", path.name, dest, time.monotonic() - started)
    return dest


def _check_loads(folder: Path, file_name: str) -> None:
    """Build mlx-lm's model from the folder (lazily, nothing computed) so a file whose
    tensors don't fit its own header is refused here rather than at first launch."""
    from mlx_lm.utils import load_model

    try:
        load_model(folder, lazy=True)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptModel(f"{file_name} does not form a model mlx-lm can load: {e}") from e


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


def _plan(header: GGUFHeader, spec: ArchSpec
          ) -> tuple[list[tuple[TensorInfo, str]], dict[str, Any]]:
    """(tensor, mlx-lm name) for every tensor to import; refuses unknown types and names."""
    name = header.path.name
    plan: list[tuple[TensorInfo, str]] = []
    skipped = 0
    for t in header.tensors:
        if spec.skipped_prefixes and t.name.startswith(spec.skipped_prefixes):
            skipped += 1  # e.g. a gemma3 vision tower: Shoal imports the text model
            continue
        if t.type_name not in SUPPORTED_TYPES:
            raise UnsupportedModel(
                f"{name} uses quantization {t.type_name} for {t.name}; Shoal can import "
                f"{', '.join(SUPPORTED_TYPES)}. Pick a Q4_K_M, Q5_K_M, Q6_K, Q8_0 or F16 "
                f"file.")
        if t.name in spec.extra_globals:
            continue  # read into config.json (RoPE factors)
        target = mlx_name(spec, t.name)
        if target is None:
            raise UnsupportedModel(f"{name} has tensor {t.name}, which a plain "
                                   f"{header.architecture} model does not have; Shoal "
                                   f"can't import this variant.")
        plan.append((t, target))
    why = {"count": skipped, "why": "vision tower; Shoal imports the text model"}
    return plan, why if skipped else {}


def _load_weights(header: GGUFHeader, spec: ArchSpec, config: dict[str, Any],
                  plan: list[tuple[TensorInfo, str]]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Decode every planned tensor into mlx-lm's names; also what each type became."""
    import mlx.core as mx
    import numpy as np

    try:
        data = np.memmap(header.path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as e:
        raise CorruptModel(f"Could not read the tensors of {header.path.name}: {e}") from e
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    weights: dict[str, Any] = {}
    stored: Counter[tuple[str, str, bool]] = Counter()
    for t, target in plan:
        start = header.data_offset + t.offset
        raw = data[start:start + (t.nbytes or 0)]
        part = layer_part(t.name)
        if len(t.shape) == 1 and t.type_name not in _FLOATS:
            value: Any = dequantize(raw, t.type_name, t.shape)  # tiny: keep norms plain
            how = ("float32 (dequantized)", True)
        else:
            value = decode(raw, t.type_name, t.shape)
            how = (HANDLING[t.type_name].stored_as, HANDLING[t.type_name].exact)
        if spec.norm_shift and t.name.endswith("norm.weight"):
            value = value.astype(np.float32) - np.float32(spec.norm_shift)
        if spec.permute_qk and part in heads:
            # llama.cpp permuted Q/K rows for its interleaved RoPE; undoing it on rows
            # alone is exact for quantized weights, scales and biases alike.
            value = _unpermute(value, heads[part], header.path.name, t.name)
        base = target.rpartition(".")[0]
        if isinstance(value, Quantized):
            weights[target] = mx.array(value.weight)
            weights[f"{base}.scales"] = mx.array(value.scales)
            weights[f"{base}.biases"] = mx.array(value.biases)
        elif t.type_name == "BF16" and value.dtype == np.uint16:
            weights[target] = mx.array(value).view(mx.bfloat16)
        else:
            weights[target] = mx.array(value)
        stored[(t.type_name, *how)] += 1
    rows = [{"gguf_type": k[0], "tensors": n, "stored_as": k[1], "exact": k[2]}
            for k, n in sorted(stored.items())]
    return weights, rows


def _unpermute(value: Any, n_head: int, file: str, tensor: str) -> Any:
    if isinstance(value, Quantized):
        return Quantized(_unpermute(value.weight, n_head, file, tensor),
                         _unpermute(value.scales, n_head, file, tensor),
                         _unpermute(value.biases, n_head, file, tensor), value.bits)
    if value.shape[0] % (2 * n_head):
        raise CorruptModel(f"{file}: {tensor} has {value.shape[0]} rows, which {n_head} "
                           f"attention heads can't split.")
    return _unpermute_rows(value, n_head)


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
