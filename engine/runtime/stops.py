"""Generated tokens as the text a client sees: special tokens shown or not (skip_special,
spaces_between_special), and stop strings over the streamed text, holding back only what
could still become one (include_stop keeps the one that ended it; min_tokens arms them)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any


class StopMatcher:
    """Feed text segments; get back the text safe to show and whether a stop was hit.
    Anything after the stop string is never shown, nor the stop string itself unless
    `include` (vLLM's include_stop_str_in_output)."""

    def __init__(self, stops: Sequence[str], include: bool = False):
        self.stops = [s for s in stops if s]
        self.include = include
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, segment: str, armed: bool = True) -> tuple[str, bool]:
        """Not `armed` (min_tokens not out yet): no stop string matches, but what could
        begin one is still held back, so one that ends after arming is found whole."""
        if not self.stops:
            return segment, False
        text = self._held + segment
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0 and armed:
            self.matched = min((s for s in self.stops if s in text), key=text.find)
            self._held = ""
            return text[:cut] + (self.matched if self.include else ""), True
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


class Shown:
    """One request's generated tokens as the text to show, token by token. Special tokens
    (rules.special_tokens) are left out where skip_special (the default), except the
    markers the output splitters read; otherwise shown, with a space either side where
    spaces_between_special (as Hugging Face's decode joins added tokens). A stop token's
    own text is shown only with include_stop."""

    def __init__(self, tokenizer: Any, sampling: Any):
        from engine.runtime.rules import special_tokens

        self.detok = tokenizer.detokenizer
        self.stops = StopMatcher(sampling.stop, sampling.include_stop)
        self.include_stop = sampling.include_stop
        self.min_tokens = sampling.min_tokens
        special, read, self._text = special_tokens(tokenizer)
        self._hide = special - read if sampling.skip_special else frozenset()
        self._spaced = special - read if not sampling.skip_special \
            and sampling.spaces_between_special else frozenset()
        self._out = ""  # text ready before the detokenizer's next segment
        self._space = False  # the next text follows a spaced special token
        self._shown = False
        self.n = 0

    @property
    def matched(self) -> str | None:
        return self.stops.matched

    def _add(self, token: int) -> None:
        if token in self._hide:
            return
        if token in self._spaced:
            self.detok.finalize()
            before = self._out + self.detok.last_segment
            gap = " " if before or self._shown else ""
            self._out = before + gap + self._text[token]
            self._space = True
            return
        self.detok.add_token(token)

    def _segment(self) -> str:
        seg = self.detok.last_segment
        if seg and self._space:
            seg, self._space = " " + seg, False
        out, self._out = self._out + seg, ""
        self._shown = self._shown or bool(out)
        return out

    def step(self, token: int, finish: str | None, cancel: threading.Event | None
             ) -> tuple[str, str | None, bool]:
        """One generated token as text to show: (text, finish_reason, stop string hit).
        `finish` is the token's own ending: "stop" for a stop token, "length" for the
        last one allowed; a stop string or a cancel ends the stream here instead."""
        self.n += 1
        if finish != "stop" or self.include_stop:
            self._add(token)
        if finish is not None:
            self.detok.finalize()
        text, hit = self.stops.feed(self._segment(), armed=self.n >= self.min_tokens)
        if hit:
            finish = "stop"
        elif finish is None and cancel is not None and cancel.is_set():
            finish = "cancelled"
        if finish is not None and not hit:
            text += self.stops.flush()
        return text, finish, hit
