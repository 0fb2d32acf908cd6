"""Planning on the live cluster, from plain data: what nodes report about themselves (the
GET /shoal/node body), their measured links and a model's config.json, turned into the
pure planner's specs. The node's routes, its launcher, the model browser and `shoal plan`
all plan through this module; none of them reaches into another's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from engine import placement_profiles
from engine.cluster_records import (
    FirstToken,
    PlacementInfo,
    PlacementRank,
    PlanInfo,
    RankMemory,
    RejectedInfo,
)
from engine.errors import BadRequest
from engine.placement.families import kv_group, strategy_refusal
from engine.placement.memory import MemoryUse, context_label
from engine.placement.model import LinkSpec, ModelSpec, NodeSpec, kv_value_bytes
from engine.placement.planner import Placement, Rejection, evaluate, explain, plan
from engine.placement.profiles import links_from
from engine.placement.tables import DEFAULT, Assumptions
from engine.placement.validate import PlacementError
from engine.platform.gpu_memory import mac_gpu_budget
from engine.records import DraftInfo, MachineInfo, NodeInfo

Layout = tuple[str, str, list[Any]]  # strategy, backend, node names or {"node", "layers"}
FALLBACK_LINK = "10gbe"  # between nodes whose link nobody has measured yet


class PlanNode(TypedDict, total=False):
    """A node as plan_from_cluster reads it: planner_node builds it from GET /shoal/node,
    `shoal plan` reads it from a file (where only id and a memory figure are needed)."""
    id: str
    name: str | None
    memory_usable_bytes: int | None  # the GPU working-set limit
    memory_bytes: int | None  # RAM; Metal's default working set is assumed usable
    chip: str | None  # e.g. "Apple M3 Ultra", to look up missing figures
    gpu_cores: int
    models: list[str]  # ids on disk
    has_model: bool
    rdma: bool
    mlx_backend: str | None
    cpu_engine: str | None  # "llamacpp": it serves GGUF imports alone on llama.cpp
    memory_bandwidth_Bps: float  # a file's figures, over the chip's table
    compute_flops: float
    watts: float
    # measured on the machine itself (engine/telemetry/calibrate.py), when known
    measured_bandwidth_Bps: float | None
    measured_flops: float | None
    measured_attention_flops: float | None
    measured_prefill_flops: dict[str, float] | None  # {hidden width: FLOP/s}
    measured_watts: float | None
    draft_bytes: int  # its draft model, which it loads beside a model it serves alone
    draft_kv_per_token: float


class PlanLink(TypedDict, total=False):
    """A measured link between two nodes (rdma: a Thunderbolt RDMA one)."""
    a: str
    b: str
    latency_s: float  # one way
    bandwidth_Bps: float
    rdma: bool


class ClusterView(TypedDict):
    nodes: list[PlanNode]
    links: list[PlanLink]


class ModelFacts(TypedDict):
    """plan_from_cluster's model inputs, read from a checkpoint (Cluster.model_facts)."""
    model_config: dict[str, Any]  # config.json
    weight_bytes: int | None  # what the weights take in memory, where the checkpoint tells
    model_context: int


class PlanInputs(ModelFacts):
    """plan_from_cluster's inputs for one model on the live cluster (Cluster.plan_inputs)."""
    node_infos: list[PlanNode]
    links: list[PlanLink]


@dataclass(frozen=True)
class PlanReport:
    model: ModelSpec
    context: int
    placements: list[Placement]
    rejections: list[Rejection]
    notes: list[str] = field(default_factory=list)
    # what it was planned on (engine.placement.users compares replicas over them)
    nodes: tuple[NodeSpec, ...] = ()
    links: tuple[LinkSpec, ...] = ()


# --- what nodes report, as the planner reads it ---------------------------------------
def planner_node(info: NodeInfo) -> PlanNode:
    """One node's self-description (GET /shoal/node) as plan_from_cluster's node info."""
    machine = info.machine or MachineInfo()
    rdma = info.platform.rdma.enabled if info.platform else None
    speed, draft = info.speed, info.draft or DraftInfo("")
    return {"id": info.id, "name": info.name,
            "memory_usable_bytes": machine.memory.available_bytes,
            "memory_bytes": machine.memory.total_bytes, "chip": machine.chip,
            "models": info.models, "rdma": bool(rdma),
            "mlx_backend": machine.mlx_backend, "cpu_engine": machine.cpu_engine,
            "measured_bandwidth_Bps": speed.memory_bandwidth_Bps,
            "measured_flops": speed.compute_flops,
            "measured_attention_flops": speed.attention_flops,
            "measured_prefill_flops": speed.prefill_flops,
            "draft_bytes": draft.bytes, "draft_kv_per_token": draft.kv_per_token,
            # its power while it generated (RAPL, NVML, IOReport), when it has measured it
            "measured_watts": info.power.serving_watts if info.power else None}


