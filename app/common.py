"""Small helpers every view shares: error text, byte and rate formatting, labels tied to
their controls."""

from __future__ import annotations

from typing import Any

from app.sentences import explain
from engine.errors import ModelNotFound, ShoalError


def message_of(error: BaseException) -> str:
    """What to show a user for an error from a background task: a sentence about their
    machines and models (app.sentences), the technical text left out."""
    return explain(error).sentence


def route_missing(error: BaseException) -> bool:
    """True when the node has no such route at all (an older node), as opposed to a 404
    about a model it doesn't have."""
    return (isinstance(error, ShoalError) and not isinstance(error, ModelNotFound)
            and getattr(error, "status", None) == 404)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "?"
    n = float(n)
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bytes_per_s: float | None) -> str:
    return "" if not bytes_per_s else f"{fmt_bytes(bytes_per_s)}/s"


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds} s"


def fmt_tps(tps: float | None) -> str:
    if tps is None:
        return "?"
    return f"{tps:,.0f}" if tps >= 100 else f"{tps:.1f}"


def buddy(text: str, control: Any) -> Any:
    """A QLabel tied to its control: Alt+letter focuses the control, and screen readers
    read the label as the control's name."""
    from PySide6.QtWidgets import QLabel
    label = QLabel(text)
    label.setBuddy(control)
    return label
