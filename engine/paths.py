"""Where Shoal keeps its state. One folder (the "home") holds everything a node writes, so
tests and several local nodes can each have their own."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def default_home() -> Path:
    """The home folder: $SHOAL_HOME, else the platform's per-user data folder."""
    env = os.environ.get("SHOAL_HOME")
    if env:
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "Shoal"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "shoal"


def models_dir(home: Path) -> Path:
    """Shoal's own models folder (imported GGUF files and the default model live here)."""
    return home / "models"


def logs_dir(home: Path) -> Path:
    return home / "logs"


def ensure(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
