"""CORS for browser clients (Open WebUI run in a browser, web playgrounds): off unless origins
are given with --cors-origin; a preflight is answered only for an allowed origin."""

from __future__ import annotations

from typing import Awaitable, Callable

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
METHODS = "GET, POST, HEAD, OPTIONS, DELETE"


def allowed(origins: frozenset[str], origin: str | None) -> bool:
    return bool(origin) and ("*" in origins or origin in origins)


def middleware(origins: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not allowed(origins, origin):
                return web.json_response(
                    {"error": {"message": f"Cross-origin requests from {origin or 'this page'} "
                               "are not allowed: start the node with --cors-origin "
                               f"{origin or '<origin>'} (or add it in Settings).",
                               "type": "invalid_request_error", "param": None,
                               "code": "cors_forbidden"}}, status=403)
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": origin or "",
                "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Allow-Headers":
                    request.headers.get("Access-Control-Request-Headers", "*"),
                "Access-Control-Max-Age": "600", "Vary": "Origin"})
        return await handler(request)
    return cors


def add_headers(origins: frozenset[str]) -> Callable[[web.Request, web.StreamResponse],
                                                     Awaitable[None]]:
    """An on_response_prepare hook: streamed answers get the header before they start."""
    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if allowed(origins, origin):
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Vary"] = "Origin"
    return hook
