"""The GGUF file a model folder was imported from, for an engine that reads GGUF itself
(engine/runtime/llamacpp.py): `source.gguf` in the folder, a hard link the import makes
(engine/hub/gguf.py), or the bundled model's own file. Only a file inside the folder (or
Shoal's own) is read: a path written in a downloaded config.json could name any file."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)
NAME = "source.gguf"
MAGIC = b"GGUF"


def gguf_source(folder: Path, bundled: Path | None = None) -> Path | None:
    """The folder's GGUF file; `bundled` (engine.hub.bundled.bundled_gguf()) where the
    folder was imported from it before imports kept their file."""
    here = folder / NAME
    if _is_gguf(here):
        return here
    try:
        meta = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    imported = meta.get("shoal_import") if isinstance(meta, dict) else None
    if isinstance(imported, dict) and bundled is not None \
            and imported.get("source") == bundled.name and _is_gguf(bundled):
        return bundled
    return None


def model_files(folder: Path) -> list[Path]:
    """The folder's files, less the link to the GGUF it came from: the model's size counts
    its weights once (OSError where the folder can't be read)."""
    return [p for p in folder.iterdir() if p.is_file() and p.name != NAME]


def keep_source(path: Path, folder: Path) -> None:
    """A hard link to the imported file in the folder (no copy: where it can't be linked,
    on another disk say, the folder is served by MLX alone)."""
    try:
        os.link(path, folder / NAME)
    except OSError as e:
        log.info("%s stays MLX's only: can't link %s into it (%s)", folder.name, path.name,
                 e.strerror or e)


def _is_gguf(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return path.is_file() and f.read(4) == MAGIC
    except OSError:
        return False
