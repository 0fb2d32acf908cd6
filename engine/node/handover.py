"""Prefill on one node, decode on another. A node serving a model alone can name a prefill
node (a launch's "prefill"; a group's owner too: engine/node/handover_group.py): before
a request whose prompt has at least `min_tokens` not in this node's prefix cache, the
prefill node runs the model over the prompt (all but its last token) and streams the KV
back over the authenticated node channel, each layer's rows as they are made, in the
KV's own dtype (engine/runtime/handover.py, kv_frames.py); this node's worker takes the
frames in as they arrive and keeps the cache in its prefix cache, so the request's own
lookup finds it and decoding starts after one token. A prompt mostly cached here skips
the prefill node. A prefill node that fails or stops answering fails that request alone,
saying so."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine import protocol as wire
from engine.errors import PeerUnreachable, ShoalError
from engine.runtime.kv_frames import FrameError, Reader, encode

log = logging.getLogger(__name__)
MIN_TOKENS = 1024  # shorter prompts prefill here faster than the round trip pays
WATCH_S = 1.0  # how often a hand-over checks that the prefill node is still there
HEADER_BYTES = 16 << 20  # the frames' headers (the first lists the tokens), at most
POLL_S = 0.005  # how often the prefill side looks for the worker's next frames


@dataclass(frozen=True)
class PrefillNode:
    node: str  # the prefill node's id
    model: str  # the model it prefills (a request for another one runs here as it is)
    min_tokens: int = MIN_TOKENS


def folder(home: Path) -> Path:
    f = home / "tmp" / "handover"
    f.mkdir(parents=True, exist_ok=True)
    return f


async def decide(node: Any, cluster: Any, worker: Any,
                 req: wire.GenerateRequest) -> tuple[Any, list[int]] | None:
    """The prefill node and the tokens it prefills for `req` (all of its prompt but the
    last token), where that pays; None where the request runs here as it is."""
    plan: PrefillNode | None = getattr(node, "prefill", None)
    if plan is None or cluster is None or req.count_only or req.images \
            or worker.model_id != plan.model:
        return None
    if _chars(req) < plan.min_tokens:  # fewer characters than that can't be that many
        return None                    # tokens: no pass through the worker to count
    ids, cached = await _listing(worker, req)
    if ids is None or len(ids) - 1 - cached < plan.min_tokens:
        return None
    ready = getattr(worker, "ready", None)
    if ready is not None and len(ids) >= ready.context_length:
        return None  # the request itself says what doesn't fit (a 400), not the prefill node
    peer = cluster.peers.find(plan.node)
    if peer is None or not peer.trusted or not peer.reachable:
        raise PeerUnreachable(f"The prefill node ({cluster.name_of(plan.node)}) can't be "
                              "reached, so this long prompt can't be prefilled there. Try "
                              "again once it is back, or launch the model without it.")
    return peer, ids[:-1]


async def into_one(node: Any, cluster: Any, worker: Any, peer: Any,
                   tokens: list[int]) -> None:
    """`tokens`' KV from the prefill node `peer` into `worker` (serving alone), which takes
    the frames in as they arrive (the prefill there and the transfer run together), so
    the request decodes as soon as the last layer's rows are here."""
    t0 = time.monotonic()
    path = folder(node.home) / f"{uuid.uuid4().hex}.frames"
    path.touch()
    adopting = asyncio.ensure_future(worker.adopt_kv(wire.AdoptKV("", tokens, str(path))))
    try:
        fetch = fetch_frames(cluster.peers, peer, worker.model_id, tokens, path,
                       kv_bound(node, worker.model_id, len(tokens)))
        size, there = await _watched(peer, fetch, adopting)
        fetched = time.monotonic()
        ans = await adopting
    finally:
        if not adopting.done():  # the fetch failed: the worker stops waiting for frames
            adopting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await adopting
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    if isinstance(ans, wire.Error):
        raise bad_gateway(f"The KV the prefill node sent couldn't be used: {ans.message}")
    done = time.monotonic()
    # the transfer ran beside the prefill there: what it added is the time past it
    log.info("%d prompt tokens prefilled by %s: %.1f MB streamed; prefill %.2f s there, "
             "last frame %.2f s after it, adopted %.2f s after that, in all %.2f s",
             len(tokens), peer.name, size / 1e6, there, max(fetched - t0 - there, 0.0),
             done - fetched, done - t0)


async def _watched(peer: Any, fetch: Any, adopting: asyncio.Future) -> tuple[int, float]:
    """`fetch` until it ends, or until the peers' poll finds the prefill node gone (the
    frames of a long chunk can be minutes apart on a slow node, so no read timeout can
    tell a long prompt from a node that stopped), or the worker refuses the frames."""
    task = asyncio.ensure_future(fetch)
    try:
        while not task.done():
            await asyncio.wait({task, adopting}, timeout=WATCH_S,
                               return_when=asyncio.FIRST_COMPLETED)
            if not task.done() and adopting.done():
                ans = adopting.result()
                why = ans.message if isinstance(ans, wire.Error) else "it stopped early"
                raise bad_gateway("The KV the prefill node sends couldn't be used: " + why)
            if not task.done() and not peer.reachable:
                raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering "
                                      "during the hand-over; this request is lost. Try "
                                      "again once it is back.")
        return task.result()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _chars(req: wire.GenerateRequest) -> int:
    """The request's text, in characters (a token is one at least, the template's aside)."""
    if req.messages:
        return sum(len(str(m.get("content") or "")) for m in req.messages) + \
            len(json.dumps(req.tools or []))
    return len(req.prompt) if req.prompt is not None else 0


