"""Placement planning on the live cluster: what each node reports (memory it may use,
chip, models on disk, RDMA) and the measured links, fed to the pure planner."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from engine.errors import BadRequest, InsufficientMemory
from engine.node.cluster import Cluster
from engine.placement.validate import PlacementError

routes = web.RouteTableDef()


def _node_info(info: dict[str, Any]) -> dict[str, Any]:
    machine = info.get("machine") or {}
    memory = machine.get("memory") or {}
    rdma = ((info.get("platform") or {}).get("rdma") or {}).get("enabled")
    return {"id": info.get("id"), "name": info.get("name"),
            "memory_usable_bytes": memory.get("available_bytes"),
            "memory_bytes": memory.get("total_bytes"), "chip": machine.get("chip"),
            "models": info.get("models") or [], "rdma": bool(rdma),
            # measured on the machine itself (engine/telemetry/calibrate.py), when known
            "measured_bandwidth_Bps": (info.get("speed") or {}).get("memory_bandwidth_Bps"),
            "measured_flops": (info.get("speed") or {}).get("compute_flops")}


def plan_inputs(c: Cluster, model: str) -> dict[str, Any]:
    """Nodes (this one first, then trusted compatible peers), links and the model's config."""
    return {**cluster_view(c), "config": model_config(c, model)}


def model_config(c: Cluster, model: str) -> dict[str, Any]:
    return json.loads((c.node.resolve(model) / "config.json").read_text())


def cluster_view(c: Cluster) -> dict[str, Any]:
    """What the planner needs of the cluster: {"nodes", "links"} (no model)."""
    from engine.node.cluster_routes import _self_info
    infos = [_self_info(c)] + [p.info for p in c.peers.all() if p.trusted and not p.warning]
    links = []
    for info in infos:
        for lk in info.get("links") or []:
            if "rtt_ms" in lk and "bandwidth_MBps" in lk:
                links.append({"a": info["id"], "b": lk["to"],
                              "latency_s": lk["rtt_ms"] / 2000,  # one way
                              "bandwidth_Bps": lk["bandwidth_MBps"] * 1e6, "rdma": False})
    ids = {i["id"] for i in infos}
    return {"nodes": [_node_info(i) for i in infos],
            "links": [lk for lk in links if lk["b"] in ids]}


@routes.get("/shoal/plan/inputs")
async def inputs(request: web.Request) -> web.Response:
    model = request.query.get("model")
    if not model:
        raise BadRequest("Say which model: /shoal/plan/inputs?model=ID", param="model")
    return web.json_response(plan_inputs(request.app["cluster"], model))


@routes.post("/shoal/plan")
async def plan(request: web.Request) -> web.Response:
    """Ranked placements for {"model", "context"?}, or with "strategy" and "nodes" (rank
    order, optionally with layer ranges) the prediction for that placement or why it
    can't run; "force" accepts placements beyond the memory check, with a warning."""
    from engine.placement.validate import NotEnoughMemory
    from engine.placement_cli import plan_from_cluster, report_json
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise BadRequest("Send {\"model\": ID, \"context\"?: N, \"strategy\"?, \"nodes\"?}.",
                         param="model")
    src = plan_inputs(request.app["cluster"], body["model"])
    layout = None
    if body.get("strategy"):
        if not isinstance(body.get("nodes"), list):
            raise BadRequest("With a strategy, give 'nodes' in rank order.", param="nodes")
        layout = (body["strategy"], body.get("backend", "ring"), body["nodes"])
    try:
        report = plan_from_cluster(src["nodes"], src["config"], body.get("context"),
                                   src["links"], body["model"], bool(body.get("force")),
                                   layout)
    except NotEnoughMemory as e:
        raise InsufficientMemory(str(e), param="nodes") from None
    except PlacementError as e:
        raise BadRequest(f"This placement can't run: {e}", param="nodes") from None
    return web.json_response(report_json(report))
