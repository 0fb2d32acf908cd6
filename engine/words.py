"""Small pieces of the sentences people read, shared by the engine's messages and the app."""

from __future__ import annotations

from collections.abc import Sequence


def joined(names: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
