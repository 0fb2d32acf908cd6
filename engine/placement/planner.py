"""Where every layer goes: every feasible combination of nodes and strategy, ranked by
predicted decode tokens/s, and the check of a placement a user chose by hand.

Trying all 2^n node subsets is not needed: the best subsets of each size are prefixes of
the nodes sorted by speed, by memory or by who already holds the files, so a plan looks
at those few orders, sizes 1..n, and every node alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.placement.cost import Prediction, Stage, predict
from engine.placement.families import strategy_refusal
from engine.placement.links import Topology, ring_links
from engine.placement.memory import MemoryUse, Sizer, gb, refusal
from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
from engine.placement.split import split_pipeline
from engine.placement.split_prefill import Prefill, prefer_split
from engine.placement.tables import DEFAULT, Assumptions
from engine.placement.validate import (
    ModelShape,
    NotEnoughMemory,
    PlacementError,
    check_pipeline,
    check_tensor,
)
from engine.words import joined

BACKENDS = ("ring", "jaccl")


@dataclass(frozen=True)
class Rank:
    node: str  # node id
    name: str
    layers: tuple[int, int]  # [start, end); every layer for tensor ranks
    memory: MemoryUse


@dataclass(frozen=True)
class Placement:
    model: str
    strategy: str  # single | pipeline | tensor
    backend: str  # ring | jaccl
    ranks: tuple[Rank, ...]  # rank 0 first
    context: int
    prediction: Prediction
    files_on: int = 0  # ranks whose node already holds the model's files
    warnings: tuple[str, ...] = field(default=())
    prefill: Prefill | None = None  # a node that prefills its long prompts sooner (agents)

    @property
    def decode_tps(self) -> float:
        return self.prediction.decode_tps

    @property
    def prefill_tps(self) -> float:
        return self.prediction.prefill_tps

    @property
    def fits(self) -> bool:
        return all(r.memory.fits for r in self.ranks)

    def to_launch(self, model: str | None = None) -> dict[str, Any]:
        """The body of POST /shoal/instances (a single node is a one-rank pipeline)."""
        return {"model": model or self.model,
                "strategy": "tensor" if self.strategy == "tensor" else "pipeline",
                "backend": self.backend,
                "nodes": [{"node": r.node, "layers": list(r.layers)} for r in self.ranks],
                **(self.prefill.launch() if self.prefill else {})}


@dataclass(frozen=True)
class Rejection:
    """A combination the planner looked at and why it can't run."""
    strategy: str
    backend: str
    nodes: tuple[str, ...]  # names
    reason: str


# "chat" (or "decode"): decode tokens/s; "drafted": decode with drafts, as an agent echoing
# code gets it; "agents": the time to first token of the longest prompt predicted, with a
# prefill node where one makes it sooner (engine/placement/split_prefill.py)
RANKINGS = ("chat", "decode", "drafted", "agents")


def plan(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
         context: int | None = None, force: bool = False,
         a: Assumptions = DEFAULT, rank: str = "decode") -> list[Placement]:
    """Every feasible placement, best first by `rank` (RANKINGS); ties go to placements
    whose nodes already hold the files, then to fewer nodes. force=True also lists those
    that overflow memory, with a warning."""
    found = [c for c in _candidates(model, nodes, links, context or model.context, force, a)
             if isinstance(c, Placement)]
    if rank == "agents":
        found = prefer_split(model, found, nodes, links, a)
    return sorted(found, key=lambda p: _rank_key(p, rank))


def explain(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
            context: int | None = None, a: Assumptions = DEFAULT) -> list[Rejection]:
    """Why each combination the planner tried can't run."""
    return [c for c in _candidates(model, nodes, links, context or model.context, False, a)
            if isinstance(c, Rejection)]


