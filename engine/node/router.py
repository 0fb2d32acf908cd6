"""The replicas of each model as this node sees them (itself and its trusted peers), the
choice for each request (engine/node/routing.py), and the count of what it sent where, for
/shoal/replicas and /metrics."""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from engine.errors import Busy
from engine.node.routing import Replica, choose, name_key, same_name, whole
from engine.records import ReplicaInfo, ReplicasInfo, RunnerLoading, RunnerReady, ServingInfo

log = logging.getLogger(__name__)
# longer than a peer poll (2 s): by then every node's view of a stopped copy is fresh
STOPPED_S = 10.0
SHORT = 16  # hex digits of a conversation's key that name it between nodes
RECENT = 512  # conversations a replica names to its peers as served lately
WENT = 4096  # conversations this node remembers sending, until the replica names them


class Router:
    def __init__(self, cluster: Any):
        self.cluster = cluster  # engine.node.cluster.Cluster
        self.routed: Counter[tuple[str, str]] = Counter()  # (model, node id) -> requests
        self.reasons: Counter[tuple[str, str, str]] = Counter()  # + why
        self._sending: Counter[str] = Counter()  # node id -> requests in flight from here
        # (node id, name key) -> when a user's Stop ended that copy
        self._stopped: dict[tuple[str, str], float] = {}
        # the conversations this node's replica served lately (newest last), and the
        # worker that served them (a new worker's cache holds none)
        self._kept: OrderedDict[str, None] = OrderedDict()
        self._kept_by: Any = None
        # conversation -> the node this one sent it to (known before that node's next poll)
        self._went: OrderedDict[str, str] = OrderedDict()
        self._named: dict[str, tuple[Any, frozenset[str]]] = {}  # peer id -> (info, its)

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
        loading = isinstance(node.runner, RunnerLoading) and node.runner.model == w.model_id
        if inst is not None:
            loading = inst.state == "starting" or (loading and inst.state == "ready")
            ready = ready and inst.state == "ready"
            nodes = [r.node for r in inst.ranks]
        else:
            nodes = [c.id]
        plan = getattr(node, "prefill", None)
        return ServingInfo(w.model_id, inst.id if inst else None,
                           inst.strategy if inst else "single", nodes, bool(ready),
                           bool(loading) and not ready,
                           w.in_flight if w.alive else 0, w.waiting if w.alive else 0,
                           node.max_streams, plan.node if plan is not None else None,
                           "llamacpp" if w.engine == "llamacpp" else None)

    # --- the replicas ---------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names the models are served under here and by the trusted peers (ready or
        not), each once."""
        c, out = self.cluster, []
        w = c.node.worker
        if w is not None and w.alive:
            out.append(w.model_id)
        for p in c.peers.all():
            s = p.info.serving if p.trusted and p.info else None
            if s is not None and isinstance(s.model, str):
                out.append(s.model)
        out += [inst.model for _, inst in c.remote_instances() if isinstance(inst.model, str)]
        return list(dict.fromkeys(out))

    def canonical(self, model: str) -> str:
        """The one id a request for `model` goes by, at the node that routes it: the name
        a copy is served under where `model` is another name of it (this node's own name
        first), else `model` as it came."""
        w = self.cluster.node.worker
        mine = w.model_id if w is not None and w.alive else None
        return same_name(model, self.names(), prefer=mine)

    def replicas(self, model: str, loading: bool = False) -> list[Replica]:
        """Every ready replica of `model` (under any of its names) this node can send a
        request to now; with `loading`, the copies loading it instead."""
        out, key = [], name_key(model)

        def fits(s: ServingInfo) -> bool:
            return isinstance(s.model, str) and name_key(s.model) == key \
                and (s.loading if loading else s.ready) is True

        mine = self.serving()
        if mine is not None and fits(mine):
            out.append(self._replica(mine, self.cluster.id, None, self.cluster.name))
        theirs = [(p, p.info.serving) for p in self.cluster.peers.all()
                  if p.trusted and p.reachable and p.info and p.info.serving and p.id]
        for p, s in theirs:
            if fits(s) and not self._just_stopped(p.id, key):
                out.append(self._replica(s, p.id, p.url, p.name or p.id))
        # a node that prefills for another copy decodes nothing itself
        prefilling = {s.prefill for s in [mine] + [s for _, s in theirs]
                      if s is not None and isinstance(s.prefill, str)}
        return [r for r in out if r.node not in prefilling]

    # --- a copy the user stopped -----------------------------------------------------------
    def stopped(self, node: str, model: str) -> None:
        """`node`'s copy of `model` was stopped by a user: no request goes there, though
        a peer's last poll still says it runs."""
        self._stopped[(node, name_key(model))] = time.monotonic()

    def _just_stopped(self, node: str, key: str) -> bool:
        t = self._stopped.get((node, key))
        return t is not None and time.monotonic() - t < STOPPED_S

    def refuse_stopped(self, model: str) -> None:
        """A request a member passed here for the copy of `model` a user stopped moments
        ago (the member's view is older): a 503 saying to send it again, never that copy
        started again behind the user's back."""
        w = self.cluster.node.worker
        if w is not None and w.alive and name_key(w.model_id) == name_key(model):
            return
        if self._just_stopped(self.cluster.id, name_key(model)):
            raise Busy(f"The copy of {model} on {self.cluster.name} was stopped a moment "
                       "ago; send the request again: another copy answers it.")

    def _replica(self, s: ServingInfo, node: str, url: str | None, name: str) -> Replica:
        running, waiting = whole(s.running), whole(s.waiting)
        # what this node sent since the peer's last poll counts too, and so do requests
        # it chose to serve itself that haven't reached its worker yet
        running = max(running + waiting, self._sending[node]) - waiting
        nodes = tuple(n for n in s.nodes if isinstance(n, str)) if isinstance(s.nodes, list) \
            else (node,)
        return Replica(node, url, name, s.instance if isinstance(s.instance, str) else None,
                       s.strategy if isinstance(s.strategy, str) else "single",
                       nodes or (node,), running, waiting, whole(s.streams, 1, 4096) or 1,
                       s.model, self._sending[node])

    def choose(self, model: str, key: Callable[[], str | None] | None) -> Replica | None:
        """The replica for a request for `model` (`key` gives its conversation's key,
        worked out only where there is a choice): a ready one, else one loading it (the
        request waits there rather than load another copy here); None where none runs
        (the caller loads the model here, as a node alone does)."""
        found = self.replicas(model) or self.replicas(model, loading=True)
        if not found:
            return None
        k = key() if key is not None and len(found) > 1 else None
        short = k[:SHORT] if k is not None else ""
        r, why = choose(k, found, lambda rep: self._served(rep, short))
        if k is not None:
            _remember(self._went, short, r.node, WENT)
            if r.url is None:
                self.served_here(k)
        self.routed[(model, r.node)] += 1
        self.reasons[(model, r.node, why)] += 1
        return r

    # --- the conversations each replica served ---------------------------------------------
    def served_here(self, key: str | None) -> None:
        """This node's replica serves conversation `key`: its later turns come here."""
        w = self.cluster.node.worker
        if key is None or w is None:
            return
        if self._kept_by is not w:
            self._kept.clear()
            self._kept_by = w
        _remember(self._kept, key[:SHORT], None, RECENT)

    def recent(self) -> list[str]:
        """The conversations this node's replica served lately, for its peers' routing
        (NodeInfo.conversations; members only: never in the topology)."""
        return list(self._kept) if self._kept_by is self.cluster.node.worker else []

    def _served(self, r: Replica, short: str) -> bool:
        if r.url is None:
            return short in self._kept and self._kept_by is self.cluster.node.worker
        return self._went.get(short) == r.node or short in self._theirs(r.node)

    def _theirs(self, node: str) -> frozenset[str]:
        """The conversations a peer said its replica served (its last poll), checked: a
        list of strings, at most RECENT."""
        info = next((p.info for p in self.cluster.peers.all() if p.id == node), None)
        got = self._named.get(node)
        if got is not None and got[0] is info:
            return got[1]
        named = getattr(info, "conversations", None)
        keys = frozenset(k for k in named[:RECENT] if isinstance(k, str) and len(k) == SHORT) \
            if isinstance(named, list) else frozenset()
        self._named[node] = (info, keys)
        return keys

    @contextlib.contextmanager
    def sending(self, node: str) -> Iterator[None]:
        """A request in flight from here to `node`'s replica."""
        release = self.hold(node)
        try:
            yield
        finally:
            release()

    def hold(self, node: str) -> Callable[[], None]:
        """A request this node sent to `node`'s replica (its own too), counted in that
        replica's load until the returned call (once: later calls do nothing)."""
        self._sending[node] += 1
        held = [True]

        def release() -> None:
            if held.pop() if held else False:
                self._sending[node] -= 1
        return release

    # --- what the user sees --------------------------------------------------------------
    def info(self) -> ReplicasInfo:
        """Every replica of every model this node can route to, with its share of the
        requests this node routed for that model."""
        names = list(dict.fromkeys([m for m, _ in self.routed] + self.names()))
        models = {name_key(m): self.canonical(m) for m in names}  # one row set a model
        out = []
        for model in sorted(set(models.values())):
            total = sum(n for (m, _), n in self.routed.items() if m == model)
            for r in self.replicas(model):
                n = self.routed[(model, r.node)]
                out.append(ReplicaInfo(model, r.node, r.name, r.instance, r.strategy,
                                       list(r.nodes), r.url is None, r.running, r.waiting,
                                       r.streams, n, round(n / total, 4) if total else 0.0))
        return ReplicasInfo(out)


def _remember(kept: OrderedDict[str, Any], key: str, value: Any, most: int) -> None:
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > most:
        kept.popitem(last=False)
