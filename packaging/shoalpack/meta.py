"""What the bundle says about itself: name, id, version and the oldest macOS it runs on."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

NAME = "Shoal"
EXECUTABLE = "shoal"
BUNDLE_ID = "org.shoal.Shoal"
ROOT = Path(__file__).resolve().parents[2]


def version(root: Path = ROOT) -> str:
    """The version in pyproject.toml: one number for the wheel, the app and the archive."""
    with (root / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def macos_min_from_tags(tags: list[str]) -> str | None:
    """The newest macOS any of these wheel tags needs ("macosx_14_0_arm64" → "14.0")."""
    found = [(int(m[1]), int(m[2])) for t in tags
             if (m := re.search(r"macosx_(\d+)_(\d+)_", t))]
    if not found:
        return None
    major, minor = max(found)
    return f"{major}.{minor}"


def wheel_tags(distribution: str) -> list[str]:
    """The Tag: lines of an installed distribution's WHEEL file ([] when not installed)."""
    try:
        text = importlib.metadata.distribution(distribution).read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Tag:")]


def macos_minimum(default: str = "14.0") -> str:
    """LSMinimumSystemVersion: what the installed MLX wheels (mlx, mlx-metal) were built for,
    so the app never claims an older macOS than MLX loads on."""
    tags = wheel_tags("mlx") + wheel_tags("mlx-metal")
    return macos_min_from_tags(tags) or default