def cluster_view(infos: Sequence[NodeInfo]) -> ClusterView:
    """{"nodes", "links"} for the planner from node self-descriptions (the asking node
    first): each node's measured links, kept where both ends are among the nodes."""
    links: list[PlanLink] = []
    for info in infos:
        for lk in info.links:
            if lk.to and lk.rtt_ms is not None and lk.bandwidth_MBps is not None:
                links.append({"a": info.id, "b": lk.to,
                              "latency_s": lk.rtt_ms / 2000,  # one way
                              "bandwidth_Bps": lk.bandwidth_MBps * 1e6, "rdma": False})
    ids = {i.id for i in infos}
    return {"nodes": [planner_node(i) for i in infos],
            "links": [lk for lk in links if lk["b"] in ids]}


# --- planning ---------------------------------------------------------------------------
def make_report(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
                context: int, force: bool, layout: Layout | None,
                notes: list[str], rank: str = "decode",
                kv_options: Sequence[int] = (8, 4), a: Assumptions = DEFAULT) -> PlanReport:
    """Ranked placements, or with a layout (chosen by hand) its prediction or why not.
    `kv_options`: the KV bits the model's heads can be quantized to, tried in turn
    where nothing fits at 16; `a` the prompt lengths and cached share the time to first
    token is predicted for (prompt_assumptions)."""
    if layout is not None:
        strategy, backend, ranks = layout
        one = evaluate(model, nodes, links, context, strategy, ranks, backend, force, a)
        return PlanReport(model, context, [one], [], notes, tuple(nodes), tuple(links))
    found = plan(model, nodes, links, context, force, a, rank=rank)
    if not found and model.kv_bytes == 2:  # would quantized KV make room?
        for bits in kv_options:
            if plan(model.with_kv_bits(bits), nodes, links, context):
                notes.append(f"It fits with {bits}-bit KV cache (launch with \"kv_bits\": "
                             f"{bits}, or shoal node --kv-bits {bits}): "
                             f"{context_label(context)} context in "
                             f"{kv_value_bytes(bits) / 2:.0%} of the KV memory.")
                break
    return PlanReport(model, context, found, explain(model, nodes, links, context), notes,
                      tuple(nodes), tuple(links))


def plan_from_cluster(node_infos: Sequence[PlanNode], model_config: Mapping[str, Any],
                      context: int | None = None,
                      links: Sequence[PlanLink] | None = None,
                      model_name: str | None = None, force: bool = False,
                      layout: Layout | None = None, weight_bytes: int | None = None,
                      model_context: int | None = None,
                      kv_bits: int | None = None, rank: str = "decode",
                      a: Assumptions = DEFAULT) -> PlanReport:
    """Plan from what nodes report (PlanNode) and their measured links (PlanLink; pairs
    unmeasured are assumed 10GbE).
    model_config: the model's config.json; weight_bytes what its weights take in memory,
    model_context its context window, where the checkpoint on disk tells them; kv_bits the
    KV's quantization (8 or 4; None: 16 bits); rank "drafted" orders placements by
    decode with drafts (engine.placement.planner.plan)."""
    notes: list[str] = []
    model = ModelSpec.from_config(model_config, name=model_name, weight_bytes=weight_bytes,
                                  context=model_context)
    if kv_bits is not None:
        try:
            kv_group(dict(model_config), kv_bits)
        except ValueError as e:
            raise BadRequest(f"Can't quantize this model's KV cache to {kv_bits} bits: {e}.",
                             param="kv_bits", code="kv_bits_refused") from None
        model = model.with_kv_bits(kv_bits)
    nodes = [_node_from_info(i, info, model_name, notes) for i, info in enumerate(node_infos)
             if i == 0 or _reports_memory(info, notes)]
    specs = [LinkSpec(str(k["a"]), str(k["b"]), float(k["latency_s"]),
                      float(k["bandwidth_Bps"]), bool(k.get("rdma", False)))
             for k in links or []]
    known = {frozenset((k.a, k.b)) for k in specs if not k.rdma}
    missing = [[x.id, y.id] for i, x in enumerate(nodes) for y in nodes[i + 1:]
               if frozenset((x.id, y.id)) not in known]
    if missing:
        presets = placement_profiles.machines()
        ids = [nd.id for nd in nodes]
        specs += [s for pair in missing for s in
                  links_from({"a": pair[0], "b": pair[1], "preset": FALLBACK_LINK},
                             "links", presets, ids)]
        notes.append(f"{len(missing)} node pair(s) have no link measurement yet; assumed "
                     f"{FALLBACK_LINK}")
    return make_report(model, nodes, specs, context or model.context, force, layout, notes,
                       rank, quantizable(model_config), a)


