"""Reads the machine, link and model profiles shipped in resources/profiles/. Kept out of
engine/placement, which does no I/O; this module only reads two JSON files."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

PROFILES = Path(__file__).resolve().parent.parent / "resources" / "profiles"


@cache
def machines() -> dict[str, Any]:
    """{"machines": {name: profile}, "links": {preset: link}}."""
    return json.loads((PROFILES / "machines.json").read_text())


@cache
def models() -> dict[str, Any]:
    """{"models": {name: {"config", "card", "source", ...}}}."""
    return json.loads((PROFILES / "models.json").read_text())
