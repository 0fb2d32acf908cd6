"""What the node's routes check of a request: its JSON body (parsed the one way the API
parses bodies) and whether it came from this machine."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from engine.api.common import read_json
from engine.errors import BadRequest, Unauthorized
from engine.net import is_loopback


async def json_object(request: web.Request, usage: str | None = None,
                      param: str | None = None) -> dict[str, Any]:
    """The body as a JSON object. Text that isn't JSON, NaN or absurd nesting is a 400
    saying so (engine.api.common.read_json); any other shape, or no body, is a 400 with
    `usage` (what to send), naming `param`."""
    body = await read_json(request)
    if not isinstance(body, dict):
        raise BadRequest(usage or "The request body must be a JSON object.", param=param)
    return body


PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP",
                 "X-Forwarded-Proto", "Via")


def require_local(request: web.Request, doing: str) -> None:
    """Unauthorized unless the client runs on this machine: the socket's own peer (a Unix
    socket counts; never what a header claims), and no sign of a proxy, since behind a
    reverse proxy on this machine every client's socket is local."""
    peer = ""
    if request.transport is not None:
        name = request.transport.get_extra_info("peername")
        peer = str(name[0]) if isinstance(name, tuple | list) and name else ""
    if peer and not is_loopback(peer):
        raise Unauthorized(f"Only a client on this machine can {doing}.")
    through = [h for h in PROXY_HEADERS if h in request.headers]
    if through:
        raise Unauthorized(f"Only a client on this machine can {doing}, and this request "
                           f"came through a proxy ({through[0]} header): use the app or "
                           "the shoal CLI on this machine itself.")
