"""Placement planning on the live cluster, over HTTP: the inputs (what each node reports
and the measured links, with the model's config) and the planner's answer. The planning
itself is engine.node.planning."""

from __future__ import annotations

from dataclasses import replace

from aiohttp import web

from engine.errors import BadRequest, InsufficientMemory
from engine.node.cluster import Cluster
from engine.node.incoming import json_object
from engine.node.planning import (
    PlanReport,
    best_placement,
    plan_from_cluster,
    plan_info,
    prompt_assumptions,
)
from engine.placement.split_prefill import split_json
from engine.placement.tables import Assumptions
from engine.placement.users import MAX_USERS, compare, to_json
from engine.placement.validate import NotEnoughMemory, PlacementError

routes = web.RouteTableDef()
PLAN_USAGE = ("Send {\"model\": ID, \"context\"?: N, \"kv_bits\"?: 16|8|4, "
              "\"rank\"?: \"chat\"|\"agents\"|\"drafted\", \"prompt_tokens\"?: [N, ...], "
              "\"cached\"?: 0-1, \"users\"?: 1-256, \"strategy\"?, \"nodes\"?}.")


@routes.get("/shoal/plan/inputs")
async def inputs(request: web.Request) -> web.Response:
    """{"nodes", "links", "config"}: what `shoal plan` plans with."""
    model = request.query.get("model")
    if not model:
        raise BadRequest("Say which model: /shoal/plan/inputs?model=ID", param="model")
    src = _cluster(request).plan_inputs(model)
    return web.json_response({"nodes": src["node_infos"], "links": src["links"],
                              "config": src["model_config"]})


@routes.post("/shoal/plan")
async def plan(request: web.Request) -> web.Response:
    """Ranked placements for {"model", "context"?}, or with "strategy" and "nodes" (rank
    order, optionally with layer ranges) the prediction for that placement or why it
    can't run; "force" accepts placements beyond the memory check, with a warning.
    "best" is the index of the placement a launch without nodes would take. Each placement
    one node serves alone has "split_prefill": each other node prefilling for it, at each
    prompt length; ranked for agents, "prefill" and "prefill_min" say which one a launch
    from it uses, and for prompts from how many uncached tokens."""
    body = await json_object(request, PLAN_USAGE, "model")
    if not isinstance(body.get("model"), str):
        raise BadRequest(PLAN_USAGE, param="model")
    c = _cluster(request)
    users = _users(body)
    layout = None
    if body.get("strategy"):
        if not isinstance(body.get("nodes"), list):
            raise BadRequest("With a strategy, give 'nodes' in rank order.", param="nodes")
        layout = (body["strategy"], body.get("backend", "ring"), body["nodes"])
    prompts = _prompts(body)
    try:
        report = plan_from_cluster(**c.plan_inputs(body["model"]), context=body.get("context"),
                                   model_name=body["model"], force=bool(body.get("force")),
                                   layout=layout, kv_bits=(bits := _kv_bits(body, c)),
                                   rank=_rank(body), a=prompts)
    except NotEnoughMemory as e:
        raise InsufficientMemory(str(e), param="nodes") from None
    except PlacementError as e:
        raise BadRequest(f"This placement can't run: {e}", param="nodes") from None
    best = best_placement(report.placements, c.id) if layout is None else None
    out = replace(plan_info(report, best), kv_bits=bits or 16).to_json()
    # each placement's prefill node (ranked for agents) and split rows, as `shoal plan`
    for info, split in zip(out["placements"], split_json(
            report.model, report.placements, report.nodes, report.links, prompts)):
        info.update(split)
    if users is not None:  # replicas against one instance, over every node planned on
        out["users"] = _compare_users(report, users, prompts)
    return web.json_response(out)


def _users(body: dict) -> int | None:
    """How many people ask at once, for the replicas/one-instance comparison."""
    n = body.get("users")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)
                          or not 1 <= n <= MAX_USERS):
        raise BadRequest(f"users must be a whole number of people from 1 to {MAX_USERS}, "
                         f"not {n!r}.", param="users")
    return n


def _compare_users(report: PlanReport, users: int, a: Assumptions) -> dict | None:
    """The comparison as data; None where nothing fits to compare."""
    if not report.placements:
        return None
    return to_json(compare(report.model, report.nodes, report.links, [users],
                           report.context, a))


def _rank(body: dict) -> str:
    from engine.placement.planner import RANKINGS

    rank = body.get("rank", "chat")
    if not isinstance(rank, str) or rank not in RANKINGS:
        raise BadRequest(f"rank must be \"chat\" (decode tokens/s), \"agents\" (time to "
                         f"the first token of the longest prompt_tokens), or \"drafted\" "
                         f"(decode with drafts), not {rank!r}.", param="rank")
    return rank


def _prompts(body: dict) -> Assumptions:
    """The prompt lengths and cached share the time to first token is predicted for."""
    prompts, cached = body.get("prompt_tokens"), body.get("cached")
    if prompts is not None and not isinstance(prompts, list):
        raise BadRequest("prompt_tokens must be a list of prompt lengths in tokens, e.g. "
                         "[1000, 10000, 50000].", param="prompt_tokens")
    try:
        return prompt_assumptions(prompts, cached)
    except ValueError as e:
        raise BadRequest(f"{str(e)[0].upper()}{str(e)[1:]}.",
                         param="cached" if "cached" in str(e) else "prompt_tokens") from None


def _kv_bits(body: dict, c: Cluster) -> int | None:
    """The plan's KV bits: the body's, else what a launch without them takes (the node's
    --kv-bits); None for 16."""
    bits = body.get("kv_bits")
    if bits not in (None, 16, 8, 4) or isinstance(bits, bool):
        raise BadRequest(f"kv_bits must be 16, 8 or 4, not {bits!r}.", param="kv_bits")
    if bits is None:
        bits = c.node.kv_bits
    return None if bits in (None, 16) else bits


def _cluster(request: web.Request) -> Cluster:
    return request.app["cluster"]
