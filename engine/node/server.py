"""The node's HTTP server: the OpenAI API, the GUI's control routes and its event stream."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from aiohttp import web

from engine import __version__
from engine.api import cors
from engine.api.backend import BACKEND
from engine.api.common import MAX_BODY_MB, too_large
from engine.api.routes import error_body
from engine.api.routes import routes as api_routes
from engine.cluster.auth import NotInCluster
from engine.errors import BadRequest, ShoalError, Unauthorized
from engine.node.backend import NodeBackend
from engine.node.incoming import json_object, require_local
from engine.node.request_log import RequestLog
from engine.node.service import Node

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BODY_READ_S = 60.0  # the most a request's body may take to arrive
routes = web.RouteTableDef()


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """One mapping from the error tree to HTTP status + OpenAI error body; every user-API
    request's outcome goes into the request log."""
    started = time.monotonic()
    log_ = request.app.get("requests")
    try:
        resp = await handler(request)
        if log_ is not None:
            log_.add(request, resp.status, started)
        return resp
    except ShoalError as e:
        refused(request, e.status, e.message, e.param)
        if log_ is not None:
            log_.add(request, e.status, started, e.message)
        retry = getattr(e, "retry_after", None)
        return web.json_response(error_body(request.path, e), status=e.status,
                                 headers={"Retry-After": str(retry)} if retry else None)
    except web.HTTPRequestEntityTooLarge:
        # aiohttp found the body over client_max_size while reading it
        big = too_large(request.app["max_body"])
        refused(request, big.status, big.message, None)
        if log_ is not None:
            log_.add(request, big.status, started, big.message)
        return web.json_response(error_body(request.path, big), status=big.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        err = ShoalError(f"{e.reason}: {request.method} {request.path}", code=str(e.status))
        refused(request, e.status, err.message, None)
        if log_ is not None:
            log_.add(request, e.status, started, err.message)
        err.type = "invalid_request_error"
        err.status = e.status
        return web.json_response(error_body(request.path, err), status=e.status)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:
        log.exception("unexpected error in %s %s", request.method, request.path)
        err = ShoalError(f"Internal error: {e}. The node keeps running; see its log.")
        if log_ is not None:
            log_.add(request, 500, started, err.message)
        return web.json_response(error_body(request.path, err), status=500)


def refused(request: web.Request, status: int, reason: str, param: str | None) -> None:
    """Every refused request in the node's log: status, route, reason, the field and the
    client's name. Never its body or headers (keys, prompts)."""
    client = request.headers.get("User-Agent", "?")[:80]
    field = f" ({param})" if param else ""
    level = logging.WARNING if status >= 500 else logging.INFO
    log.log(level, "%d %s %s%s: %s [%s]", status, request.method, request.path, field,
            reason[:300], client)


class BodyTimeout(BadRequest):
    status = 408
    code = "request_timeout"


def body_limit(max_body: int, read_s: float = BODY_READ_S) -> Any:
    """Refuse a body whose Content-Length is over the limit before reading any of it
    (a chunked one is stopped by aiohttp's client_max_size as it is read), and one that
    takes longer than `read_s` to arrive (a client that trickles bytes holds a
    connection); what is read is kept for the handler."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        size = request.content_length
        if size is not None and size > max_body:
            raise too_large(max_body, size)
        if request.body_exists:
            try:
                await asyncio.wait_for(request.read(), read_s)
            except TimeoutError:
                raise BodyTimeout(f"The request body took longer than {read_s:.0f} s to "
                                  "arrive; send it again on a faster link.") from None
        return await handler(request)
    return check


def is_peer_route(path: str) -> bool:
    """Routes only other nodes of the cluster may call (signed with the cluster secret)."""
    return path == "/shoal/node" or path.startswith("/shoal/peer/")


def auth(api_key: str | None, verifier: Any = None, cluster_port: int = 0) -> Any:
    """The cluster port serves only requests signed for this node by a member (and signs
    its answers, sign_answers); the user API wants the API key where one is set, and
    never serves the peer routes."""
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if verifier is not None and cors.arrived_on(request, cluster_port):
            # raises NotInCluster: unsigned, another secret, stale, replayed, not for us
            request["caller"] = verifier.verify(request.method, request.path_qs,
                                                request.headers, await request.read())
            return await handler(request)
        if path == "/health":
            return await handler(request)
        if is_peer_route(path):
            raise NotInCluster("Only other nodes of this cluster call this route, on the "
                               "cluster port.")
        if api_key and not (request.method == "HEAD" and path == "/"):
            # Bearer for OpenAI/Ollama clients, x-api-key for Anthropic's
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip() \
                or request.headers.get("x-api-key", "").strip()
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                raise Unauthorized("A valid API key is required: send it as "
                                   "'Authorization: Bearer <key>' (or 'x-api-key: <key>').")
        return await handler(request)
    return check


def sign_answers(verifier: Any) -> Callable[[web.Request, web.StreamResponse],
                                             Awaitable[None]]:
    """An on_response_prepare hook: every answer to a member's request is signed, bound to
    that request (engine/cluster/auth.py); a whole body's hash is in the signature, a
    streamed one's integrity is TLS's."""
    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        caller = request.get("caller")
        if caller is None or verifier is None:
            return
        body: bytes | None = None  # streamed (a file, a relayed answer, the probe)
        if isinstance(response, web.Response):
            whole = response.body
            body = b"" if whole is None else bytes(whole) \
                if isinstance(whole, bytes | bytearray) else None
        response.headers.update(verifier.answer_headers(caller, response.status, body))
    return hook


def _node(request: web.Request) -> Node:
    return request.app["node"]


@routes.get("/health")
async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "version": __version__})


@routes.get("/shoal/status")
async def status(request: web.Request) -> web.Response:
    cluster = request.app.get("cluster")
    mine = replace(cluster.describe(), url=cluster.peers.self_url) if cluster is not None \
        else None
    return web.json_response(_node(request).status(cluster=mine).to_json())


@routes.get("/shoal/events")
async def events(request: web.Request) -> web.StreamResponse:
    node = _node(request)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    q = node.subscribe()
    try:
        await resp.write(f"data: {json.dumps(node.status().to_json())}\n\n".encode())
        while True:
            try:
                snap = await asyncio.wait_for(q.get(), 10)
                await resp.write(f"data: {json.dumps(snap.to_json())}\n\n".encode())
            except TimeoutError:
                await resp.write(b": keep-alive\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        node.unsubscribe(q)
    return resp


@routes.get("/shoal/requests")
async def requests_log(request: web.Request) -> web.Response:
    """The node's recent API requests (engine/node/request_log.py); ?since=UNIX_TIME."""
    try:
        since = float(request.query.get("since", 0))
    except ValueError:
        raise BadRequest("'since' is a unix time in seconds.", param="since") from None
    return web.json_response({"requests": [e.to_json()
                                           for e in request.app["requests"].recent(since)]})


@routes.post("/shoal/load")
async def load(request: web.Request) -> web.Response:
    usage = "Send {\"model\": \"<model id>\"}."
    body = await json_object(request, usage, "model")
    if not isinstance(body.get("model"), str):
        raise BadRequest(usage, param="model")
    node = _node(request)
    node.resolve(body["model"])  # unknown ids fail now, with the list of models here
    node.load_in_background(body["model"])
    return web.json_response(node.status().to_json(), status=202)


@routes.post("/shoal/unload")
async def unload(request: web.Request) -> web.Response:
    cluster = request.app.get("cluster")
    if cluster is not None:  # the user's unload ends what healing did, here or elsewhere
        await cluster.unload()
    else:
        await _node(request).unload()
    return web.json_response(_node(request).status().to_json())


@routes.post("/shoal/shutdown")
async def shutdown(request: web.Request) -> web.Response:
    require_local(request, "shut the node down")
    request.app["stop"].set()
    return web.json_response({"ok": True})


def _count_as(node: Node, cluster: Any) -> None:
    """The node's name in /metrics' labels, and its machine's facts (memory, watts)."""
    if cluster is None:
        return
    from engine.node.facts import capped
    node.metrics.node = cluster.name
    node.metrics.facts = lambda: capped(cluster.facts.describe(), node.memory_limit) \
        if cluster.facts is not None else None
    node.metrics.routes = lambda: [((m, cluster.name_of(n), why), c) for (m, n, why), c
                                   in cluster.router.reasons.items()]


def build_app(node: Node, api_key: str | None = None, cluster: Any = None,
              verifier: Any = None, cluster_port: int = 0,
              cors_origins: list[str] | tuple[str, ...] = (), host: str = "127.0.0.1",
              allowed_hosts: list[str] | tuple[str, ...] = (),
              max_body_mb: float = MAX_BODY_MB) -> web.Application:
    """The node's one app, served on two listeners: the user API on `host` (browser rules
    of engine.api.cors apply there) and the cluster port (signed requests only)."""
    from engine.node.cluster_routes import routes as cluster_routes
    origins = frozenset(o.rstrip("/") for o in cors_origins)
    max_body = int(max_body_mb * 2**20)
    app = web.Application(middlewares=[
        errors, body_limit(max_body),
        cors.guard(origins, cors.host_names(host, allowed_hosts), cluster_port),
        cors.middleware(origins), auth(api_key, verifier, cluster_port)],
        client_max_size=max_body)
    app.on_response_prepare.append(cors.add_headers(origins))
    app.on_response_prepare.append(sign_answers(verifier))
    app["max_body"] = max_body
    app["node"] = node
    app[BACKEND] = NodeBackend(node, cluster)
    app["requests"] = RequestLog()
    app["cluster"] = cluster
    app["stop"] = asyncio.Event()
    from engine.node.metrics_routes import routes as metrics_routes
    from engine.node.settings_routes import routes as settings_routes
    _count_as(node, cluster)
    app.add_routes(routes)
    app.add_routes(metrics_routes)
    app.add_routes(settings_routes)
    app.add_routes(api_routes)
    if cluster is not None:
        from engine.node.plan_routes import routes as plan_routes
        app.add_routes(cluster_routes)
        app.add_routes(plan_routes)
    from engine.node.hub_routes import setup_hub
    setup_hub(app)
    return app
