"""Loading one rank's share of a model.

Pipeline: only the safetensors files holding this rank's layers (plus the embedding, norm
and head files on rank 0, which runs the head) are opened, found through
model.safetensors.index.json or the files' headers. mx.load is lazy per tensor, so building
the model through mlx-lm and dropping the other layers before evaluating reads from disk
only the tensors this rank keeps. The other files need not even be present.

Tensor: the whole model is loaded lazily and mlx-lm's `shard()` slices every layer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelNotFound, ShardMismatch, UnsupportedModel
from engine.hub.checkpoint import check_safetensors, weight_map
from engine.hub.shards import rank_keeps
from engine.runtime.load import (
    check_loaded,
    cpu_fast_path,
    lazy_model,
    materialise,
    read_config,
    unpacks_on_cpu,
)
from engine.runtime.realize import flat, realize

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


def _share(model: Any, start: int, end: int) -> Callable[[str], bool]:
    """Which of the model's weights a rank holding layers [start, end) keeps: those
    layers', and on rank 0 everything outside the layers too."""
    from engine.runtime.stage import layer_list

    def ids(m: Any) -> set[int]:
        return {id(a) for _, a in flat(m.parameters())}

    layers = layer_list(model)
    mine = set().union(*(ids(layer) for layer in layers[start:end]))
    if start == 0:
        mine |= ids(model) - set().union(*(ids(layer) for layer in layers))
    names = {k for k, a in flat(model.parameters()) if id(a) in mine}
    return names.__contains__


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
    from engine.hub.shards import files_for_layers

    wmap = weight_map(folder)
    try:
        files = sorted(files_for_layers(wmap, (start, end), max(total, end), start == 0))
    except ValueError as e:
        raise ShardMismatch(f"The model folder {folder} is incomplete: {e}.") from None
    for f in files:
        if not (folder / f).is_file():
            raise ModelNotFound(f"{folder / f} holds layers of this rank's share and is "
                                "missing; download the model again.")
        check_safetensors(folder / f)
    model, config, loaded = lazy_model(
        folder, files, keep=lambda k: rank_keeps(k, start, end, start == 0))
    try:
        check_loaded(model, loaded, _share(model, start, end), folder)
        stage = Stage(model, start, end)  # the other layers' lazy weights go, unread
    except ValueError as e:
        raise UnsupportedModel(f"This model can't be split into a pipeline: {e}.") from e
    cpu_fast_path(stage.held_modules())  # in place: the slots keep the same layers
    materialise(stage.layers, stage.held_modules(), progress)
    realize(stage, skip=stage.unheld())
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
    from engine.runtime.group.tensor_split import add_shard
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
        model, config, _ = lazy_model(folder)
    add_shard(model)  # a vision checkpoint's wrapper (engine/runtime/group/tensor_split.py)
    if not hasattr(model, "shard"):
        raise UnsupportedModel(f"mlx-lm has no tensor parallel split for "
                               f"{type(model).__module__.rsplit('.', 1)[-1]} models; use "
                               "pipeline placement.")
    try:
        with slice_reads(sources):  # quantized weights too: split packed, unpacked after
            model.shard(group)
    except ValueError as e:  # a quantized layer whose groups don't divide by the ranks
        if not unpacks_on_cpu(model, group.size()):
            raise UnsupportedModel(f"Tensor parallelism over {group.size()} ranks can't split "
                                   f"this model's quantized layers ({e}); use pipeline "
                                   "placement.") from e
        log.info("tensor shard: splitting the unpacked weights (%s)", e)
        sources = Sources()
        with remember_loads(sources):
            model, config, _ = lazy_model(folder)
        model = cpu_fast_path(model, group.size())
        add_shard(model)
        with slice_reads(sources):
            model.shard(group)
    log.info("tensor shard: %.1f MB read as slices", sources.bytes_read / 1e6)
    sources.by_id.clear()  # the whole tensors' lazy arrays can go now
    model = cpu_fast_path(model)  # this rank's slices only
    layers = layer_list(model)
    materialise(layers, model, progress)
    realize(model)
    return model, config, ShardInfo(tuple(files), read_bytes() - before, (0, len(layers)))
