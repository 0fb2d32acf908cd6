"""The node's JSON, typed: the states (str enums) and the frozen records every route
answers with and engine.client reads back, so the node and its readers spell a shape once.
A record is read by attribute; a reader that keeps the JSON takes `to_json()`.
"""

from __future__ import annotations

import dataclasses
import keyword
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Protocol, Self, cast

from engine.platform.nvidia import NvidiaReport
from engine.platform.probes import PlatformReport


# States go on the wire as the same strings, and compare equal to them.
class InstanceState(StrEnum):
    """An instance's, or one of its follower ranks', life: starting → ready → failed|stopped."""
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


ENDED = (InstanceState.FAILED, InstanceState.STOPPED)


class NodeState(StrEnum):
    """What a node's worker is doing (GET /shoal/status "state")."""
    IDLE = "idle"
    LOADING = "loading"
    GENERATING = "generating"
    ERROR = "error"


class DownloadState(StrEnum):
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JsonObject(Protocol):
    """A value that spells itself as one JSON object: a Record, or a report that reads
    its own (engine.platform.probes.PlatformReport)."""
    def to_json(self) -> dict[str, Any]: ...

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Record:
    """A JSON object of the node's API as a frozen value."""
    nested: ClassVar[dict[str, type[Record]]] = {}  # list fields holding records
    singles: ClassVar[dict[str, type[JsonObject]]] = {}  # fields holding one record
    optional: ClassVar[tuple[str, ...]] = ()  # fields left out of the JSON when None
    states: ClassVar[dict[str, type[StrEnum]]] = {}  # fields holding a state

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in self.optional:
                continue
            out[_key(f.name)] = [x.to_json() for x in v] if f.name in self.nested else \
                v.to_json() if f.name in self.singles and v is not None else v
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """The record of a JSON object; keys it doesn't know (a newer node's) are dropped,
        and so is a record's field that holds neither an object nor null (its default)."""
        known = {}
        for f in dataclasses.fields(cls):
            if _key(f.name) in data:
                v = data[_key(f.name)]
                sub, state = cls.nested.get(f.name), cls.states.get(f.name)
                one = cls.singles.get(f.name)
                if one and v is not None and not isinstance(v, dict):
                    continue
                known[f.name] = [sub.from_json(x) for x in v or []] if sub else \
                    one.from_json(v) if one and isinstance(v, dict) else \
                    state(v) if state and v is not None else v
        return cls(**known)


def _key(name: str) -> str:
    """A field's JSON key: a field named after a Python keyword ends in "_" (from_)."""
    return name[:-1] if name.endswith("_") and keyword.iskeyword(name[:-1]) else name


@dataclass(frozen=True)
class TopLogprob(Record):
    """One token's log-probability, as OpenAI's logprobs name it; `id` is the token's id
    (for vLLM's return_tokens_as_token_ids; renderers leave it out of OpenAI's shape)."""
    optional = ("id",)
    token: str
    logprob: float
    bytes: list[int]
    id: int | None = field(default=None, kw_only=True)  # kw_only: positional order stays


@dataclass(frozen=True)
class TokenLogprob(TopLogprob):
    """A generated token's log-probability and the most likely tokens at its place (as
    many as the request's top_logprobs asked for)."""
    nested = {"top_logprobs": TopLogprob}
    top_logprobs: list[TopLogprob] = field(default_factory=list)

@dataclass(frozen=True)
class LoadReport(Record):
    """What a group rank read to load its share: its weight files, their bytes, its peak
    memory."""
    files: list[str] = field(default_factory=list)
    bytes_read: int = 0
    peak_rss: int = 0


@dataclass(frozen=True)
class RankInfo(Record):
    singles = {"loaded": LoadReport}
    rank: int
    node: str
    layers: list[int] | None = None  # [start, end) for pipeline; None for tensor
    progress: list[int] | None = None  # layers loaded, total (while starting)
    loaded: LoadReport | None = None  # once loaded


