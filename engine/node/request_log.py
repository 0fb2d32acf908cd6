"""The node's recent API requests, for the app's Developer panel (GET /shoal/requests):
when, route, status, how long, which client and, for a refusal, why. Never a body, a
prompt or a header's value beyond the client's name."""

from __future__ import annotations

import time
from collections import deque

from aiohttp import web

from engine.records import RequestInfo

KEEP = 200
LOGGED = ("/v1/", "/api/")  # the user API: what agents and chat UIs call


class RequestLog:
    def __init__(self, keep: int = KEEP):
        self._entries: deque[RequestInfo] = deque(maxlen=keep)

    def add(self, request: web.Request, status: int, started: float,
            reason: str | None = None) -> None:
        if not request.path.startswith(LOGGED):
            return
        self._entries.append(RequestInfo(
            at=round(time.time() - (time.monotonic() - started), 3), method=request.method,
            path=request.path, status=status, seconds=round(time.monotonic() - started, 3),
            client=request.headers.get("User-Agent", "?")[:80],
            reason=reason[:300] if reason else None))

    def recent(self, since: float = 0.0) -> list[RequestInfo]:
        return [e for e in self._entries if e.at > since]
