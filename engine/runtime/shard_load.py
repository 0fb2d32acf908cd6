"""Loading one rank's share of a model.

Pipeline: only the safetensors files holding this rank's layers (plus the embedding, norm
and head files on rank 0, which runs the head) are opened, found through
model.safetensors.index.json or the files' headers. mx.load is lazy per tensor, so building
the model through mlx-lm and dropping the other layers before evaluating reads from disk
only the tensors this rank keeps. The other files need not even be present.

Tensor: the whole model is loaded lazily and mlx-lm's `shard()` slices every layer.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import CorruptModel, ModelNotFound, ShardMismatch, UnsupportedModel
from engine.runtime.load import check_safetensors, read_config

log = logging.getLogger(__name__)

LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.")  # as mlx-lm's sharded_load matches them
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ShardInfo:
    """What a rank loaded, for the ready event and the benchmark."""

    files: tuple[str, ...]
    bytes_read: int
    layers: tuple[int, int]


def read_bytes() -> int:
    """Bytes this process has read through read()/pread() so far (Linux), else 0."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def weight_map(folder: Path) -> dict[str, str]:
    """Tensor name → file name, from the index when there is one, else the headers."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            return dict(json.loads(index.read_text())["weight_map"])
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptModel(f"The model index {index} is damaged ({e}).") from e
    out: dict[str, str] = {}
    for f in sorted(folder.glob("model*.safetensors")):
        check_safetensors(f)
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            out.update({k: f.name for k in json.loads(fh.read(n)) if k != "__metadata__"})
    if not out:
        raise ModelNotFound(f"{folder} holds no model*.safetensors weights.")
    return out


def files_for_layers(wmap: dict[str, str], start: int, end: int, total: int,
                     ends: bool) -> list[str]:
    """Files holding layers [start, end), plus the non-layer tensors (embedding, final
    norm, head) when `ends` (rank 0)."""
    files, seen = set(), set()
    for key, f in wmap.items():
        m = LAYER_KEY.search(key)
        if m is None:
            if ends:
                files.add(f)
            continue
        layer = int(m.group(1))
        seen.add(layer)
        if start <= layer < end:
            files.add(f)
    missing = sorted(set(range(start, min(end, total))) - seen)
    if missing:
        raise ShardMismatch(f"The checkpoint has no weights for layers {missing}; "
                            "the model folder is incomplete.")
    return sorted(files)


def _lazy_model(folder: Path, files: list[str] | None) -> tuple[Any, dict[str, Any]]:
    """mlx-lm's own loader (sanitize, quantization formats) over a folder that shows only
    `files` of the weights, without reading any tensor yet."""
    from mlx_lm.utils import load_model

    if files is None:
        return load_model(folder, lazy=True)
    view = Path(tempfile.mkdtemp(prefix="shoal-shard-"))
    try:
        for p in folder.iterdir():
            if p.suffix != ".safetensors" or p.name in files:
                (view / p.name).symlink_to(p.resolve())
        return load_model(view, lazy=True, strict=False)
    finally:  # the lazy arrays keep their files open: the view can go now
        shutil.rmtree(view, ignore_errors=True)


def _unpack_if_fast(modules: Any, world: int = 1) -> Any:
    """On the CPU, quantized weights become float32 (see cpu.py); decided on this rank's
    share and done lazily, so each layer is unpacked as it is read."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, get_total_parameters

    from engine.runtime.cpu import available_memory_bytes, should_dequantize

    if not any(hasattr(m, "bits") for _, m in modules.named_modules()):
        return modules
    fp32 = 4 * get_total_parameters(modules) // world
    if should_dequantize(fp32, mx.default_device() == mx.gpu,
                         available=available_memory_bytes()):
        log.info("CPU: unpacking this rank's quantized weights to float32 (%.2f GB)",
                 fp32 / 1e9)
        return dequantize_model(modules)
    return modules


