"""The cluster's records: what an instance's owner and its ranks' nodes tell each other
(/shoal/peer/...), the cluster's map (GET /shoal/topology) and the planner's placements
(POST /shoal/plan), each a frozen Record of engine/records.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from engine.cluster.dist_config import DistConfig
from engine.platform.probes import PlatformReport
from engine.records import (
    DraftInfo,
    FollowerInfo,
    InstanceInfo,
    InstanceState,
    LinkInfo,
    LoadReport,
    MachineInfo,
    NodeInfo,
    NodeState,
    PeerInfo,
    PeerLink,
    PowerInfo,
    Record,
    ServingInfo,
    SpeedInfo,
)


@dataclass(frozen=True)
class RankPrepare(Record):
    """POST /shoal/peer/prepare: check a model's files for a rank, on the host the owner
    reaches this node at (None: the node's own)."""
    instance: str
    model: str
    host: str | None = None


@dataclass(frozen=True)
class RankPorts(Record):
    """The prepare's answer: the host a rank listens on and its two fresh ports."""
    host: str
    ports: list[int]  # MLX's ring, the group's doorbell

    @property
    def ring(self) -> str:
        return f"{self.host}:{self.ports[0]}"

    @property
    def bell(self) -> str:
        return f"{self.host}:{self.ports[1]}"


@dataclass(frozen=True)
class RankStart(Record):
    """POST /shoal/peer/start: run rank config.rank of an instance `owner` runs."""
    singles = {"config": DistConfig}
    instance: str
    model: str
    owner: str  # the owner's URL, told when the rank fails
    config: DistConfig


@dataclass(frozen=True)
class FollowerState(Record):
    """GET /shoal/peer/instances/{id}: a rank as the node running it for another sees it
    (what the owner's watch reads)."""
    singles = {"loaded": LoadReport}
    states = {"state": InstanceState}
    optional = ("rank", "progress", "loaded")
    state: InstanceState
    reason: str | None = None
    rank: int | None = None
    progress: list[int] | None = None  # layers loaded, total
    loaded: LoadReport | None = None  # once ready


# --- the map and the plans ------------------------------------------------------------------
@dataclass(frozen=True)
class TopologyNode(Record):
    """A node in GET /shoal/topology: what it says of itself (NodeInfo's fields) and what
    this node's peer list knows of it (PeerInfo's). This node's entry ("self") has only the
    first; a peer that never described itself (not reached, or not in the cluster: its
    state None) only the second."""
    nested = NodeInfo.nested
    singles = {**NodeInfo.singles, "link": PeerLink}
    states = NodeInfo.states
    optional = NodeInfo.optional
    id: str | None = None
    name: str | None = None
    instances: list[InstanceInfo] = field(default_factory=list)
    followers: list[FollowerInfo] = field(default_factory=list)
    version: str | None = None
    mlx_version: str | None = None
    state: NodeState | None = None
    models: list[str] = field(default_factory=list)
    links: list[LinkInfo] = field(default_factory=list)
    machine: MachineInfo | None = None
    speed: SpeedInfo = field(default_factory=SpeedInfo)
    platform: PlatformReport | None = None
    power: PowerInfo | None = None
    draft: DraftInfo | None = None
    serving: ServingInfo | None = None  # the replica it answers for, if any
    url: str | None = None  # None for this node
    reachable: bool = False
    trusted: bool = False
    error: str | None = None
    warning: str | None = None
    link: PeerLink | None = None  # this node's measurement of it (None for itself)
    seen_s_ago: float | None = None
    self: bool = False  # the node that answered

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        # each kind of entry keeps the keys, in the order, it always had
        keys = [*_names(NodeInfo), "self", "reachable", "trusted"] if self.self else \
            [*_names(PeerInfo), "self"] if self.state is None else list(out)
        return {k: out[k] for k in keys if k in out}  # (an unset optional is left out)


def _names(record: type[Record]) -> list[str]:
    return [f.name for f in dataclasses.fields(record)]


@dataclass(frozen=True)
class TopologyLink(Record):
    """A measured link in GET /shoal/topology: a node's LinkInfo after the node's id."""
    from_: str | None  # "from": the node that measured it
    to: str | None
    url: str = ""
    type: str = ""
    rtt_ms: float | None = None
    bandwidth_MBps: float | None = None


@dataclass(frozen=True)
class CableInfo(Record):
    """A Thunderbolt cable between two trusted nodes, from their platform reports: the
    port and interface at each end, the negotiated speed, a dock on the way ("via"), and
    whether it carries RDMA (type "thunderbolt-rdma") or, when not, why."""
    a: str  # node ids
    b: str
    a_port: int | None  # Thunderbolt receptacle
    b_port: int | None
    a_interface: str | None  # "en2"
    b_interface: str | None
    speed: str | None  # "80 Gb/s"
    via: str | None
    type: str  # "thunderbolt-rdma" | "thunderbolt-ip"
    rdma: bool
    why: str | None


@dataclass(frozen=True)
class TopologyInfo(Record):
    """GET /shoal/topology: every node this one knows (itself first, with "self": true)
    with its machine, platform and power facts, every measured link, and the Thunderbolt
    cables between trusted nodes (each saying whether it carries RDMA and why not)."""
    nested = {"nodes": TopologyNode, "links": TopologyLink, "thunderbolt": CableInfo}
    nodes: list[TopologyNode] = field(default_factory=list)
    links: list[TopologyLink] = field(default_factory=list)
    thunderbolt: list[CableInfo] = field(default_factory=list)


@dataclass(frozen=True)
class RejectedInfo(Record):
    """A placement the planner can't run, and why."""
    strategy: str
    backend: str
    nodes: list[str]
    reason: str


@dataclass(frozen=True)
class RankMemory(Record):
    """Bytes one rank of a placement needs, by kind (the planner's MemoryUse, in
    engine/placement/memory.py), their total, and what its node can give."""
    weights: int = 0
    kv_cache: int = 0
    prefix_cache: int = 0
    activations: int = 0
    draft: int = 0  # a draft model's weights and KV, on the rank that drafts
    overhead: int = 0
    total: int = 0
    usable: int = 0


@dataclass(frozen=True)
class PlacementRank(Record):
    """One rank of a placement: its node, the layers it holds and the memory it needs."""
    singles = {"memory": RankMemory}
    node: str  # node id
    name: str
    layers: list[int]  # [start, end); every layer for tensor ranks
    memory: RankMemory


@dataclass(frozen=True)
class FirstToken(Record):
    """The predicted time to the first token of a prompt (with `cached_tokens` of it in
    the prefix cache), alone and with the placement's other streams decoding."""
    prompt_tokens: int
    cached_tokens: int
    seconds: float
    seconds_busy: float
    joules: float | None = None  # None where a node's watts are unknown


@dataclass(frozen=True)
class PlacementInfo(Record):
    """A placement the planner can run (engine/placement/planner.py's Placement): its
    ranks, rank 0 first, and what it predicts (engine/placement/cost.py's Prediction)."""
    nested = {"ttft": FirstToken, "ranks": PlacementRank}
    model: str
    strategy: str  # single | pipeline | tensor
    backend: str  # ring | jaccl
    context: int
    decode_tps: float
    decode_tps_full_context: float
    prefill_tps: float
    decode_tps_streams: float = 0.0  # `streams` sequences together
    streams: int = 1
    lanes: int = 1
    decode_tps_drafted: float = 0.0  # with drafts (0: not predicted)
    draft_tokens: int = 0
    ttft: list[FirstToken] = field(default_factory=list)
    watts: float | None = None  # None where a node's watts are unknown
    decode_j_per_token: float | None = None
    warnings: list[str] = field(default_factory=list)
    ranks: list[PlacementRank] = field(default_factory=list)
    # ranked for agents: the node id that prefills its long prompts (a launch's "prefill")
    prefill: str | None = None
    prefill_min: int | None = None  # the uncached prompt tokens from which it pays
    # each other node prefilling for it, per prompt length (engine/placement/split_prefill.py)
    split_prefill: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class PlanInfo(Record):
    """POST /shoal/plan (and `shoal plan --json`): the ranked placements, the rejected
    ones, why a strategy can't run the model at all (None: it can), and which placement a
    launch would take."""
    nested = {"placements": PlacementInfo, "rejected": RejectedInfo}
    optional = ("users",)
    model: str
    context: int
    notes: list[str] = field(default_factory=list)
    strategies: dict[str, str | None] = field(default_factory=dict)
    placements: list[PlacementInfo] = field(default_factory=list)
    rejected: list[RejectedInfo] = field(default_factory=list)
    best: int | None = None  # the index of the placement a launch without nodes takes
    users: dict[str, Any] | None = None  # replicas against one instance (plan's "users")
    kv_bits: int = 16  # the KV cache's bits the figures assume
