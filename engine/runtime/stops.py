"""Stop strings over streamed text: hold back only what could still become a stop string."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class StopMatcher:
    """Feed text segments; get back the text safe to show and whether a stop was hit.
    The stop string itself and anything after it are never shown."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, segment: str) -> tuple[str, bool]:
        if not self.stops:
            return segment, False
        text = self._held + segment
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.matched = min((s for s in self.stops if s in text), key=text.find)
            self._held = ""
            return text[:cut], True
        keep = self._longest_partial(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_partial(self, text: str) -> int:
        """Length of the longest suffix of text that is a proper prefix of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


def text_step(detok: Any, stops: StopMatcher, token: int, finish: str | None,
              cancel: threading.Event | None) -> tuple[str, str | None, bool]:
    """One generated token as text to show: (text, finish_reason, stop string hit).
    `finish` is the token's own ending: "stop" for a stop token (never shown), "length"
    for the last one allowed; a stop string or a cancel ends the stream here instead."""
    if finish != "stop":
        detok.add_token(token)
    if finish is not None:
        detok.finalize()
    text, hit = stops.feed(detok.last_segment)
    if hit:
        finish = "stop"
    elif finish is None and cancel is not None and cancel.is_set():
        finish = "cancelled"
    if finish is not None and not hit:
        text += stops.flush()
    return text, finish, hit
