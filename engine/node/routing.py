"""Which replica of a model answers a request (several nodes, or groups, serving the same
model). A conversation goes where its earlier turns went, so its prefix is in that
replica's cache: every node ranks the replicas by the same hash of the conversation's
start (rendezvous hashing), so every node makes the same choice without asking anyone,
and a replica joining or leaving moves only the conversations that ranked it first.

Load overrides the hash where it matters. A conversation a replica has served (each
replica tells its peers the ones it served lately, engine/node/router.py) stays there
unless that replica is full or has clearly more requests than the least loaded. One no
replica has served, whose start no cache holds, goes to the replica this node has the
fewest requests in flight to, the hash's order deciding among equals: a wave of new
conversations through one node spreads evenly, where the hash alone left it as uneven as
chance (5 and 3 of 8), paced by the busier copy; one at a time, each goes where the hash
says on every node, so a next turn sent to another node before the copies' next poll
still finds it.

The loads are what the peers' polls last said (every 2 s), raised by the requests this
node has sent each replica since: choosing waits on no round trip.

A model has several names a node takes (Ollama's ":latest", a name in other letter case as
the Hub and a Mac's disk take it, the bundled embedding model's short names): its replicas
are the copies served under any of them (name_key)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engine.node.beside import canonical

SPREAD = 2  # requests more than the least loaded replica before the hash gives way


@dataclass(frozen=True)
class Replica:
    node: str  # the id of the node that answers for it
    url: str | None  # None: this node
    name: str
    instance: str | None
    strategy: str
    nodes: tuple[str, ...]
    running: int
    waiting: int
    streams: int
    model: str = ""  # the name the copy is served under (one of the model's names)
    sent: int = 0  # requests the choosing node has in flight there (exact, never stale)

    @property
    def load(self) -> int:
        return self.running + self.waiting

    @property
    def full(self) -> bool:
        return self.load >= self.streams


def name_key(name: str) -> str:
    """What every name of one model has in common: two names with the same key name the
    same model (Ollama's default tag dropped, letter case ignored, the bundled embedding
    model's names as one)."""
    return canonical(name).removesuffix(":latest").casefold()


def same_name(name: str, names: Sequence[str], prefer: str | None = None) -> str:
    """The one of `names` that stands for every name of `name`'s model: `prefer` where
    it is one of them, else the first by sort; `name` as it came where none is."""
    key = name_key(name)
    same = sorted(n for n in names if name_key(n) == key)
    if prefer is not None and prefer in same:
        return prefer
    return same[0] if same else name


def ranked(key: str, replicas: Sequence[Replica]) -> list[Replica]:
    """The replicas in the order this conversation prefers them (the same on every node)."""
    def weight(r: Replica) -> bytes:
        return hashlib.sha256(f"{key}\0{r.node}".encode()).digest()
    return sorted(replicas, key=weight, reverse=True)


def choose(key: str | None, replicas: Sequence[Replica],
           served: Callable[[Replica], bool] = lambda r: True) -> tuple[Replica, str]:
    """The replica for a request with conversation `key` and why ("prefix", "load", or
    "only"). `served(r)`: whether replica r served this conversation lately (the default,
    every one, is the hash's choice alone). A conversation's replica keeps it unless
    that one is full while another isn't, or has SPREAD requests more than the least
    loaded; one no replica served (and none so loaded) goes to the replica this node has
    the fewest requests in flight to (`sent`), the first in hash order among equals.
    Without a key, the least loaded (this node first among equals: no
    hop)."""
    if not replicas:
        raise ValueError("no replica to choose from")
    if len(replicas) == 1:
        return replicas[0], "only"
    least = min(replicas, key=lambda r: (r.full, r.load, r.url is not None, r.node))
    if key is None:
        return least, "load"
    order = ranked(key, replicas)
    holders = [r for r in order if served(r)]
    first = holders[0] if holders else order[0]
    if (first.full and not least.full) or first.load - least.load >= SPREAD:
        return least, "load"
    if holders:
        return first, "prefix"
    # new: by what this node has in flight, which it knows exactly (a wave through it
    # splits evenly, while one request at a time goes where the hash says, as on every
    # other node: the polled loads are up to a poll old); min keeps the hash's order
    new = min(order, key=lambda r: (r.full, r.sent))
    return new, "prefix" if new is first else "load"


def whole(v: Any, default: int = 0, top: int = 1 << 20) -> int:
    """A count a peer reported, as a number in bounds (a peer's JSON is checked where used)."""
    if isinstance(v, bool) or not isinstance(v, int):
        return default
    return max(0, min(v, top))
