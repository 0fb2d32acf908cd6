"""Engine snapshots (the JSON of /shoal/topology and /shoal/status) turned into the plain
values the views draw: one NodeCard per machine, one LinkEdge per measured pair. Qt-free,
so the adapters are tested without a window."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from engine.platform.gpu_memory import mac_gpu_budget

LINK_NAMES = {"thunderbolt-rdma": "Thunderbolt RDMA", "thunderbolt-ip": "Thunderbolt IP",
              "ethernet": "Ethernet", "wifi": "Wi-Fi", "wi-fi": "Wi-Fi",
              "thunderbolt": "Thunderbolt", "loopback": "Loopback", "network": "Network"}


@dataclass(frozen=True)
class MemoryBar:
    """A machine's memory in four parts that add up to `total` (bytes)."""
    total: int
    others: int  # used by other programs
    shoal: int  # used by Shoal's model shards (predicted for the running placement)
    planned: int  # what the selected placement would add
    free: int
    overflow: int = 0  # planned beyond what is available
    rule: str = ""  # how the OS figure was read (e.g. "MemAvailable from /proc/meminfo")
    usable: int = 0  # what Shoal may use here: steady, unlike free (see usable_memory)


@dataclass(frozen=True)
class NodeCard:
    id: str
    name: str  # unique among the cards (a short id is added to repeated names)
    url: str | None
    is_self: bool
    kind: str  # "ok" | "offline" | "unpaired" | "mismatch"
    detail: str | None  # why it is offline / unpaired / mismatched
    chip: str | None = None
    os: str | None = None
    version: str | None = None
    state: str | None = None
    memory: MemoryBar | None = None
    watts: float | None = None
    power_unavailable: str | None = None
    warnings: tuple[str, ...] = ()
    rdma: bool | None = None  # RDMA ready: enabled with a device; None where unknown
    models: tuple[str, ...] = ()
    # the machine's measured speed (memory bandwidth, compute), once its calibration ran
    speed: tuple[tuple[str, float], ...] = ()

    @property
    def usable(self) -> bool:
        """Can run a shard of a model with this node now."""
        return self.kind == "ok"


@dataclass(frozen=True)
class LinkEdge:
    a: str
    b: str
    type: str | None
    rtt_ms: float | None
    bandwidth_MBps: float | None
    extra: tuple[str, ...] = field(default=())  # why a Thunderbolt cable carries no RDMA

    @property
    def label(self) -> str:
        parts = [LINK_NAMES.get(self.type or "", self.type or "link")]
        if self.rtt_ms is not None:
            parts.append(f"{self.rtt_ms:.1f} ms" if self.rtt_ms < 10 else f"{self.rtt_ms:.0f} ms")
        if self.bandwidth_MBps is not None:
            bw = self.bandwidth_MBps
            parts.append(f"{bw / 1000:.1f} GB/s" if bw >= 1000 else f"{bw:.0f} MB/s")
        return " · ".join(parts)


def _kind(node: Mapping[str, Any]) -> tuple[str, str | None]:
    if node.get("self"):
        return "ok", None
    if not node.get("reachable"):
        return "offline", node.get("error") or "not answering"
    if not node.get("trusted"):
        return "unpaired", node.get("error") or "not in this cluster"
    if node.get("warning"):
        return "mismatch", str(node["warning"])
    return "ok", None


def platform_warnings(node: Mapping[str, Any]) -> tuple[str, ...]:
    """What the user must fix on this machine (Thunderbolt Bridge loops, RDMA off), with
    the fix the platform report gives; "unavailable" notes (Linux) are not warnings."""
    platform = node.get("platform") or {}
    out = [str(w) for w in platform.get("warnings") or []]
    rdma = platform.get("rdma") or {}
    explanation = rdma.get("explanation")
    if explanation and not str(explanation).startswith("unavailable"):
        out.append(f"RDMA: {explanation}")
    return tuple(out)


def moves(rule: str) -> bool:
    """Whether a node's available figure is what the OS has free now (Linux), which moves
    with other programs, rather than a budget (Metal's working set, a wired limit, the
    user's --memory-limit)."""
    return not rule.startswith("--memory-limit") and ("MemAvailable" in rule or
                                                      "MemFree" in rule)


def usable_memory(total: int, available: int, rule: str) -> int:
    """What Shoal may use on a machine, steady while other programs come and go: the
    node's budget; where the node reports only what is free now, the planner's rule for
    a machine known by its RAM alone (engine.platform.gpu_memory)."""
    return mac_gpu_budget(total, None, None)[0] if moves(rule) else available


def memory_bar(node: Mapping[str, Any], shoal: int = 0, planned: int = 0) -> MemoryBar | None:
    mem = ((node.get("machine") or {}).get("memory") or {})
    total, available = mem.get("total_bytes"), mem.get("available_bytes")
    if not isinstance(total, int) or total <= 0:
        return None
    available = min(available if isinstance(available, int) else total, total)
    rule = str(mem.get("rule") or "")
    used = total - available
    shoal = min(max(shoal, 0), used)
    fits = min(max(planned, 0), available)
    return MemoryBar(total=total, others=used - shoal, shoal=shoal, planned=fits,
                     free=available - fits, overflow=max(planned - available, 0),
                     rule=rule, usable=usable_memory(total, available, rule))