async def _listing(worker: Any, req: wire.GenerateRequest) -> tuple[list[int] | None, int]:
    """The prompt's token ids and how many of them the prefix cache holds (a count-only
    pass through the worker: the template and the tokenizer are its)."""
    probe = replace(req, count_only=True, show_prompt=True)
    acc: wire.Accepted | None = None
    async with worker.generate(probe) as events:
        async for ev in events:
            if isinstance(ev, wire.Accepted):
                acc = ev
            if isinstance(ev, wire.Error):
                return None, 0  # the request itself will say what is wrong
    if acc is None or acc.prompt_ids is None:
        return None, 0
    return list(acc.prompt_ids), int(acc.cached or 0)


def kv_bound(node: Any, model: str, tokens: int) -> int:
    """The most bytes a hand-over of `tokens` tokens may bring: their KV in float32 (a
    CPU worker runs the model unpacked in float32; the plan counts 16 bits), and the
    file's header."""
    from engine.runtime.admission import kv_bytes_per_token
    try:
        config = json.loads((node.resolve(model) / "config.json").read_text())
        per = kv_bytes_per_token(config, None)
    except (OSError, ValueError, ShoalError):
        per = 1 << 20
    return int((tokens + 256) * max(per, 1) * 2 * 1.1) + HEADER_BYTES


async def fetch_frames(peers: Any, peer: Any, model: str, tokens: list[int], path: Path,
                 bound: int) -> tuple[int, float]:
    """The prefill node's frames for `tokens`, appended to `path` as they come (the
    worker reads them there); (their bytes, the seconds the prefill node's model took,
    from its end frame)."""
    body = json.dumps({"model": model, "tokens": tokens}).encode()
    size, end = 0, None
    frames = Reader(keep=False)
    try:
        async with peers.stream(peer.url, "POST", "/shoal/peer/prefill", body,
                                {"Content-Type": "application/json"}) as up:
            if up.status != 200:
                raw = await up.content.read(65536)
                try:
                    why = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    why = raw[:200].decode(errors="replace")
                raise bad_gateway(f"The prefill node ({peer.name}) couldn't prefill "
                                   f"this prompt: {why}")
            with path.open("ab") as f:
                async for chunk in up.content.iter_any():
                    size += len(chunk)
                    if size > bound or end is not None:
                        raise bad_gateway(f"The prefill node ({peer.name}) sent more KV "
                                           f"than {len(tokens)} tokens hold; its answer "
                                           "was dropped.")
                    f.write(chunk)
                    f.flush()
                    for header, _ in frames.feed(chunk):
                        if header["kind"] == "error":
                            raise bad_gateway(f"The prefill node ({peer.name}) failed: "
                                               f"{str(header.get('message'))[:300]}")
                        if header["kind"] == "end":
                            end = header
    except FrameError as e:
        raise bad_gateway(f"The prefill node ({peer.name}) sent what isn't KV ({e}).") \
            from None
    except PeerUnreachable as e:
        raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering during "
                              f"the hand-over: {e.message}") from None
    except (OSError, ConnectionError) as e:
        raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering during "
                              f"the hand-over ({e}).") from None
    if end is None:
        raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering during "
                              "the hand-over (its answer ended before the last layer).")
    there = end.get("seconds")
    return size, float(there) if isinstance(there, (int, float)) and 0 <= there < 1e6 \
        else 0.0


class Prefill:
    """A member's /shoal/peer/prefill on this node: this node's worker writes the frames
    of `tokens` to a file, which `chunks` passes on as it grows, ending with this node's
    end frame (or its error frame, once the answer has begun)."""

    def __init__(self, node: Any, model: Any, tokens: Any):
        from engine.errors import BadRequest
        w = node.worker
        if not isinstance(model, str) or w is None or not w.alive or w.model_id != model:
            raise BadRequest(f"This node doesn't run {str(model)[:80]!r} now; launch it "
                             "here to prefill for it.", param="model")
        if w.dist_config is not None:
            raise BadRequest("This node runs the model as part of a group; a prefill node "
                             "runs it alone.", param="model")
        if not isinstance(tokens, list) or not tokens:
            raise BadRequest("Send the prompt's token ids as 'tokens'.", param="tokens")
        self.path = folder(node.home) / f"{uuid.uuid4().hex}.frames"
        self.path.touch()
        self._file = self.path.open("rb")
        self._task = asyncio.ensure_future(w.prefill_kv(wire.PrefillKV("", tokens,
                                                                      str(self.path))))

    async def first(self) -> bytes:
        """The first bytes; an error (its own status) where the worker refused before
        writing any."""
        while not (data := self._file.read(1 << 20)):
            if self._task.done():
                ans = self._task.result()
                if isinstance(ans, wire.Error):
                    from engine.api.render import error_of
                    raise error_of(ans)
                return b""
            await asyncio.sleep(POLL_S)
        return data

    async def rest(self) -> Any:
        """The rest of the frames as the worker writes them, then the last word."""
        while True:
            data = self._file.read(1 << 20)
            if data:
                yield data
            elif self._task.done():
                if data := self._file.read():
                    yield data
                ans = self._task.result()
                if isinstance(ans, wire.Error):
                    yield encode({"kind": "error", "message": ans.message})
                else:
                    yield encode({"kind": "end", "seconds": ans.seconds})
                return
            else:
                await asyncio.sleep(POLL_S)

    async def close(self) -> None:
        """The worker's prefill cancelled where it still runs (the member left); the
        file removed."""
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._file.close()
        with contextlib.suppress(OSError):
            self.path.unlink(missing_ok=True)


def bad_gateway(message: str) -> ShoalError:
    e = ShoalError(message, code="handover_failed")
    e.status = 502
    return e
