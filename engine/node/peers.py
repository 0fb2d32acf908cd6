"""Known peers: addresses typed once (--peer), remembered, or heard over mDNS, polled every
few seconds so a node that vanishes is noticed, and trusted only while each answer proves
it holds the cluster secret."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from engine.cluster.auth import HELLO, NotInCluster, check_answer, check_body, sign
from engine.errors import PeerUnreachable, ShoalError
from engine.records import NodeInfo, PeerInfo, PeerLink

log = logging.getLogger(__name__)
POLL_S = 2.0
LINK_PROBE_S = 60.0  # re-measure each link this often
PROBE_BYTES = 4 * 2**20
MAX_ANSWER = 16 * 2**20  # the most a peer's JSON answer may hold
CONNECTIONS, CONNECTIONS_PER_PEER = 256, 32  # open to peers at once (relayed streams too)


def _major_minor(v: Any) -> tuple[str, ...]:
    return tuple(str(v or "?").split(".")[:2])


def incompatibility(info: NodeInfo) -> str | None:
    """Why a peer can't share an instance with this node (Shoal or MLX versions), or None.
    MLX's wire format between ranks is only promised within one version."""
    from engine import __version__
    from engine.telemetry.versions import mlx_version
    theirs, ours = info.version, __version__
    if _major_minor(theirs) != _major_minor(ours):
        return (f"runs Shoal {theirs}, this node runs {ours}: update both to the same "
                "version before running a model on them together")
    if info.mlx_version and mlx_version() and info.mlx_version != mlx_version():
        return (f"runs MLX {info.mlx_version}, this node runs {mlx_version()}: install "
                "the same MLX on both")
    return None


def normalize(addr: str, scheme: str = "https") -> str:
    """'host:port' or a URL → 'SCHEME://host:port' (a node's cluster port speaks one)."""
    addr = addr.strip().rstrip("/")
    return f"{scheme}://{addr.split('://', 1)[-1]}"


@dataclass(frozen=True)
class Peer:
    url: str
    discovered: bool = False  # heard over mDNS (not remembered across restarts)
    id: str | None = None  # as its signed answers say (never what mDNS or a stranger claims)
    name: str | None = None
    version: str | None = None
    reachable: bool = False
    trusted: bool = False  # its answers prove it holds our cluster secret
    last_seen: float = 0.0
    error: str | None = None
    info: NodeInfo | None = None  # what it last said of itself (trusted peers only)
    warning: str | None = None  # e.g. versions that can't run one model together
    link: PeerLink = field(default_factory=PeerLink)  # unmeasured until probed

    def public(self) -> PeerInfo:
        """The peer as GET /shoal/peers lists it."""
        return PeerInfo(self.url, self.id, self.name, self.version, self.reachable,
                        self.trusted, self.error, self.warning, self.link,
                        self.info.mlx_version if self.info else None,
                        round(time.monotonic() - self.last_seen, 1) if self.last_seen else None)


