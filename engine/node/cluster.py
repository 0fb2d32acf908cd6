"""Distributed instances: one model across several nodes.

The node that owns an instance holds rank 0 and serves its requests; the others run
follower ranks (engine/node/followers.py). The owner checks the launch (engine/node/
launch.py: the body, the ranks, the placement, the memory) before anything starts, gathers
a fresh pair of ports from every node (MLX ring + doorbell; every instance gets its own),
starts all ranks from one DistConfig, and watches them: any rank or node that fails tears
the whole instance down, with the reason, on every node.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine import __version__
from engine.api.common import parse
from engine.errors import BadRequest, ShoalError
from engine.node.facts import Facts, capped
from engine.node.followers import Followers
from engine.node.group_start import WATCH_S, follower_state, peer_record, start_ranks
from engine.node.healing import Healer
from engine.node.launch import (
    Instance,
    LaunchRequest,
    Rank,
    check_placement,
    choose_lanes,
    first_choice,
    handed_over,
    host_of,
    memory_check,
    planned_request,
    rdma_matrix,
    resolve_ranks,
)
from engine.node.peers import Peers
from engine.node.planning import ModelFacts, PlanInputs, cluster_view
from engine.node.router import Router
from engine.node.service import Node
from engine.platform.probes import PlatformReport
from engine.records import (
    ENDED,
    ClusterInfo,
    DraftInfo,
    InstanceInfo,
    InstanceState,
    LaunchedReplicas,
    LinkInfo,
    NodeInfo,
    RankInfo,
    RunnerLoading,
)
from engine.telemetry.versions import mlx_version

log = logging.getLogger(__name__)
GONE_S = 6.0  # a rank's node silent this long is gone (liveness within 10 s)
REPLACED = "replaced by a new launch"
SHUTDOWN = "the owner node is shutting down"


class Cluster:
    def __init__(self, node: Node, node_id: str, node_name: str, peers: Peers, host: str):
        self.node = node
        self.id = node_id
        self.name = node_name
        self.peers = peers
        self.host = host
        self.instance: Instance | None = None
        self.followers = Followers(node, peers, node_name, host)
        self.facts: Any = None  # engine.node.facts.NodeFacts, set by the node's main
        self.draft: DraftInfo | None = None  # its draft model's size, set by main
        self.healer = Healer(self)  # main turns it off for --no-heal
        self.router = Router(self)

    # --- what other nodes and the GUI see ----------------------------------------------
    def links(self) -> list[LinkInfo]:
        """This node's measured links to its trusted peers."""
        return [LinkInfo(p.id, p.url, p.link.type or "", p.link.rtt_ms, p.link.bandwidth_MBps)
                for p in self.peers.all() if p.trusted and p.link.measured]

    def info(self) -> NodeInfo:
        """This node as GET /shoal/node describes it (peers keep it as their `info`)."""
        mine = self.describe()
        facts = capped(self.facts.describe() if self.facts else Facts(),
                       self.node.memory_limit)
        return NodeInfo(self.id, self.name, mine.instances, mine.followers, __version__,
                        mlx_version(), self.node.status().state,
                        [m.id for m in self.node.local_models()], self.links(),
                        machine=facts.machine, speed=facts.speed,
                        platform=facts.platform, power=facts.power, draft=self.draft,
                        serving=self.router.serving(),
                        conversations=self.router.recent() or None)

    def name_of(self, node_id: str) -> str:
        """A node's machine name, for sentences a person reads (its address where it never
        told its name)."""
        if node_id == self.id:
            return self.name
        peer = self.peers.find(node_id)
        return (peer.name or host_of(peer.url)) if peer is not None else "a machine that left"

    def plan_infos(self) -> list[NodeInfo]:
        """What the planner may use: this node first, then trusted compatible peers."""
        return [self.info()] + [p.info for p in self.peers.all()
                                if p.trusted and not p.warning and p.info is not None]

    def model_config(self, model: str) -> dict[str, Any]:
        return json.loads((self.node.resolve(model) / "config.json").read_text())

    def plan_inputs(self, model: str, exclude: set[str] | frozenset[str] = frozenset()
                    ) -> PlanInputs:
        """plan_from_cluster's node_infos, links and model facts for `model` here, without
        the nodes in `exclude` and peers unreachable now (a launch couldn't use them)."""
        gone = set(exclude) | {p.id for p in self.peers.all() if p.id and not p.reachable}
        infos = [i for i in self.plan_infos() if i.id not in gone]
        view = cluster_view(infos)
        return {"node_infos": view["nodes"], "links": view["links"], **self.model_facts(model)}

    def model_facts(self, model: str) -> ModelFacts:
        """plan_from_cluster's model inputs: config.json, the weights' bytes in memory and
        the context, read from the checkpoint here."""
        from engine.hub.checkpoint import memory_bytes, model_context
        config = self.model_config(model)
        return {"model_config": config,
                "weight_bytes": memory_bytes(self.node.resolve(model), config),
                "model_context": self.node.model_settings.capped(model, model_context(config))}

    def describe(self) -> ClusterInfo:
        """This node's part in distributed instances (GET /shoal/instances)."""
        instances = [self.instance.info()] if self.instance else []
        run = self.node.runner
        if instances and isinstance(run, RunnerLoading) and run.model == instances[0].model:
            first = replace(instances[0].ranks[0], progress=[run.layers_done,
                                                             run.layers_total])
            instances[0] = replace(instances[0], ranks=[first, *instances[0].ranks[1:]])
        return ClusterInfo(self.id, self.name, instances,
                           [f.info() for f in self.followers.all()], self.healer.info)

    def remote_instances(self) -> list[tuple[str, InstanceInfo]]:
        """(owner URL, instance) for every ready instance a trusted peer owns."""
        return [(p.url, inst) for p in self.peers.all() if p.trusted and p.info is not None
                for inst in p.info.instances if inst.state == InstanceState.READY]

    def owner_of(self, model: str) -> str | None:
        """URL of the peer that serves `model` as a distributed instance, if any."""
        return next((url for url, inst in self.remote_instances() if inst.model == model),
                    None)

    # --- launching (owner side) ----------------------------------------------------------
    async def launch_replicas(self, raw: Any) -> LaunchedReplicas:
        """A launch with "replicas": the model as that many copies (engine/node/replicas.py)."""
        from engine.node.replicas import launch_replicas
        return await launch_replicas(self, parse(LaunchRequest, raw))

    async def launch(self, raw: Any, exclude: set[str] | frozenset[str] = frozenset(),
                     healing: bool = False) -> InstanceInfo:
        """Check a launch, hand it to the node that holds rank 0 if that is another, else
        start every rank and watch them (the walk in docs/design-notes.md). `exclude`:
        nodes a launch without nodes leaves out (healing: the lost ones)."""
        req = parse(LaunchRequest, raw)
        # the user's own launch: what healing did no longer applies
        healed = None if healing else self.healer.forget()
        if req.kv_bits is None:  # this node's setting, for every rank (and a hand-over)
            req = req.model_copy(update={"kv_bits": self.node.kv_bits or 16})
        chosen, inputs = None, None
        if not req.nodes:  # the planner's first choice
            inputs = self.plan_inputs(req.model, exclude)
            chosen = first_choice(inputs, req, self.id)
            req = planned_request(req, chosen)
        ranks = resolve_ranks(req, (self.id, self.name), self.peers)
        if ranks[0].url is not None:  # rank 0 lives on its owner: hand the job over
            return await peer_record(InstanceInfo, self.peers, ranks[0].url, "POST",
                                     "/shoal/instances", handed_over(req, ranks),
                                     timeout=900)
        path = self.node.resolve(req.model)
        await self.node.check_model(path, all_files=len(ranks) == 1 or req.strategy == "tensor")
        inputs = inputs or self.plan_inputs(req.model)  # config.json read once a launch
        t0 = time.monotonic()
        prefill = await self._prefill_node(req, ranks, inputs["model_config"])
        self.node.prefill = None  # whatever this launch replaces prefilled for another
        if len(ranks) == 1:  # one node: a plain single-process model here
            memory_check(inputs, req, "pipeline", ranks, chosen)
            choose_lanes(req.lanes, "pipeline", [self.host], 1, 1)  # one process: one batch
            await self.healer.undo(healed, req.model)
            await self.stop_instance(REPLACED)
            await self.node.start_worker(req.model, path, kv_bits=req.kv(None),
                                         engine=req.engine, handover=prefill is not None)
            self.node.prefill = prefill
            return InstanceInfo(None, req.model, "single", InstanceState.READY, None,
                                [RankInfo(0, self.id)], kv_bits=req.kv(None) or 16)
        if req.engine == "llamacpp":
            raise BadRequest("'engine': llama.cpp serves a model one node holds alone; a "
                             "group runs on MLX. Leave 'engine' out, or launch on one node.",
                             param="engine")
        rdma = rdma_matrix(ranks, req.backend, self._platforms(ranks)) \
            if req.backend != "ring" else None
        check_placement(inputs["model_config"], req.strategy, ranks)
        warning, predicted = memory_check(inputs, req, req.strategy, ranks, chosen)
        hosts = [self.host if r.url is None else host_of(r.url) for r in ranks]
        lanes = choose_lanes(req.lanes, req.strategy, hosts, predicted, self.node.max_streams)
        if lanes != predicted:
            log.info("%s runs %d lane(s), the planner predicted %d best", req.model, lanes,
                     predicted)
        await self.healer.undo(healed, req.model)
        await self.stop_instance(REPLACED)
        inst = Instance(uuid.uuid4().hex[:12], req.model, req.strategy, ranks,
                        backend=req.backend, devices=rdma, lanes=lanes,
                        kv_bits=req.kv(None))
        self.instance = inst
        try:
            await self._start_or_end(inst, path, inputs["model_context"])
        except ShoalError as e:
            if inst.backend == "ring":
                raise
            # the RDMA group didn't form: the same nodes over TCP, saying so
            reason = e.message
            log.warning("%s: the %s group didn't form (%s); trying the ring", req.model,
                        inst.backend, reason)
            inst = replace(inst, id=uuid.uuid4().hex[:12], backend="ring", devices=None,
                           state=InstanceState.STARTING, reason=None, watch=None)
            inst.ranks = [replace(r, progress=None, loaded=None) for r in inst.ranks]
            self.instance = inst
            fell_back = (f"The {req.backend} (RDMA) group didn't form ({reason}); it runs "
                         f"over the ring (TCP) on the same nodes instead.")
            warning = f"{warning} {fell_back}" if warning else fell_back
            inst.warning = fell_back
            await self._start_or_end(inst, path, inputs["model_context"])
        inst.state = InstanceState.READY
        inst.ready_once = True
        self.node.prefill = prefill
        inst.load_s = time.monotonic() - t0  # healing's estimate for placing it again
        inst.watch = asyncio.create_task(self._watch(inst))
        return replace(inst.info(), warning=warning) if warning else inst.info()

    async def _prefill_node(self, req: LaunchRequest, ranks: list[Rank],
                            config: dict[str, Any]) -> Any:
        """The launch's prefill node (engine/node/handover.py), checked: a trusted member
        outside the instance (a group's too: engine/node/handover_group.py, where it
        batches); the model started there where it isn't already (_start_prefill_node)."""
        from engine.node.handover import MIN_TOKENS, PrefillNode
        from engine.placement.families import batching_refusal
        if req.prefill is None:
            return None
        if len(ranks) > 1 and (self.node.max_streams < 2
                               or batching_refusal(str(config.get("model_type")))):
            raise BadRequest("This group would run one request at a time, which can't take "
                             "a prefill node's KV: leave 'prefill' out, or serve more "
                             "streams.", param="prefill")
        peer = self.peers.find(req.prefill)
        if peer is None or not peer.trusted or not peer.id:
            raise BadRequest(f"'prefill': {req.prefill[:80]!r} is no node of this cluster "
                             "that this node can reach.", param="prefill")
        if peer.id == self.id:
            raise BadRequest("'prefill' names the node that decodes; name another.",
                             param="prefill")
        if peer.id in {r.node for r in ranks}:
            raise BadRequest(f"'prefill' names {peer.name}, a node of the model's group; "
                             "name one outside it.", param="prefill")
        await self._start_prefill_node(req, peer)
        return PrefillNode(peer.id, req.model, req.prefill_min or MIN_TOKENS)

    async def _start_prefill_node(self, req: LaunchRequest, peer: Any) -> None:
        """The model started alone on the launch's prefill node `peer`, where it isn't
        already (with this launch's KV bits: the two sides' KV must match); one that
        serves another model now is left as it is, and the launch refused, saying so."""
        # asked now, not from the last poll: a launch there a moment ago must count
        info = await peer_record(NodeInfo, self.peers, peer.url, "GET", "/shoal/node")
        serving = info.serving
        if serving is not None and serving.model == req.model \
                and serving.strategy in ("single", "pipeline"):  # (a group: it owns it)
            if serving.engine == "llamacpp":
                raise BadRequest(f"The prefill node ({peer.name}) serves {req.model[:80]} "
                                 "through llama.cpp, which can't hand its KV over: launch "
                                 "it there with \"engine\": \"mlx\", or name another "
                                 "prefill node.", param="prefill")
            return
        if any(f.state not in ENDED for f in info.followers):
            owner = next((p.name for p in self.peers.all() if p.info and p.info.serving
                          and peer.id in p.info.serving.nodes[1:]), None) or "its owner"
            raise BadRequest(f"The prefill node ({peer.name}) serves a rank of a group; "
                             f"name {owner}, which owns it.", param="prefill")
        if serving is not None:
            raise BadRequest(f"The prefill node ({peer.name}) serves {serving.model[:80]} "
                             "now; stop that there, or name another prefill node.",
                             param="prefill")
        log.info("starting %s on %s to prefill for this node", req.model, peer.name)
        await peer_record(InstanceInfo, self.peers, peer.url, "POST", "/shoal/instances",
                          {"model": req.model, "nodes": [{"node": "self"}],
                           "kv_bits": req.kv_bits, "engine": "mlx"}, timeout=900)

    def _platforms(self, ranks: list[Rank]) -> dict[str, PlatformReport | None]:
        """Each rank node's platform report (Thunderbolt, RDMA), for jaccl's devices."""
        out: dict[str, PlatformReport | None] = {}
        for r in ranks:
            peer = self.peers.find(r.url) if r.url else None
            out[r.node] = peer.info.platform if peer and peer.info else None
            if r.url is None and self.facts and self.facts.platform:
                out[r.node] = self.facts.platform
        return out

    async def _start_or_end(self, inst: Instance, path: Path, context: int) -> None:
        """Start every rank, or tear the instance down with the reason and raise."""
        try:
            await start_ranks(self.node, self.peers, self.host, inst, path, context)
        except BaseException as e:
            await self._teardown(inst, e.message if isinstance(e, ShoalError)
                                 else f"launch failed: {e}")
            raise

    # --- watching and tearing down -------------------------------------------------------
    async def _watch(self, inst: Instance) -> None:
        heard = {r.url: time.monotonic() for r in inst.ranks if r.url}  # last answer
        while self.instance is inst and inst.state == InstanceState.READY:
            await asyncio.sleep(WATCH_S)
            w = self.node.worker
            if w is None or not w.alive:
                reason = (w.dead_reason if w else None) or f"its part on {self.name} stopped"
                await self._teardown(inst, reason)
                return
            for r in inst.ranks:
                if r.url is None:
                    continue
                try:
                    st = await follower_state(self.peers, r.url, inst.id)
                    heard[r.url] = time.monotonic()
                except ShoalError:
                    # silent since its last answer, not since the first failed poll
                    if time.monotonic() - heard[r.url] >= GONE_S:
                        await self._teardown(inst, f"{self.name_of(r.node)} stopped "
                                             f"answering")
                        return
                    continue
                if st.state != InstanceState.READY:
                    await self._teardown(inst, f"its part on {self.name_of(r.node)} "
                                         f"{st.state}: {st.reason}")
                    return

    async def peer_failed(self, inst_id: str, reason: str, leaving: str | None = None
                          ) -> None:
        """A rank's node says its part failed; `leaving`: the id of a node (proven by its
        signature) that said so because it quits, which healing then says left."""
        if leaving:
            self.healer.said_leaving(leaving)
        if self.instance and self.instance.id == inst_id:
            await self._teardown(self.instance, reason)

    async def _teardown(self, inst: Instance, reason: str) -> None:
        if inst.state in ENDED:
            return
        inst.state = InstanceState.STOPPED if reason == "stopped" else InstanceState.FAILED
        inst.reason = reason
        log.warning("instance %s of %s ends: %s", inst.id, inst.model, reason)
        heal = inst.state == InstanceState.FAILED and inst.ready_once \
            and reason not in (REPLACED, SHUTDOWN)
        if inst.watch and inst.watch is not asyncio.current_task():
            inst.watch.cancel()
        await asyncio.gather(*(self.peers.call(r.url, "POST", "/shoal/peer/stop",
                                               {"instance": inst.id, "reason": reason},
                                               timeout=10)
                               for r in inst.ranks if r.url is not None),
                             return_exceptions=True)
        await self.node.stop_worker(reason if inst.state == InstanceState.FAILED else None)
        if heal:
            self.healer.start(inst, reason)

    async def unload(self) -> None:
        """A user's unload of this node's model: what healing placed for it, here or led
        by another node, ends too."""
        placed = self.healer.forget()
        if placed is not None:  # a copy led by another node: stopped there
            await self.healer.undo(placed, placed.model)
        await self.node.unload()

    async def stop_instance(self, reason: str = "stopped") -> None:
        if reason == "stopped":
            self.healer.forget()
        if self.instance is not None:
            await self._teardown(self.instance, reason)

    async def close(self) -> None:
        await self.healer.close()
        await self.stop_instance(SHUTDOWN)
        await self.followers.close()

