"""Healing: an instance that loses a node is placed again on the nodes left.

When a distributed instance fails for any reason but a stop or a new launch (a rank's
process died, its node stopped answering, a link went silent), its owner hands it here.
The nodes left are this one and every trusted peer that answers now (a killed node may
still look reachable for a few seconds); the planner places the model on them as a launch
without nodes would, and the owner launches it there. Where nothing fits, the message says
what is missing. The requests in flight when the node went were failed by the group; the
error they got says what happens next (`hint`). Once every lost node answers again, the
original placement is offered (`HealInfo.back`): POST /shoal/instances with
`HealInfo.original` runs it as before. `shoal node --no-heal` turns healing off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from engine.errors import ShoalError
from engine.records import HealInfo

if TYPE_CHECKING:
    from engine.node.cluster import Cluster
    from engine.node.launch import Instance

log = logging.getLogger(__name__)
PROBE_S = 3.0  # a peer that doesn't answer within this is left out of the new placement
BACK_EVERY_S = 5.0  # how often a lost node is looked for while the healed model runs


class Healer:
    def __init__(self, cluster: Cluster, enabled: bool = True):
        self.cluster, self.enabled = cluster, enabled
        self.info: HealInfo | None = None
        self._task: asyncio.Task | None = None

    def hint(self, model: str) -> str | None:
        """What a client whose request failed with its group is told happens next."""
        if not self.enabled:
            return None
        return (f"Shoal is placing {model} again on the nodes that remain; retry in a "
                f"minute (GET /shoal/instances says how it goes).")

    def note(self, model: str) -> str | None:
        """What a request for `model` is told while its failed instance heals (or can't)."""
        info = self.info
        if info is None or info.model != model:
            return None
        if info.state == "placing":
            return ("Shoal is placing it again on the nodes that remain; retry in a "
                    "minute.")
        return info.message if info.state in ("doesnt_fit", "failed") else None

    def start(self, inst: Instance, reason: str) -> None:
        """The owner's instance failed: place it again (in the background)."""
        original = {"model": inst.model, "strategy": inst.strategy, "backend": inst.backend,
                    "nodes": [{"node": r.node, **({"layers": list(r.layers)} if r.layers
                                                  else {})} for r in inst.ranks],
                    "kv_bits": inst.kv_bits or 16}
        if not self.enabled:
            self.info = HealInfo(inst.model, "off", f"{reason}. Healing is off (shoal node "
                                 f"--no-heal): launch it again.", [], original)
            return
        self.info = HealInfo(inst.model, "placing", f"{reason}. Placing {inst.model} again "
                             f"on the nodes that remain.", [], original)
        self.cancel()
        self._task = asyncio.create_task(self._heal(inst, reason, original))

    def cancel(self) -> None:
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
        self._task = None

    def forget(self) -> None:
        """A launch or stop by the user: what healing did no longer applies."""
        self.cancel()
        self.info = None

    async def _heal(self, inst: Instance, reason: str, original: dict[str, Any]) -> None:
        t0 = time.monotonic()
        alive = await self._answering([r.node for r in inst.ranks])
        lost = [r.node for r in inst.ranks if r.node not in alive]
        names = self._names(lost) or "a node"
        self.info = replace(self.info or HealInfo(inst.model, "placing", ""), lost=lost)
        # an RDMA group that broke with every node still there: the same nodes over TCP
        tcp = not lost and inst.backend != "ring"
        try:
            await self.cluster.launch({**original, "backend": "ring"} if tcp else
                                      {"model": inst.model, "kv_bits": inst.kv_bits or 16},
                                      exclude=set(lost), healing=True)
        except ShoalError as e:
            state = "doesnt_fit" if e.code == "insufficient_memory" else "failed"
            what = (f"{inst.model} doesn't fit on the nodes left without {names}: "
                    f"{e.message}" if state == "doesnt_fit" else
                    f"placing {inst.model} again failed: {e.message}")
            log.warning("healing %s: %s", inst.model, what)
            self.info = replace(self.info, state=state,
                                message=f"{reason}. {what[0].upper()}{what[1:]}")
        except Exception as e:  # anything else: say so, never leave "placing" forever
            log.exception("healing %s failed", inst.model)
            self.info = replace(self.info, state="failed",
                                message=f"{reason}. Placing {inst.model} again failed: {e}")
        else:
            took = time.monotonic() - t0
            log.warning("healed %s without %s in %.1f s", inst.model, names, took)
            again = (f"{inst.model} runs again over the ring (TCP) on the same nodes; the "
                     f"{inst.backend} (RDMA) group broke" if tcp else
                     f"{inst.model} runs again without {names}" if lost else
                     f"{inst.model} runs again, placed afresh on the nodes that answer")
            self.info = replace(self.info, state="serving", seconds=round(took, 2),
                                message=f"{reason}. {again} ({took:.0f} s after it was "
                                        f"lost).")
        await self._watch_for(lost)

    async def _watch_for(self, lost: list[str]) -> None:
        """Offer the original placement once every lost node answers again."""
        while lost and self.info is not None and not self.info.back:
            await asyncio.sleep(BACK_EVERY_S)
            if set(lost) <= await self._answering(lost):
                names = self._names(lost)
                self.info = replace(self.info, back=True, message=(
                    f"{names} {'is' if len(lost) == 1 else 'are'} back: launch the original "
                    f"placement again to run as before."))
                log.info("healing: %s back", names)

    async def _answering(self, ids: list[str]) -> set[str]:
        """The nodes among `ids` that answer now (this one always does)."""
        c = self.cluster

        async def probe(nid: str) -> str | None:
            if nid == c.id:
                return nid
            peer = c.peers.find(nid)
            if peer is None or not peer.trusted:
                return None
            try:
                await c.peers.call(peer.url, "GET", "/shoal/node", timeout=PROBE_S)
            except ShoalError:
                return None
            return nid
        return {x for x in await asyncio.gather(*(probe(n) for n in ids)) if x}

    def _names(self, ids: list[str]) -> str:
        names = []
        for nid in ids:
            peer = self.cluster.peers.find(nid)
            names.append(f"node {peer.name or nid}" if peer else f"node {nid}")
        return " and ".join(names)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
