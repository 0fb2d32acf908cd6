"""Prefill on one node, decode on another. A node serving a model alone can name a prefill
node (a launch's "prefill"): before a request whose prompt has at least `min_tokens` not in
this node's prefix cache, the prefill node runs the model over the prompt (all but its last
token) and sends the KV back over the authenticated node channel, as one file in the KV's
own dtype (engine/runtime/handover.py); this node's worker keeps it in its prefix cache, so
the request's own lookup finds it and decoding starts after one token. A prompt mostly
cached here skips the prefill node. A prefill node that fails or stops answering fails that
request alone, saying so."""

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

log = logging.getLogger(__name__)
MIN_TOKENS = 1024  # shorter prompts prefill here faster than the round trip pays
PREFILL_SECONDS = "X-Shoal-Prefill-Seconds"  # the prefill node's model time, in its answer
WATCH_S = 1.0  # how often a hand-over checks that the prefill node is still there
HEADER_BYTES = 4 << 20  # a prompt-cache file's safetensors header and metadata, at most


@dataclass(frozen=True)
class PrefillNode:
    node: str  # the prefill node's id
    model: str  # the model it prefills (a request for another one runs here as it is)
    min_tokens: int = MIN_TOKENS


@dataclass
class Handed:
    """What a hand-over moved, and how long it took."""
    tokens: int = 0
    bytes: int = 0
    prefill_s: float = 0.0  # the prefill node's model time
    total_s: float = 0.0  # asked to adopted, as this node saw it


def folder(home: Path) -> Path:
    f = home / "tmp" / "handover"
    f.mkdir(parents=True, exist_ok=True)
    return f


async def before_generate(node: Any, cluster: Any, worker: Any,
                          req: wire.GenerateRequest) -> Handed | None:
    """Have the prefill node compute `req`'s prompt KV for `worker` where that pays; None
    where the request runs here as it is."""
    plan: PrefillNode | None = getattr(node, "prefill", None)
    if plan is None or cluster is None or req.count_only or req.images \
            or worker.dist_config is not None or worker.model_id != plan.model:
        return None
    if _chars(req) < plan.min_tokens:  # fewer characters than that can't be that many
        return None                    # tokens: no pass through the worker to count
    ids, cached = await _listing(worker, req)
    if ids is None or len(ids) - 1 - cached < plan.min_tokens:
        return None
    peer = cluster.peers.find(plan.node)
    if peer is None or not peer.trusted or not peer.reachable:
        raise PeerUnreachable(f"The prefill node ({cluster.name_of(plan.node)}) can't be "
                              "reached, so this long prompt can't be prefilled there. Try "
                              "again once it is back, or launch the model without it.")
    t0 = time.monotonic()
    tokens = ids[:-1]
    path = folder(node.home) / f"{uuid.uuid4().hex}.safetensors"
    try:
        size, there = await _watched(peer, _fetch(cluster.peers, peer, worker.model_id,
                                                  tokens, path,
                                                  _bound(node, worker.model_id, len(tokens))))
        fetched = time.monotonic()
        ans = await worker.adopt_kv(wire.AdoptKV("", tokens, str(path)))
    finally:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    if isinstance(ans, wire.Error):
        raise _bad_gateway(f"The KV the prefill node sent couldn't be used: {ans.message}")
    done = time.monotonic()
    got = Handed(len(tokens), size, there, done - t0)
    # the transfer: asked to the file here, less the prefill there
    log.info("%d prompt tokens prefilled by %s: %.1f MB; prefill %.2f s there, transfer "
             "%.2f s, adopt %.2f s, in all %.2f s", got.tokens, peer.name, size / 1e6, there,
             max(fetched - t0 - there, 0.0), done - fetched, got.total_s)
    return got


async def _watched(peer: Any, fetch: Any) -> tuple[int, float]:
    """`fetch` until it ends, or until the peers' poll finds the prefill node gone (a
    prefill is silent until its file comes, so no read timeout can tell a long prompt
    from a node that stopped)."""
    task = asyncio.ensure_future(fetch)
    try:
        while not task.done():
            await asyncio.wait({task}, timeout=WATCH_S)
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


def _bound(node: Any, model: str, tokens: int) -> int:
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


async def _fetch(peers: Any, peer: Any, model: str, tokens: list[int], path: Path,
                 bound: int) -> tuple[int, float]:
    """The prefill node's file for `tokens`, written to `path`; (its size, the seconds the
    prefill node said its model took)."""
    body = json.dumps({"model": model, "tokens": tokens}).encode()
    size, there = 0, 0.0
    try:
        async with peers.stream(peer.url, "POST", "/shoal/peer/prefill", body,
                                {"Content-Type": "application/json"}) as up:
            if up.status != 200:
                raw = await up.content.read(65536)
                try:
                    why = json.loads(raw)["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    why = raw[:200].decode(errors="replace")
                raise _bad_gateway(f"The prefill node ({peer.name}) couldn't prefill "
                                   f"this prompt: {why}")
            try:
                there = float(up.headers.get(PREFILL_SECONDS, "0"))
            except ValueError:
                there = 0.0
            with path.open("wb") as f:
                async for chunk in up.content.iter_chunked(1 << 20):
                    size += len(chunk)
                    if size > bound:
                        raise _bad_gateway(f"The prefill node ({peer.name}) sent more KV "
                                           f"than {len(tokens)} tokens hold; its answer "
                                           "was dropped.")
                    f.write(chunk)
    except PeerUnreachable as e:
        raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering during "
                              f"the hand-over: {e.message}") from None
    except (OSError, ConnectionError) as e:
        raise PeerUnreachable(f"The prefill node ({peer.name}) stopped answering during "
                              f"the hand-over ({e}).") from None
    return size, there if 0 <= there < 1e6 else 0.0


async def serve_prefill(node: Any, model: Any, tokens: Any) -> tuple[Path, int, float]:
    """A member's /shoal/peer/prefill: the KV of `tokens` written by this node's worker
    (which must serve `model`, alone); (the file, its size, the model's seconds)."""
    from engine.errors import BadRequest
    w = node.worker
    if not isinstance(model, str) or w is None or not w.alive or w.model_id != model:
        raise BadRequest(f"This node doesn't run {str(model)[:80]!r} now; launch it here "
                         "to prefill for it.", param="model")
    if w.dist_config is not None:
        raise BadRequest("This node runs the model as part of a group; a prefill node "
                         "runs it alone.", param="model")
    if not isinstance(tokens, list) or not tokens:
        raise BadRequest("Send the prompt's token ids as 'tokens'.", param="tokens")
    path = folder(node.home) / f"{uuid.uuid4().hex}.safetensors"
    ans = await w.prefill_kv(wire.PrefillKV("", tokens, str(path)))
    if isinstance(ans, wire.Error):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        from engine.api.render import error_of
        raise error_of(ans)
    return path, path.stat().st_size, ans.seconds


def _bad_gateway(message: str) -> ShoalError:
    e = ShoalError(message, code="handover_failed")
    e.status = 502
    return e