def prompt_assumptions(prompts: Sequence[int] | None = None,
                       cached: float | None = None) -> Assumptions:
    """The planner's assumptions with the prompt lengths (tokens) whose time to first token
    it predicts, and the share of each prompt the prefix cache already holds (0 to 1: an
    agent's next turn repeats most of its prompt). Raises ValueError naming the bad one."""
    a = DEFAULT
    if prompts is not None:
        if not prompts or len(prompts) > 8 or any(
                isinstance(n, bool) or not isinstance(n, int) or not 1 < n <= 10_000_000
                for n in prompts):
            raise ValueError("prompt lengths must be 1 to 8 whole numbers of tokens, "
                             "2 to 10,000,000 each")
        a = replace(a, ttft_prompts=tuple(sorted(set(prompts))))
    if cached is not None:
        if isinstance(cached, bool) or not isinstance(cached, int | float) \
                or not 0 <= cached < 1:
            raise ValueError("the cached share must be a number from 0 up to (not "
                             "including) 1")
        a = replace(a, prompt_cached=float(cached))
    return a


def quantizable(config: Mapping[str, Any]) -> tuple[int, ...]:
    """The KV bits (8, 4) this model's heads can be quantized to."""
    out = []
    for bits in (8, 4):
        try:
            kv_group(dict(config), bits)
        except ValueError:
            continue
        out.append(bits)
    return tuple(out)


def _usable(info: PlanNode) -> int:
    """The memory a node's GPU may use, as it reported it (0: not yet)."""
    if usable := info.get("memory_usable_bytes"):
        return int(usable)
    ram = info.get("memory_bytes")  # unreported: the probes' rule on a Mac
    return mac_gpu_budget(int(ram), None, None)[0] if ram else 0


def _reports_memory(info: PlanNode, notes: list[str]) -> bool:
    """Whether a peer has told its memory yet: one that just started hasn't, and is left
    out of the plan (with a note) rather than failing it."""
    if _usable(info):
        return True
    notes.append(f"{info.get('name') or info.get('id')} hasn't reported its memory yet; "
                 f"left out of this plan (ask again in a few seconds)")
    return False


def _node_from_info(i: int, info: PlanNode, model_name: str | None,
                    notes: list[str]) -> NodeSpec:
    nid = str(info.get("id") or info.get("name") or f"node-{i}")
    name = str(info.get("name") or nid)
    prof = _chip_profile(str(info.get("chip") or ""), info.get("gpu_cores"))
    usable = _usable(info)
    if not usable:
        raise PlacementError(f"node {name} hasn't reported its memory yet (it has just "
                             f"started); ask again in a few seconds")
    bw = info.get("memory_bandwidth_Bps") or (prof or {}).get("memory_bandwidth_gbs", 0) * 1e9
    flops = info.get("compute_flops") or (prof or {}).get("fp16_tflops", 0) * 1e12
    if mbw := info.get("measured_bandwidth_Bps"):  # measured figures are what a step
        bw = mbw / DEFAULT.bandwidth_efficiency  # really gets: undo the efficiency
    if mflops := info.get("measured_flops"):  # factors the model applies to peak figures
        flops = mflops / DEFAULT.compute_efficiency
    guessed = not bw or not flops
    if guessed:
        bw, flops = bw or 100e9, flops or 2e12
        notes.append(f"{name}: no bandwidth/compute figures for chip {info.get('chip')!r}; "
                     f"assumed {bw / 1e9:.0f} GB/s and {flops / 1e12:.0f} TFLOPS")
    has = bool(info.get("has_model")) or (model_name is not None and
                                          model_name in (info.get("models") or []))
    return NodeSpec(nid, name, usable, float(bw), float(flops), has,
                    bool(info.get("rdma", False)), int(info.get("draft_bytes") or 0),
                    float(info.get("draft_kv_per_token") or 0.0),
                    float(info.get("measured_attention_flops") or 0.0),
                    prefill_flops=_widths(info.get("measured_prefill_flops")),
                    unpacks=info.get("mlx_backend") == "cpu",
                    reads_gguf=info.get("cpu_engine") == "llamacpp",
                    watts=float(info.get("watts") or info.get("measured_watts")
                                or (prof or {}).get("max_power_w") or 0.0),
                    guessed=guessed)


