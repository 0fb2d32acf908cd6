"""Distributed instances: one model across several nodes.

The node that owns an instance holds rank 0 and serves its requests; the others run
follower workers. The owner validates the placement before anything starts, gathers a
fresh pair of ports from every node (MLX ring + doorbell; every instance gets its own),
starts all ranks, and watches them: any rank or node that fails tears the whole instance
down, with the reason, on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, cast

from engine import __version__
from engine.errors import BadRequest, InsufficientMemory, PeerUnreachable, ShoalError, WorkerFailed
from engine.node.peers import Peers
from engine.node.planning import best_placement, cluster_view, plan_from_cluster
from engine.node.service import Node
from engine.node.state import Loading
from engine.node.worker_handle import WorkerHandle
from engine.paths import logs_dir
from engine.placement.families import strategy_refusal
from engine.placement.validate import (
    STRATEGIES,
    ModelShape,
    NotEnoughMemory,
    PlacementError,
    check_pipeline,
    check_strategy,
    check_tensor,
    max_lanes,
)
from engine.protocol import ENDED, ClusterInfo, FollowerInfo, InstanceInfo, InstanceState, RankInfo
from engine.telemetry.versions import mlx_version

log = logging.getLogger(__name__)
BACKENDS = ("ring", "jaccl", "jaccl-ring")
WATCH_S = 2.0
GONE_S = 6.0  # a rank's node silent this long is gone (liveness within 10 s)


@dataclass
class Follower:
    """A rank this node runs for an instance owned elsewhere."""
    instance: str
    owner_url: str
    rank: int
    worker: WorkerHandle | None = None
    state: InstanceState = InstanceState.STARTING
    reason: str | None = None
    progress: list[int] = field(default_factory=lambda: [0, 0])  # layers loaded, total
    loaded: dict[str, Any] | None = None  # the rank's load report, once ready


def load_report(extra: dict[str, Any]) -> dict[str, Any]:
    """What a rank read to load its share, from its ready message."""
    return {k: extra.get(k) for k in ("files", "bytes_read", "peak_rss")}


@dataclass
class Instance:
    id: str
    model: str
    strategy: str
    ranks: list[dict[str, Any]]  # {"node", "url" (None = self), "layers"}
    state: InstanceState = InstanceState.STARTING
    reason: str | None = None
    backend: str = "ring"
    devices: list[list[str | None]] | None = None  # jaccl: RDMA device per rank pair
    lanes: int = 1  # micro-batches a pipeline keeps in flight
    watch: asyncio.Task | None = field(default=None, repr=False)

    def info(self) -> InstanceInfo:
        return InstanceInfo(self.id, self.model, self.strategy, self.state, self.reason,
                            [RankInfo(i, r["node"], r.get("layers"), r.get("progress"),
                                      r.get("loaded")) for i, r in enumerate(self.ranks)],
                            lanes=self.lanes)

    def public(self) -> dict[str, Any]:
        return self.info().to_json()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _prefix_budget(path: Path) -> int:
    """The prefix cache budget every rank of a group shares (the planner counts it)."""
    from engine.runtime.checkpoint import model_context, read_config
    from engine.runtime.prefix import default_budget
    return default_budget(model_context(read_config(path)))


def choose_lanes(body: dict[str, Any], strategy: str, hosts: list[str], predicted: int,
                 max_streams: int) -> int:
    """The micro-batches a launch's pipeline keeps in flight: the body's "lanes" (1 to one
    per rank), else the planner's choice for the placement. Ranks on one machine (the same
    host) get one lane unless asked: they share its memory bus, so their steps at once
    don't gain (docs/benchmarks.md, "Pipeline lanes"). A node with --max-streams 1 runs a
    group one request at a time, so there is nothing to split."""
    lanes = body.get("lanes")
    top = max_lanes(strategy, len(hosts))
    if lanes is None:
        shared = len(set(hosts)) < len(hosts)
        return 1 if strategy != "pipeline" or shared or max_streams < 2 else predicted
    if isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= top:
        raise BadRequest(f"'lanes' must be a whole number from 1 to {top} for this "
                         f"{strategy} placement (one per rank at most; tensor ranks run "
                         f"every step together), not {lanes!r}.", param="lanes")
    if lanes > 1 and max_streams < 2:
        raise BadRequest("'lanes' needs a node that decodes several requests at once; this "
                         "one runs with --max-streams 1.", param="lanes")
    return lanes


def model_shape(config: dict[str, Any]) -> tuple[ModelShape, str]:
    cfg = config.get("text_config", config)
    heads = int(cfg.get("num_attention_heads", 0))
    mtype = str(config.get("model_type", "?"))
    return ModelShape(layers=int(cfg.get("num_hidden_layers", 0)), heads=heads,
                      kv_heads=int(cfg.get("num_key_value_heads") or heads),
                      has_shard=strategy_refusal(mtype, "tensor") is None,
                      vocab=int(cfg.get("vocab_size") or 0),
                      tied=bool(cfg.get("tie_word_embeddings",
                                        config.get("tie_word_embeddings", False)))), mtype


class Cluster:
    def __init__(self, node: Node, node_id: str, node_name: str, peers: Peers, host: str):
        self.node = node
        self.id = node_id
        self.name = node_name
        self.peers = peers
        self.host = host
        self.instance: Instance | None = None
        self.followers: dict[str, Follower] = {}
        self.facts: Any = None  # engine.node.facts.NodeFacts, set by the node's main

    # --- what other nodes and the GUI see ----------------------------------------------
    def links(self) -> list[dict[str, Any]]:
        """This node's measured links to its trusted peers."""
        return [{"to": p.id, "url": p.url, **{k: v for k, v in p.link.items() if k != "at"}}
                for p in self.peers.all() if p.trusted and p.link]

    def info(self) -> dict[str, Any]:
        """This node as GET /shoal/node describes it (peers keep it as their `info`)."""
        return {**self.describe(), "version": __version__, "mlx_version": mlx_version(),
                "state": self.node.status()["state"],
                "models": [m.id for m in self.node.local_models()],
                "links": self.links(), **(self.facts.describe() if self.facts else {})}

    def plan_infos(self) -> list[dict[str, Any]]:
        """What the planner may use: this node first, then trusted compatible peers."""
        return [self.info()] + [p.info for p in self.peers.all()
                                if p.trusted and not p.warning]

    def model_config(self, model: str) -> dict[str, Any]:
        return json.loads((self.node.resolve(model) / "config.json").read_text())

    def model_facts(self, model: str) -> dict[str, Any]:
        """plan_from_cluster's model inputs: config.json, the weights' bytes in memory and
        the context, read from the checkpoint here."""
        from engine.runtime.checkpoint import memory_bytes, model_context
        path = self.node.resolve(model)
        config = self.model_config(model)
        return {"model_config": config, "weight_bytes": memory_bytes(path, config),
                "model_context": model_context(config)}

    def plan_inputs(self, model: str) -> dict[str, Any]:
        """plan_from_cluster's node_infos, links and model facts for `model` here."""
        view = cluster_view(self.plan_infos())
        return {"node_infos": view["nodes"], "links": view["links"],
                **self.model_facts(model)}

    def describe(self) -> dict[str, Any]:
        instances = [self.instance.info()] if self.instance else []
        run = self.node.runner
        if instances and isinstance(run, Loading) and run.model == instances[0].model:
            first = replace(instances[0].ranks[0], progress=[run.layers_done,
                                                             run.layers_total])
            instances[0] = replace(instances[0], ranks=[first, *instances[0].ranks[1:]])
        return ClusterInfo(self.id, self.name, instances,
                           [FollowerInfo(f.instance, f.rank, f.state, f.reason, f.progress)
                            for f in self.followers.values()]).to_json()

    def remote_instances(self) -> list[tuple[str, dict[str, Any]]]:
        """(owner URL, instance) for every ready instance a trusted peer owns."""
        return [(p.url, inst) for p in self.peers.all() if p.trusted
                for inst in p.info.get("instances") or []
                if inst.get("state") == InstanceState.READY]

    def owner_of(self, model: str) -> str | None:
        """URL of the peer that serves `model` as a distributed instance, if any."""
        return next((url for url, inst in self.remote_instances()
                     if inst.get("model") == model), None)

    # --- launching (owner side) ----------------------------------------------------------
    async def launch(self, body: Any) -> dict[str, Any]:
        if isinstance(body, dict) and isinstance(body.get("model"), str) \
                and not body.get("nodes"):
            body = {**body, **self._best_placement(body)}  # the planner's first choice
        model, strategy, ranks = self._parse(body)
        if len(ranks) == 1:  # one node: a plain single-process model there
            if ranks[0]["url"] is not None:
                return await self.peers.call(ranks[0]["url"], "POST", "/shoal/instances",
                                             {**body, "nodes": [{"node": "self"}]},
                                             timeout=900)
            self._check_memory(body, model, "pipeline", ranks)
            choose_lanes(body, "pipeline", [self.host], 1, 1)  # one process: one batch
            await self.node.check_model(self.node.resolve(model))  # before anything stops
            await self.stop_instance("replaced by a new launch")
            await self.node.start_worker(model, self.node.resolve(model))
            return InstanceInfo(None, model, "single", InstanceState.READY, None,
                                [RankInfo(0, self.id)]).to_json()
        if ranks[0]["url"] is not None:  # rank 0 lives on its owner: hand the job over
            return await self.peers.call(ranks[0]["url"], "POST", "/shoal/instances",
                                         {**body, "nodes": [
                                             {**n, "node": r["node"]} for n, r in
                                             zip(body["nodes"], ranks)]}, timeout=900)
        path = self.node.resolve(model)
        await self.node.check_model(path, all_files=strategy == "tensor")
        backend = body.get("backend", "ring")
        rdma = self._rdma_matrix(ranks, backend) if backend != "ring" else None
        shape, mtype = model_shape(json.loads((path / "config.json").read_text()))
        try:
            check_strategy(mtype, strategy)  # the same rule as the planner's
            if strategy == "pipeline":
                check_pipeline([r["layers"] for r in ranks], shape.layers)
            else:
                if any(r["layers"] not in (None, [0, shape.layers]) for r in ranks):
                    raise PlacementError(f"tensor ranks hold a slice of every layer: leave "
                                         f"out 'layers' (or give [0, {shape.layers}])")
                check_tensor(shape, len(ranks), mtype)
        except PlacementError as e:
            raise BadRequest(f"This placement can't run: {e}.", param="nodes") from None
        warning, predicted = self._check_memory(body, model, strategy, ranks)
        hosts = [self.host if r["url"] is None else _host_of(r["url"]) for r in ranks]
        lanes = choose_lanes(body, strategy, hosts, predicted, self.node.max_streams)
        if lanes != predicted:
            log.info("%s runs %d lane(s), the planner predicted %d best", model, lanes,
                     predicted)
        await self.stop_instance("replaced by a new launch")
        inst = Instance(uuid.uuid4().hex[:12], model, strategy, ranks)
        inst.backend, inst.devices, inst.lanes = backend, rdma, lanes
        self.instance = inst
        try:
            await self._start(inst, path)
        except BaseException as e:
            reason = e.message if isinstance(e, ShoalError) else f"launch failed: {e}"
            await self._teardown(inst, reason)
            raise
        inst.state = InstanceState.READY
        inst.watch = asyncio.create_task(self._watch(inst))
        return {**inst.public(), **({"warning": warning} if warning else {})}

    def _best_placement(self, body: dict[str, Any]) -> dict[str, Any]:
        """strategy/backend/nodes of the best feasible placement for body["model"]."""
        model = body["model"]
        report = plan_from_cluster(**self.plan_inputs(model), context=body.get("context"),
                                   model_name=model)
        best = best_placement(report.placements, self.id)
        if best is None:
            why = "; ".join(r.reason for r in report.rejections[:3]) or "no node can hold it"
            raise InsufficientMemory(f"{model} fits no placement on this cluster: "
                                     f"{why}", param="model")
        launch = report.placements[best].to_launch(model)
        return {"strategy": launch["strategy"], "backend": "ring", "nodes": launch["nodes"]}

    def _check_memory(self, body: dict[str, Any], model: str, strategy: str,
                      ranks: list[dict[str, Any]]) -> tuple[str | None, int]:
        """Refuse a placement that would swap, with the numbers, unless forced (then the
        numbers come back as a warning). Also the lanes the planner predicts best."""
        layout = (strategy, "ring",
                  [{"node": r["node"], **({"layers": r["layers"]} if r["layers"] else {})}
                   for r in ranks])
        force = bool(body.get("force"))
        try:
            report = plan_from_cluster(**self.plan_inputs(model), context=body.get("context"),
                                       model_name=model, force=force, layout=layout)
        except NotEnoughMemory as e:
            raise InsufficientMemory(f"{e}. Choose other nodes or a shorter context, or "
                                     "launch with \"force\": true to try anyway.",
                                     param="nodes") from None
        except PlacementError as e:
            log.info("memory check skipped: %s", e)
            return None, 1
        warnings = [w for p in report.placements for w in getattr(p, "warnings", ())]
        lanes = report.placements[0].prediction.lanes if report.placements else 1
        return "; ".join(warnings) or None, lanes

    def _rdma_matrix(self, ranks: list[dict[str, Any]], backend: str
                     ) -> list[list[str | None]]:
        """The jaccl device matrix from every rank node's Thunderbolt and RDMA report, or
        BadRequest naming the pair that lacks a cable or RDMA."""
        from engine.cluster.probes import PlatformReport
        from engine.cluster.rdma import device_matrix
        from engine.cluster.thunderbolt import cable_graph
        reports = {}
        for r in ranks:
            if r["url"] is None:
                plat = self.facts.platform.to_dict() if self.facts and self.facts.platform \
                    else None
            else:
                peer = self.peers.find(r["url"])
                plat = peer.info.get("platform") if peer else None
            reports[r["node"]] = PlatformReport.from_dict(plat)
        m = device_matrix([r["node"] for r in ranks],
                          cable_graph({k: v.thunderbolt for k, v in reports.items()}),
                          {k: v.rdma for k, v in reports.items()},
                          ring=backend == "jaccl-ring")
        if not m.ok:
            raise BadRequest(f"{backend} can't run on these nodes: "
                             f"{'; '.join(m.problems)}. Use the ring backend (TCP).",
                             param="backend")
        return [list(row) for row in m.matrix or []]

    def _parse(self, body: Any) -> tuple[str, str, list[dict[str, Any]]]:
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise BadRequest("Send {\"model\", \"strategy\", \"nodes\": [{\"node\", "
                             "\"layers\"}, ...]}.", param="model")
        strategy = body.get("strategy", "pipeline")
        if strategy not in STRATEGIES:
            raise BadRequest(f"strategy must be one of {', '.join(STRATEGIES)}.",
                             param="strategy")
        if body.get("backend", "ring") not in BACKENDS:
            raise BadRequest(f"backend must be one of {', '.join(BACKENDS)}.",
                             param="backend")
        nodes = body.get("nodes")
        if not isinstance(nodes, list) or not nodes:
            raise BadRequest("'nodes' must list the nodes of the instance, rank 0 first.",
                             param="nodes")
        ranks, seen = [], set()
        for i, n in enumerate(nodes):
            ref = n.get("node") if isinstance(n, dict) else None
            if not isinstance(ref, str):
                raise BadRequest(f"nodes[{i}] needs a 'node' (id, name or host:port).",
                                 param=f"nodes[{i}].node")
            if ref in ("self", self.id, self.name):
                nid, url = self.id, None
            else:
                peer = self.peers.find(ref)
                if peer is not None and peer.reachable and not peer.trusted:
                    raise BadRequest(f"nodes[{i}]: '{ref}' is not in this cluster (it holds "
                                     "another cluster secret).", param=f"nodes[{i}].node")
                if peer is not None and peer.trusted and peer.warning:
                    raise BadRequest(f"nodes[{i}]: '{ref}' {peer.warning}.",
                                     param=f"nodes[{i}].node")
                if peer is None or not peer.reachable or not peer.id:
                    known = ", ".join(p.name or p.url for p in self.peers.all()) or "none"
                    raise BadRequest(f"nodes[{i}]: no reachable node '{ref}' (known peers: "
                                     f"{known}).", param=f"nodes[{i}].node")
                nid, url = peer.id, peer.url
            if nid in seen:
                raise BadRequest(f"nodes[{i}]: node '{ref}' is listed twice.",
                                 param=f"nodes[{i}].node")
            seen.add(nid)
            layers = n.get("layers")
            if strategy == "pipeline" and layers is None:
                raise BadRequest(f"nodes[{i}] needs 'layers': [start, end] for pipeline.",
                                 param=f"nodes[{i}].layers")
            ranks.append({"node": nid, "url": url, "layers": layers})
        return body["model"], strategy, ranks

    async def _start(self, inst: Instance, path: Path) -> None:
        # 1. every node checks the model and hands out two fresh ports
        preps = await asyncio.gather(*(
            self._prepare_local(inst) if r["url"] is None else
            self.peers.call(r["url"], "POST", "/shoal/peer/prepare",
                            {"instance": inst.id, "model": inst.model,
                             "host": _host_of(r["url"])}, timeout=30)
            for r in inst.ranks), return_exceptions=True)
        for r, p in zip(inst.ranks, preps):
            if isinstance(p, BaseException):
                raise _blame(r, p)
        got = cast(list[dict[str, Any]], preps)  # no exceptions past this point
        base = {"world": len(inst.ranks), "backend": inst.backend, "strategy": inst.strategy,
                **({"devices": inst.devices, "coordinator":
                    f"{got[0]['host']}:{got[0]['ports'][0]}"} if inst.devices else {}),
                "hosts": [f"{p['host']}:{p['ports'][0]}" for p in got],
                "bells": [f"{p['host']}:{p['ports'][1]}" for p in got],
                "layers": [r["layers"] for r in inst.ranks]
                if inst.strategy == "pipeline" else [],
                # one token or one 2048-token prefill chunk round the whole group
                "timeout_s": 120, "prefix_cache_tokens": _prefix_budget(path),
                "lanes": inst.lanes}
        # 2. start every rank at once (MLX's init needs them all)
        starts = [self.peers.call(r["url"], "POST", "/shoal/peer/start",
                                  {"instance": inst.id, "model": inst.model,
                                   "owner": self._my_url_for(r["url"]),
                                   "config": {**base, "rank": i}}, timeout=30)
                  for i, r in enumerate(inst.ranks) if r["url"] is not None]
        results = await asyncio.gather(self._start_rank0(inst, path, {**base, "rank": 0}),
                                       *starts, return_exceptions=True)
        for r, res in zip(inst.ranks, results):
            if isinstance(res, BaseException):
                raise _blame(r, res)
        # 3. wait until every follower has loaded its shard
        await asyncio.gather(*(self._await_follower(inst, i, r)
                               for i, r in enumerate(inst.ranks) if r["url"] is not None))

    async def _prepare_local(self, inst: Instance) -> dict[str, Any]:
        self.node.resolve(inst.model)
        return {"host": self.host, "ports": [free_port(self.host), free_port(self.host)]}

    async def _start_rank0(self, inst: Instance, path: Path, config: dict) -> None:
        cfg = self._write_config(inst.id, config)
        w = await self.node.start_worker(inst.model, path, dist_config=cfg)
        if w.ready is not None:
            inst.ranks[0]["loaded"] = load_report(w.ready.extra)

    async def _await_follower(self, inst: Instance, i: int, r: dict[str, Any],
                              timeout: float = 900) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = await self._follower_state(r["url"], inst.id)
            r["progress"] = st.get("progress")  # shown per rank while the instance starts
            if st["state"] == InstanceState.READY:
                r["loaded"] = st.get("loaded")
                return
            if st["state"] in ENDED:
                raise WorkerFailed(f"rank {i} on node {r['node']} failed: {st.get('reason')}")
            await asyncio.sleep(0.2)
        raise WorkerFailed(f"rank {i} on node {r['node']} did not load within {timeout:.0f} s")

    async def _follower_state(self, url: str, inst_id: str) -> dict[str, Any]:
        return await self.peers.call(url, "GET", f"/shoal/peer/instances/{inst_id}",
                                     timeout=WATCH_S * 2)

    def _my_url_for(self, peer_url: str | None) -> str:
        return f"http://{self.host}:{self.node.port}"

    def _write_config(self, inst_id: str, config: dict[str, Any]) -> Path:
        folder = self.node.home / "instances" / inst_id
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"rank{config['rank']}.json"
        path.write_text(json.dumps(config, indent=1))
        return path

    # --- watching and tearing down -------------------------------------------------------
    async def _watch(self, inst: Instance) -> None:
        heard = {r["url"]: time.monotonic() for r in inst.ranks if r["url"]}  # last answer
        while self.instance is inst and inst.state == InstanceState.READY:
            await asyncio.sleep(WATCH_S)
            w = self.node.worker
            if w is None or not w.alive:
                reason = (w.dead_reason if w else None) or "rank 0 stopped"
                await self._teardown(inst, reason)
                return
            for i, r in enumerate(inst.ranks):
                if r["url"] is None:
                    continue
                try:
                    st = await self._follower_state(r["url"], inst.id)
                    heard[r["url"]] = time.monotonic()
                except ShoalError:
                    # silent since its last answer, not since the first failed poll
                    if time.monotonic() - heard[r["url"]] >= GONE_S:
                        await self._teardown(inst, f"node {r['node']} (rank {i}) stopped "
                                             f"answering")
                        return
                    continue
                if st["state"] != InstanceState.READY:
                    await self._teardown(inst, f"rank {i} on node {r['node']} "
                                         f"{st['state']}: {st.get('reason')}")
                    return

    async def peer_failed(self, inst_id: str, reason: str) -> None:
        if self.instance and self.instance.id == inst_id:
            await self._teardown(self.instance, reason)

    async def _teardown(self, inst: Instance, reason: str) -> None:
        if inst.state in ENDED:
            return
        inst.state = InstanceState.STOPPED if reason == "stopped" else InstanceState.FAILED
        inst.reason = reason
        log.warning("instance %s of %s ends: %s", inst.id, inst.model, reason)
        if inst.watch and inst.watch is not asyncio.current_task():
            inst.watch.cancel()
        await asyncio.gather(*(self.peers.call(r["url"], "POST", "/shoal/peer/stop",
                                               {"instance": inst.id, "reason": reason},
                                               timeout=10)
                               for r in inst.ranks if r["url"] is not None),
                             return_exceptions=True)
        await self.node.stop_worker(reason if inst.state == InstanceState.FAILED else None)

    async def stop_instance(self, reason: str = "stopped") -> None:
        if self.instance is not None:
            await self._teardown(self.instance, reason)

    # --- follower side -------------------------------------------------------------------
    async def prepare(self, body: dict[str, Any]) -> dict[str, Any]:
        await self.node.check_model(self.node.resolve(str(body.get("model"))), all_files=False)
        host = str(body.get("host") or self.host)
        return {"host": host, "ports": [free_port(host), free_port(host)]}

    async def start_follower(self, body: dict[str, Any]) -> dict[str, Any]:
        inst_id, config = str(body["instance"]), body["config"]
        path = self.node.resolve(str(body["model"]))
        old = self.followers.pop(inst_id, None)
        if old and old.worker:
            await old.worker.stop()
        f = Follower(inst_id, str(body["owner"]), int(config["rank"]))
        for old_id in [k for k, v in self.followers.items() if v.state in ENDED][:-4]:
            del self.followers[old_id]  # keep only the last few ended ones, for their reasons
        self.followers[inst_id] = f
        cfg = self._write_config(inst_id, config)
        f.worker = WorkerHandle(str(body["model"]), path,
                                logs_dir(self.node.home) / f"worker-{inst_id}.log",
                                lambda ev: self._on_follower_event(f, ev),
                                dist_config=cfg)
        task = asyncio.create_task(self._run_follower(f))
        self.node.keep(task)
        return {"ok": True}

    async def _run_follower(self, f: Follower) -> None:
        assert f.worker
        try:
            ready = await f.worker.start()
            f.state, f.loaded = InstanceState.READY, load_report(ready.extra)
        except ShoalError as e:
            f.state, f.reason = InstanceState.FAILED, e.message

    def _on_follower_event(self, f: Follower, ev: dict[str, Any]) -> None:
        if ev["ev"] == "exited" and f.state != InstanceState.STOPPED:
            # the worker's own reason, where it gave one, says more than its exit
            f.state, f.reason = InstanceState.FAILED, f.reason or ev.get("reason")
            task = asyncio.get_running_loop().create_task(self._tell_owner(f))
            self.node.keep(task)
        elif ev["ev"] == "fatal":
            f.reason = ev.get("message")
        elif ev["ev"] == "loading":
            f.progress = [int(ev.get("done", 0)), int(ev.get("total", 0))]

    async def _tell_owner(self, f: Follower) -> None:
        with contextlib.suppress(ShoalError):
            await self.peers.call(f.owner_url, "POST", "/shoal/peer/failed",
                                  {"instance": f.instance,
                                   "reason": f"rank {f.rank} on node {self.name}: {f.reason}"},
                                  timeout=5)

    def follower_state(self, inst_id: str) -> dict[str, Any]:
        f = self.followers.get(inst_id)
        if f is None:
            return {"state": InstanceState.STOPPED, "reason": "this node runs no such instance"}
        return {"state": f.state, "reason": f.reason, "rank": f.rank, "progress": f.progress,
                "loaded": f.loaded}

    async def stop_follower(self, inst_id: str, reason: str) -> None:
        f = self.followers.get(inst_id)
        if f is not None:
            f.state, f.reason = InstanceState.STOPPED, reason
            if f.worker:
                f.worker.dead_reason = "stopped"
                await f.worker.stop()

    async def close(self) -> None:
        await self.stop_instance("the owner node is shutting down")
        for inst_id in list(self.followers):
            await self.stop_follower(inst_id, "the node is shutting down")


def _host_of(url: str) -> str:
    return url.split("://", 1)[-1].rsplit(":", 1)[0]


def _blame(rank: dict[str, Any], e: BaseException) -> ShoalError:
    where = f"node {rank['node']}"
    if isinstance(e, ShoalError):
        err = ShoalError(f"{where}: {e.message}", param=e.param, code=e.code)
        err.status, err.type = (e.status if e.status < 500 else 502), e.type
        return err
    return PeerUnreachable(f"{where}: {e}")
