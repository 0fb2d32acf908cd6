"""GET /metrics (Prometheus' text format, or OpenMetrics where the scraper asks for it) and
GET /shoal/finished (the same requests' figures as records, for the app's charts). Both
are user API: the API key where one is set, and the browser rules of /v1 (a page from an
origin not allowed with --cors-origin is refused)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from engine.errors import BadRequest
from engine.node.metrics import NodeMetrics

routes = web.RouteTableDef()


def _metrics(request: web.Request) -> NodeMetrics:
    return request.app["node"].metrics


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encode(_metrics(request).registry),
                        headers={"Content-Type": content_type})


@routes.get("/shoal/finished")
async def finished(request: web.Request) -> web.Response:
    """The requests this node served that ended after ?since=UNIX_TIME."""
    try:
        since = float(request.query.get("since", 0))
    except ValueError:
        raise BadRequest("'since' is a unix time in seconds.", param="since") from None
    return web.json_response({"requests": [f.to_json()
                                           for f in _metrics(request).recent(since)]})
