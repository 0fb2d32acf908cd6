"""HTTP routes for the cluster: this node's description, its peers, distributed instances
(launch/list/stop), and the node-to-node calls that run them."""

from __future__ import annotations

from typing import TypeVar

from aiohttp import web

from engine.cluster_records import RankPrepare, RankStart
from engine.errors import BadRequest
from engine.node.cluster import Cluster
from engine.node.incoming import json_object
from engine.node.topology import topology_info
from engine.records import Record

routes = web.RouteTableDef()
R = TypeVar("R", bound=Record)


def _cluster(request: web.Request) -> Cluster:
    return request.app["cluster"]


PROBE_CHUNK = b"\0" * 65536


@routes.get("/shoal/peer/probe")
async def probe(request: web.Request) -> web.StreamResponse:
    """N bytes of zeros, for measuring a link's bandwidth (at most 64 MiB)."""
    try:
        n = min(int(request.query.get("bytes", "0")), 64 * 2**20)
    except ValueError:
        raise BadRequest("bytes must be a number", param="bytes") from None
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = n
    await resp.prepare(request)
    while n > 0:
        await resp.write(PROBE_CHUNK[:n])
        n -= len(PROBE_CHUNK)
    await resp.write_eof()
    return resp


@routes.get("/shoal/node")
async def node_info(request: web.Request) -> web.Response:
    return web.json_response(_cluster(request).info().to_json())


@routes.get("/shoal/topology")
async def topology(request: web.Request) -> web.Response:
    """Every node this one knows (itself first) with its facts, and every measured link
    (each node measures its own; peers report theirs)."""
    c = _cluster(request)
    return web.json_response(topology_info(c.info(), c.peers.all()).to_json())


@routes.get("/shoal/replicas")
async def replicas(request: web.Request) -> web.Response:
    """Every replica of every model this node can send requests to, with its load and its
    share of the requests this node sent."""
    return web.json_response(_cluster(request).router.info().to_json())


@routes.post("/shoal/replicas/stop")
async def stop_copy(request: web.Request) -> web.Response:
    """One copy of a model stopped, wherever it runs (a peer's is passed on to it over
    the cluster's signed channel); the other copies serve on."""
    from engine.node.replicas import USAGE
    from engine.node.replicas import stop_copy as stop
    body = await json_object(request, USAGE, "node")
    stopped = await stop(_cluster(request), body, request.get("caller") is not None)
    return web.json_response(stopped.to_json())


@routes.get("/shoal/peers")
async def list_peers(request: web.Request) -> web.Response:
    return web.json_response([p.public().to_json() for p in _cluster(request).peers.all()])


@routes.post("/shoal/peers")
async def add_peer(request: web.Request) -> web.Response:
    addr = (await json_object(request)).get("address")
    if not isinstance(addr, str) or ":" not in addr:
        raise BadRequest("Send {\"address\": \"host:port\"}.", param="address")
    return web.json_response(_cluster(request).peers.add(addr).public().to_json(), status=201)


@routes.post("/shoal/instances")
async def launch(request: web.Request) -> web.Response:
    body = await json_object(request)
    c = _cluster(request)
    out = await (c.launch_replicas(body) if body.get("replicas", 1) != 1 else c.launch(body))
    return web.json_response(out.to_json(), status=201)


@routes.get("/shoal/instances")
async def instances(request: web.Request) -> web.Response:
    return web.json_response(_cluster(request).describe().to_json())


@routes.delete("/shoal/instances/{id}")
async def stop_instance(request: web.Request) -> web.Response:
    from engine.hub.names import shown
    from engine.node.replicas import CopyNotFound
    c, wanted = _cluster(request), request.match_info["id"]
    if c.instance is None or c.instance.id != wanted:
        raise CopyNotFound(f"This node leads no instance {shown(wanted, 40)}: GET "
                           "/shoal/instances lists its own; POST /shoal/replicas/stop "
                           "stops a copy another node runs.", param="id")
    await c.stop_instance()
    return web.json_response(c.instance.info().to_json())