def evaluate(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
             context: int | None, strategy: str,
             layout: Sequence[str | Mapping[str, Any]], backend: str = "ring",
             force: bool = False, a: Assumptions = DEFAULT) -> Placement:
    """Check a placement chosen by hand: `layout` lists node ids or names (rank 0 first;
    pipeline layers are then split by the planner) or {"node", "layers": [start, end]}
    entries. Returns the prediction or raises PlacementError with the exact reason;
    force=True turns a memory refusal into a warning."""
    if strategy not in ("single", "pipeline", "tensor"):
        raise PlacementError(f"strategy must be pipeline or tensor, got {strategy!r}")
    if backend not in BACKENDS:
        raise PlacementError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not layout:
        raise PlacementError("the placement lists no nodes")
    by_ref = {nd.id: nd for nd in nodes} | {nd.name: nd for nd in nodes}
    chosen, ranges, seen = [], [], set()
    for i, item in enumerate(layout):
        ref = item.get("node") if isinstance(item, Mapping) else item
        nd = by_ref.get(ref) if isinstance(ref, str) else None
        if nd is None:
            known = ", ".join(n.name for n in nodes) or "none"
            raise PlacementError(f"nodes[{i}]: no node {ref!r} (known: {known})")
        if nd.id in seen:
            raise PlacementError(f"nodes[{i}]: node {nd.name} is listed twice")
        seen.add(nd.id)
        chosen.append(nd)
        if isinstance(item, Mapping) and item.get("layers") is not None:
            ranges.append(item["layers"])
    if ranges and len(ranges) != len(chosen):
        raise PlacementError("give layers for every node or for none")
    ctx = context or model.context
    return _build(model, strategy, backend, chosen, Topology(links), Sizer(model, ctx, a),
                  force, a, ranges or None)


# --- building one placement -----------------------------------------------------------
def _build(model: ModelSpec, strategy: str, backend: str, order: Sequence[NodeSpec],
           topo: Topology, size: Sizer, force: bool, a: Assumptions,
           ranges: Sequence[Sequence[int]] | None = None) -> Placement:
    n, context = len(order), size.context
    if strategy == "single" and n > 1:
        raise PlacementError(f"a single-node placement lists {n} nodes")
    if n == 1:  # one node needs no collective: launch it as a one-rank ring
        strategy, backend = "single", "ring"
    ring = ring_links(topo, order, backend)
    warnings: list[str] = []
    why = strategy_refusal(model.model_type, strategy) if model.model_type else None
    if why:
        raise PlacementError(why)
    if strategy == "tensor":
        _check_tensor(model, n)
        if ranges and any(list(r) != [0, model.layers] for r in ranges):
            raise PlacementError(f"tensor ranks hold a slice of every layer: layers must be "
                                 f"[0, {model.layers}] or left out")
        layers = [(0, model.layers)] * n
        uses = [size.tensor(nd, n, i == 0) for i, nd in enumerate(order)]
    else:
        if ranges is not None:
            check_pipeline(ranges, model.layers)
            layers = [(int(r[0]), int(r[1])) for r in ranges]
        else:
            layers = split_pipeline(model, order, context, force, a, size)
        uses = [size.pipeline(nd, r, i == 0, i == n - 1)
                for i, (nd, r) in enumerate(zip(order, layers))]
    over = [refusal(nd, u, r, context, n if strategy == "tensor" else 0)
            for nd, u, r in zip(order, uses, layers) if not u.fits]
    if over and not force:
        raise NotEnoughMemory("; ".join(over))
    warnings += [f"forced beyond the memory check: {m}" for m in over]
    stages = [Stage(nd, r, i == 0) for i, (nd, r) in enumerate(zip(order, layers))]
    ranks = tuple(Rank(nd.id, nd.name, r, u) for nd, r, u in zip(order, layers, uses))
    return Placement(model.name, strategy, backend, ranks, context,
                     predict(model, strategy, stages, ring, context, a),
                     sum(nd.has_model_files for nd in order), tuple(warnings))


def _check_tensor(model: ModelSpec, n: int) -> None:
    check_tensor(ModelShape(model.layers, model.heads, model.kv_heads, model.shardable,
                            model.vocab, model.tie_embeddings), n,
                 model.model_type or model.name)
    for what, width in (("MLP width", model.intermediate if not model.experts or
                         model.dense_layers else 0),
                        ("expert width", model.moe_intermediate)):
        if width and width % n:
            raise PlacementError(f"the model's {what} {width} doesn't divide by {n} ranks")


