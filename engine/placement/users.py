"""For how many people: several copies of a model (replicas) against one instance over the
cluster, when `users` people ask at once.

Each instance batches up to `Assumptions.streams` requests (the node's --max-streams) with
the planner's own batching model (cost.batched_step_s, and a pipeline's lanes); people
beyond that wait in its queue for a stream to free. Replicas split the people evenly, as
the router spreads load; one instance takes them all. Nothing here is a new speed model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.placement.cost import Stage, batched_step_s, pipeline_lanes, ttft_s
from engine.placement.links import Topology, ring_links
from engine.placement.memory import MemoryUse, context_label, gb
from engine.placement.model import LinkSpec, ModelSpec, NodeSpec
from engine.placement.planner import Placement, plan
from engine.placement.tables import DEFAULT, Assumptions
from engine.words import joined

MAX_USERS = 256
ANSWER_TOKENS = 500  # an answer's length, for how long a queued person waits for a stream
WIN = 1.05  # replicas must serve 5% more tokens/s to be called better


@dataclass(frozen=True)
class Copy:
    """One instance serving `users` people: `streams` of them decode together, the rest
    wait."""
    placement: Placement
    users: int
    streams: int
    tps: float  # all its streams together
    ttft_s: float  # first token for one who gets a stream while the others decode
    queue_wait_s: float  # the extra wait of the last one in its queue (0: no queue)
    kv_need: int  # bytes of KV its streams need at the full context, on its fullest rank
    kv_room: int  # bytes that rank has for KV beside weights, activations and runtime

    @property
    def queued(self) -> int:
        return self.users - self.streams

    @property
    def kv_fits(self) -> bool:
        return self.kv_need <= self.kv_room


@dataclass(frozen=True)
class Serving:
    """How one arrangement (replicas, or one instance) serves the people."""
    how: str  # "replicas" | "one instance"
    copies: tuple[Copy, ...]  # those people were sent to (a replica with none is left out)
    total: int  # instances in the arrangement

    @property
    def tps(self) -> float:
        return sum(c.tps for c in self.copies)

    @property
    def per_user_tps(self) -> float:
        """The slowest streaming person's tokens/s."""
        return min((c.tps / c.streams for c in self.copies if c.streams), default=0.0)

    @property
    def ttft_s(self) -> float:
        """The longest wait for a first token, queue included."""
        return max((c.ttft_s + c.queue_wait_s for c in self.copies), default=0.0)

    @property
    def queued(self) -> int:
        return sum(max(c.queued, 0) for c in self.copies)

    @property
    def kv_fits(self) -> bool:
        return all(c.kv_fits for c in self.copies)


@dataclass(frozen=True)
class UsersRow:
    users: int
    one: Serving
    replicas: Serving | None  # None: no room for a second copy (`why`)
    verdict: str
    why: str = ""


@dataclass(frozen=True)
class UsersReport:
    model: str
    context: int
    streams: int  # per instance
    prompt: int  # tokens of the prompt the first token is predicted for
    replica_set: tuple[Placement, ...]
    rows: tuple[UsersRow, ...]