def _widths(rates: Any) -> tuple[tuple[int, float], ...]:
    """A calibration's prefill rates ({"512": FLOP/s, ...}) as (width, FLOP/s), narrowest
    first; () where there are none or they aren't numbers."""
    try:
        pts = sorted((int(w), float(r)) for w, r in (rates or {}).items())
    except (AttributeError, TypeError, ValueError):
        return ()
    return tuple(p for p in pts if p[0] > 0 and p[1] > 0)


def _chip_profile(chip: str, gpu_cores: Any) -> dict[str, Any] | None:
    matches = [m for m in placement_profiles.machines()["machines"].values()
               if chip and m["chip"].lower() == chip.lower()]
    exact = [m for m in matches if m["gpu_cores"] == gpu_cores]
    return (exact or matches or [None])[0]


def best_placement(placements: Sequence[Placement], self_id: str | None) -> int | None:
    """The one rule for "the planner's best" (a launch without nodes, the GUI's first
    proposal): among the (nearly) fastest placements the ring backend can run, the one
    led by the asking node, else the fastest; its index, or None when none can run."""
    ring = [i for i, p in enumerate(placements)
            if p.backend in ("ring", "-", None) or len(p.ranks) == 1]
    if not ring:
        return None
    fastest = placements[ring[0]].decode_tps
    top = [i for i in ring if placements[i].decode_tps >= 0.99 * fastest]
    mine = [i for i in top if placements[i].ranks[0].node == self_id]
    return (mine or ring)[0]


def placement_info(p: Placement) -> PlacementInfo:
    """A placement and its prediction as the API spells them (figures not known are None)."""
    f = p.prediction
    return PlacementInfo(
        p.model, p.strategy, p.backend, p.context, f.decode_tps,
        decode_tps_full_context=f.decode_tps_full, prefill_tps=f.prefill_tps,
        decode_tps_streams=f.decode_tps_streams, streams=f.streams, lanes=f.lanes,
        decode_tps_drafted=f.decode_tps_drafted, draft_tokens=f.draft_tokens,
        ttft=[FirstToken(n, c, alone, busy, f.watts * alone or None)
              for n, c, alone, busy in f.ttft],
        watts=f.watts or None, decode_j_per_token=f.decode_j_per_token or None,
        warnings=list(p.warnings),
        ranks=[PlacementRank(r.node, r.name, list(r.layers), _memory(r.memory))
               for r in p.ranks])


def _memory(m: MemoryUse) -> RankMemory:
    return RankMemory(m.weights, m.kv_cache, m.prefix_cache, m.activations, m.draft,
                      m.overhead, m.total, m.usable)


def plan_info(r: PlanReport, best: int | None = None) -> PlanInfo:
    """The /shoal/plan body (and `shoal plan --json`)."""
    mtype = r.model.model_type
    return PlanInfo(
        model=r.model.name, context=r.context, notes=r.notes,
        # the family rule: why a strategy can't run this model at all (None: it can)
        strategies={s: strategy_refusal(mtype, s) if mtype else None
                    for s in ("pipeline", "tensor")},
        placements=[placement_info(p) for p in r.placements],
        rejected=[RejectedInfo(x.strategy, x.backend, list(x.nodes), x.reason)
                  for x in r.rejections],
        best=best)


def report_json(r: PlanReport) -> dict[str, Any]:
    return plan_info(r).to_json()
