"""The ranks this node runs for instances other nodes own: it checks the model and hands out
ports when asked (prepare), starts the rank's worker from the owner's DistConfig, reports
its state to the owner's watch, and tells the owner at once when the rank fails."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from engine.cluster_records import FollowerState, RankPorts, RankPrepare, RankStart
from engine.errors import ShoalError
from engine.node.launch import check_instance_id, fresh_ports, write_config
from engine.node.peers import Peers
from engine.node.service import Node
from engine.node.worker_handle import WorkerHandle
from engine.paths import logs_dir
from engine.protocol import Exited, Fatal, Loading, Message
from engine.records import ENDED, FollowerInfo, InstanceState, LoadReport

KEEP_ENDED = 4  # ended ranks remembered, for their reasons
LEAVING = "the node is shutting down"  # a rank's reason while its node quits (healing reads it)


@dataclass
class Follower:
    """A rank this node runs for an instance owned elsewhere."""
    instance: str
    owner_url: str
    rank: int
    model: str
    owner_id: str = ""  # the member that started it (as its signature proved)
    worker: WorkerHandle | None = None
    state: InstanceState = InstanceState.STARTING
    reason: str | None = None
    progress: list[int] = field(default_factory=lambda: [0, 0])  # layers loaded, total
    loaded: LoadReport | None = None  # once ready

    def info(self) -> FollowerInfo:
        return FollowerInfo(self.instance, self.rank, self.state, self.reason, self.progress)


class Followers:
    def __init__(self, node: Node, peers: Peers, name: str, host: str):
        self.node, self.peers, self.name, self.host = node, peers, name, host
        self._by_id: dict[str, Follower] = {}

    def all(self) -> list[Follower]:
        return list(self._by_id.values())

    def holding(self, model: str) -> Follower | None:
        """The rank of `model` this node holds (or held, until a failure)."""
        return next((f for f in self._by_id.values() if f.worker is not None
                     and f.model == model and f.reason != "stopped"), None)

    async def prepare(self, body: RankPrepare) -> RankPorts:
        """Check the model (the files this rank reads) and hand out two fresh ports."""
        check_instance_id(body.instance)
        await self.node.check_model(self.node.resolve(body.model), all_files=False)
        return fresh_ports(body.host or self.host)

    async def start(self, body: RankStart, owner_id: str = "") -> None:
        """Start the rank `body` asks for, for member `owner_id` (who signed it)."""
        inst_id, model, owner = check_instance_id(body.instance), body.model, body.owner
        cfg = body.config
        path = self.node.resolve(model)
        old = self._by_id.pop(inst_id, None)
        if old and old.worker:
            await old.worker.stop()
        f = Follower(inst_id, owner, cfg.rank, model, owner_id=owner_id)
        ended = [k for k, v in self._by_id.items() if v.state in ENDED]
        for old_id in ended[:-KEEP_ENDED]:
            del self._by_id[old_id]
        self._by_id[inst_id] = f
        f.worker = WorkerHandle(model, path, logs_dir(self.node.home) / f"worker-{inst_id}.log",
                                lambda ev: self._on_event(f, ev),
                                dist_config=write_config(self.node.home, inst_id, cfg),
                                # this node's admission budget, its share of the prefix
                                # cache's disk tier, where it reads a prefill node's KV
                                worker_args=self.node.rank_flags())
        self.node.keep(asyncio.create_task(self._run(f)))

    async def _run(self, f: Follower) -> None:
        assert f.worker
        try:
            ready = await f.worker.start()
            f.state = InstanceState.READY
            f.loaded = ready.rank.report() if ready.rank else None
        except ShoalError as e:
            f.state, f.reason = InstanceState.FAILED, e.message

    def _on_event(self, f: Follower, ev: Message) -> None:
        if isinstance(ev, Exited) and f.state != InstanceState.STOPPED:
            # the worker's own reason, where it gave one, says more than its exit
            f.state, f.reason = InstanceState.FAILED, f.reason or ev.reason
            self.node.keep(asyncio.get_running_loop().create_task(self._tell_owner(f)))
        elif isinstance(ev, Fatal):
            f.reason = ev.message
        elif isinstance(ev, Loading):
            f.progress = [ev.done, ev.total]

    def owner(self, f: Follower) -> str:
        """The URL this node knows the rank's owner by (its id first: the owner's own idea
        of its address may not be the one this node reaches it at)."""
        peer = self.peers.find(f.owner_id) if f.owner_id else None
        return peer.url if peer is not None else self.peers.url_of(f.owner_url)

    async def _tell_owner(self, f: Follower) -> None:
        with contextlib.suppress(ShoalError):
            await self.peers.call(self.owner(f), "POST", "/shoal/peer/failed",
                                  {"instance": f.instance,
                                   "reason": f"{self.name} is shutting down"
                                   if f.reason == LEAVING else
                                   f"its part on {self.name} stopped: {f.reason}",
                                   "leaving": f.reason == LEAVING},
                                  timeout=5)

    def state(self, inst_id: str) -> FollowerState:
        """What the owner's watch reads (GET /shoal/peer/instances/{id})."""
        f = self._by_id.get(inst_id)
        if f is None:
            return FollowerState(InstanceState.STOPPED, "this node runs no such instance")
        return FollowerState(f.state, f.reason, f.rank, f.progress, f.loaded)

    async def stop(self, inst_id: str, reason: str) -> None:
        f = self._by_id.get(inst_id)
        if f is not None:
            if f.state not in ENDED:  # a rank that failed keeps its own reason
                f.state, f.reason = InstanceState.STOPPED, reason
            if f.worker:
                f.worker.dead_reason = "stopped"
                await f.worker.stop()

    async def close(self) -> None:
        """The node is quitting: owners hear it first, so they place their models again at
        once instead of waiting for silence; GET /shoal/node says so while it finishes."""
        live = [f for f in self._by_id.values() if f.state not in ENDED]
        for f in live:
            f.state, f.reason = InstanceState.STOPPED, LEAVING
        await asyncio.gather(*(self._tell_owner(f) for f in live))
        for inst_id in list(self._by_id):
            await self.stop(inst_id, LEAVING)
