"""Fields the official APIs (and vLLM's and llama.cpp's servers) define that only carry
client bookkeeping or hints (metadata, cache and context-management hints, deferred tool
loading, billing, scheduling priority, slots): accepted, as those servers accept them, and
logged once per client so a user can see what this node didn't use. A schema's TREATMENT
marks them "hint" (engine/api/openai_schemas.py). Fields that change the answer are
honoured or refused, never here."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiohttp import web

log = logging.getLogger(__name__)
_seen: set[tuple[str, str]] = set()
_MAX_SEEN = 4096  # clients x fields: bounded, whatever a client sends


def note(request: web.Request, fields: Iterable[str]) -> None:
    """Log, the first time this client sends them, the fields this node accepted without
    using them."""
    client = request.headers.get("User-Agent", "?")[:80]
    new = sorted({f for f in fields if (client, f) not in _seen})
    if not new:
        return
    if len(_seen) < _MAX_SEEN:
        _seen.update((client, f) for f in new)
    log.info("%s %s: accepted without effect here (bookkeeping or hints): %s [%s]",
             request.method, request.path, ", ".join(new), client)
