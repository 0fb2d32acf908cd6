"""GET /shoal/topology's body: every node this one knows with its facts, every measured
link, and the Thunderbolt cables between trusted nodes, found from their platform reports."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from engine.cluster_records import CableInfo, TopologyInfo, TopologyLink, TopologyNode
from engine.node.peers import Peer
from engine.platform.probes import PlatformReport
from engine.platform.rdma import RdmaReport, cable_problem
from engine.platform.thunderbolt import Cable, cable_graph
from engine.records import NodeInfo


def topology_info(me: NodeInfo, peers: Iterable[Peer]) -> TopologyInfo:
    """This node first, then its peers; each node's links as it measured them (a peer's
    only once it is trusted)."""
    peers = list(peers)
    nodes = [TopologyNode(**_shown(me), self=True, reachable=True, trusted=True)]
    links = [TopologyLink(me.id, **vars(lk)) for lk in me.links]
    for p in peers:
        # what the peer list knows wins over what the peer last said (as its JSON did)
        nodes.append(TopologyNode(**{**(_shown(p.info) if p.info else {}), **vars(p.public())}))
        if p.trusted and p.info is not None:
            links += [TopologyLink(p.id, **vars(lk)) for lk in p.info.links]
    cables = cluster_cables({me.id: me.platform, **{p.id: p.info.platform for p in peers
                                                    if p.trusted and p.id and p.info}})
    return TopologyInfo(nodes, links, cables)


def _shown(info: NodeInfo) -> dict[str, Any]:
    """A node's description less what only its peers' routing reads (the conversations
    its replica served: a fingerprint of users' prompts)."""
    return {k: v for k, v in vars(info).items() if k != "conversations"}


def cluster_cables(platforms: Mapping[str, PlatformReport | None]) -> list[CableInfo]:
    """Node id → its platform report (None: it sent none) → the Thunderbolt cables between
    those nodes, each with its speed, whether it carries RDMA and why not."""
    reports = {n: r or PlatformReport.from_json(None) for n, r in platforms.items()}
    return thunderbolt_links(cable_graph({n: r.thunderbolt for n, r in reports.items()}),
                             {n: r.rdma for n, r in reports.items()})


def thunderbolt_links(cables: tuple[Cable, ...], rdma: Mapping[str, RdmaReport]
                      ) -> list[CableInfo]:
    """One entry per cable: which ports, the negotiated speed, whether it carries RDMA
    and, when not, why."""
    out = []
    for c in cables:
        why = cable_problem(c, c.a.node, c.b.node, rdma)
        out.append(CableInfo(c.a.node, c.b.node, c.a.receptacle, c.b.receptacle,
                             c.a.interface, c.b.interface, c.speed, c.via,
                             "thunderbolt-ip" if why else "thunderbolt-rdma", why is None, why))
    return out
