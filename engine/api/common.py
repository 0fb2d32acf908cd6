"""What every protocol adapter shares: reading and checking a body, pydantic errors as a 400
naming the field, finding the worker (or the node that serves the model) and starting one
generation, whose typed events each adapter renders in its own shape."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

from engine import protocol as wire
from engine.api import images
from engine.api.backend import backend
from engine.api.render import Answer, error_of
from engine.errors import BadRequest, ShoalError, WorkerFailed

M = TypeVar("M", bound=BaseModel)
MAX_BODY_MB = 32.0  # the default of `shoal node --max-body-mb` (images come inline)
MAX_DEPTH = 64  # deeper JSON is no request any client sends; refuse it before recursing
_UNION_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "literal"}


class PayloadTooLarge(ShoalError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


def too_large(limit: int, size: int | None = None) -> PayloadTooLarge:
    """The 413 for a body over the node's limit, whether its Content-Length said so or
    aiohttp found out while reading it."""
    got = f" of {size / 2**20:.1f} MB" if size else ""
    return PayloadTooLarge(
        f"The request body{got} is over this node's limit of {limit / 2**20:g} MB: send a "
        "shorter request, or start the node with a larger --max-body-mb.")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        p = str(part)
        if p.lower() in _UNION_TAGS or "[" in p or "-" in p or p.startswith("tagged"):
            break  # pydantic's name for a union member, not a field
        out += f".{p}" if out else p
    return out


def _walk(v: Any, path: str, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise BadRequest(f"The request nests deeper than {MAX_DEPTH} levels at '{path}'.",
                         param=path or None)
    if isinstance(v, float) and not math.isfinite(v):
        raise BadRequest(f"'{path}' must be a finite number, got {v}.", param=path or None)
    if isinstance(v, dict):
        for k, x in v.items():
            _walk(x, f"{path}.{k}" if path else str(k), depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _walk(x, f"{path}[{i}]", depth + 1)


def check_body(body: Any) -> Any:
    """NaN and infinities anywhere are a 400 naming the field, as is absurd nesting."""
    _walk(body, "", 0)
    return body


async def read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        body = json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(f"The request body is not valid JSON: {e}.") from None
    except RecursionError:
        raise BadRequest(f"The request nests deeper than {MAX_DEPTH} levels.") from None
    return check_body(body)


def parse(model: type[M], body: Any) -> M:
    """The body as `model`, or a BadRequest naming the first field that is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        param = _path(tuple(err["loc"]))
        if err["type"] == "extra_forbidden":
            msg = f"'{param}' is not a parameter Shoal understands; remove it"
        elif err["type"] == "missing":
            msg = f"'{param}' is required"
        else:
            msg = f"'{param}': {err['msg']}"
            got = repr(err["input"]) if "input" in err else ""
            if got and not isinstance(err["input"], (dict, list)) and got not in msg:
                msg += f" (got {got if len(got) <= 80 else got[:77] + '...'})"  # not 100 KB back
        raise BadRequest(msg + ".", param=param or None) from None


KEEPALIVE_S = 10.0  # while nothing else is said: an SSE comment (or Anthropic's ping)



class Generation:
    """One generation's events for an adapter. Prefill progress is kept, not passed on:
    `admitted()` waits for the first (the prefix cache's hit is known then), and
    `stream(every)` yields None whenever `every` seconds pass in silence, for a
    keep-alive, so clients with read timeouts wait out a long prefill."""

    def __init__(self, model: str, accepted: wire.Accepted, source: AsyncIterator[wire.Event],
                 t0: float):
        self.model, self.accepted, self.t0 = model, accepted, t0
        self.progress: wire.Progress | None = None
        self._source = aiter(source)
        self._held: list[wire.Event] = []
        self._next: asyncio.Future | None = None

    async def _pull(self, timeout: float | None) -> wire.Event | None:
        """The next event that isn't progress; None when `timeout` passes first; raises
        StopAsyncIteration at the end."""
        if self._held:
            return self._held.pop(0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._next is None:
                self._next = asyncio.ensure_future(anext(self._source))
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = await asyncio.wait({self._next}, timeout=left)
            if not done:
                return None
            fut, self._next = self._next, None
            ev = fut.result()
            if isinstance(ev, wire.Progress):
                self.progress = ev
                if self._show_progress:
                    return ev
                if timeout is not None and self._waiting_admission:
                    return None
                continue
            return ev

    _waiting_admission = False
    _show_progress = False

    async def admitted(self, timeout: float = 30.0) -> int:
        """The prompt tokens the prefix cache held, once the request is admitted (or 0 if
        the first token, an error or `timeout` comes first)."""
        deadline = time.monotonic() + timeout
        self._waiting_admission = True
        try:
            while self.progress is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    ev = await self._pull(left)
                except StopAsyncIteration:
                    break
                if ev is not None:
                    self._held.append(ev)
                    break
        finally:
            self._waiting_admission = False
        return self.progress.cached if self.progress else 0

    async def stream(self, every: float | None = KEEPALIVE_S, progress: bool = False
                     ) -> AsyncIterator[wire.Event | None]:
        """The events; None after `every` seconds of silence; Progress too if asked."""
        self._show_progress = progress
        try:
            while True:
                try:
                    ev = await self._pull(every)
                except StopAsyncIteration:
                    return
                yield ev
        finally:
            if self._next is not None and not self._next.done():
                self._next.cancel()

    @property
    def events(self) -> AsyncIterator[wire.Event]:
        """The events without keep-alives."""
        async def only() -> AsyncIterator[wire.Event]:
            async for ev in self.stream(None):
                if ev is not None:
                    yield ev
        return only()

    async def answer(self) -> Answer:
        a = Answer()
        async for ev in self.events:
            if isinstance(ev, wire.Error):
                raise error_of(ev)
            a.add(ev)
        if a.done is None:
            raise WorkerFailed("The worker stopped without finishing the answer.")
        return a


@contextlib.asynccontextmanager
async def generation(request: web.Request, model: str | None,
                     req: wire.GenerateRequest) -> AsyncIterator[Generation]:
    """Start `req` on the backend's worker for `model`; errors before the first token are
    raised (so they become a proper HTTP error), later ones arrive as Error events."""
    t0 = time.perf_counter()
    if isinstance(req, images.PendingRequest):  # decoded and checked here, not in a worker
        param = req.sources[0].param
        req = await images.resolve(req)
        b = backend(request)
        images.check_vision(model or b.loaded_model(),
                            [(m.id, m.capabilities) for m in await b.models()], param)
    async with backend(request).generate(model, req) as started:
        first = await anext(started.events)
        if isinstance(first, wire.Error):
            raise error_of(first)
        if not isinstance(first, wire.Accepted):
            raise WorkerFailed(f"The worker answered {first.tag} before accepting.")
        yield Generation(started.model, first, started.events, t0)


async def sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


def tool_arguments(text: str, where: str) -> Any:
    """An OpenAI tool call's arguments (a JSON string) as the object templates expect."""
    try:
        return json.loads(text) if text.strip() else {}
    except ValueError:
        raise BadRequest(f"'{where}' must be a JSON object encoded as a string.",
                         param=where) from None

