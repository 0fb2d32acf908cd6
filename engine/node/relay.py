"""Passing a request on to the node that owns the distributed instance serving its model,
and streaming the answer back, ended with an error the client recognises if that node
stops answering midway."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
from aiohttp import web

from engine.cluster.auth import NotInCluster
from engine.errors import PeerUnreachable, ShoalError

RELAY_CHECK_S = 1.0  # how often a relayed answer checks that its owner is still reachable


async def relay(request: web.Request, cluster: Any, model: str,
                body: Any) -> web.StreamResponse | None:
    """When another node owns the distributed instance serving `model`, pass the request on
    unchanged and stream its answer back byte for byte; None when this node serves it."""
    owner, peers = cluster.owner_of(model), cluster.peers
    if owner is None:
        held = cluster.followers.holding(model)
        if held is None:
            return None
        # This node holds (or held, until a failure) a rank of the model's instance: its
        # owner answers, or says why not; never a second, local copy of the model.
        owner = cluster.followers.owner(held)
        peer = peers.find(owner)
        if peer is None or not peer.trusted:
            raise PeerUnreachable(
                f"{model} runs here as a rank of a distributed instance whose owner "
                f"({owner}) can't be reached. Launch it again once the nodes can reach "
                "each other.")
    return await forward(request, peers, owner, json.dumps(body).encode())


async def forward(request: web.Request, peers: Any, owner: str, raw: bytes,
                  what: str = "serving this model") -> web.StreamResponse:
    """Pass `raw` (the request's JSON body) to the peer `owner` at the request's path and
    stream its answer back; a peer that stops answering midway ends it with an error the
    client recognises."""
    resp: web.StreamResponse | None = None

    async def pipe() -> None:
        nonlocal resp
        async with peers.stream(owner, "POST", request.path, raw,
                                {"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status, headers={
                "Content-Type": up.headers.get("Content-Type", "application/json")})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()

    task = asyncio.ensure_future(pipe())
    try:
        # A stream has no read timeout (a long prefill is silent), so the owner's liveness
        # is the peers' poll: a pulled cable ends the answer instead of stalling it.
        while not task.done():
            await asyncio.wait({task}, timeout=RELAY_CHECK_S)
            peer = peers.find(owner)
            if not task.done() and peer is not None and not peer.reachable:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                    await task
                gone = PeerUnreachable(f"The node {what} ({owner}) stopped "
                                       "answering; this answer is lost. Try again once it "
                                       "is back, or launch the model on the nodes that are.")
                if resp is None:
                    raise gone
                await _end_with(resp, gone)
                return resp
        task.result()
        if resp is None:  # (pipe prepares it before it can end without raising)
            raise PeerUnreachable(f"The node {what} ({owner}) sent no answer.")
        return resp
    except aiohttp.ClientError as e:
        raise PeerUnreachable(f"The node {what} ({owner}) did not answer: "
                              f"{e}") from None
    except NotInCluster as e:  # its answer didn't prove the secret: nothing of it passes
        raise PeerUnreachable(f"The node {what} ({owner}) could not prove it "
                              f"is in this cluster: {e.message}") from None
    finally:
        task.cancel()


async def _end_with(resp: web.StreamResponse, err: ShoalError) -> None:
    """End an answer that has begun with an error its client recognises: an SSE `error`
    event (the OpenAI and Anthropic SDKs both raise on it) or an NDJSON line (Ollama)."""
    body = err.to_openai()
    if resp.content_type == "text/event-stream":
        line = f"event: error\ndata: {json.dumps({'type': 'error', **body})}\n\n"
    else:
        line = json.dumps({"error": err.message}) + "\n"
    with contextlib.suppress(ConnectionError, RuntimeError):
        await resp.write(line.encode())
        await resp.write_eof()
