"""Each token's own text, as llama.cpp's /tokenize shows it with `with_pieces`: the piece
as a string where its bytes are UTF-8 on their own, else the bytes (a character split
between tokens: '媽' is three byte tokens in a byte-level vocabulary)."""

from __future__ import annotations

import functools
import re
from typing import Any

_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@functools.cache
def _byte_level() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character → byte (the tokenizers library's
    ByteLevel pre-tokenizer, which most BPE vocabularies use)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
    cs = list(bs)
    extra = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


def _raw_bytes(tokenizer: Any, token: int) -> list[int] | None:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    raw = convert(token) if convert is not None else None
    if not isinstance(raw, str) or not raw:
        return None
    if (m := _BYTE_TOKEN.fullmatch(raw)) is not None:
        return [int(m.group(1), 16)]
    table = _byte_level()
    if all(ch in table for ch in raw):
        return [table[ch] for ch in raw]
    return None


def piece(tokenizer: Any, token: int) -> str | list[int]:
    """One token's text, or its bytes where they aren't UTF-8 alone."""
    text = tokenizer.decode([token])
    if "\ufffd" not in text:
        return text
    raw = _raw_bytes(tokenizer, token)
    if raw is None:
        return text
    try:
        return bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return raw


def pieces(tokenizer: Any, tokens: list[int]) -> list[str | list[int]]:
    """Each token's piece (the ids were checked against the vocabulary before)."""
    return [piece(tokenizer, t) for t in tokens]
