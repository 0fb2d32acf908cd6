"""Versions that decide whether nodes can run one model together."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def mlx_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mlx")
    except PackageNotFoundError:
        return None
