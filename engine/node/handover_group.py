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
    bound = one.kv_bound(node, worker.model_id, len(tokens))
    fetch = one.fetch_frames(cluster.peers, peer, worker.model_id, tokens, path, bound)
    tasks: list[asyncio.Future[Any]] = [asyncio.ensure_future(fetch)]
    tasks += [asyncio.ensure_future(cluster.peers.call(
        m.url, "POST", "/shoal/peer/handover/pull",
        {"job": job, "model": worker.model_id, "tokens": len(tokens)}, timeout=86400))
        for m in members]
    try:
        answers = await _watched([peer, *members], tasks)
        fetched = time.monotonic()
        mine = await asyncio.to_thread(_digest, path)  # (GBs for a long prompt)
        for m, ans in zip(members, answers[1:]):
            if not isinstance(ans, dict) or ans.get("sha256") != mine:
                raise one.bad_gateway(f"{m.name}'s copy of the handed-over KV differs "
                                       "from this node's; the request is not served.")
        ans = await worker.adopt_kv(wire.AdoptKV("", tokens, str(path), job))
    finally:
        for t in tasks:
            t.cancel()
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
    if isinstance(ans, wire.Error):
        raise one.bad_gateway(f"The KV the prefill node sent couldn't be used: {ans.message}")
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
    bound, size, end = one.kv_bound(node, model, n), 0, None
    h, frames = hashlib.sha256(), Reader(keep=False)
    try:
        async with cluster.peers.stream(owner.url, "POST", "/shoal/peer/handover/frames",
                                        _json({"job": job}),
                                        {"Content-Type": "application/json"}) as up:
            if up.status != 200:
                raise one.bad_gateway(f"{owner.name} has no hand-over numbered {job}.")
            with path.open("wb") as f:
                async for chunk in up.content.iter_any():
                    size += len(chunk)
                    if size > bound or end is not None:
                        raise one.bad_gateway(f"{owner.name} sent more KV than {n} tokens "
                                               "hold.")
                    f.write(chunk)
                    h.update(chunk)
                    for header, _ in frames.feed(chunk):
                        if header["kind"] in ("end", "error"):
                            end = header
    except FrameError as e:
        _gone(path)
        raise one.bad_gateway(f"{owner.name} sent what isn't KV ({e}).") from None
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
        raise one.bad_gateway(f"The hand-over failed: {why}")
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
    with f:  # (the owner's own fetch says what is wrong with frames that aren't)
        await _pass_on(f, path, resp, ("end", "error"))
    await resp.write_eof()
    return resp


async def _pass_on(f: Any, path: Path, resp: web.StreamResponse, ends: tuple[str, ...]
                   ) -> None:
    """The frames written to `path` (open as `f`) to `resp` as they come, until one whose
    kind is in `ends`, bytes that aren't frames, or the file's removal (its hand-over
    ended here: the reader sees the frames end early)."""
    reader = Reader(keep=False)
    while True:
        data = f.read(1 << 20)
        if data:
            await resp.write(data)
            try:
                if any(h["kind"] in ends for h, _ in reader.feed(data)):
                    return
            except FrameError:
                return
        elif not path.exists():
            return
        else:
            await asyncio.sleep(one.POLL_S)


def _json(body: dict[str, Any]) -> bytes:
    import json
    return json.dumps(body).encode()


