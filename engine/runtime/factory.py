"""The factory behind the worker's seam (as exo's engine_factory.py): which Engine serves a
model folder, by what its checkpoint does (engine.modelconfig.capabilities)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine.errors import ShoalError
from engine.runtime.engine import Emit, Engine

log = logging.getLogger(__name__)


def make_engine(model_dir: str, args: Any, emit: Emit) -> Engine:
    """The engine for a model folder (its config.json says which kind), loaded: a group's
    rank where `args.dist` names its config (rank 0 returns; the other ranks follow rank 0
    and end with the group), else an embedding or reranker model, a vision model, or a
    text model. Raises ShoalError with what to do where it can't load."""
    if getattr(args, "dist", None) is not None:
        from engine.runtime.group.rank import load_rank
        return load_rank(model_dir, args, emit)
    if getattr(args, "engine", "mlx") == "llamacpp":  # a CPU node's text model
        from engine.runtime.llamacpp import load_engine as load_llamacpp
        return load_llamacpp(model_dir, args, emit)
    does = _capabilities(Path(model_dir), getattr(args, "model_id", "") or "")
    if "generate" not in does and ("embed" in does or "rerank" in does):
        from engine.runtime.embedding import load_engine as load_embedding
        return load_embedding(model_dir, args, emit)
    if "vision" in does:
        try:
            from engine.runtime.vision import load_engine as load_vision
            return load_vision(model_dir, args, emit)
        except (ImportError, NotImplementedError) as e:  # images unserved, text still is
            log.warning("serving %s as text only: its vision engine can't run here (%s)",
                        model_dir, e)
    from engine.runtime.text_engine import load_text_engine
    return load_text_engine(model_dir, args, emit)


def _capabilities(folder: Path, name: str = "") -> list[str]:
    """What the folder's checkpoint does; a folder that can't be read is taken for a text
    model, whose loading then says what is wrong with it."""
    from engine.hub.checkpoint import read_config
    from engine.modelconfig import capabilities

    try:
        config = read_config(folder)
        files = frozenset(p.name for p in folder.iterdir() if p.is_file())
    except (ShoalError, OSError):
        return ["generate"]
    return capabilities(config, files, f"{name} {folder.name}")
