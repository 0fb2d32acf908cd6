"""The replicas of each model as this node sees them (itself and its trusted peers), the
choice for each request (engine/node/routing.py), and the count of what it sent where, for
/shoal/replicas and /metrics."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from engine.node.routing import Replica, choose, whole
from engine.records import ReplicaInfo, ReplicasInfo, RunnerReady, ServingInfo

log = logging.getLogger(__name__)


class Router:
    def __init__(self, cluster: Any):
        self.cluster = cluster  # engine.node.cluster.Cluster
        self.routed: Counter[tuple[str, str]] = Counter()  # (model, node id) -> requests
        self.reasons: Counter[tuple[str, str, str]] = Counter()  # + why
        self._sending: Counter[str] = Counter()  # node id -> requests in flight from here

    # --- what this node serves ---------------------------------------------------------
    def serving(self) -> ServingInfo | None:
        """The replica this node answers for: its worker's model, alone or as the owner of
        a group; None where it runs nothing, or only a follower rank."""
        c, node = self.cluster, self.cluster.node
        w = node.worker
        if w is None:
            return None
        inst = c.instance if c.instance is not None and c.instance.model == w.model_id \
            else None
        ready = w.alive and isinstance(node.runner, RunnerReady) \
            and node.runner.model == w.model_id
        if inst is not None:
            ready = ready and inst.state == "ready"
            nodes = [r.node for r in inst.ranks]
        else:
            nodes = [c.id]
        plan = getattr(node, "prefill", None)
        return ServingInfo(w.model_id, inst.id if inst else None,
                           inst.strategy if inst else "single", nodes, bool(ready),
                           w.in_flight if w.alive else 0, w.waiting if w.alive else 0,
                           node.max_streams, plan.node if plan is not None else None)

    # --- the replicas ------------------------------------------------------------------
    def replicas(self, model: str) -> list[Replica]:
        """Every ready replica of `model` this node can send a request to now."""
        out = []
        mine = self.serving()
        if mine is not None and mine.model == model and mine.ready:
            out.append(self._replica(mine, self.cluster.id, None, self.cluster.name))
        theirs = [(p, p.info.serving) for p in self.cluster.peers.all()
                  if p.trusted and p.reachable and p.info and p.info.serving and p.id]
        for p, s in theirs:
            if s.model == model and s.ready is True:
                out.append(self._replica(s, p.id, p.url, p.name or p.id))
        # a node that prefills for another copy decodes nothing itself
        prefilling = {s.prefill for s in [mine] + [s for _, s in theirs]
                      if s is not None and isinstance(s.prefill, str)}
        return [r for r in out if r.node not in prefilling]

    def _replica(self, s: ServingInfo, node: str, url: str | None, name: str) -> Replica:
        running, waiting = whole(s.running), whole(s.waiting)
        if url is not None:  # what this node sent since the peer's last poll counts too
            running = max(running + waiting, self._sending[node]) - waiting
        nodes = tuple(n for n in s.nodes if isinstance(n, str)) if isinstance(s.nodes, list) \
            else (node,)
        return Replica(node, url, name, s.instance if isinstance(s.instance, str) else None,
                       s.strategy if isinstance(s.strategy, str) else "single",
                       nodes or (node,), running, waiting, whole(s.streams, 1, 4096) or 1)

    def choose(self, model: str, key: Callable[[], str | None] | None) -> Replica | None:
        """The replica for a request for `model` (`key` gives its conversation's key,
        worked out only where there is a choice); None where none runs (the caller loads
        the model here, as a node alone does)."""
        found = self.replicas(model)
        if not found:
            return None
        r, why = choose(key() if key is not None and len(found) > 1 else None, found)
        self.routed[(model, r.node)] += 1
        self.reasons[(model, r.node, why)] += 1
        return r

    @contextlib.contextmanager
    def sending(self, node: str) -> Iterator[None]:
        """A request in flight from here to `node`'s replica."""
        self._sending[node] += 1
        try:
            yield
        finally:
            self._sending[node] -= 1

    # --- what the user sees --------------------------------------------------------------
    def info(self) -> ReplicasInfo:
        """Every replica of every model this node can route to, with its share of the
        requests this node routed for that model."""
        models = {m for m, _ in self.routed}
        mine = self.serving()
        if mine is not None:
            models.add(mine.model)
        for p in self.cluster.peers.all():
            if p.trusted and p.info and p.info.serving and isinstance(p.info.serving.model, str):
                models.add(p.info.serving.model)
        out = []
        for model in sorted(models):
            total = sum(n for (m, _), n in self.routed.items() if m == model)
            for r in self.replicas(model):
                n = self.routed[(model, r.node)]
                out.append(ReplicaInfo(model, r.node, r.name, r.instance, r.strategy,
                                       list(r.nodes), r.url is None, r.running, r.waiting,
                                       r.streams, n, round(n / total, 4) if total else 0.0))
        return ReplicasInfo(out)
