"""Which link joins two nodes, for each backend. The ring backend runs over TCP between
neighbouring ranks (the last rank back to the first closes the ring); jaccl needs an RDMA
link between every pair. A Thunderbolt 5 cable with RDMA enabled carries both, so it is
described by two links: one for TCP, one with rdma=True."""

from __future__ import annotations

from collections.abc import Sequence

from engine.placement.model import LinkSpec, NodeSpec
from engine.placement.validate import PlacementError


class Topology:
    def __init__(self, links: Sequence[LinkSpec]):
        # both directions are keys: lookups are the planner's inner loop
        self._tcp: dict[tuple[str, str], LinkSpec] = {}
        self._rdma: dict[tuple[str, str], LinkSpec] = {}
        for link in links:
            table = self._rdma if link.rdma else self._tcp
            best = table.get((link.a, link.b))
            # decode messages are small: latency first, then bandwidth
            if best is None or (link.latency_s, -link.bandwidth_Bps) < \
                    (best.latency_s, -best.bandwidth_Bps):
                table[(link.a, link.b)] = table[(link.b, link.a)] = link

    def tcp(self, a: str, b: str) -> LinkSpec | None:
        return self._tcp.get((a, b))

    def rdma(self, a: str, b: str) -> LinkSpec | None:
        return self._rdma.get((a, b))

    def rdma_mesh(self, nodes: Sequence[NodeSpec]) -> bool:
        """Every node has RDMA enabled and every pair an RDMA link (what jaccl needs)."""
        return all(nd.rdma for nd in nodes) and all(
            self.rdma(x.id, y.id) for i, x in enumerate(nodes) for y in nodes[i + 1:])

    def cycle(self, nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
        """A ring order starting at nodes[0]: each next node is the closest (lowest TCP
        latency) one not yet taken; equal links keep the given order."""
        order, left = [nodes[0]], list(nodes[1:])
        while left:
            here = order[-1]
            near = [(link.latency_s, i) for i, nd in enumerate(left)
                    if (link := self.tcp(here.id, nd.id)) is not None]
            if not near:
                raise PlacementError(f"no TCP link from {here.name} to "
                                     f"{', '.join(nd.name for nd in left)}")
            order.append(left.pop(min(near)[1]))
        return order


def ring_links(topo: Topology, order: Sequence[NodeSpec], backend: str) -> list[LinkSpec]:
    """The link from each rank to the next, the last one back to rank 0."""
    n = len(order)
    if n == 1:
        return []
    if backend == "jaccl":
        if not topo.rdma_mesh(order):
            off = [nd.name for nd in order if not nd.rdma]
            raise PlacementError(
                "jaccl needs RDMA on every node and an RDMA link between every pair; "
                + (f"RDMA is off on {', '.join(off)}" if off else "some pairs have none"))
    out = []
    for i in range(n):
        x, y = order[i], order[(i + 1) % n]
        link = topo.rdma(x.id, y.id) if backend == "jaccl" else topo.tcp(x.id, y.id)
        if link is None:
            raise PlacementError(f"no TCP link between {x.name} and {y.name}: the ring "
                                 f"backend needs one between neighbouring ranks, and from "
                                 f"the last rank back to the first")
        out.append(link)
    return out