@dataclass(frozen=True)
class InstanceInfo(Record):
    """A model over several nodes (GET /shoal/instances, POST and DELETE answers)."""
    nested = {"ranks": RankInfo}
    optional = ("id", "warning")
    states = {"state": InstanceState}
    id: str | None = None  # None for a single-node launch (no distributed instance)
    model: str = ""
    strategy: str = "pipeline"  # pipeline | tensor | single
    state: InstanceState = InstanceState.STARTING
    reason: str | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    lanes: int = 1  # micro-batches a pipeline keeps in flight (one per rank at most)
    kv_bits: int = 16  # the KV cache's bits on every rank (16, or quantized to 8 or 4)
    warning: str | None = None  # a forced launch's memory warning


@dataclass(frozen=True)
class FollowerInfo(Record):
    """A rank this node runs for an instance another node owns."""
    states = {"state": InstanceState}
    instance: str
    rank: int
    state: InstanceState
    reason: str | None = None
    progress: list[int] | None = None


@dataclass(frozen=True)
class HealInfo(Record):
    """What the owner did after a node of its instance was lost (engine/node/healing.py):
    state "placing" (re-planning and launching on the nodes left), "serving" (running
    there), "doesnt_fit" (nothing fits on them: `message` says what is missing), "failed"
    (the new launch failed) or "off" (healing turned off); `back` once every lost node is
    reachable again, when `original` (the launch body it ran with) can be launched again.
    `message` is a sentence with machine names; `detail` the technical reason behind it."""
    model: str
    state: str
    message: str
    lost: list[str] = field(default_factory=list)  # node ids
    original: dict[str, Any] = field(default_factory=dict)
    back: bool = False
    seconds: float | None = None  # from the loss to serving again
    lost_names: list[str] = field(default_factory=list)  # the lost machines, by name
    on: list[str] = field(default_factory=list)  # node ids it is placed (or runs) on
    on_names: list[str] = field(default_factory=list)  # the same machines, by name
    estimate_s: float | None = None  # how long placing it again should take
    left: bool = False  # a lost node said it was leaving (shut down), not cut off or killed
    detail: str = ""  # what the nodes reported, for a "Details" click


@dataclass(frozen=True)
class ClusterInfo(Record):
    """This node's part in distributed instances (GET /shoal/instances)."""
    nested = {"instances": InstanceInfo, "followers": FollowerInfo}
    singles = {"healing": HealInfo}
    optional = ("healing", "url")
    id: str
    name: str
    instances: list[InstanceInfo] = field(default_factory=list)
    followers: list[FollowerInfo] = field(default_factory=list)
    healing: HealInfo | None = None
    url: str | None = None  # where peers reach it (in GET /shoal/status)


@dataclass(frozen=True)
class MemoryInfo(Record):
    """A machine's memory as engine/telemetry/memory.py finds it."""
    total_bytes: int | None = None
    available_bytes: int | None = None  # what a model may use (Metal's working set)
    rule: str = ""  # how available_bytes was found
    free_percent: int | None = None  # macOS memory pressure (kern.memorystatus_level)
    unavailable: str | None = None


@dataclass(frozen=True)
class MachineInfo(Record):
    """A machine: its chip, OS, GPU, MLX and memory (engine/telemetry/memory.py)."""
    singles = {"memory": MemoryInfo, "nvidia": NvidiaReport}
    optional = ("nvidia", "cpu_engine")
    chip: str | None = None  # "Apple M3 Ultra", "AMD EPYC 7763 64-Core Processor"
    os_name: str = ""  # "macOS", "Ubuntu 22.04.4 LTS"
    os_version: str = ""  # "26.2", kernel release on Linux
    gpu: str | None = None  # "Apple M3 Ultra (80-core GPU)", "NVIDIA H200", None
    mlx_version: str | None = None
    mlx_backend: str | None = None  # "metal" | "cuda" | "cpu" | None (mlx unusable)
    memory: MemoryInfo = field(default_factory=MemoryInfo)
    nvidia: NvidiaReport | None = None  # Linux: nvidia-smi's GPUs, or why there are none
    # "llamacpp" where a GGUF import served alone runs on llama.cpp (engine/node/cpu_engine.py)
    cpu_engine: str | None = None


