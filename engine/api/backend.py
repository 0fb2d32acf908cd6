"""What the protocol adapters need from whatever serves them: the models it has, the one
loaded, loading and unloading, one generation's events, an embedding or rerank answer
from a model served beside the main one, and passing a request on to the node that serves
its model. The node implements it (engine/node/backend.py); the adapters
never see the node, its worker or the cluster."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from engine import protocol as wire
from engine.errors import Busy, ShoalError
from engine.hub.local import LocalModel


@dataclass(frozen=True)
class RemoteModel:
    """A model a distributed instance on another node serves."""
    id: str
    owner: str  # the owning node's URL
    instance: dict[str, Any]  # its InstanceInfo as JSON


@dataclass
class Started:
    """A generation the worker has begun: the model that serves it and its events, the
    first of which is Accepted or Error."""
    model: str
    events: AsyncIterator[wire.Event]


class Backend(Protocol):
    async def models(self) -> list[LocalModel]: ...
    def remote_models(self) -> list[RemoteModel]: ...
    def loaded_model(self) -> str | None: ...
    async def load(self, model: str | None) -> str: ...
    async def unload(self, model: str) -> None: ...
    def keep_alive(self, model: str, seconds: float | None) -> None: ...
    def expires_in(self, model: str) -> float | None: ...
    async def running_beside(self) -> list[LocalModel]: ...
    def generate(self, model: str | None, req: wire.GenerateRequest
                 ) -> AbstractAsyncContextManager[Started]: ...
    async def relay(self, request: web.Request, model: str | None, body: Any,
                    key: Callable[[], str | None] | None = None
                    ) -> web.StreamResponse | None: ...
    async def embed(self, model: str, cmd: wire.Embed) -> wire.Embedded | wire.Error: ...
    async def rerank(self, model: str, cmd: wire.Rerank) -> wire.Ranked | wire.Error: ...
    async def prepare(self, model: str, need: str) -> None: ...
    def serving(self, need: str) -> list[str]: ...
    async def elsewhere(self, request: web.Request,
                        err: ShoalError) -> web.StreamResponse | None: ...


BACKEND = web.AppKey("backend", Backend)


def backend(request: web.Request) -> Backend:
    return request.app[BACKEND]


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def placed(handler: Handler) -> Handler:
    """A route whose model runs beside the chat model: where it has no room on this node
    (a 503, insufficient_memory), a member with room answers instead (Backend.elsewhere);
    without one the 503 stands."""
    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except Busy as e:
            if e.code != "insufficient_memory":
                raise
            answer = await backend(request).elsewhere(request, e)
            if answer is None:
                raise
            return answer
    return run
