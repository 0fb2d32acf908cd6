"""GET /metrics (Prometheus' text format, or OpenMetrics where the scraper asks for it) and
GET /shoal/finished (the same requests' figures as records, for the app's charts; with
?peers=1 the cluster's trusted peers' too). Both are user API: the API key where one is
set, and the browser rules of /v1 (a page from an origin not allowed with --cors-origin is
refused)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from prometheus_client.exposition import (
    CONTENT_TYPE_PLAIN_0_0_4,
    choose_encoder,
    generate_latest,
)

from engine.errors import BadRequest, ShoalError
from engine.node.metrics import KEEP, NodeMetrics

routes = web.RouteTableDef()
PEER_WAIT_S = 2.0  # a peer slower than this is left out of one poll, not waited for


def _metrics(request: web.Request) -> NodeMetrics:
    return request.app["node"].metrics


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    try:
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    except (TypeError, ValueError):  # a version it can't compare ("version=abc")
        encode, content_type = generate_latest, CONTENT_TYPE_PLAIN_0_0_4
    return web.Response(body=encode(_metrics(request).registry),
                        headers={"Content-Type": content_type})


@routes.get("/shoal/finished")
async def finished(request: web.Request) -> web.Response:
    """The requests this node served that ended after ?since=UNIX_TIME; with ?peers=1 also
    those its trusted peers served (each record names its node), oldest first."""
    try:
        since = float(request.query.get("since", 0))
    except ValueError:
        raise BadRequest("'since' is a unix time in seconds.", param="since") from None
    out = [f.to_json() for f in _metrics(request).recent(since)]
    cluster = request.app.get("cluster")
    if request.query.get("peers") in ("1", "true") and cluster is not None:
        urls = [p.url for p in cluster.peers.all() if p.trusted and p.reachable]
        for rows in await asyncio.gather(*(_of_peer(cluster.peers, u, since) for u in urls)):
            out += rows
        out.sort(key=lambda r: r["at"])
    return web.json_response({"requests": out})


async def _of_peer(peers: Any, url: str, since: float) -> list[dict[str, Any]]:
    """A peer's own records (its answer is signed; still, only well-formed rows count)."""
    try:
        data = await peers.call(url, "GET", f"/shoal/finished?since={since!r}",
                                timeout=PEER_WAIT_S)
    except ShoalError:
        return []
    rows = data.get("requests") if isinstance(data, dict) else None
    return [r for r in rows[-KEEP:] if _plausible(r)] if isinstance(rows, list) else []


def _plausible(r: Any) -> bool:
    return isinstance(r, dict) and isinstance(r.get("node"), str) \
        and isinstance(r.get("model"), str) \
        and all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
                for k in ("at", "seq"))