@dataclass(frozen=True)
class SpeedInfo(Record):
    """What calibration measured on the machine (engine/telemetry/calibrate.py); None
    where it hasn't (yet, or SHOAL_CALIBRATE=0), and then left out of the JSON."""
    optional = ("memory_bandwidth_Bps", "compute_flops", "attention_flops", "prefill_flops")
    memory_bandwidth_Bps: float | None = None
    compute_flops: float | None = None
    attention_flops: float | None = None
    prefill_flops: dict[str, float] | None = None  # {hidden width: a decoder layer's FLOP/s}


@dataclass(frozen=True)
class DraftInfo(Record):
    """A node's draft model, which it loads beside a model it serves alone."""
    model: str
    bytes: int = 0  # its weights in memory
    kv_per_token: float = 0.0  # its own KV cache's bytes per token


@dataclass(frozen=True)
class PowerReading(Record):
    """One power reading, what every power source returns (engine/telemetry/power.py on
    Linux, ioreport.py on macOS)."""
    watts: float | None = None  # total of what the source measures
    cpu_watts: float | None = None
    gpu_watts: float | None = None
    ane_watts: float | None = None
    dram_watts: float | None = None
    gpu_sram_watts: float | None = None  # kept apart from GPU power, as macmon does
    source: str = ""  # "ioreport" | "rapl" | "nvml" | "rapl+nvml"
    unavailable: str | None = None
    at: float = 0.0  # time.time() when measured

    def rounded(self) -> PowerReading:
        """The same reading with its watts to 0.01 W, as the node reports them."""
        watts: dict[str, Any] = {
            f.name: round(v, 2) for f in dataclasses.fields(self)
            if f.name.endswith("watts") and isinstance(v := getattr(self, f.name), float)}
        return dataclasses.replace(self, **watts)


@dataclass(frozen=True)
class PowerInfo(PowerReading):
    """A node's latest power reading and, once it has generated, what it drew while it
    did: the planner's watts."""
    optional = ("serving_watts",)
    serving_watts: float | None = None


@dataclass(frozen=True)
class LinkInfo(Record):
    """A node's measured link to a trusted peer (engine/node/peers.py probes it)."""
    to: str | None  # the peer's id
    url: str = ""  # its cluster URL
    type: str = ""  # "loopback", "thunderbolt", "ethernet", "wi-fi", "network"
    rtt_ms: float | None = None  # best of 5 small requests
    bandwidth_MBps: float | None = None  # one bulk read


@dataclass(frozen=True)
class PeerLink(Record):
    """A peer's link as this node last measured it (engine/node/peers.py), in GET
    /shoal/peers: every field None, and the JSON {}, until the first probe ends."""
    optional = ("type", "rtt_ms", "bandwidth_MBps", "at")
    type: str | None = None  # as in LinkInfo
    rtt_ms: float | None = None
    bandwidth_MBps: float | None = None
    at: float | None = None  # the measuring node's time.monotonic()

    @property
    def measured(self) -> bool:
        return self.at is not None


@dataclass(frozen=True)
class ServingInfo(Record):
    """What a node's worker answers requests for (NodeInfo.serving): one replica of
    `model`, the node alone or a group it owns, and its load, which peers route by
    (engine/node/routing.py)."""
    optional = ("instance", "prefill", "engine")
    model: str
    instance: str | None = None  # the group's id where this node owns a distributed instance
    strategy: str = "single"  # single | pipeline | tensor
    nodes: list[str] = field(default_factory=list)  # its ranks' node ids, rank 0 first
    ready: bool = False  # loaded and answering (not loading, failing or stopping)
    loading: bool = False  # loading it now: a request sent there waits for the load
    running: int = 0  # requests generating
    waiting: int = 0  # requests waiting for a turn
    streams: int = 1  # requests it runs at once
    prefill: str | None = None  # the node that prefills its long prompts (engine/node/handover.py)
    engine: str | None = None  # "llamacpp" where llama.cpp runs it (None: MLX)