@routes.post("/shoal/peer/prepare")
async def peer_prepare(request: web.Request) -> web.Response:
    body = await peer_body(request, RankPrepare)
    return web.json_response((await _cluster(request).followers.prepare(body)).to_json())


@routes.post("/shoal/peer/start")
async def peer_start(request: web.Request) -> web.Response:
    await _cluster(request).followers.start(await peer_body(request, RankStart),
                                            request["caller"].node)
    return web.json_response({"ok": True}, status=202)


@routes.post("/shoal/peer/prefill")
async def peer_prefill(request: web.Request) -> web.StreamResponse:
    """A member's long prompt prefilled here: its KV's frames streamed back as each layer
    makes them (engine/node/handover.py)."""
    from engine.node.handover import Prefill
    from engine.node.handover_group import GroupPrefill
    body = await json_object(request)
    c = _cluster(request)
    w = c.node.worker
    job: Prefill | GroupPrefill = \
        GroupPrefill(c.node, c, body.get("model"), body.get("tokens")) \
        if w is not None and w.dist_config is not None \
        else Prefill(c.node, body.get("model"), body.get("tokens"))
    try:
        first = await job.first()  # a refusal before any KV keeps its own status
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        await resp.write(first)
        async for chunk in job.rest():
            await resp.write(chunk)
        await resp.write_eof()
        return resp
    finally:
        await job.close()


@routes.post("/shoal/peer/handover/pull")
async def peer_handover_pull(request: web.Request) -> web.Response:
    """The group's owner has a prefill node's KV coming in: this member copies it
    (engine/node/handover_group.py)."""
    from engine.node.handover_group import pull
    c = _cluster(request)
    return web.json_response(await pull(c.node, c, request["caller"].node,
                                        await json_object(request)))


@routes.post("/shoal/peer/handover/frames")
async def peer_handover_frames(request: web.Request) -> web.StreamResponse:
    """A member of this node's group reads a hand-over's frames as they land here."""
    from engine.node.handover_group import frames
    c = _cluster(request)
    return await frames(request, c.node, c)


@routes.post("/shoal/peer/handover/export")
async def peer_handover_export(request: web.Request) -> web.StreamResponse:
    """The group's owner reads what this node's rank writes for another node."""
    from engine.node.handover_group import export
    c = _cluster(request)
    return await export(request, c.node, c)


@routes.get("/shoal/peer/instances/{id}")
async def peer_state(request: web.Request) -> web.Response:
    return web.json_response(_cluster(request).followers.state(request.match_info["id"])
                             .to_json())


async def peer_body(request: web.Request, cls: type[R]) -> R:
    """A peer's request body as its record; a 400 naming what it lacks."""
    body = await json_object(request)
    try:
        return cls.from_json(body)
    except (TypeError, ValueError) as e:  # a field missing: another version's
        raise BadRequest(f"{request.path} can't be read ({e}); update both nodes.") from None


@routes.post("/shoal/peer/stop")
async def peer_stop(request: web.Request) -> web.Response:
    body = await json_object(request)
    await _cluster(request).followers.stop(str(body.get("instance")),
                                          str(body.get("reason") or "stopped"))
    return web.json_response({"ok": True})


@routes.post("/shoal/peer/failed")
async def peer_failed(request: web.Request) -> web.Response:
    body = await json_object(request)
    await _cluster(request).peer_failed(str(body.get("instance")),
                                        str(body.get("reason") or "a rank failed"),
                                        leaving=request["caller"].node
                                        if body.get("leaving") is True else None)
    return web.json_response({"ok": True})


@routes.get("/shoal/peer/hello")
async def hello(request: web.Request) -> web.Response:
    """A member's first request, before it knows this node's id: the id, and nothing
    else (its signed answer proves this node holds the secret)."""
    return web.json_response({"id": _cluster(request).id})