# --- the candidates a plan looks at ----------------------------------------------------
def _candidates(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
                context: int, force: bool, a: Assumptions) -> Iterator[Placement | Rejection]:
    topo, size = Topology(links), Sizer(model, context, a)
    floor = model.total_params * model.bytes_per_param  # weights alone, before the cache
    seen: set[tuple[str, str, frozenset[str]]] = set()
    for subset in _subsets(nodes, topo):
        rdma = topo.rdma_mesh(subset)
        combos = [("single", "ring")] if len(subset) == 1 else \
            [(s, b) for b in (("ring", "jaccl") if rdma else ("ring",))
             for s in ("pipeline", "tensor")]
        for strategy, backend in combos:
            key = (strategy, backend, frozenset(nd.id for nd in subset))
            if key in seen:
                continue
            seen.add(key)
            names = tuple(nd.name for nd in subset)
            usable = sum(nd.memory_bytes for nd in subset)
            if not force and usable < floor:  # cheap refusal before any split
                yield Rejection(strategy, backend, names,
                                f"the weights alone need {gb(floor)}; "
                                f"{joined(names)} {'has' if len(names) == 1 else 'have'} "
                                f"{gb(usable)} usable")
                continue
            try:
                order = topo.cycle(subset) if backend == "ring" else list(subset)
                yield _build(model, strategy, backend, order, topo, size, force, a)
            except PlacementError as e:
                yield Rejection(strategy, backend, names, str(e))


def _subsets(nodes: Sequence[NodeSpec], topo: Topology) -> Iterator[list[NodeSpec]]:
    orders = [
        sorted(nodes, key=lambda nd: (-nd.memory_bandwidth_Bps, -nd.memory_bytes,
                                      not nd.has_model_files, nd.name)),
        sorted(nodes, key=lambda nd: (-nd.memory_bytes, -nd.memory_bandwidth_Bps,
                                      not nd.has_model_files, nd.name)),
        sorted(nodes, key=lambda nd: (not nd.has_model_files, -nd.memory_bandwidth_Bps,
                                      -nd.memory_bytes, nd.name)),
    ]
    for nd in orders[0]:
        yield [nd]
    tcp = _groups(nodes, topo.tcp)
    rdma = _groups([nd for nd in nodes if nd.rdma], topo.rdma)
    for order in orders:
        for group in tcp:  # grown in this order, each node linked to one already in
            chosen: list[NodeSpec] = []
            for nd in (nd for nd in order if nd.id in group):
                if not chosen or any(topo.tcp(nd.id, m.id) for m in chosen):
                    chosen.append(nd)
                    if len(chosen) > 1:
                        yield list(chosen)
        for group in rdma:  # the same, but linked to every node already in (jaccl)
            chosen = []
            for nd in (nd for nd in order if nd.id in group):
                if all(topo.rdma(nd.id, m.id) for m in chosen):
                    chosen.append(nd)
                    if len(chosen) > 1:
                        yield list(chosen)


def _groups(nodes: Sequence[NodeSpec],
            link: Callable[[str, str], LinkSpec | None]) -> list[set[str]]:
    """Connected groups of two or more nodes: a node nobody is cabled to can't seed one."""
    left, out = [nd.id for nd in nodes], []
    while left:
        group, todo = set(), [left.pop(0)]
        while todo:
            here = todo.pop()
            group.add(here)
            near = [x for x in left if link(here, x)]
            left = [x for x in left if x not in near]
            todo += near
        if len(group) > 1:
            out.append(group)
    return out


def _rank_key(p: Placement, rank: str = "decode") -> tuple[Any, ...]:
    tps = max(p.prediction.decode_tps_drafted, p.decode_tps) if rank == "drafted" \
        else p.decode_tps
    # to 3 significant figures, so a near tie goes to files on disk and fewer nodes
    wait = p.prefill.row.split_s if p.prefill else p.prediction.ttft_at()
    first = float(f"{wait:.3g}") if rank == "agents" else 0.0
    return (first, -float(f"{tps:.3g}"), -p.files_on, len(p.ranks), -p.prefill_tps,
            p.strategy, p.backend, [r.name for r in p.ranks])