def compare(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
            users: Sequence[int], context: int | None = None,
            a: Assumptions = DEFAULT) -> UsersReport:
    """Replicas against one instance for each count in `users` (1..MAX_USERS)."""
    for n in users:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_USERS:
            raise ValueError(f"users must be whole numbers from 1 to {MAX_USERS}, got {n!r}")
    ctx = context or model.context
    every = plan(model, nodes, links, ctx, a=a)
    copies, why = replica_set(model, nodes, links, ctx, every, a)
    prompt = min([n for n in a.ttft_prompts if n <= ctx] or [min(ctx // 2, 1000)])
    topo = Topology(links)
    ev = _Evaluator(model, nodes, topo, ctx, prompt, a)
    if not every:
        raise ValueError(f"{model.name} fits nowhere on these nodes at "
                         f"{context_label(ctx)} context")
    rows = []
    for n in users:
        # the instance that serves them most tokens/s, among those with KV room for them
        best = max(every, key=lambda p: (ev.kv_fits(p, n), round(ev.tps(p, n), 1)))
        one = Serving("one instance", (ev.serve(best, n),), 1)
        reps = None
        if len(copies) > 1:
            reps = Serving("replicas", tuple(ev.serve(p, k) for p, k in
                                             zip(copies, _spread(n, len(copies))) if k),
                           len(copies))
        rows.append(UsersRow(n, one, reps, verdict(model.name, n, one, reps, why, ctx), why))
    return UsersReport(model.name, ctx, a.streams, prompt, tuple(copies), tuple(rows))


def replica_set(model: ModelSpec, nodes: Sequence[NodeSpec], links: Sequence[LinkSpec],
                context: int, every: Sequence[Placement] | None = None,
                a: Assumptions = DEFAULT) -> tuple[list[Placement], str]:
    """As many disjoint copies as fit, each on as few nodes as it can (the fastest for
    many streams among those), and why there is no second copy where there isn't."""
    left, copies = list(nodes), []
    found = list(every) if every is not None else plan(model, left, links, context, a=a)
    while found:
        best = min(found, key=lambda p: (len(p.ranks), -p.prediction.decode_tps_streams,
                                         -p.decode_tps))
        copies.append(best)
        used = {r.node for r in best.ranks}
        left = [nd for nd in left if nd.id not in used]
        found = plan(model, left, links, context, a=a) if left else []
    if len(copies) != 1:
        return copies, ""
    first = copies[0]
    names = joined([r.name for r in first.ranks])
    rest = [nd.name for nd in nodes if nd.id not in {r.node for r in first.ranks}]
    where = f"it fits only across {len(first.ranks)} nodes ({names})" \
        if len(first.ranks) > 1 else f"only {names} can hold a copy"
    return copies, (f"{where}; {joined(rest)} can't hold a second copy" if rest else
                    f"{where}, and there are no other nodes")


def _spread(users: int, copies: int) -> list[int]:
    """People per copy as the router spreads them: evenly, the first (fastest) copies
    taking one more."""
    return [users // copies + (i < users % copies) for i in range(copies)]


class _Evaluator:
    def __init__(self, model: ModelSpec, nodes: Sequence[NodeSpec], topo: Topology,
                 context: int, prompt: int, a: Assumptions):
        self.model, self.topo, self.context, self.prompt, self.a = model, topo, context, \
            prompt, a
        self.by_id = {nd.id: nd for nd in nodes}

    def _stages(self, p: Placement) -> tuple[list[Stage], list[LinkSpec]]:
        order = [self.by_id[r.node] for r in p.ranks]
        return ([Stage(nd, r.layers, i == 0) for i, (nd, r) in enumerate(zip(order, p.ranks))],
                ring_links(self.topo, order, p.backend))

    def tps(self, p: Placement, users: int) -> float:
        """Tokens/s of all its streams together (the planner's batching and lanes)."""
        stages, ring = self._stages(p)
        streams, position = min(users, self.a.streams), min(self.a.prefill_tokens,
                                                             self.context)
        if p.strategy == "tensor":
            round_s = batched_step_s(self.model, stages, ring, "tensor", streams, position,
                                     self.a)
        else:
            round_s = pipeline_lanes(self.model, stages, ring, streams, position, self.a)[1]
        return streams / round_s

    def kv_fits(self, p: Placement, users: int) -> bool:
        streams = min(users, self.a.streams)
        return all(streams * r.memory.kv_cache <= _kv_room(r.memory) for r in p.ranks)

    def serve(self, p: Placement, users: int) -> Copy:
        a, m = self.a, self.model
        stages, ring = self._stages(p)
        streams = min(users, a.streams)
        tps = self.tps(p, users)
        first = ttft_s(m, p.strategy, stages, ring, self.prompt,
                       int(self.prompt * a.prompt_cached), streams - 1,
                       p.strategy == "pipeline" and a.streams > 1, a)
        # the last in the queue waits for its turn: a batch of answers per round
        waits = math.ceil(max(users - streams, 0) / streams)
        wait = waits * ANSWER_TOKENS / (tps / streams)
        need, room = max(((streams * r.memory.kv_cache, _kv_room(r.memory))
                          for r in p.ranks), key=lambda x: x[0] - x[1])
        return Copy(p, users, streams, tps, first, wait, need, room)


def _kv_room(m: MemoryUse) -> int:
    """Bytes a rank can give KV: what its GPU may use less weights, activations, runtime
    and a draft model (the prefix cache gives way to live streams)."""
    return m.usable - (m.weights + m.activations + m.overhead + m.draft)


# --- words ------------------------------------------------------------------------------
def describe(p: Placement) -> str:
    """"studio-1", or "tensor over studio-1, studio-2"."""
    names = ", ".join(r.name for r in p.ranks)
    return names if len(p.ranks) == 1 else f"{p.strategy} over {names}"


def verdict(model: str, users: int, one: Serving, reps: Serving | None, why: str,
            context: int) -> str:
    """One line in plain words: which arrangement serves `users` people better, and why."""
    people = "1 person" if users == 1 else f"{users} people"
    o = one.copies[0]
    if reps is None:
        line = (f"One instance: {why}, so {describe(o.placement)} serves {people} at "
                f"{one.tps:.1f} tokens/s" + (f" together ({one.per_user_tps:.1f} each)."
                                             if users > 1 else "."))
    elif reps.tps > WIN * one.tps:
        where = "; ".join(describe(c.placement) for c in reps.copies)
        line = (f"Replicas: {reps.total} copies of {model} ({where}) serve {people} at "
                f"{reps.tps:.1f} tokens/s together, {reps.tps / one.tps:.1f}x "
                f"one instance ({describe(o.placement)}: {one.tps:.1f}); "
                f"at least {reps.per_user_tps:.1f} tokens/s each.")
    elif users == 1:
        line = (f"One instance: for 1 person one copy is enough; {describe(o.placement)} "
                f"gives {one.tps:.1f} tokens/s, and more copies only help once more people "
                f"ask at once.")
    else:
        line = (f"One instance: {describe(o.placement)} serves {people} at {one.tps:.1f} "
                f"tokens/s together ({one.per_user_tps:.1f} each), "
                f"{'more than' if one.tps >= reps.tps else 'about as much as'} "
                f"{reps.total} copies ({reps.tps:.1f}).")
    win, lose = (reps, one) if reps is not None and line.startswith("Replicas") else \
        (one, reps)
    if win.queued:
        line += (f" {win.queued} wait for a free stream ({win.copies[0].streams} per "
                 f"instance), the last about {win.ttft_s:.0f} s for a first token"
                 + (f", where {lose.total} {'copies' if lose.total > 1 else 'instance'} "
                    f"start everyone at once ({lose.ttft_s:.1f} s)"
                    if lose is not None and not lose.queued else "") + ".")
    short = [c for c in win.copies if not c.kv_fits]
    if short:
        c = short[0]
        line += (f" But the KV cache for {c.streams} streams at {context_label(context)} "
                 f"context doesn't fit on {describe(c.placement)} (needs {gb(c.kv_need)}, "
                 f"{gb(max(c.kv_room, 0))} free).")
    return line


def to_json(r: UsersReport) -> dict[str, Any]:
    """The comparison as data: `shoal plan --users --json` and POST /shoal/plan's "users"."""
    def copy(c: Copy) -> dict[str, Any]:
        return {"strategy": c.placement.strategy, "backend": c.placement.backend,
                "nodes": [r.node for r in c.placement.ranks],
                "names": [r.name for r in c.placement.ranks],
                "users": c.users, "streams": c.streams, "queued": max(c.queued, 0),
                "tps": c.tps, "ttft_s": c.ttft_s, "queue_wait_s": c.queue_wait_s,
                "kv_need_bytes": c.kv_need, "kv_room_bytes": c.kv_room,
                "kv_fits": c.kv_fits}

    def serving(s: Serving | None) -> dict[str, Any] | None:
        if s is None:
            return None
        return {"how": s.how, "instances": s.total, "tps": s.tps,
                "per_user_tps": s.per_user_tps, "ttft_s": s.ttft_s, "queued": s.queued,
                "kv_fits": s.kv_fits, "copies": [copy(c) for c in s.copies]}

    return {"model": r.model, "context": r.context, "streams_per_instance": r.streams,
            "prompt_tokens": r.prompt, "answer_tokens": ANSWER_TOKENS,
            "replicas": [describe(p) for p in r.replica_set],
            "rows": [{"users": row.users, "verdict": row.verdict,
                      "winner": "replicas" if row.verdict.startswith("Replicas")
                      else "one instance",
                      "no_replicas": row.why or None, "one_instance": serving(row.one),
                      "replicas": serving(row.replicas)} for row in r.rows]}