@dataclass(frozen=True)
class ReplicaInfo(Record):
    """One replica of a model as a node sees it (GET /shoal/replicas): its load, and the
    requests this node routed to it."""
    optional = ("instance", "name")
    model: str
    node: str  # the id of the node that answers for it (rank 0)
    name: str | None = None
    instance: str | None = None
    strategy: str = "single"
    nodes: list[str] = field(default_factory=list)
    here: bool = False  # this node answers for it
    running: int = 0
    waiting: int = 0
    streams: int = 1
    routed: int = 0  # requests this node sent it since it started
    share: float = 0.0  # its part of the requests this node routed for the model


@dataclass(frozen=True)
class LaunchedReplicas(Record):
    """POST /shoal/instances with "replicas" above 1: each copy launched, in order."""
    nested = {"instances": InstanceInfo}
    model: str = ""
    instances: list[InstanceInfo] = field(default_factory=list)


@dataclass(frozen=True)
class ReplicasInfo(Record):
    """GET /shoal/replicas: every replica of every model this node can route to."""
    nested = {"replicas": ReplicaInfo}
    replicas: list[ReplicaInfo] = field(default_factory=list)


@dataclass(frozen=True)
class NodeInfo(Record):
    """GET /shoal/node: a node as it describes itself. Peers keep the last one they read;
    the planner, the topology and the app read it."""
    nested = {"instances": InstanceInfo, "followers": FollowerInfo, "links": LinkInfo}
    singles = {"machine": MachineInfo, "speed": SpeedInfo, "draft": DraftInfo,
               "power": PowerInfo, "platform": PlatformReport, "serving": ServingInfo}
    states = {"state": NodeState}
    optional = ("serving", "conversations")
    id: str
    name: str | None = None
    instances: list[InstanceInfo] = field(default_factory=list)  # those it owns
    followers: list[FollowerInfo] = field(default_factory=list)  # ranks it runs for others
    version: str | None = None
    mlx_version: str | None = None
    state: NodeState = NodeState.IDLE
    models: list[str] = field(default_factory=list)  # the ids on its disk
    links: list[LinkInfo] = field(default_factory=list)  # its measured links
    machine: MachineInfo | None = None  # None until the node has looked
    speed: SpeedInfo = field(default_factory=SpeedInfo)  # calibrated bandwidth and flops
    platform: PlatformReport | None = None  # Thunderbolt, RDMA, interfaces (macOS probes)
    power: PowerInfo | None = None
    draft: DraftInfo | None = None
    serving: ServingInfo | None = None  # the replica it answers for, if any
    # the conversations that replica served lately (their routing keys' first 16 hex
    # digits, engine/node/router.py): peers send their later turns there. Members only.
    conversations: list[str] | None = None


@dataclass(frozen=True)
class FileProgress(Record):
    path: str
    done: int
    total: int
    state: str  # "waiting", "downloading", "verifying", "done"
    source: str | None  # "cache", "hub", "peer NAME"
    speed_Bps: float
    eta_s: float | None


@dataclass(frozen=True)
class DownloadProgress(Record):
    """One snapshot of a pull (engine/hub/progress.py tracks it), for the GUI, the API and
    the CLI."""
    nested = {"files": FileProgress}
    repo_id: str
    revision: str
    done: int
    total: int
    speed_Bps: float
    eta_s: float | None
    files: list[FileProgress]


@dataclass(frozen=True)
class ErrorInfo(Record):
    """An error's OpenAI-shaped body (engine.errors.ShoalError.to_openai's "error"), with
    "node" when a cluster node is to blame."""
    optional = ("node",)
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    node: str | None = None


