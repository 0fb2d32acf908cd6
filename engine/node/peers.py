"""Known peers: addresses typed once (--peer) and remembered, polled every few seconds so a
node that vanishes is noticed. Discovery and authentication come on top of this."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from engine.cluster.auth import NotInCluster, sign
from engine.errors import PeerUnreachable, ShoalError
from engine.records import NodeInfo, PeerInfo, PeerLink

log = logging.getLogger(__name__)
POLL_S = 2.0
LINK_PROBE_S = 60.0  # re-measure each link this often
PROBE_BYTES = 4 * 2**20


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


def normalize(addr: str) -> str:
    """'host:port' or a URL → 'http://host:port'."""
    addr = addr.strip().rstrip("/")
    return addr if addr.startswith(("http://", "https://")) else f"http://{addr}"


@dataclass(frozen=True)
class Peer:
    url: str
    discovered: bool = False  # heard over mDNS (not remembered across restarts)
    id: str | None = None
    name: str | None = None
    version: str | None = None
    reachable: bool = False
    trusted: bool = False  # answers with our cluster secret
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
    def __init__(self, home: Path, addresses: list[str], secret: str = "",
                 node_id: str = ""):
        self.secret = secret
        self.node_id = node_id
        self.self_url = ""
        self.on_same_id: Any = None
        self._probing: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._file = home / "peers.json"
        self._peers: dict[str, Peer] = {}
        for a in self._remembered() + addresses:
            self._peers.setdefault(normalize(a), Peer(normalize(a)))
        self._save()
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task | None = None

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
        url = normalize(addr)
        if url not in self._peers or self._peers[url].discovered:
            self._peers[url] = replace(self._peers.get(url) or Peer(url), discovered=False)
            self._save()
        return self._peers[url]

    def add_discovered(self, url: str, node_id: str = "") -> None:
        """A node heard over mDNS; thread-safe (zeroconf calls from its own thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._add_discovered, normalize(url), node_id)

    def _add_discovered(self, url: str, node_id: str = "") -> None:
        # A known node back at another address replaces its old entry (no ghost).
        for old in [p for p in self._peers.values() if node_id and p.id == node_id
                    and p.url != url and p.discovered]:
            del self._peers[old.url]
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
            if ref in (p.id, p.name, p.url) or normalize(ref) == p.url:
                return p
        return None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise PeerUnreachable("the node is not running")
        return self._session

    def sign(self, method: str, path: str, body: bytes = b"") -> dict[str, str]:
        return sign(self.secret, self.node_id, method, path, body) if self.secret else {}

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._session = aiohttp.ClientSession()
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

    async def _poll(self, url: str) -> None:
        peer = self._peers[url]
        try:
            raw = await self.call(url, "GET", "/shoal/node", timeout=POLL_S)
            if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
                raise PeerUnreachable(f"{url} answered, but not as a Shoal node")
            try:
                info: NodeInfo = NodeInfo.from_json(raw)
            except (TypeError, ValueError) as e:
                raise PeerUnreachable(f"{url} described itself in a shape this node "
                                      f"can't read ({e}); update both nodes") from None
            if info.id == self.node_id and self.on_same_id is not None:
                self.on_same_id(url)  # a copied state folder: one side must change
                return
            first = not peer.trusted
            self._peers[url] = replace(peer, id=info.id, name=info.name,
                                       version=info.version, reachable=True,
                                       trusted=True, last_seen=time.monotonic(), error=None,
                                       info=info, warning=incompatibility(info))
            if first or time.monotonic() - (peer.link.at or 0) > LINK_PROBE_S:
                self._probe_later(url)
        except NotInCluster as e:
            if peer.trusted or peer.error is None:
                log.warning("peer %s is not in this cluster: %s", url, e.message)
            self._peers[url] = replace(peer, reachable=True, trusted=False, info=None,
                                       last_seen=time.monotonic(),
                                       error=f"not in this cluster: {e.message}")
        except ShoalError as e:
            if peer.reachable:
                log.warning("peer %s is unreachable: %s", url, e.message)
            self._peers[url] = replace(peer, reachable=False, trusted=False,
                                       error=e.message)

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
        path = f"/shoal/peer/probe?bytes={nbytes}"
        try:
            async with self.session.get(url + path, headers=self.sign("GET", path),
                                        timeout=aiohttp.ClientTimeout(total=30)) as r:
                if r.status != 200:
                    raise PeerUnreachable(f"{url} refused the bandwidth probe ({r.status})")
                got = 0
                async for chunk in r.content.iter_any():
                    got += len(chunk)
                return got
        except (TimeoutError, aiohttp.ClientError) as e:
            raise PeerUnreachable(f"bandwidth probe to {url} failed: {e}") from None

    async def call(self, url: str, method: str, path: str, json_body: Any = None,
                   timeout: float = 10.0) -> Any:
        """One JSON request to a peer. Errors come back as ShoalError; a peer that answers
        garbage or nothing is PeerUnreachable."""
        if self._session is None:
            raise PeerUnreachable("the node is not running")
        raw = b"" if json_body is None else json.dumps(json_body).encode()
        headers = {"Content-Type": "application/json",
                   **self.sign(method, path, raw)}
        try:
            async with self._session.request(method, url + path, data=raw or None,
                                             headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=timeout)
                                             ) as r:
                body = await r.read()
                data = json.loads(body) if body else None
                if r.status >= 400:
                    err = data if isinstance(data, dict) else {}
                    if (err.get("error") or {}).get("code") == NotInCluster.code:
                        raise NotInCluster((err["error"].get("message") or "") +
                                           f" ({url})")
                    raise ShoalError.from_openai(err, r.status)
                return data
        except (TimeoutError, aiohttp.ClientError, ValueError) as e:
            raise PeerUnreachable(f"The node at {url} did not answer {path}: "
                                  f"{e or type(e).__name__}") from None


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