class Peers:
    """The peers this node knows, and the one way it talks to them: over TLS pinned to the
    cluster's certificate (engine/cluster/tls.py), each request signed for the peer it
    goes to and each answer checked for the cluster's signature (engine/cluster/auth.py).
    A peer is trusted only while its answers prove it holds the secret."""

    def __init__(self, home: Path, addresses: list[str], secret: str = "",
                 node_id: str = "", tls: bool = True):
        self.secret = secret
        self.node_id = node_id
        self.scheme = "https" if tls else "http"
        self.self_url = ""
        self.on_same_id: Any = None
        self._probing: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._file = home / "peers.json"
        self._peers: dict[str, Peer] = {}
        for a in self._remembered() + addresses:
            url = self.url_of(a)
            self._peers.setdefault(url, Peer(url))
        self._save()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

    def url_of(self, addr: str) -> str:
        """'host:port' or a URL → this cluster's URL for it (https unless TLS is off)."""
        return normalize(addr, self.scheme)

    def _remembered(self) -> list[str]:
        try:
            return [str(a) for a in json.loads(self._file.read_text())]
        except FileNotFoundError:
            return []
        except (ValueError, TypeError) as e:
            log.warning("%s is unreadable (%s); starting with no remembered peers",
                        self._file, e)
            return []

    def _save(self) -> None:
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(sorted(u for u, p in self._peers.items()
                                         if not p.discovered)))
        os.replace(tmp, self._file)

    def add(self, addr: str) -> Peer:
        url = self.url_of(addr)
        if url not in self._peers or self._peers[url].discovered:
            self._peers[url] = replace(self._peers.get(url) or Peer(url), discovered=False)
            self._save()
            if self._session is not None:
                asyncio.get_running_loop().create_task(self._poll(url))
        return self._peers[url]

    def add_discovered(self, url: str) -> None:
        """A node heard over mDNS; thread-safe (zeroconf calls from its own thread). What
        it announces proves nothing: it is polled like any address, and trusted only once
        its answers prove it holds the secret."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._add_discovered, self.url_of(url))

    def _add_discovered(self, url: str) -> None:
        if url not in self._peers and url != self.self_url:
            log.info("discovered node %s", url)
            self._peers[url] = Peer(url, discovered=True)
            if self._session is not None:
                asyncio.get_running_loop().create_task(self._poll(url))

    def all(self) -> list[Peer]:
        return list(self._peers.values())

    def find(self, ref: str) -> Peer | None:
        """A peer by id, name or address."""
        for p in self._peers.values():
            if ref in (p.id, p.name, p.url) or self.url_of(ref) == p.url:
                return p
        return None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ssl_ctx: Any = False
        if self.scheme == "https":
            from engine.cluster.tls import client_context
            ssl_ctx = await asyncio.to_thread(client_context, self.secret)
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=ssl_ctx, limit=CONNECTIONS, limit_per_host=CONNECTIONS_PER_PEER))
        self._task = asyncio.create_task(self._poll_forever())

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        if self._session:
            await self._session.close()

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.gather(*(self._poll(p.url) for p in self.all()))
            await asyncio.sleep(POLL_S)

    async def _describe(self, url: str, peer: Peer) -> tuple[Peer, NodeInfo]:
        """The peer's own description, its id learned (and proven) first if need be."""
        if peer.id is None:  # first contact: learn (and prove) its id
            hello = await self.call(url, "GET", HELLO, timeout=POLL_S)
            if not isinstance(hello, dict) or not isinstance(hello.get("id"), str):
                raise PeerUnreachable(f"{url} answered, but not as a Shoal node")
            peer = self._peers[url] = replace(peer, id=hello["id"])
        raw = await self.call(url, "GET", "/shoal/node", timeout=POLL_S)
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise PeerUnreachable(f"{url} answered, but not as a Shoal node")
        try:
            info: NodeInfo = NodeInfo.from_json(raw)
        except (TypeError, ValueError) as e:
            raise PeerUnreachable(f"{url} described itself in a shape this node "
                                  f"can't read ({e}); update both nodes") from None
        if info.id != peer.id:
            raise NotInCluster(f"{url} described itself as node {info.id}, but signed as "
                               f"{peer.id}.", code="wrong_node")
        return peer, info

    async def _poll(self, url: str) -> None:
        peer = self._peers.get(url)
        if peer is None:
            return
        try:
            try:
                peer, info = await self._describe(url, peer)
            except NotInCluster as e:
                if e.code != "wrong_node" or peer.id is None:
                    raise
                # it took a new id (a copied state folder, resolved): learn it at once
                peer, info = await self._describe(url, replace(peer, id=None))
            if info.id == self.node_id and self.on_same_id is not None:
                self.on_same_id(url)  # a copied state folder: one side must change
                return
            first = not peer.trusted
            self._peers[url] = replace(peer, name=info.name, version=info.version,
                                       reachable=True, trusted=True,
                                       last_seen=time.monotonic(), error=None, info=info,
                                       warning=incompatibility(info))
            self._drop_moved(url, info.id)
            if first or time.monotonic() - (peer.link.at or 0) > LINK_PROBE_S:
                self._probe_later(url)
        except NotInCluster as e:
            if peer.trusted or peer.error is None:
                log.warning("peer %s is not in this cluster: %s", url, e.message)
            # its id is learned again next time, through the hello it must sign: a peer
            # that took a new id (a copied state folder) refuses requests signed for the
            # old one with an unsigned 401, which says nothing this node may trust, so
            # keeping the old id would refuse it for good
            self._peers[url] = replace(peer, reachable=True, trusted=False, info=None,
                                       last_seen=time.monotonic(), id=None,
                                       error=f"not in this cluster: {e.message}")
        except ShoalError as e:
            if peer.reachable:
                log.warning("peer %s is unreachable: %s", url, e.message)
            self._peers[url] = replace(peer, reachable=False, trusted=False,
                                       error=e.message)

    def _drop_moved(self, url: str, node_id: str) -> None:
        """A discovered node proven at a new address leaves no ghost at its old one."""
        for old in [p for p in self._peers.values() if p.id == node_id and p.url != url
                    and p.discovered and not p.reachable]:
            del self._peers[old.url]

    def _probe_later(self, url: str) -> None:
        if url not in self._probing:
            self._probing.add(url)
            asyncio.get_running_loop().create_task(self._probe(url))

    async def _probe(self, url: str) -> None:
        """Round-trip latency (best of 5 small requests) and bandwidth (one bulk read)."""
        try:
            rtts = []
            for _ in range(5):
                t0 = time.perf_counter()
                await self.call(url, "GET", "/health", timeout=5)
                rtts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            n = await self._bulk(url, PROBE_BYTES)
            dt = time.perf_counter() - t0 - min(rtts)
            link = PeerLink(link_type(url), round(min(rtts) * 1000, 3),
                            round(n / max(dt, 1e-6) / 1e6, 1), time.monotonic())
            if url in self._peers:
                self._peers[url] = replace(self._peers[url], link=link)
        except ShoalError as e:
            log.info("link probe to %s failed: %s", url, e.message)
        finally:
            self._probing.discard(url)

    async def _bulk(self, url: str, nbytes: int) -> int:
        async with self.stream(url, "GET", f"/shoal/peer/probe?bytes={nbytes}",
                               timeout=aiohttp.ClientTimeout(total=30)) as r:
            if r.status != 200:
                raise PeerUnreachable(f"{url} refused the bandwidth probe ({r.status})")
            got = 0
            try:
                async for chunk in r.content.iter_any():
                    got += len(chunk)
            except (TimeoutError, aiohttp.ClientError) as e:
                raise PeerUnreachable(f"bandwidth probe to {url} failed: {e}") from None
            return got

    # --- talking to a peer -----------------------------------------------------------------
    def _signed(self, url: str, method: str, path: str, body: bytes) -> dict[str, str]:
        """Headers that sign a request for the peer at `url` (for its proven id; only the
        hello goes out before that is known)."""
        peer = self._peers.get(url)
        to = peer.id if peer is not None and peer.id else ""
        return sign(self.secret, self.node_id, method, path, body, to=to)

    def _check(self, url: str, sent: dict[str, str], r: aiohttp.ClientResponse) -> None:
        """The answer's signature, bound to `sent` (its nonce) and both ids."""
        peer = self._peers.get(url)
        expect = peer.id if peer is not None and peer.id else ""
        check_answer(self.secret, self.node_id, sent, r.status, r.headers, expect)

    @contextlib.asynccontextmanager
    async def stream(self, url: str, method: str, path: str, body: bytes = b"",
                     headers: dict[str, str] | None = None,
                     timeout: aiohttp.ClientTimeout | None = None
                     ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A request to a peer whose answer is read as it comes (a relayed stream, a file,
        the bandwidth probe), once its head proves the cluster's secret. Failing to
        connect is PeerUnreachable; a peer that can't prove itself is NotInCluster."""
        if self._session is None:
            raise PeerUnreachable("the node is not running")
        sent = self._signed(url, method, path, body)
        try:
            async with self._session.request(
                    method, URL(url + path, encoded=True), data=body or None,
                    headers={**(headers or {}), **sent},
                    timeout=timeout or aiohttp.ClientTimeout(total=None, sock_connect=10)
                    ) as r:
                self._check(url, sent, r)
                yield r
        except aiohttp.ClientConnectorCertificateError:
            raise NotInCluster(f"{url} showed a certificate that isn't this cluster's: it "
                               "holds another cluster secret (or isn't a Shoal node)."
                               ) from None
        except aiohttp.ClientSSLError as e:
            log.debug("TLS with %s failed: %s", url, e)
            raise NotInCluster(f"{url} doesn't speak this cluster's TLS: an older Shoal, "
                               "or not a Shoal node.") from None
        except (TimeoutError, aiohttp.ClientError) as e:
            raise PeerUnreachable(f"The node at {url} did not answer {path}: "
                                  f"{e or type(e).__name__}") from None

    async def call(self, url: str, method: str, path: str, json_body: Any = None,
                   timeout: float = 10.0, max_bytes: int = MAX_ANSWER) -> Any:
        """One JSON request to a peer, its answer read up to `max_bytes`. Errors come back
        as ShoalError; a peer that answers garbage or nothing is PeerUnreachable, one that
        can't prove it holds the secret NotInCluster."""
        raw = b"" if json_body is None else json.dumps(json_body).encode()
        async with self.stream(url, method, path, raw,
                               {"Content-Type": "application/json"},
                               aiohttp.ClientTimeout(total=timeout)) as r:
            body = await _read_bounded(r, max_bytes, url, path)
            check_body(r.headers, body)
            try:
                data = json.loads(body) if body else None
            except ValueError:
                raise PeerUnreachable(f"{url} answered {path} with something that isn't "
                                      "JSON") from None
            if r.status >= 400:
                err = data if isinstance(data, dict) else {}
                got = err.get("error")
                detail: dict[str, Any] = got if isinstance(got, dict) else {}
                if detail.get("code") in (NotInCluster.code, "wrong_node"):
                    raise NotInCluster(f"{detail.get('message') or ''} ({url})",
                                       code=detail.get("code"))
                raise ShoalError.from_openai(err, r.status)
            return data


async def _read_bounded(r: aiohttp.ClientResponse, limit: int, url: str, path: str) -> bytes:
    """The whole answer, refused past `limit` bytes (a peer can't fill this node's memory)."""
    too_big = PeerUnreachable(f"{url} answered {path} with more than {limit} bytes")
    if (r.content_length or 0) > limit:
        raise too_big
    out = bytearray()
    try:
        async for chunk in r.content.iter_chunked(1 << 16):
            out += chunk
            if len(out) > limit:
                raise too_big
    except (TimeoutError, aiohttp.ClientError) as e:
        raise PeerUnreachable(f"{url} stopped answering {path}: {e or type(e).__name__}"
                              ) from None
    return bytes(out)


def link_type(url: str) -> str:
    """What kind of link reaches a peer. Loopback is certain; otherwise the platform probes
    (Thunderbolt/Ethernet/Wi-Fi interface kinds) refine 'network'."""
    import ipaddress
    host = url.split("://", 1)[-1].rsplit(":", 1)[0]
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "loopback"
    except ValueError:
        pass
    return "network"
