"""Import a GGUF model file into an MLX model folder that `mlx_lm.load(folder)` loads.

Architectures: llama, mistral, qwen2, qwen3, qwen3moe, gemma3 (text part) and phi3
(gguf_arch.py). Tensor types (gguf_quants.py): F32, F16 and BF16 are copied; Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q4_K and Q5_K are kept quantized as MLX affine groups of 32 with the
very same values; Q6_K (sub-blocks of 16, which MLX can't hold) is dequantized and
requantized to 8-bit affine groups of 32. What was done to each type is logged and
recorded in config.json under shoal_import.tensor_types.

The header is checked first (architecture, tensor types, names, sizes) so an unsupported or
damaged file is refused, naming what it can't take, before anything is written; the
finished folder is then loaded by mlx-lm (lazily) before it is moved into place.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from engine.errors import BadRequest, CorruptModel, ShoalError, UnsupportedModel
from engine.hub.gguf_arch import (
    SUPPORTED_ARCHITECTURES,
    ArchSpec,
    build_config,
    check_layers,
    mlx_name,
    spec_for,
)
from engine.hub.gguf_quants import SUPPORTED_TYPES
from engine.hub.gguf_reader import GGUFHeader, read_header
from engine.hub.gguf_source import keep_source
from engine.hub.gguf_tokenizer import build_tokenizer
from engine.hub.gguf_weights import Planned, quantization, report, save_weights

log = logging.getLogger(__name__)

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "build_config", "default_name",
           "import_gguf"]
MAX_SHARD_BYTES = 5 << 30


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

    quant = quantization(plan)
    if quant is not None:
        config["quantization"] = config["quantization_config"] = quant
    stored = report(plan)
    config["shoal_import"]["tensor_types"] = stored
    if skipped:
        config["shoal_import"]["skipped_tensors"] = skipped

    tmp = dest_root / f".{name}.importing-{uuid.uuid4().hex[:8]}"
    try:
        tmp.mkdir(parents=True)
        save_weights(tmp, header, spec, config, plan, MAX_SHARD_BYTES)
        _write_json(tmp / "config.json", config)
        (tmp / "tokenizer.json").write_text(tokenizer.tokenizer_json, encoding="utf-8")
        _write_json(tmp / "tokenizer_config.json", tokenizer.config)
        _check_loads(tmp, path.name)
        keep_source(path, tmp)  # what llama.cpp serves on a CPU node
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


def _plan(header: GGUFHeader, spec: ArchSpec) -> tuple[list[Planned], dict[str, Any]]:
    """Every tensor to import with its mlx-lm name; refuses unknown types and names."""
    name = header.path.name
    plan: list[Planned] = []
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
        plan.append(Planned(t, target))
    why = {"count": skipped, "why": "vision tower; Shoal imports the text model"}
    return plan, why if skipped else {}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
