"""Loading a model folder in a worker: check files first so a damaged one is named,
then load through mlx-lm and materialise layer by layer to report progress."""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import CorruptModel, ModelNotFound

log = logging.getLogger(__name__)


def check_safetensors(path: Path) -> None:
    """Raise CorruptModel naming `path` if its header is unreadable or the file is shorter
    than the header says (a truncated download or copy)."""
    size = path.stat().st_size
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise ValueError("file is shorter than a safetensors header")
            (n,) = struct.unpack("<Q", raw)
            if n > min(size - 8, 100_000_000):
                raise ValueError("header length is larger than the file")
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise CorruptModel(f"The model file {path} is damaged ({e}). Delete the model "
                           "folder and download or import it again.") from e
    if 8 + n + end != size:
        raise CorruptModel(f"The model file {path} is truncated or damaged: it holds "
                           f"{size} bytes, its header says {8 + n + end}. Delete the model "
                           "folder and download or import it again.")


def read_config(folder: Path) -> dict[str, Any]:
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise ModelNotFound(f"{folder} is not a model folder (no config.json).")
    try:
        return json.loads(cfg.read_text())
    except ValueError as e:
        raise CorruptModel(f"The model file {cfg} is not valid JSON ({e}).") from e


def context_length(config: dict[str, Any]) -> int:
    """The model's context window, from the fields the common families use."""
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions",
                "seq_length", "context_length"):
        v = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(v, int) and v > 0:
            return v
    return 4096


def load_model(folder: Path, progress: Callable[[int, int], None] | None = None
               ) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, config). Every weight file is checked before loading."""
    import mlx.core as mx
    from mlx_lm.utils import load

    config = read_config(folder)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{folder} holds no .safetensors weights.")
    for f in files:
        check_safetensors(f)
    model, tokenizer = load(str(folder), lazy=True)[:2]  # (model, tokenizer[, config])
    layers = list(getattr(getattr(model, "model", model), "layers", []) or [])
    total = len(layers)
    for i, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress:
            progress(i + 1, total)
    mx.eval(model.parameters())
    return cpu_fast_path(model), tokenizer, config


def cpu_fast_path(model: Any) -> Any:
    """Unpack quantized layers to float32 on the CPU when that fits (see cpu.py)."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, get_total_parameters

    from engine.runtime.cpu import available_memory_bytes, should_dequantize

    quantized = any(hasattr(m, "bits") for _, m in model.named_modules())
    on_gpu = mx.default_device() == mx.gpu
    fp32 = 4 * get_total_parameters(model)
    if quantized and should_dequantize(fp32, on_gpu, available=available_memory_bytes()):
        log.info("CPU: unpacking quantized weights to float32 (%.2f GB) for BLAS speed",
                 fp32 / 1e9)
        model = dequantize_model(model)
        mx.eval(model.parameters())
    return model