def _gone(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def _sweep(folder: Path) -> None:
    """Copies no plan took (their request failed before it) go after STALE_S."""
    now = time.time()
    for f in [*folder.glob("g*.frames"), *folder.glob("p*.frames")]:
        with contextlib.suppress(OSError):
            if now - f.stat().st_mtime > STALE_S:
                f.unlink()


# --- a pipeline group as the prefill node -----------------------------------------------
class GroupPrefill:
    """A member's /shoal/peer/prefill on a pipeline group's owner: every rank writes its
    layers' frames to its node's folder as the chunks pass (engine/runtime/group/export.py);
    this node passes on its own rank's and each member node's (POST
    /shoal/peer/handover/export) as whole frames come, rank 0's "begin" first, and ends
    with its end frame once every rank has written its last."""

    def __init__(self, node: Any, cluster: Any, model: Any, tokens: Any):
        from engine.runtime.group.export import export_name
        w, inst = node.worker, cluster.instance
        if not isinstance(model, str) or w is None or not w.alive or w.model_id != model \
                or inst is None or inst.model != model:
            raise BadRequest(f"This node doesn't run {str(model)[:80]!r} now; launch it "
                             "here to prefill for it.", param="model")
        if inst.strategy != "pipeline":
            raise BadRequest("A tensor group can't prefill for another node (its ranks "
                             "hold every layer's heads in parts): launch it as a pipeline.",
                             param="model")
        if not isinstance(tokens, list) or not tokens:
            raise BadRequest("Send the prompt's token ids as 'tokens'.", param="tokens")
        self.members = [cluster.peers.find(r.node) for r in inst.ranks[1:]]
        if any(m is None or not m.trusted or not m.reachable for m in self.members):
            raise PeerUnreachable("A node of this group can't be reached; it can't prefill "
                                  "now.")
        self.peers, self.job = cluster.peers, secrets.randbelow(1 << 31)
        # what one rank may send at most: the whole prompt's KV (its share is less)
        self.bound = one.kv_bound(node, model, len(tokens))
        self._got: dict[int, int] = {}
        self.path = one.folder(node.home) / export_name(self.job)
        self.path.touch()
        self._q: asyncio.Queue[tuple[int, dict[str, Any] | None, bytes]] = asyncio.Queue()
        self._task = asyncio.ensure_future(w.prefill_kv(wire.PrefillKV(
            "", tokens, str(self.path), self.job)))
        self._sources = [asyncio.ensure_future(self._own())] + [
            asyncio.ensure_future(self._member(i + 1, m)) for i, m in enumerate(self.members)]
        self._frames = self._merged()

    async def first(self) -> bytes:
        return await self._frames.__anext__()

    async def rest(self) -> Any:
        async for raw in self._frames:
            yield raw

    async def close(self) -> None:
        for t in [*self._sources, self._task]:
            if not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        _gone(self.path)

    async def _merged(self) -> Any:
        """The ranks' frames in an order the decode side takes (its "begin" first); an
        error before the first frame raises (its own status), after it is a frame."""
        from engine.api.render import error_of
        from engine.runtime.kv_frames import encode
        begun, ended = False, 0
        held: list[bytes] = []
        while ended < len(self._sources):
            src, header, raw = await self._get()
            if header is None or header["kind"] == "error":
                why = raw.decode(errors="replace") if header is None \
                    else str(header.get("message"))[:300]
                if not begun:
                    ans = self._task.result() if self._task.done() else None
                    if isinstance(ans, wire.Error):
                        raise error_of(ans)
                    raise one.bad_gateway(f"The group couldn't prefill: {why}")
                yield encode({"kind": "error", "message": why})
                return
            if header["kind"] == "rank_end":
                ended += 1
            elif begun:
                yield raw
            elif src == 0 and header["kind"] == "begin":
                begun = True
                yield raw
                for h in held:
                    yield h
                held = []
            else:
                held.append(raw)
        ans = await self._task
        if isinstance(ans, wire.Error):
            yield encode({"kind": "error", "message": ans.message})
        else:
            yield encode({"kind": "end", "seconds": ans.seconds})

    async def _get(self) -> tuple[int, dict[str, Any] | None, bytes]:
        """The next whole frame from any rank; a worker that failed before writing, or a
        member gone, is an error item."""
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self._q.get(), one.WATCH_S)
            if self._task.done() and isinstance(self._task.result(), wire.Error):
                return 0, None, self._task.result().message.encode()
            gone = next((m for m in self.members if not m.reachable), None)
            if gone is not None:
                return 0, None, f"{gone.name} stopped answering".encode()

    async def _own(self) -> None:
        """This node's rank's frames, as its worker writes them."""
        frames = Reader()
        with self.path.open("rb") as f:
            while True:
                data = f.read(1 << 20)
                if not data:
                    await asyncio.sleep(one.POLL_S)
                    continue
                if await self._put(0, frames, data):
                    return

    async def _member(self, i: int, m: Any) -> None:
        frames = Reader()
        try:
            async with self.peers.stream(m.url, "POST", "/shoal/peer/handover/export",
                                         _json({"job": self.job}),
                                         {"Content-Type": "application/json"}) as up:
                if up.status != 200:
                    raw = await up.content.read(65536)
                    await self._q.put((i, None, f"{m.name}: {raw[:300]!r}".encode()))
                    return
                async for chunk in up.content.iter_any():
                    if await self._put(i, frames, chunk):
                        return
            await self._q.put((i, None, f"{m.name}'s frames ended early".encode()))
        except (ShoalError, OSError, ConnectionError, FrameError) as e:
            await self._q.put((i, None, f"{m.name}: {e}".encode()))

    async def _put(self, src: int, frames: Reader, data: bytes) -> bool:
        """Whole frames into the queue; True once this rank's last has come."""
        from engine.runtime.kv_frames import encode
        self._got[src] = self._got.get(src, 0) + len(data)
        if self._got[src] > self.bound:
            await self._q.put((src, None, f"rank {src} sent more KV than the prompt "
                               "holds".encode()))
            return True
        try:
            got = frames.feed(data)
        except FrameError as e:
            await self._q.put((src, None, f"rank {src}'s frames can't be read ({e})".encode()))
            return True
        for header, payload in got:
            await self._q.put((src, header, encode(header) + payload))
            if header["kind"] in ("rank_end", "error"):
                return True
        return False


async def export(request: web.Request, node: Any, cluster: Any) -> web.StreamResponse:
    """POST /shoal/peer/handover/export: the owner of the group this node's rank serves
    reads the frames the rank writes for export `job`, until its last (the file removed
    then)."""
    from engine.node.incoming import json_object
    from engine.runtime.group.export import RANK_END, export_name

    body = await json_object(request)
    name = export_name(body.get("job"))
    caller = request["caller"].node
    if not any(f.owner_id == caller and f.worker is not None and f.worker.alive
               for f in cluster.followers.all()):
        raise BadRequest("Only the owner of a group this node serves a rank of reads its "
                         "hand-overs.")
    folder = one.folder(node.home)
    _sweep(folder)
    path = folder / name
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    await resp.prepare(request)
    try:
        waited = time.monotonic()
        while not path.exists():  # its plan may not have reached this rank yet (the
            await asyncio.sleep(one.POLL_S)  # owner's leaving ends this wait too)
            if time.monotonic() - waited > STALE_S:
                await resp.write_eof()
                return resp
        with path.open("rb") as f:
            await _pass_on(f, path, resp, (RANK_END, "error"))
    finally:
        _gone(path)
    await resp.write_eof()
    return resp