def node_cards(topology: Mapping[str, Any], shoal_use: Mapping[str, int] | None = None,
               planned: Mapping[str, int] | None = None) -> list[NodeCard]:
    """One card per node, this node first. shoal_use / planned: bytes per node id."""
    shoal_use, planned = shoal_use or {}, planned or {}
    nodes = list(topology.get("nodes") or [])
    names = [str(n.get("name") or n.get("url") or n.get("id") or "?") for n in nodes]
    cards = []
    for node, name in zip(nodes, names):
        nid = str(node.get("id") or node.get("url") or name)
        if names.count(name) > 1 and node.get("id"):
            name = f"{name} · {str(node['id'])[:4]}"
        kind, detail = _kind(node)
        if kind == "offline":  # what it last said is no longer true: keep who it is
            node = {k: node.get(k) for k in ("id", "url", "name", "version")
                    if node.get(k) is not None} | {"machine": {
                        k: v for k, v in (node.get("machine") or {}).items() if k != "memory"}}
        machine = node.get("machine") or {}
        os_text = " ".join(str(x) for x in (machine.get("os_name"), machine.get("os_version"))
                           if x) or None
        power = node.get("power") or {}
        rdma_report = (node.get("platform") or {}).get("rdma") or {}
        rdma = rdma_report.get("enabled")
        if rdma and rdma_report.get("explanation"):  # enabled, but no device (e.g. a TB4 Mac)
            rdma = False
        cards.append(NodeCard(
            id=nid, name=name, url=node.get("url"), is_self=bool(node.get("self")),
            kind=kind, detail=detail, chip=machine.get("chip"), os=os_text,
            version=node.get("version"), state=node.get("state"),
            memory=memory_bar(node, shoal_use.get(nid, 0), planned.get(nid, 0)),
            watts=power.get("watts"), power_unavailable=power.get("unavailable"),
            warnings=platform_warnings(node), rdma=rdma if isinstance(rdma, bool) else None,
            models=tuple(str(m) for m in node.get("models") or ()),
            speed=tuple(sorted((str(k), float(v)) for k, v in (node.get("speed") or {}).items()
                               if isinstance(v, (int, float))))))
    cards.sort(key=lambda c: not c.is_self)
    return cards


def link_edges(topology: Mapping[str, Any]) -> list[LinkEdge]:
    """One edge per pair of nodes that measured a link (either side's measurement) or share a
    Thunderbolt cable; a cable types the edge (Thunderbolt RDMA or Thunderbolt IP)."""
    known = {str(n.get("id")) for n in topology.get("nodes") or []
             if n.get("id") and (n.get("self") or n.get("reachable"))}  # gone: no links
    seen: dict[frozenset[str], LinkEdge] = {}
    for lk in topology.get("links") or []:
        a, b = str(lk.get("from")), str(lk.get("to"))
        if a == b or a not in known or b not in known:
            continue
        key = frozenset((a, b))
        if key not in seen:
            seen[key] = LinkEdge(a, b, lk.get("type"), lk.get("rtt_ms"),
                                 lk.get("bandwidth_MBps"))
    # A Thunderbolt cable types the edge: RDMA when one of the pair's cables carries it.
    cables: dict[frozenset[str], list[Mapping[str, Any]]] = {}
    for c in topology.get("thunderbolt") or []:
        a, b = str(c.get("a")), str(c.get("b"))
        if a != b and a in known and b in known:
            cables.setdefault(frozenset((a, b)), []).append(c)
    for key, found in cables.items():
        rdma = [c for c in found if c.get("rdma")]
        kind = "thunderbolt-rdma" if rdma else "thunderbolt-ip"
        why = () if rdma else tuple(str(c["why"]) for c in found if c.get("why"))
        old = seen.get(key)
        if old is None:
            a, b = sorted(key)
            seen[key] = LinkEdge(a, b, kind, None, None, why)
        elif old.type != "loopback":
            seen[key] = replace(old, type=kind, extra=why)
    return list(seen.values())


def running_instances(topology: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Instances any node that answers reports as starting or ready (each once)."""
    found: dict[str, dict[str, Any]] = {}
    for n in topology.get("nodes") or []:
        if not (n.get("self") or n.get("reachable")):
            continue  # what a node that left last said runs
        for inst in n.get("instances") or []:
            if inst.get("state") in ("starting", "ready") and inst.get("id"):
                found.setdefault(str(inst["id"]), inst)
    return list(found.values())


def fit_label(size_bytes: int | None, cards: list[NodeCard]) -> str:
    """Whether a model's weights fit in what Shoal may use on the usable nodes: on one node,
    only across the cluster, or not at all (the planner has the exact answer)."""
    free = [c.memory.usable for c in cards if c.usable and c.memory]
    if not size_bytes or not free:
        return "?"
    need = size_bytes * 1.1  # weights plus a little for the cache and activations
    if need <= max(free):
        return "fits one node"
    if need <= sum(free):
        return "fits the cluster"
    return "too big"
