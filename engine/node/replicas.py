"""A model as several copies (replicas), each one node or a group, for many users: a launch
with "replicas": N runs the model as N copies in all. Copies already running count; the
rest go where the planner places them on machines that run no copy yet, the smallest
placement that fits (one machine where it can), each copy on machines of its own. Requests
then go to the copy that holds their conversation, or the least loaded
(engine/node/routing.py). One copy stops on its own (stop_copy), wherever it runs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from engine.errors import BadRequest, InsufficientMemory, ShoalError
from engine.node.launch import LaunchRequest, planned_request
from engine.node.planning import best_placement, plan_from_cluster
from engine.placement.planner import Placement
from engine.records import InstanceInfo, InstanceState, LaunchedReplicas, RankInfo, ReplicaInfo

log = logging.getLogger(__name__)


def smallest_placement(inputs: Any, req: LaunchRequest, me: str) -> Placement | None:
    """The planner's best among the placements with the fewest machines, or None."""
    report = plan_from_cluster(**inputs, context=req.context, model_name=req.model,
                               kv_bits=req.kv(None))
    if not report.placements:
        return None
    fewest = min(len(p.ranks) for p in report.placements)
    small = [p for p in report.placements if len(p.ranks) == fewest]
    best = best_placement(small, me)
    return small[best] if best is not None else None


async def launch_replicas(cluster: Any, req: LaunchRequest) -> LaunchedReplicas:
    """Run `req.model` as `req.replicas` copies (Cluster.launch hands each one over to
    the machine that holds its rank 0). Every copy is planned before any starts: where
    too few fit, nothing starts and the 400 says how many can."""
    if req.nodes:
        raise BadRequest("'replicas' places each copy itself: leave 'nodes' out, or "
                         "launch each copy with its own nodes.", param="replicas")
    running = cluster.router.replicas(req.model)
    used = {n for r in running for n in r.nodes}
    for p in cluster.peers.all():  # a copy still loading holds its machines too
        s = p.info.serving if p.trusted and p.info else None
        if s is not None and s.model == req.model:
            used |= {n for n in s.nodes if isinstance(n, str)} | {p.id}
    mine = cluster.router.serving()
    if mine is not None and mine.model == req.model:
        used |= set(mine.nodes)
    plans: list[LaunchRequest] = []
    for _ in range(req.replicas - len(running)):
        inputs = cluster.plan_inputs(req.model, exclude=used)
        chosen = smallest_placement(inputs, req, cluster.id)
        if chosen is None:
            have = len(running) + len(plans)
            raise InsufficientMemory(
                f"{req.model} fits {have} cop{'y' if have == 1 else 'ies'} on separate "
                f"machines here, not {req.replicas}: ask for {have or 1}, or add machines.",
                param="replicas")
        used |= {r.node for r in chosen.ranks}
        plans.append(planned_request(req, chosen).model_copy(update={"replicas": 1}))
    log.info("%s: %d cop(ies) running, starting %d", req.model, len(running), len(plans))
    started = await asyncio.gather(*(cluster.launch(p.body()) for p in plans),
                                   return_exceptions=True)
    failed = [(p, e) for p, e in zip(plans, started, strict=True)
              if isinstance(e, BaseException)]
    if failed:
        ok = len(plans) - len(failed)
        why = "; ".join(e.message if isinstance(e, ShoalError) else str(e)
                        for _, e in failed[:2])
        raise ShoalError(f"{len(failed)} of {len(plans)} new copies of {req.model} didn't "
                         f"start ({why}); {ok + len(running)} run.")
    kept = [InstanceInfo(r.instance, req.model, r.strategy, InstanceState.READY,
                         ranks=[RankInfo(i, n) for i, n in enumerate(r.nodes)])
            for r in running]
    return LaunchedReplicas(req.model, kept + [i for i in started
                                               if isinstance(i, InstanceInfo)])


class CopyNotFound(ShoalError):
    status = 404
    type = "invalid_request_error"
    code = "copy_not_found"


USAGE = ('Send {"model": "<model>", "node": "<node id>"}: a copy as GET /shoal/replicas '
         'lists it.')


async def stop_copy(cluster: Any, body: dict[str, Any], member: bool) -> ReplicaInfo:
    """Stop one copy of a model (`body`: its model and the node that answers for it)
    wherever it runs, the others serving on: this node's own by unloading it (or ending
    its group), a peer's by asking that peer over the cluster's signed channel. A
    request a member passed here (`member`) is for this node's own copy only: one hop."""
    from engine.hub.names import shown
    model, node = body.get("model"), body.get("node")
    if not isinstance(model, str) or not model:
        raise BadRequest(USAGE, param="model")
    if not isinstance(node, str) or not node:
        raise BadRequest(USAGE, param="node")
    found = next((r for r in cluster.router.replicas(model) if r.node == node), None)
    if found is None or (member and found.url is not None):
        raise CopyNotFound(f"No copy of {shown(model, 80)} runs on the node "
                           f"{shown(node, 40)} now: it stopped already, or never ran "
                           "there. GET /shoal/replicas lists the copies.", param="node")
    if found.url is not None:
        await cluster.peers.call(found.url, "POST", "/shoal/replicas/stop",
                                 {"model": found.model, "node": node}, timeout=60)
    elif found.instance is not None:
        if cluster.instance is None or cluster.instance.id != found.instance:
            raise CopyNotFound(f"The group running {shown(model, 80)} here ended a "
                               "moment ago.", param="node")
        await cluster.stop_instance()
    else:  # as POST /shoal/unload: what healing placed elsewhere goes too
        await cluster.unload()
    cluster.router.stopped(node, model)
    log.info("stopped the copy of %s on %s", model, found.name)
    return ReplicaInfo(found.model or model, node, found.name, found.instance,
                       found.strategy, list(found.nodes), found.url is None)
