"""What a web browser may do with the user API.

A browser sends requests for any page the user has open, to any address, and sends the
"simple" ones (a text/plain or form POST) without asking first. So on the user API:
- the Host header must name this node (its listen address, the loopback names, or a name
  given with --allowed-host): a page that rebinds its own DNS name to 127.0.0.1 sends its
  own name and is refused (DNS rebinding);
- a request with an Origin header (a page's fetch or form) is served only for an origin
  allowed with --cors-origin, and control routes (shutdown, load, instances, ...) never
  from a page at all, whatever the origin or Sec-Fetch-Site says;
- a POST/PUT/PATCH body is JSON only, so no form or text/plain request gets through.
Clients that are not browsers (the app, curl, the SDKs) send no Origin and pass.
CORS itself is off unless origins are given; a preflight is answered only for an allowed
origin, never for a control route.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from engine.errors import ShoalError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
METHODS = "GET, POST, HEAD, OPTIONS, DELETE"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
# Docker's name for the host (a container's Open WebUI reaches the node by it); .internal
# is reserved for private use, so no web page's DNS can own it
DOCKER_HOST = "host.docker.internal"
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
# llama.cpp's and vLLM's utility routes (engine/api/utility.py) and the rerank aliases: user
# API, not control
USER_ROUTES = frozenset({"/tokenize", "/detokenize", "/apply-template", "/rerank", "/v2/rerank"})


class Forbidden(ShoalError):
    """A request a web page may have made on the user's behalf, refused."""

    status = 403
    type = "permission_error"
    code = "forbidden"


class UnsupportedMediaType(ShoalError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


def allowed(origins: frozenset[str], origin: str | None) -> bool:
    return bool(origin) and ("*" in origins or origin in origins)


def host_name(header: str) -> str:
    """'Example.com:8421' → 'example.com', '[::1]:8421' → '::1'."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1:h.find("]")] if "]" in h else h
    name, sep, port = h.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        h = name
    return h.rstrip(".")


def is_control(request: web.Request) -> bool:
    """A route that changes the node's state and belongs to no wire protocol: the app's
    control (shutdown, load, unload, instances, peers, hub pulls, model deletion, plans)."""
    method = request.method
    if method == "OPTIONS":  # a preflight asks for the method it wants to send
        method = request.headers.get("Access-Control-Request-Method", "GET").upper()
    path = request.path
    if method in SAFE_METHODS or path.startswith(("/v1/", "/api/")) or path == "/" \
            or path in USER_ROUTES:
        return False
    return True


def host_names(listen_host: str, extra: Iterable[str]) -> frozenset[str]:
    """The Host names the user API answers to (beside the address a request came in on)."""
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in extra if h.strip()}
    if listen_host in WILDCARDS:  # every interface: this machine's own names too
        me = socket.gethostname().lower()
        names |= {me, f"{me.split('.')[0]}.local", DOCKER_HOST}
    else:
        names.add(host_name(listen_host))
    return frozenset(names)


def arrived_on(request: web.Request, port: int) -> bool:
    """Whether the request came in on this node's listener at `port` (the cluster port)."""
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    return bool(port and sock and sock[1] == port)


def guard(origins: frozenset[str], hosts: frozenset[str],
          cluster_port: int = 0) -> Callable[..., Awaitable[web.StreamResponse]]:
    """The browser rules above, for requests on the user API (the cluster port serves
    only signed requests, which no page can make, and is left to the auth middleware)."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if arrived_on(request, cluster_port):
            return await handler(request)
        sock = request.transport.get_extra_info("sockname") if request.transport else None
        host = request.headers.get("Host")
        if host is not None and "*" not in hosts:
            name = host_name(host)
            if name not in hosts and not (sock and name == str(sock[0]).lower()):
                raise Forbidden(
                    f"This node does not answer to the name '{name}' (Host header): only "
                    "to its own address and localhost. A web page that renamed itself to "
                    "reach this node is refused; if you reach it by that name on purpose, "
                    f"start the node with --allowed-host {name}.", code="forbidden_host")
        origin = request.headers.get("Origin")
        fetch_site = request.headers.get("Sec-Fetch-Site", "").lower()
        if is_control(request) and (origin is not None
                                    or fetch_site in ("cross-site", "same-site")):
            raise Forbidden(
                f"{request.path} controls the node and can't be called from a web page "
                f"(the request came from {origin or 'another site'}). Use the Shoal app, "
                "the shoal CLI or a client that is not a browser.",
                code="forbidden_from_browser")
        if origin is not None and not allowed(origins, origin):
            raise Forbidden(
                f"Requests from web pages at {origin} are not allowed: to let that page use "
                f"the API, start the node with --cors-origin {origin} (or add it in "
                "Settings → API).", code="cors_forbidden")
        if request.method in BODY_METHODS:
            ctype = request.headers.get("Content-Type")
            if (ctype is not None or request.body_exists) and \
                    request.content_type != "application/json":
                raise UnsupportedMediaType(
                    f"Send the request body as JSON with 'Content-Type: application/json' "
                    f"(got {ctype or 'no Content-Type'}); with curl add "
                    "-H 'Content-Type: application/json'. Other body types are refused so "
                    "that no web page can post to this node.", code="unsupported_media_type")
        return await handler(request)
    return check


def middleware(origins: frozenset[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Answers preflights (after `guard`, so only allowed origins and protocol routes
    reach it)."""
    @web.middleware
    async def cors(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            if not allowed(origins, origin):
                raise Forbidden(
                    f"Cross-origin requests from {origin or 'this page'} are not allowed: "
                    f"start the node with --cors-origin {origin or '<origin>'} (or add it "
                    "in Settings).", code="cors_forbidden")
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
    """An on_response_prepare hook: streamed answers get the header before they start;
    control routes never get it, so no page can even read their refusal."""
    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if allowed(origins, origin) and not is_control(request):
            response.headers["Access-Control-Allow-Origin"] = origin or ""
            response.headers["Vary"] = "Origin"
    return hook
