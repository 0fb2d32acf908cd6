"""The node as the protocol adapters' Backend (engine/api/backend.py): its models, its one
worker, and the cluster's distributed instances, which other nodes own and answer for."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.api.backend import RemoteModel, Started
from engine.errors import ShoalError
from engine.hub.local import LocalModel
from engine.node import prefill_split, relay
from engine.node.beside import canonical
from engine.node.routing import name_key
from engine.node.service import Node
from engine.records import InstanceInfo, InstanceState, RankInfo

log = logging.getLogger(__name__)

PREPARE_WAIT_S = 120.0  # the bundled model's import takes seconds; a list never hangs


class NodeBackend:
    def __init__(self, node: Node, cluster: Any = None):
        self.node, self.cluster = node, cluster

    async def models(self) -> list[LocalModel]:
        """The models here; on a first run, once the default model is imported (a client
        that lists models as soon as the API answers sees it)."""
        with contextlib.suppress(TimeoutError):
            await self.node.prepared(PREPARE_WAIT_S)
        return self.node.local_models()

    def remote_models(self) -> list[RemoteModel]:
        """The models other nodes serve that this one has not: each once, under one name
        (a model on this disk, or another copy's, under another name is left out)."""
        if self.cluster is None:
            return []
        seen = {name_key(m.id) for m in self.node.local_models()}
        out = []
        for url, inst in self.cluster.remote_instances():
            if isinstance(inst.model, str) and name_key(inst.model) not in seen:
                seen.add(name_key(inst.model))
                out.append(RemoteModel(inst.model, url, inst.to_json()))
        for p in self.cluster.peers.all():  # a model a peer serves alone
            s = p.info.serving if p.trusted and p.info else None
            if s is not None and s.ready and s.instance is None \
                    and isinstance(s.model, str) and name_key(s.model) not in seen:
                seen.add(name_key(s.model))
                out.append(RemoteModel(s.model, p.url, InstanceInfo(
                    None, s.model, "single", InstanceState.READY,
                    ranks=[RankInfo(0, p.id)]).to_json()))
        return out

    def _named(self, model: str | None) -> str | None:
        """`model` as the cluster serves it (another name of a running model: that
        model's), so an alias never starts a second worker for it."""
        if model is None or self.cluster is None:
            return model
        return self.cluster.router.canonical(model)

    def loaded_model(self) -> str | None:
        w = self.node.worker
        return w.model_id if w is not None and w.alive else None

    async def load(self, model: str | None) -> str:
        return (await self.node.ensure_loaded(self._named(model))).model_id

    async def unload(self, model: str) -> None:
        if await self.node.beside.unload(model):
            return
        if self.loaded_model() == self._named(model):
            await self.node.unload()

    def keep_alive(self, model: str, seconds: float | None) -> None:
        self.node.keep_alive[canonical(self._named(model) or model)] = seconds

    def expires_in(self, model: str) -> float | None:
        return self.node.expires_in(canonical(self._named(model) or model))

    async def running_beside(self) -> list[LocalModel]:
        """The models running beside the main one, as the model list has them."""
        from engine.records import RunnerReady
        ready = {m for m, s in self.node.beside.states.items() if isinstance(s, RunnerReady)}
        return [m for m in await self.models() if canonical(m.id) in ready]

    @contextlib.asynccontextmanager
    async def generate(self, model: str | None,
                       req: wire.GenerateRequest) -> AsyncIterator[Started]:
        worker = await self.node.ensure_loaded(self._named(model))
        # a long prompt may be prefilled by another node first (engine/node/prefill_split.py)
        await prefill_split.before_generate(self.node, self.cluster, worker, req)
        async with worker.generate(req, self.node.on_turn) as events:
            yield Started(worker.model_id, events)

    async def embed(self, model: str, cmd: wire.Embed) -> wire.Embedded | wire.Error:
        """`cmd` answered by `model`'s worker (beside the main one, started if need be)."""
        worker = await self.node.beside.worker(model, "embed")
        return await worker.embed(cmd, self._turn(worker))

    async def rerank(self, model: str, cmd: wire.Rerank) -> wire.Ranked | wire.Error:
        worker = await self.node.beside.worker(model, "rerank")
        return await worker.rerank(cmd, self._turn(worker))

    async def prepare(self, model: str, need: str) -> None:
        """Start `model`'s worker for `need` ("embed", "rerank") if it isn't running."""
        await self.node.beside.worker(model, need)

    def serving(self, need: str) -> list[str]:
        """The models here that do `need` ("embed", "rerank")."""
        return self.node.beside.serving(need)

    async def elsewhere(self, request: web.Request,
                        err: ShoalError) -> web.StreamResponse | None:
        """A beside model with no room here (`err`: beside.NoRoom) runs on the member with
        the most room that has it: the request is passed on and its answer streamed back.
        None (the 503 stands) without one, or for a request a member passed here."""
        from engine.node.beside import NoRoom, room_elsewhere
        if not isinstance(err, NoRoom) or self.cluster is None \
                or request.get("caller") is not None:  # one hop: a member's request stays
            return None
        peer = room_elsewhere(err.model, err.need, self.cluster.peers.all())
        if peer is None:
            return None
        log.info("%s has no room here: %s (%s) runs it", err.model, peer.name, peer.id)
        return await relay.forward(request, self.cluster.peers, peer.url, await request.read(),
                                   f"running {err.model}")

    def _turn(self, worker: Any) -> Any:
        if worker is self.node.worker:
            return self.node.on_turn
        return lambda busy: self.node.beside.on_turn(worker.model_id, busy)

    async def relay(self, request: web.Request, model: str | None, body: Any,
                    key: Callable[[], str | None] | None = None
                    ) -> web.StreamResponse | None:
        """Pass the request to the replica of `model` (under any of its names) that
        answers it (engine/node/routing.py), or None where that is this node. A request a
        member passed here stays (one hop); so does one for a model no replica runs (this
        node loads it)."""
        if not model or self.cluster is None:
            return None
        router = self.cluster.router
        model = router.canonical(model)  # once, here: every name of it routes alike
        w = self.node.worker
        here = w is not None and w.alive and w.model_id == model
        if request.get("caller") is None:
            chosen = router.choose(model, key)
            if chosen is not None:
                if chosen.url is None:  # counted in this replica's load until it ends
                    release = router.hold(chosen.node)
                    if request.task is None:  # (a request made in a test has none)
                        release()
                    else:
                        request.task.add_done_callback(lambda _: release())
                    return None
                if isinstance(body, dict) and chosen.model:  # the name it knows it by
                    body = {**body, "model": chosen.model}
                with router.sending(chosen.node):
                    return await relay.forward(request, self.cluster.peers, chosen.url,
                                               json.dumps(body).encode(),
                                               f"serving {model}")
        else:
            router.refuse_stopped(model)  # a member's view from before a user's Stop
            if here and key is not None:  # the member chose this copy for it
                router.served_here(key())
        if here:
            return None
        return await relay.relay(request, self.cluster, model, body)