def _materialise(layers: list[Any], whole: Any, progress: Progress | None) -> None:
    """Read (and unpack) layer by layer, reporting progress, then the rest."""
    import mlx.core as mx

    for i, layer in enumerate(layers):
        mx.eval(layer.parameters())
        if progress:
            progress(i + 1, len(layers))
    mx.eval(whole.parameters())


def load_pipeline_stage(folder: Path, start: int, end: int, progress: Progress | None = None
                        ) -> tuple[Any, dict[str, Any], ShardInfo]:
    """(Stage for layers [start, end), config, what was read)."""
    from engine.runtime.stage import Stage

    config = read_config(folder)
    before = read_bytes()
    total = int(config.get("num_hidden_layers")
                or (config.get("text_config") or {}).get("num_hidden_layers") or 0)
    if total and not 0 <= start < end <= total:
        raise ShardMismatch(f"Layers [{start}, {end}) are outside this model's {total}.")
    wmap = weight_map(folder)
    files = files_for_layers(wmap, start, end, total or end, ends=start == 0)
    for f in files:
        if not (folder / f).is_file():
            raise ModelNotFound(f"{folder / f} holds layers of this rank's share and is "
                                "missing; download the model again.")
        check_safetensors(folder / f)
    model, config = _lazy_model(folder, files)
    try:
        stage = Stage(model, start, end)  # the other layers' lazy weights go, unread
    except ValueError as e:
        raise UnsupportedModel(f"This model can't be split into a pipeline: {e}.") from e
    _unpack_if_fast(stage.held_modules())
    _materialise(stage.layers, stage.held_modules(), progress)
    info = ShardInfo(tuple(files), read_bytes() - before, (start, end))
    log.info("pipeline shard: layers [%d, %d) from %s, %.1f MB read", start, end,
             ", ".join(files), info.bytes_read / 1e6)
    return stage, config, info


def check_tensor_split(config: dict[str, Any], world: int) -> None:
    """Heads (and KV heads) must divide by the group size."""
    cfg = {**(config.get("text_config") or {}), **config}
    heads = int(cfg.get("num_attention_heads") or 0)
    kv = int(cfg.get("num_key_value_heads") or heads)
    if not heads or heads % world or kv % world:
        raise ShardMismatch(f"Tensor parallelism over {world} ranks needs the attention heads "
                            f"({heads}) and key/value heads ({kv}) to divide by {world}; "
                            "choose another number of nodes or pipeline placement.")


def load_tensor_shard(folder: Path, group: Any, progress: Progress | None = None
                      ) -> tuple[Any, dict[str, Any], ShardInfo]:
    """(model sharded over `group` with mlx-lm's shard(), config, what was read). Split
    weights are read only in this rank's part where the files allow it (slice_read.py)."""
    from engine.runtime.slice_read import Sources, remember_loads, slice_reads
    from engine.runtime.stage import layer_list

    config = read_config(folder)
    check_tensor_split(config, group.size())
    before = read_bytes()
    files = sorted(p.name for p in folder.glob("model*.safetensors"))
    for f in files:
        check_safetensors(folder / f)
    sources = Sources()
    with remember_loads(sources):
        model, config = _lazy_model(folder, None)
    if not hasattr(model, "shard"):
        raise UnsupportedModel(f"mlx-lm has no tensor parallel split for "
                               f"{type(model).__module__.rsplit('.', 1)[-1]} models; use "
                               "pipeline placement.")
    # Unpack before slicing: shard() turns quantized layers into sharded quantized ones,
    # which the unpacker would turn back into plain (unsharded) layers.
    model = _unpack_if_fast(model, group.size())
    with slice_reads(sources):
        model.shard(group)
    log.info("tensor shard: %.1f MB read as slices", sources.bytes_read / 1e6)
    sources.by_id.clear()  # the whole tensors' lazy arrays can go now
    layers = layer_list(model)
    _materialise(layers, model, progress)
    return model, config, ShardInfo(tuple(files), read_bytes() - before, (0, len(layers)))
