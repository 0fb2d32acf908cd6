"""Healing: an instance that loses a node is placed again on the nodes left.

When a distributed instance fails for any reason but a stop or a new launch (a rank's
process died, its node stopped answering or said it was leaving, a link went silent), its
owner hands it here. The nodes left are this one and every trusted peer that answers now
and isn't shutting down (a killed node may still look reachable for a few seconds). The
planner places the model on them as a launch without nodes would, whatever ran before (a
hand split is planned afresh, never replayed: its ranges named a node that is gone), and
the owner launches it there. Where nothing fits, the message says what is missing. The
requests in flight when the node went were failed by the group; the error they got says
what happens next (`hint`). Once every lost node answers again, the original placement is
offered (`HealInfo.back`): launching `HealInfo.original` runs it as before. Messages name
machines, never node ids or ranks; the nodes' own reason is kept as `detail`.
`shoal node --no-heal` turns healing off.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import ShoalError
from engine.node.followers import LEAVING
from engine.records import HealInfo, InstanceInfo
from engine.words import joined

if TYPE_CHECKING:
    from engine.node.launch import Instance
    from engine.node.peers import Peers

log = logging.getLogger(__name__)
PROBE_S = 3.0  # a peer that doesn't answer within this is left out of the new placement
LEAVING_KEPT_S = 60.0  # how long a node's "I am quitting" explains its silence
BACK_EVERY_S = 5.0  # how often a lost node is looked for while the healed model runs
GUESS_S = 30.0  # the estimate for a model whose load was never timed


def estimate_s(inst: Instance, nodes_left: int) -> float:
    """How long placing `inst` again should take, in whole seconds: about its last launch
    (workers start, load and join side by side, so fewer nodes each loading a bigger share
    measured no slower on small models: benchmarks/healing.py), or a guess if never timed.
    Where it now runs on one node alone, that node loads all of it."""
    took = inst.load_s or GUESS_S
    if nodes_left <= 1 < len(inst.ranks):
        took *= 1.5
    return float(math.ceil(1 + took))


class Healed(Protocol):
    """What healing needs of the node's cluster (engine.node.cluster.Cluster): its id, its
    peers, the instance it runs, names for ids, and a launch that leaves nodes out."""
    id: str
    peers: Peers
    instance: Instance | None

    def name_of(self, node_id: str) -> str: ...

    async def launch(self, raw: Any, exclude: set[str] | frozenset[str] = ...,
                     healing: bool = ...) -> InstanceInfo: ...


class Healer:
    def __init__(self, cluster: Healed, enabled: bool = True):
        self.cluster, self.enabled = cluster, enabled
        self.info: HealInfo | None = None
        self._task: asyncio.Task | None = None
        self._placed: InstanceInfo | None = None  # where healing put the model
        self._leaving: dict[str, float] = {}  # node id -> when it said it quits

    def said_leaving(self, node: str) -> None:
        """`node` told this one it quits (SIGTERM, the app's Quit): a heal then says it
        left, even once it no longer answers."""
        self._leaving = {n: self._leaving[n] for n in self._told()}
        self._leaving[node] = time.monotonic()

    def _told(self) -> set[str]:
        """The nodes that said within LEAVING_KEPT_S that they quit."""
        now = time.monotonic()
        return {n for n, t in self._leaving.items() if now - t < LEAVING_KEPT_S}

    def hint(self, model: str) -> str | None:
        """What a client whose request failed with its group is told happens next."""
        if not self.enabled:
            return None
        inst = self.cluster.instance
        about = (f" (about {estimate_s(inst, len(inst.ranks) - 1):.0f} s)"
                 if inst is not None and inst.model == model else "")
        return (f"Shoal is placing {model} again on the machines that remain{about}; send "
                f"the request again then.")

    def note(self, model: str) -> str | None:
        """What a request for `model` is told while its failed instance heals (or can't)."""
        info = self.info
        if info is None or info.model != model:
            return None
        if info.state == "placing":
            about = f" (about {info.estimate_s:.0f} s)" if info.estimate_s else ""
            return (f"Shoal is placing {model} again on the machines that remain{about}; "
                    f"send the request again then.")
        return info.message if info.state in ("doesnt_fit", "failed") else None

    def start(self, inst: Instance, reason: str) -> None:
        """The owner's instance failed: place it again (in the background)."""
        original = {"model": inst.model, "strategy": inst.strategy, "backend": inst.backend,
                    "nodes": [{"node": r.node, **({"layers": list(r.layers)} if r.layers
                                                  else {})} for r in inst.ranks],
                    "kv_bits": inst.kv_bits or 16, **({"lanes": inst.lanes}
                                                      if inst.lanes > 1 else {})}
        if not self.enabled:
            self.info = HealInfo(inst.model, "off", f"{inst.model} stopped: {reason}. "
                                 f"Healing is off on this machine (shoal node --no-heal): "
                                 f"Launch it again.", [], original, detail=reason)
            return
        self.info = HealInfo(inst.model, "placing", f"{inst.model} stopped. Shoal is "
                             f"finding the machines that remain.", [], original,
                             detail=reason)
        self.cancel()
        self._task = asyncio.create_task(self._heal(inst, reason, original))

    def cancel(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None

    def forget(self) -> InstanceInfo | None:
        """A launch or stop by the user: what healing did no longer applies. Returns
        where healing had placed the model, for `undo`."""
        self.cancel()
        self.info = None
        placed, self._placed = self._placed, None
        return placed

    async def undo(self, placed: InstanceInfo | None, model: str) -> None:
        """As the user's launch of `model` starts (their own split, say): stop the copy
        healing `placed` on other nodes, so it doesn't hold their memory twice."""
        if placed is None or placed.model != model or placed.ranks[0].node == self.cluster.id:
            return  # a copy led by this node is replaced by the launch itself
        peer = self.cluster.peers.find(placed.ranks[0].node)
        if peer is None:
            return
        path = f"/shoal/instances/{placed.id}" if placed.id else "/shoal/unload"
        try:
            await self.cluster.peers.call(peer.url, "DELETE" if placed.id else "POST", path,
                                          timeout=30)
        except ShoalError as e:
            log.warning("couldn't stop %s on %s before the new launch: %s", model,
                        peer.name, e.message)

    async def _heal(self, inst: Instance, reason: str, original: dict[str, Any]) -> None:
        t0 = time.monotonic()
        alive, leaving = await self._answering([r.node for r in inst.ranks])
        lost = [r.node for r in inst.ranks if r.node not in alive]
        left = bool(lost) and set(lost) <= leaving | self._told()
        gone = self._names(lost)
        # an RDMA group that broke with every node still there: the same nodes over TCP
        tcp = not lost and inst.backend != "ring"
        remain = [self.cluster.id] + [p.id for p in self.cluster.peers.all()
                                      if p.id and p.trusted and p.reachable
                                      and p.id not in lost]
        on_ids = [r.node for r in inst.ranks] if tcp else remain
        on = self._names(on_ids)
        about = estimate_s(inst, len(on))
        what = (f"{joined(gone)} {'left' if left else 'stopped answering'}" if lost else
                "the machines running it together lost step with each other")
        self.info = replace(self.info or HealInfo(inst.model, "placing", ""), lost=lost,
                            lost_names=gone, on=on_ids, on_names=on, estimate_s=about,
                            left=left,
                            message=f"{inst.model} stopped: {what}. Placing it again on "
                                    f"{joined(on)}, about {about:.0f} s.")
        try:
            placed = await self.cluster.launch({**original, "backend": "ring"} if tcp else
                                               {"model": inst.model,
                                                "kv_bits": inst.kv_bits or 16},
                                               exclude=set(lost), healing=True)
        except ShoalError as e:
            state = "doesnt_fit" if e.code == "insufficient_memory" else "failed"
            without = f" without {joined(gone)}" if gone else ""
            said = (f"It doesn't fit on {joined(on)}{without}, so it stays stopped. Free "
                    f"memory there, or bring {joined(gone)} back and use your own split "
                    f"again." if state == "doesnt_fit" and gone else
                    f"It doesn't fit on {joined(on)}, so it stays stopped."
                    if state == "doesnt_fit" else
                    f"Placing it again on {joined(on)} failed, so it stays stopped. Launch "
                    f"it again when the machines are ready.")
            log.warning("healing %s: %s (%s)", inst.model, said, e.message)
            self.info = replace(self.info, state=state, message=f"{inst.model} stopped: "
                                f"{what}. {said}", detail=f"{reason}; {e.message}")
        except Exception as e:  # anything else: say so, never leave "placing" forever
            log.exception("healing %s failed", inst.model)
            self.info = replace(self.info, state="failed", detail=f"{reason}; {e}",
                                message=f"{inst.model} stopped: {what}. Placing it again "
                                        f"failed, so it stays stopped. Launch it again.")
        else:
            took = time.monotonic() - t0
            self._placed = placed
            on_ids = [r.node for r in placed.ranks]
            on = self._names(on_ids)
            log.warning("healed %s without %s in %.1f s", inst.model, joined(gone or ["-"]),
                        took)
            again = (f"{inst.model} is running again on the same machines, over the network "
                     f"(TCP): their Thunderbolt (RDMA) group broke" if tcp else
                     f"{inst.model} is running again without {joined(gone)}, on {joined(on)}"
                     if lost else f"{inst.model} is running again on {joined(on)}")
            self.info = replace(self.info, state="serving", seconds=round(took, 2),
                                on=on_ids, on_names=on,
                                message=f"{again} ({took:.0f} s after it stopped).")
        await self._watch_for(lost)

    async def _watch_for(self, lost: list[str]) -> None:
        """Offer the original placement once every lost node answers again."""
        while lost and self.info is not None and not self.info.back:
            await asyncio.sleep(BACK_EVERY_S)
            if set(lost) <= (await self._answering(lost))[0]:
                names = joined(self._names(lost))
                self.info = replace(self.info, back=True, message=(
                    f"{names} {'is' if len(lost) == 1 else 'are'} back: use your own split "
                    f"to run {self.info.model} as before."))
                log.info("healing: %s back", names)

    async def _answering(self, ids: list[str]) -> tuple[set[str], set[str]]:
        """The nodes among `ids` that answer now and stay (this one always does), and
        those that answered that they are shutting down."""
        c = self.cluster

        async def probe(nid: str) -> tuple[str, bool] | None:
            if nid == c.id:
                return nid, False
            peer = c.peers.find(nid)
            if peer is None or not peer.trusted:
                return None
            try:
                got = await c.peers.call(peer.url, "GET", "/shoal/node", timeout=PROBE_S)
            except ShoalError:
                return None
            ranks = got.get("followers") if isinstance(got, dict) else None
            return nid, any(isinstance(f, dict) and f.get("reason") == LEAVING
                            for f in ranks or [])
        answers = [x for x in await asyncio.gather(*(probe(n) for n in ids)) if x]
        return {n for n, bye in answers if not bye}, {n for n, bye in answers if bye}

    def _names(self, ids: list[str]) -> list[str]:
        """Each node's machine name (never its id, where a name is known)."""
        return [self.cluster.name_of(nid) for nid in ids]

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
