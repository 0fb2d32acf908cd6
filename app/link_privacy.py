"""Which placements send a model's working data between machines over a shared network,
and the note that says so. Qt-free, so each rule is tested without a window.

Shoal's own node-to-node traffic (relayed prompts and answers, control, model files) goes
over TLS pinned to the cluster secret. What a model's ranks pass each other while it runs
(each token's hidden states) goes over MLX's own transport, which Shoal can't encrypt:
private on a Thunderbolt cable or inside one machine, readable by anyone on an Ethernet or
Wi-Fi network, or a network Shoal hasn't named.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from app.snapshots import LINK_NAMES, LinkEdge

# Link types whose traffic stays between the machines it joins: a cable or one machine.
PRIVATE = frozenset({"thunderbolt-rdma", "thunderbolt-ip", "thunderbolt", "loopback"})
RDMA_BACKENDS = frozenset({"jaccl", "jaccl-ring"})  # RDMA: over Thunderbolt cables only

NOTE = ("Between these machines the model's working data crosses your network "
        "unencrypted; prompts and answers between Shoal nodes are encrypted. Use a "
        "Thunderbolt cable or a network you trust.")
EDGE_HINT = ("A model spread over these two machines passes its working data over this "
             "link unencrypted (MLX can't encrypt it); prompts and answers between Shoal "
             "nodes are encrypted.")
SPOKEN = {"network": "a network"}  # in a sentence, before LINK_NAMES (a label's "Network")


def is_private(link_type: str | None) -> bool:
    """Does this link keep what crosses it between the machines it joins?"""
    return link_type in PRIVATE


def shared_links(nodes: Sequence[str], edges: Iterable[LinkEdge],
                 backend: str = "ring") -> list[tuple[str, str, str | None]]:
    """The pairs of different machines in a placement (node ids in rank order) whose
    link is shared: (a, b, link type, None where no link was measured), in rank order.

    Every pair counts, not only ring neighbours: which pairs MLX connects depends on the
    backend and the group's size, and one note too many costs less than one missing."""
    if backend in RDMA_BACKENDS:
        return []  # jaccl runs only where every pair is cabled with RDMA
    types = {frozenset((e.a, e.b)): e.type for e in edges}
    machines = list(dict.fromkeys(nodes))  # a node holding two ranks is still one machine
    out = []
    for i, a in enumerate(machines):
        for b in machines[i + 1:]:
            kind = types.get(frozenset((a, b)))
            if not is_private(kind):
                out.append((a, b, kind))
    return out


def link_name(link_type: str | None) -> str:
    """The link as a sentence names it ("Ethernet", "Wi-Fi", "a network")."""
    if link_type is None:
        return "a network (not measured yet)"
    return SPOKEN.get(link_type) or LINK_NAMES.get(link_type) or link_type


def detail(links: Sequence[tuple[str, str, str | None]],
           name_of: Callable[[str], str]) -> str:
    """The details under the note: which machines, over what, and why Shoal can't help."""
    pairs = ", ".join(f"{name_of(a)} and {name_of(b)}{' are linked' if i == 0 else ''} "
                      f"over {link_name(kind)}" for i, (a, b, kind) in enumerate(links))
    return (f"{pairs}. MLX, which passes each token's hidden states from machine to "
            "machine, has no encryption; Shoal's own traffic between nodes goes over TLS.")
