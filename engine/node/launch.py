"""A launch, typed: the POST /shoal/instances body (checked once; its 400s name the field),
the ranks it names once resolved, the lanes it runs, and the checks a placement passes
before anything starts. engine/node/cluster.py walks a launch with these."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, StrictBool, StrictInt, field_validator
from pydantic_core import PydanticCustomError

from engine.api.openai_schemas import Strict
from engine.cluster.dist_config import Backend, DistConfig
from engine.cluster.secret import write_private
from engine.cluster_records import RankPorts
from engine.errors import BadRequest, InsufficientMemory
from engine.net import free_listen_port
from engine.node.peers import Peers
from engine.node.planning import PlanInputs, best_placement, plan_from_cluster
from engine.placement.families import strategy_refusal
from engine.placement.planner import Placement
from engine.placement.validate import (
    ModelShape,
    NotEnoughMemory,
    PlacementError,
    check_pipeline,
    check_strategy,
    check_tensor,
    max_lanes,
)
from engine.platform.probes import PlatformReport
from engine.records import InstanceInfo, InstanceState, LoadReport, RankInfo

log = logging.getLogger(__name__)


class NodeRef(Strict):
    node: str  # an id, a name, host:port, or "self"
    layers: tuple[StrictInt, StrictInt] | None = None  # [start, end) for a pipeline rank


class LaunchRequest(Strict):
    """POST /shoal/instances. Without `nodes` the planner's first choice is launched."""
    model: str
    strategy: Literal["pipeline", "tensor"] = "pipeline"
    backend: Backend = "ring"
    nodes: list[NodeRef] = Field(default_factory=list)  # rank 0 first
    context: StrictInt | None = Field(default=None, ge=1)  # what the memory check plans for
    force: StrictBool = False  # launch a placement the memory check refuses, with a warning
    lanes: int | None = None  # micro-batches in flight; default: the planner's choice
    kv_bits: Literal[16, 8, 4] | None = None  # the KV's bits; default: the node's setting
    # the model as this many copies in all, each on machines of its own (engine/node/replicas.py)
    replicas: StrictInt = Field(default=1, ge=1, le=16)
    # a node that prefills the model's long prompts for it (one node alone decodes), and
    # how long a prompt's uncached part must be for that (engine/node/handover.py)
    prefill: str | None = None
    prefill_min: StrictInt | None = Field(default=None, ge=1)
    # what runs a model one node serves alone (engine/node/cpu_engine.py)
    engine: Literal["auto", "mlx", "llamacpp"] = "auto"

    @field_validator("lanes", mode="before")
    @classmethod
    def _whole(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise PydanticCustomError("lanes", "must be a whole number, not {got}",
                                      {"got": repr(v)})
        return v

    def kv(self, default: int | None) -> int | None:
        """The KV quantization this launch runs with (None: the model's 16 bits)."""
        bits = self.kv_bits if self.kv_bits is not None else default
        return None if bits in (None, 16) else bits

    def body(self, nodes: list[NodeRef] | None = None) -> dict[str, Any]:
        """As JSON, for the node a launch is handed over to."""
        out = self.model_dump(exclude_none=True)
        for name, default in (("replicas", 1), ("engine", "auto")):
            if out.get(name) == default:  # the body an older node reads too
                del out[name]
        if nodes is not None:
            out["nodes"] = [n.model_dump(exclude_none=True) for n in nodes]
        return out


@dataclass
class Rank:
    """One rank of an instance: its node, and how far it has got."""
    node: str  # the node's id
    url: str | None  # None: this node
    layers: tuple[int, int] | None = None
    progress: list[int] | None = None  # layers loaded, total, while it starts
    loaded: LoadReport | None = None  # once ready


@dataclass
class Instance:
    """A model this node runs over several nodes, as its owner."""
    id: str
    model: str
    strategy: str
    ranks: list[Rank]
    state: InstanceState = InstanceState.STARTING
    reason: str | None = None
    backend: str = "ring"
    devices: list[list[str | None]] | None = None  # jaccl: RDMA device per rank pair
    lanes: int = 1  # micro-batches a pipeline keeps in flight
    kv_bits: int | None = None  # quantized KV on every rank (8, 4; None: 16 bits)
    watch: asyncio.Task | None = field(default=None, repr=False)
    ready_once: bool = False  # it served: a failure after that is healed, not a launch's
    warning: str | None = None  # what the user should know about how it runs
    load_s: float | None = None  # how long its launch took, start to ready

    def info(self) -> InstanceInfo:
        return InstanceInfo(self.id, self.model, self.strategy, self.state, self.reason,
                            [RankInfo(i, r.node, list(r.layers) if r.layers else None,
                                      r.progress, r.loaded) for i, r in enumerate(self.ranks)],
                            lanes=self.lanes, kv_bits=self.kv_bits or 16,
                            warning=self.warning)

def choose_lanes(lanes: int | None, strategy: str, hosts: list[str], predicted: int,
                 max_streams: int) -> int:
    """The micro-batches a launch's pipeline keeps in flight: the body's "lanes" (1 to one
    per rank), else the planner's choice for the placement. Ranks on one machine (the same
    host) get one lane unless asked: they share its memory bus, so their steps at once
    don't gain (docs/benchmarks.md, "Pipeline lanes"). A node with --max-streams 1 runs a
    group one request at a time, so there is nothing to split."""
    top = max_lanes(strategy, len(hosts))
    if lanes is None:
        shared = len(set(hosts)) < len(hosts)
        return 1 if strategy != "pipeline" or shared or max_streams < 2 else predicted
    if not 1 <= lanes <= top:
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


def check_placement(config: dict[str, Any], strategy: str, ranks: list[Rank]) -> None:
    """The family rule, then the layer ranges (pipeline) or the heads' split (tensor), as
    the planner checks them: a BadRequest that says why the placement can't run."""
    from engine.modelconfig import capabilities
    if "generate" not in capabilities(config):
        raise BadRequest("This is an embedding or reranker model: it runs on one node, beside "
                         "the chat model, started by the first request that names it (POST "
                         "/v1/embeddings or /v1/rerank); it isn't split over nodes.",
                         param="model")
    shape, mtype = model_shape(config)
    try:
        check_strategy(mtype, strategy)
        if strategy == "pipeline":
            check_pipeline([list(r.layers or ()) for r in ranks], shape.layers)
        else:
            if any(r.layers not in (None, (0, shape.layers)) for r in ranks):
                raise PlacementError(f"tensor ranks hold a slice of every layer: leave "
                                     f"out 'layers' (or give [0, {shape.layers}])")
            check_tensor(shape, len(ranks), mtype)
    except PlacementError as e:
        raise BadRequest(f"This placement can't run: {e}.", param="nodes") from None


def first_choice(inputs: PlanInputs, req: LaunchRequest, me: str) -> Placement:
    """The placement a launch without nodes takes: the planner's best (rank 0 here where
    it can be), or InsufficientMemory with the planner's reasons."""
    report = plan_from_cluster(**inputs, context=req.context, model_name=req.model,
                               kv_bits=req.kv(None))
    best = best_placement(report.placements, me)
    if best is None:
        why = "; ".join(r.reason for r in report.rejections[:3]) or "no node can hold it"
        raise InsufficientMemory(f"{req.model} fits no placement on this cluster: {why}",
                                 param="model")
    return report.placements[best]


def planned_request(req: LaunchRequest, chosen: Placement) -> LaunchRequest:
    """A launch without nodes as the planner placed it: every rank with its layers, so
    the body stays launchable on whichever node it is handed to."""
    strategy = "tensor" if chosen.strategy == "tensor" else "pipeline"
    return req.model_copy(update={"strategy": strategy, "backend": "ring",
                                  "nodes": [NodeRef(node=r.node, layers=r.layers)
                                            for r in chosen.ranks]})


def handed_over(req: LaunchRequest, ranks: list[Rank]) -> dict[str, Any]:
    """The body a launch whose rank 0 lives on another node is handed over with: each
    node by its id, layers and all (that node checks it as this one did)."""
    return req.body([n.model_copy(update={"node": r.node})
                     for n, r in zip(req.nodes, ranks)])


def resolve_ranks(req: LaunchRequest, me: tuple[str, str], peers: Peers) -> list[Rank]:
    """The nodes a launch names, each found as this node (`me`: its id and name) or among
    its trusted peers; a 400 names the entry that can't be used and why."""
    ranks: list[Rank] = []
    for i, n in enumerate(req.nodes):
        ref, where = n.node, f"nodes[{i}].node"
        if ref in ("self", *me):
            nid, url = me[0], None
        else:
            peer = peers.find(ref)
            if peer is not None and peer.reachable and not peer.trusted:
                raise BadRequest(f"nodes[{i}]: '{ref}' is not in this cluster (it holds "
                                 "another cluster secret).", param=where)
            if peer is not None and peer.trusted and peer.warning:
                raise BadRequest(f"nodes[{i}]: '{ref}' {peer.warning}.", param=where)
            if peer is None or not peer.reachable or not peer.id:
                known = ", ".join(p.name or p.url for p in peers.all()) or "none"
                raise BadRequest(f"nodes[{i}]: no reachable node '{ref}' (known peers: "
                                 f"{known}).", param=where)
            nid, url = peer.id, peer.url
        if any(r.node == nid for r in ranks):
            raise BadRequest(f"nodes[{i}]: node '{ref}' is listed twice.", param=where)
        # one node alone holds every layer: there is nothing to split
        if req.strategy == "pipeline" and n.layers is None and len(req.nodes) > 1:
            raise BadRequest(f"nodes[{i}] needs 'layers': [start, end] for pipeline.",
                             param=f"nodes[{i}].layers")
        ranks.append(Rank(nid, url, n.layers))
    return ranks


def memory_check(inputs: PlanInputs, req: LaunchRequest, strategy: str, ranks: list[Rank],
                 chosen: Placement | None) -> tuple[str | None, int]:
    """Refuse a placement that would swap, with the numbers, unless forced (then the
    numbers come back as a warning). Also the lanes the planner predicts best. The
    planner's own choice has passed already: its figures are used as they are."""
    if chosen is None:
        layout = (strategy, "ring",
                  [{"node": r.node, **({"layers": list(r.layers)} if r.layers else {})}
                   for r in ranks])
        try:
            report = plan_from_cluster(**inputs, context=req.context, model_name=req.model,
                                       force=req.force, layout=layout, kv_bits=req.kv(None))
        except NotEnoughMemory as e:
            raise InsufficientMemory(f"{e}. Choose other nodes or a shorter context, or "
                                     "launch with \"force\": true to try anyway.",
                                     param="nodes") from None
        except PlacementError as e:
            log.info("memory check skipped: %s", e)
            return None, 1
        if not report.placements:
            return None, 1
        chosen = report.placements[0]
    return "; ".join(chosen.warnings) or None, chosen.prediction.lanes


def rdma_matrix(ranks: list[Rank], backend: str,
                platforms: Mapping[str, PlatformReport | None]) -> list[list[str | None]]:
    """The jaccl device matrix from every rank node's Thunderbolt and RDMA report, or
    BadRequest naming the pair that lacks a cable or RDMA."""
    from engine.platform.rdma import device_matrix
    from engine.platform.thunderbolt import cable_graph
    reports = {node: p or PlatformReport.from_json(None) for node, p in platforms.items()}
    m = device_matrix([r.node for r in ranks],
                      cable_graph({k: v.thunderbolt for k, v in reports.items()}),
                      {k: v.rdma for k, v in reports.items()}, ring=backend == "jaccl-ring")
    if not m.ok:
        raise BadRequest(f"{backend} can't run on these nodes: {'; '.join(m.problems)}. "
                         "Use the ring backend (TCP).", param="backend")
    return [list(row) for row in m.matrix or []]


INSTANCE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a launch makes 12 hex digits


def check_instance_id(inst_id: object) -> str:
    """An instance id from another node, before it names a file or a folder: a 400 for
    anything but letters, digits, '-' and '_' (no path, no '..')."""
    if not isinstance(inst_id, str) or not INSTANCE_ID.fullmatch(inst_id):
        raise BadRequest(f"'instance' must be an instance id (letters, digits, - and _, "
                         f"at most 64), not {str(inst_id)[:80]!r}.", param="instance")
    return inst_id


def write_config(home: Path, inst_id: str, cfg: DistConfig) -> Path:
    """The rank's config file, which its worker reads (engine/cluster/dist_config.py)."""
    folder = home / "instances" / check_instance_id(inst_id)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"rank{cfg.rank}.json"
    write_private(path, json.dumps(cfg.to_json(), indent=1))  # it holds the group's token
    return path


def free_port(host: str) -> int:
    return free_listen_port(host)


def fresh_ports(host: str) -> RankPorts:
    """A rank's two fresh ports on `host`: MLX's ring and the group's doorbell."""
    return RankPorts(host, [free_port(host), free_port(host)])


def host_of(url: str) -> str:
    return url.split("://", 1)[-1].rsplit(":", 1)[0]
