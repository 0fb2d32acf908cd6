"""A prefill node's KV for a model a group serves (engine/node/handover.py for one that
serves alone). The group's owner node (rank 0's) fetches the frames from the prefill node
into its hand-over folder as each layer is made; each member node of the group pulls them
from the owner into its own folder as they land there (POST /shoal/peer/handover/pull,
which reads POST /shoal/peer/handover/frames). Once every copy is whole and hashes alike,
rank 0 has every rank take its share in at the next plan (engine/runtime/group/adopt.py),
so the transfer to the members runs beside the prefill, and decoding starts a local read
after the last layer lands."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import secrets
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from engine import protocol as wire
from engine.errors import BadRequest, PeerUnreachable, ShoalError
from engine.node import handover as one
from engine.runtime.group.adopt import frames_name
from engine.runtime.kv_frames import FrameError, Reader

log = logging.getLogger(__name__)
STALE_S = 600.0  # a member's copy no plan took (the request failed first) goes after this


async def into_group(node: Any, cluster: Any, worker: Any, peer: Any,
                     tokens: list[int]) -> None:
    """`tokens`' KV from the prefill node `peer` into every rank of the group `worker`
    leads (engine/node/handover.py decide() found it pays)."""
    inst = cluster.instance
    members = [] if inst is None else [cluster.peers.find(r.node) for r in inst.ranks[1:]]
    if inst is None or inst.model != worker.model_id or any(
            m is None or not m.trusted or not m.reachable for m in members):
        raise PeerUnreachable("A node of the model's group can't be reached, so this long "
                              "prompt can't be prefilled on the prefill node; try again "
                              "once the group is whole.")
    t0 = time.monotonic()
    job = secrets.randbelow(1 << 31)
    path = one.folder(node.home) / frames_name(job)
    path.touch()
    bound = one._bound(node, worker.model_id, len(tokens))
    fetch = one._fetch(cluster.peers, peer, worker.model_id, tokens, path, bound)
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(fetch)]
    tasks += [asyncio.ensure_future(cluster.peers.call(
        m.url, "POST", "/shoal/peer/handover/pull",
        {"job": job, "model": worker.model_id, "tokens": len(tokens)}, timeout=86400))
        for m in members]
    try:
        answers = await _watched([peer, *members], tasks)
        fetched = time.monotonic()
        mine = _digest(path)
        for m, ans in zip(members, answers[1:]):
            if not isinstance(ans, dict) or ans.get("sha256") != mine:
                raise one._bad_gateway(f"{m.name}'s copy of the handed-over KV differs "
                                       "from this node's; the request is not served.")
        ans = await worker.adopt_kv(wire.AdoptKV("", tokens, str(path), job))
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    if isinstance(ans, wire.Error):
        raise one._bad_gateway(f"The KV the prefill node sent couldn't be used: {ans.message}")
    size, there = answers[0]
    log.info("%d prompt tokens prefilled by %s for the group (%d ranks): %.1f MB; prefill "
             "%.2f s there, every copy whole %.2f s after it, taken in %.2f s after that",
             len(tokens), peer.name, len(members) + 1, size / 1e6, there,
             max(fetched - t0 - there, 0.0), time.monotonic() - fetched)


async def _watched(nodes: list[Any], tasks: list[asyncio.Future[Any]]) -> list[Any]:
    """Every task's answer; the first failure (or a node the peers' poll finds gone)
    fails them all (a long prefill's frames can be minutes apart: no read timeout)."""
    while True:
        done, _ = await asyncio.wait(tasks, timeout=one.WATCH_S,
                                     return_when=asyncio.FIRST_EXCEPTION)
        for t in done:
            if t.exception() is not None:
                raise t.exception()  # type: ignore[misc]
        if len(done) == len(tasks):
            return [t.result() for t in tasks]
        gone = next((n for n in nodes if not n.reachable), None)
        if gone is not None:
            raise PeerUnreachable(f"{gone.name} stopped answering during the hand-over; "
                                  "this request is lost. Try again once it is back.")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --- a member node of the group --------------------------------------------------------
async def pull(node: Any, cluster: Any, caller: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST /shoal/peer/handover/pull: the group's owner (`caller`) has hand-over `job`'s
    frames coming in; copy them here as they land there, for this node's rank to read.
    Answers their size and hash once the end frame is here."""
    job, model, n = body.get("job"), body.get("model"), body.get("tokens")
    name = frames_name(job)  # (a 400 for a number that isn't one)
    if not isinstance(model, str):
        raise BadRequest("Send the model's name as 'model'.", param="model")
    rank = next((f for f in cluster.followers.all() if f.model == model
                 and f.worker is not None and f.worker.alive), None)
    if rank is None:
        raise BadRequest(f"This node serves no rank of {str(model)[:80]!r} now.",
                         param="model")
    if type(n) is not int or n <= 0:
        raise BadRequest("Send the prompt's length in tokens as 'tokens'.", param="tokens")
    owner = cluster.peers.find(caller)
    if owner is None or not owner.trusted or caller != rank.owner_id:
        raise BadRequest("Only the member that owns the group this node's rank serves "
                         "hands KV over to it.")
    folder = one.folder(node.home)
    _sweep(folder)
    path = folder / name
    bound, size, end = one._bound(node, model, n), 0, None
    h, frames = hashlib.sha256(), Reader(keep=False)
    try:
        async with cluster.peers.stream(owner.url, "POST", "/shoal/peer/handover/frames",
                                        _json({"job": job}),
                                        {"Content-Type": "application/json"}) as up:
            if up.status != 200:
                raise one._bad_gateway(f"{owner.name} has no hand-over numbered {job}.")
            with path.open("wb") as f:
                async for chunk in up.content.iter_any():
                    size += len(chunk)
                    if size > bound or end is not None:
                        raise one._bad_gateway(f"{owner.name} sent more KV than {n} tokens "
                                               "hold.")
                    f.write(chunk)
                    h.update(chunk)
                    for header, _ in frames.feed(chunk):
                        if header["kind"] in ("end", "error"):
                            end = header
    except FrameError as e:
        _gone(path)
        raise one._bad_gateway(f"{owner.name} sent what isn't KV ({e}).") from None
    except (ShoalError, OSError, ConnectionError) as e:
        _gone(path)
        if isinstance(e, ShoalError):
            raise
        raise PeerUnreachable(f"{owner.name} stopped answering during the hand-over ({e})."
                              ) from None
    except asyncio.CancelledError:
        _gone(path)
        raise
    if end is None or end["kind"] != "end":
        _gone(path)
        why = str(end.get("message"))[:300] if end else "its frames ended early"
        raise one._bad_gateway(f"The hand-over failed: {why}")
    return {"bytes": size, "sha256": h.hexdigest()}


async def frames(request: web.Request, node: Any, cluster: Any) -> web.StreamResponse:
    """POST /shoal/peer/handover/frames: a member of this node's group reads hand-over
    `job`'s frames as this node writes them, until their end (or the hand-over ends here,
    its file removed)."""
    from engine.node.incoming import json_object

    body = await json_object(request)
    path = one.folder(node.home) / frames_name(body.get("job"))
    inst, caller = cluster.instance, request["caller"].node
    if inst is None or caller not in {r.node for r in inst.ranks[1:]}:
        raise BadRequest("Only a node of this node's group reads its hand-overs.")
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise BadRequest("No hand-over runs with that number here.") from None
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await resp.prepare(request)
    reader = Reader(keep=False)
    with f:
        while True:
            data = f.read(1 << 20)
            if data:
                await resp.write(data)
                try:
                    if any(h["kind"] in ("end", "error") for h, _ in reader.feed(data)):
                        break
                except FrameError:
                    break  # the owner's own fetch says what is wrong
            elif not path.exists():
                break  # the hand-over ended here: the member sees its frames end early
            else:
                await asyncio.sleep(one.POLL_S)
    await resp.write_eof()
    return resp


def _json(body: dict[str, Any]) -> bytes:
    import json
    return json.dumps(body).encode()


def _gone(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _sweep(folder: Path) -> None:
    """Copies no plan took (their request failed before it) go after STALE_S."""
    now = time.time()
    for f in folder.glob("g*.frames"):
        with contextlib.suppress(OSError):
            if now - f.stat().st_mtime > STALE_S:
                f.unlink()
