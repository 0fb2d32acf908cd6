"""`shoal node`: run a headless node until SIGTERM/SIGINT or a local shutdown request."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
from pathlib import Path

from aiohttp import web

from engine.errors import ShoalError
from engine.cluster.auth import Verifier
from engine.cluster.secret import SecretStore
from engine.node.cluster import Cluster
from engine.node.facts import NodeFacts
from engine import __version__
from engine.cluster.discovery import Discovery
from engine.node.identity import load_identity, regenerate_identity
from engine.node.peers import Peers
from engine.node.server import build_app
from engine.node.service import Node
from engine.paths import ensure, logs_dir, models_dir

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_key: str | None) -> None:
    """The API is reachable from the network only with a key."""
    if not _is_loopback(host) and not api_key:
        raise ShoalError(f"Serving on {host} exposes the API to the network: give an API "
                         "key with --api-key (or SHOAL_API_KEY), or use --host 127.0.0.1.")


async def run_node(host: str, port: int, home: Path, model: str | None,
                   api_key: str | None = None, peers: list[str] | None = None,
                   secret: str | None = None, mdns: bool = True,
                   mdns_interfaces: list[str] | None = None) -> None:
    check_bind(host, api_key)
    ensure(home)
    ensure(logs_dir(home))
    mdir = ensure(models_dir(home))
    if model in (None, "default"):
        default = await asyncio.to_thread(_default_model, mdir)
    else:
        default = None if model == "none" else model
    node = Node(home, mdir, default_model=default, port=port)
    ident = load_identity(home)
    store = SecretStore(home)
    cluster_secret = await asyncio.to_thread(store.ensure, secret)
    log.info("cluster secret kept in %s", store.where)
    peer_set = Peers(home, peers or [], cluster_secret, ident.id)
    me = _advertised(host)
    peer_set.self_url = f"http://{me}:{port}"
    cluster = Cluster(node, ident.id, ident.name, peer_set, me)

    def same_id(other_url: str) -> None:
        nonlocal ident
        # Both sides notice; only the one with the larger address changes, so exactly
        # one of them does.
        if peer_set.self_url > other_url:
            ident = regenerate_identity(home, ident)
            cluster.id = peer_set.node_id = ident.id
            if discovery is not None:
                discovery.close()
                start_discovery()
    peer_set.on_same_id = same_id
    discovery: Discovery | None = None

    def start_discovery() -> None:
        nonlocal discovery
        discovery = Discovery(ident.id, ident.name, me, port, __version__,
                              lambda url, fields: peer_set.add_discovered(url),
                              mdns_interfaces or None)
        try:
            discovery.start()
        except OSError as e:
            log.warning("mDNS discovery is off: %s. Add peers with --peer.", e)
            discovery = None
    app = build_app(node, api_key, cluster, Verifier(cluster_secret))
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ShoalError(f"Can't listen on {host}:{port} ({e.strerror or e}). Another program "
                         "(maybe another Shoal node) uses that port: stop it, or start this "
                         "node with --port and a free port.") from None
    await peer_set.start()
    facts = NodeFacts()
    cluster.facts = facts
    await facts.start()
    if mdns:
        await asyncio.to_thread(start_discovery)
    log.info("node serving http://%s:%d/v1 (home %s)", host, port, home)
    stop: asyncio.Event = app["stop"]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if default:
        node.load_in_background(default)
    try:
        await stop.wait()
    finally:
        log.info("node stopping")
        if discovery is not None:
            await asyncio.to_thread(discovery.close)
        await cluster.close()
        await facts.close()
        await node.close()
        await peer_set.close()
        await runner.cleanup()


def _advertised(host: str) -> str:
    """The address other nodes reach this one at (for MLX's ring and the doorbells)."""
    if host in ("0.0.0.0", "::", ""):
        import socket
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"
    return "127.0.0.1" if host == "localhost" else host


def _default_model(mdir: Path) -> str | None:
    """Import the bundled default model on first run; None (with a logged reason) if the
    package that carries it is missing."""
    from engine.hub.bundled import DEFAULT_MODEL_ID, ensure_default_model
    try:
        ensure_default_model(mdir)
        return DEFAULT_MODEL_ID
    except ShoalError as e:
        log.warning("no default model: %s", e.message)
        return None