@dataclass(frozen=True)
class DownloadInfo(Record):
    """One pull into the Hugging Face cache (GET /shoal/hub/downloads and friends)."""
    singles = {"progress": DownloadProgress, "error": ErrorInfo}
    states = {"state": DownloadState}
    id: str
    repo: str
    revision: str
    layers: list[int] | None
    state: DownloadState
    progress: DownloadProgress | None = None
    error: ErrorInfo | None = None  # why a pull failed or stopped
    path: str | None = None
    started: float = 0.0


@dataclass(frozen=True)
class StreamsInfo(Record):
    """Requests the node's model serves at once: in flight, waiting for a turn, at most."""
    in_flight: int = 0
    waiting: int = 0
    max: int = 1


# What the node's worker is doing (StatusInfo.runner), one type per state so a reader can
# match on it; the JSON names the state in "type" (its spelling since before these records).
@dataclass(frozen=True)
class RunnerState(Record):
    kind: ClassVar[str] = ""

    def to_json(self) -> dict[str, Any]:
        return {"type": self.kind, **super().to_json()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Self:
        """The state its "type" names (ValueError for one this version doesn't know)."""
        if cls is not RunnerState:
            return super().from_json(data)
        kind = next((k for k in RUNNER_STATES if k.kind == data.get("type")), None)
        if kind is None:
            raise ValueError(f"unknown runner state {data.get('type')!r}")
        return cast(Self, kind.from_json(data))  # every kind is a RunnerState


@dataclass(frozen=True)
class RunnerIdle(RunnerState):
    """No model loaded; `unloaded` names the one unloaded after `idle_s` seconds unused
    (the next request for it loads it again)."""
    kind = "Idle"
    unloaded: str | None = None
    idle_s: float = 0.0


@dataclass(frozen=True)
class RunnerPreparing(RunnerState):
    """Before a model can load: e.g. the bundled default model being imported on first
    run. `done`/`total` are 0 when the step can't say how far it is."""
    kind = "Preparing"
    model: str
    step: str
    done: int = 0
    total: int = 0


@dataclass(frozen=True)
class RunnerLoading(RunnerState):
    kind = "Loading"
    model: str
    layers_done: int = 0
    layers_total: int = 0


@dataclass(frozen=True)
class RunnerReady(RunnerState):
    optional = ("capabilities", "engine")
    kind = "Ready"
    model: str
    context_length: int
    pid: int
    generating: bool = False
    capabilities: list[str] | None = None  # "generate", "vision", "embed", "rerank"
    engine: str | None = None  # "llamacpp" where llama.cpp runs it (None: MLX)


@dataclass(frozen=True)
class RunnerFailed(RunnerState):
    kind = "Failed"
    model: str | None
    reason: str


RUNNER_STATES = (RunnerIdle, RunnerPreparing, RunnerLoading, RunnerReady, RunnerFailed)


@dataclass(frozen=True)
class StatusInfo(Record):
    """GET /shoal/status (and each /shoal/events snapshot)."""
    singles = {"streams": StreamsInfo, "cluster": ClusterInfo, "runner": RunnerState}
    nested = {"beside": RunnerState}
    states = {"state": NodeState}
    optional = ("cluster", "beside")
    state: NodeState = NodeState.IDLE
    model: str | None = None
    error: str | None = None
    runner: RunnerState = field(default_factory=RunnerIdle)
    version: str | None = None
    worker_pid: int | None = None
    models_dir: str | None = None
    default_model: str | None = None
    streams: StreamsInfo = field(default_factory=StreamsInfo)
    cluster: ClusterInfo | None = None  # this node in its cluster, and its URL there
    # models served beside the main one (an embedding or reranker model), each one's state
    beside: list[RunnerState] | None = None


# --- the node's plain answers (engine.client's health, models, requests, peers, hub) --------
@dataclass(frozen=True)
class HealthInfo(Record):
    """GET /health: the node answers (asked before anything else, without a key)."""
    ok: bool = False
    version: str | None = None


@dataclass(frozen=True)
class ModelFacts(Record):
    """A model card's "shoal" part: what the node knows of a model on its disk, or, for one
    served by an instance on another node, that instance."""
    singles = {"instance": InstanceInfo}
    optional = ("source", "size_bytes", "layers", "quantization", "context_length",
                "instance", "capabilities")
    source: str | None = None  # "shoal" | "hf-cache"
    size_bytes: int | None = None
    layers: int | None = None
    quantization: str | None = None
    context_length: int | None = None
    instance: InstanceInfo | None = None  # of a model another node serves
    # what it does, from its config: "generate", "vision", "embed", "rerank" (protocol.py)
    capabilities: list[str] | None = None


@dataclass(frozen=True)
class ModelCard(Record):
    """One entry of GET /v1/models: OpenAI's model object (id, object, created, owned_by)
    with Shoal's facts beside it."""
    singles = {"shoal": ModelFacts}
    id: str
    object: str = "model"
    created: int = 0
    owned_by: str = "shoal"
    shoal: ModelFacts = field(default_factory=ModelFacts)


@dataclass(frozen=True)
class RequestInfo(Record):
    """One entry of GET /shoal/requests (engine/node/request_log.py)."""
    at: float  # unix time the request arrived
    method: str
    path: str
    status: int
    seconds: float  # until the answer ended (a stream's whole length)
    client: str
    reason: str | None = None  # a refusal's


@dataclass(frozen=True)
class PeerInfo(Record):
    """A peer as GET /shoal/peers lists it (and POST /shoal/peers answers)."""
    singles = {"link": PeerLink}
    url: str
    id: str | None = None
    name: str | None = None
    version: str | None = None
    reachable: bool = False
    trusted: bool = False  # answers with our cluster secret
    error: str | None = None
    warning: str | None = None
    link: PeerLink = field(default_factory=PeerLink)
    mlx_version: str | None = None
    seen_s_ago: float | None = None


@dataclass(frozen=True)
class FilesAt(Record):
    """Where a catalog entry's files already are: on disk here ("shoal" or "hf-cache",
    with its path) or in a trusted peer's Hugging Face cache ("peer", its node and files)."""
    optional = ("path", "node", "files")
    source: str
    path: str | None = None
    node: str | None = None
    files: int | None = None


@dataclass(frozen=True)
class CatalogModel(Record):
    """One model of the browser's list (engine/hub/catalog.py), with whether it fits the
    cluster: "fit_basis" says if the planner said so or the size was the estimate."""
    nested = {"local": FilesAt}
    optional = ("fit_reason", "capabilities")
    id: str
    name: str = ""
    parameters: float | None = None
    quantization: str | None = None
    size_bytes: int | None = None
    layers: int | None = None
    context_length: int | None = None
    licence: str | None = None
    approximate: list[str] = field(default_factory=list)  # fields not checked against the Hub
    source: str = "catalog"  # catalog, local, hub
    local: list[FilesAt] = field(default_factory=list)
    downloads: int | None = None
    likes: int | None = None
    fits: bool | None = None
    fit_basis: str = "size"  # "planner" | "size"
    fit_reason: str | None = None  # the planner's, when it finds no placement
    capabilities: list[str] | None = None  # "generate", "vision", "embed", "rerank"


@dataclass(frozen=True)
class CatalogInfo(Record):
    """GET /shoal/hub/catalog and /shoal/hub/search: the models, and why the Hub couldn't
    be asked (None: it was, or wasn't needed)."""
    nested = {"models": CatalogModel}
    models: list[CatalogModel] = field(default_factory=list)
    hub_error: str | None = None


@dataclass(frozen=True)
class RemovedInfo(Record):
    """DELETE /shoal/models/{id}: the model deleted and the bytes freed."""
    deleted: str
    freed_bytes: int = 0
