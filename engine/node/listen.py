"""The node's listening sockets, with every connection bounded.

aiohttp's own sites accept whatever arrives: thousands of sockets that send nothing were
held forever, took every file descriptor, and each failed accept() logged a traceback.
Here a node accepts connections itself and hands each to aiohttp (and to TLS) only within
limits: a cap on connections overall and per client address; at the cap, the oldest idle
connection (no request in progress, or a TLS handshake not yet done) makes room, and with
none idle the newcomer is closed. A TLS handshake has 10 s, a request's head the runner's
keep-alive timeout (engine/node/main.py), so idle sockets don't stay."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ShoalError

log = logging.getLogger(__name__)
HANDSHAKE_S = 10.0  # a TLS handshake not done by then is dropped
ACCEPT_RETRY_S = 0.5  # after accept() fails (out of descriptors): try again this soon


@dataclass(frozen=True)
class Limits:
    total: int = 1024  # connections open at once on one listener
    per_client: int = 256  # from one address


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    client: str
    since: float = field(default_factory=time.monotonic)
    handler: Any = None  # aiohttp's RequestHandler, once the connection is served
    task: asyncio.Task | None = None  # the hand-over (the TLS handshake)

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    @property
    def idle(self) -> bool:
        """Nothing would be lost by closing it: a handshake not done, or no request in
        progress (between requests, or a request's head still not complete)."""
        h = self.handler
        return h is None or not getattr(h, "_request_in_progress", False)

    def close(self) -> None:
        if self.handler is not None and getattr(self.handler, "transport", None):
            self.handler.transport.close()
        elif self.task is not None:
            self.task.cancel()  # the handshake's wait closes the socket
        else:
            self.sock.close()


def _close_if_cancelled(sock: socket.socket) -> Callable[[asyncio.Task], None]:
    def done(task: asyncio.Task) -> None:
        if task.cancelled():
            sock.close()
    return done


class Listener:
    """One listening address of one aiohttp server (`factory`, the runner's server),
    with `limits` on its connections and TLS where `ssl_ctx` is given."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], host: str, port: int,
                 ssl_ctx: ssl.SSLContext | None, limits: Limits, what: str):
        self.factory, self.host, self.port = factory, host, port
        self.ssl_ctx, self.limits, self.what = ssl_ctx, limits, what
        self._socks: list[socket.socket] = []
        self._tasks: list[asyncio.Task] = []
        self._conns: list[_Conn] = []
        self.refused = 0  # connections closed at once: no room and none idle
        self.evicted = 0  # idle connections closed to make room

    async def start(self) -> None:
        try:
            infos = socket.getaddrinfo(self.host or None, self.port, type=socket.SOCK_STREAM,
                                       flags=socket.AI_PASSIVE)
            for family, kind, proto, addr in dict.fromkeys(
                    (f, k, p, a) for f, k, p, _, a in infos):
                s = socket.socket(family, kind, proto)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind(addr)
                s.listen(256)
                s.setblocking(False)
                self._socks.append(s)
        except OSError as e:
            self.close()
            raise ShoalError(
                f"Can't listen on {self.host}:{self.port} for the {self.what} "
                f"({e.strerror or e}). Another program (maybe another Shoal node) uses that "
                "port: stop it, or start this node with a free --port/--cluster-port."
            ) from None
        self._tasks = [asyncio.create_task(self._accept(s)) for s in self._socks]

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for s in self._socks:
            s.close()
        for c in self._conns:
            c.close()

    async def _accept(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, addr = await loop.sock_accept(listening)
            except OSError as e:  # out of descriptors: the limits below keep this rare
                log.warning("the %s can't accept a connection: %s", self.what, e)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            conn = _Conn(sock, str(addr[0]))
            if not self._make_room(conn.client):
                self.refused += 1
                log.warning("the %s refused a connection from %s: %d open (%d from it), "
                            "none idle", self.what, conn.client, len(self._conns),
                            self._from(conn.client))
                sock.close()
                continue
            self._conns.append(conn)
            conn.task = asyncio.create_task(self._serve(conn))
            # cancelled before it ran (evicted in the same burst), it never saw the socket
            conn.task.add_done_callback(_close_if_cancelled(sock))

    def _from(self, client: str) -> int:
        return sum(1 for c in self._conns if c.client == client)

    def _make_room(self, client: str) -> bool:
        """Whether a new connection from `client` fits, closing an idle one if need be:
        first one of the client's own at its cap, then any at the listener's."""
        self._conns = [c for c in self._conns if not c.closed]
        mine = [c for c in self._conns if c.client == client]
        if len(mine) >= self.limits.per_client and not self._evict(mine):
            return False
        return len(self._conns) < self.limits.total or self._evict(self._conns)

    def _evict(self, among: list[_Conn]) -> bool:
        """Close the oldest idle connection of `among`; False when none is idle."""
        idle = [c for c in among if c.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.since)
        oldest.close()
        self._conns.remove(oldest)
        self.evicted += 1
        return True

    async def _serve(self, conn: _Conn) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn.handler = await loop.connect_accepted_socket(
                self.factory, conn.sock, ssl=self.ssl_ctx,
                ssl_handshake_timeout=HANDSHAKE_S if self.ssl_ctx else None)
        except (OSError, ssl.SSLError, TimeoutError, asyncio.CancelledError) as e:
            # a stranger without the cluster's certificate, a plain-HTTP client on a TLS
            # port, a handshake that never finished: nothing to serve
            log.debug("the %s dropped a connection from %s: %s", self.what, conn.client,
                      type(e).__name__)
            with contextlib.suppress(OSError):
                conn.sock.close()
        finally:
            conn.task = None
