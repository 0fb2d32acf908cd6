"""`shoal node`: run a headless node until SIGTERM/SIGINT or a local shutdown request.

A node listens twice: the user API (OpenAI routes, the GUI's control) on --host:--port,
127.0.0.1 by default; and the cluster port (--cluster-host:--cluster-port) where only
requests signed with the cluster secret are served, so other nodes can reach it without
the user API being exposed. What a web page may do on the user API (Host names, origins,
body types, no control routes) is engine.api.cors's; see docs/security.md.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from engine import __version__
from engine.cluster.auth import Verifier
from engine.cluster.discovery import Discovery
from engine.cluster.secret import SecretStore
from engine.cluster.tls import server_context, user_api_context
from engine.errors import ShoalError
from engine.logs import quiet_loop_errors
from engine.net import is_loopback
from engine.node.cluster import Cluster
from engine.node.facts import NodeFacts
from engine.node.identity import load_identity, regenerate_identity
from engine.node.listen import Limits, Listener
from engine.node.peers import Peers
from engine.node.server import build_app
from engine.node.service import Node
from engine.paths import ensure, logs_dir, models_dir
from engine.records import DraftInfo

log = logging.getLogger(__name__)
KEEPALIVE_S = 15.0  # an idle connection, or one still sending a request's head, is closed
USER_LIMITS = Limits(total=1024, per_client=256)  # the user API's connections
CLUSTER_LIMITS = Limits(total=512, per_client=64)  # other nodes': polls, relays, files
RESCAN_S = 10.0  # how often "auto" looks for new interfaces to serve the cluster on


@dataclass
class NodeConfig:
    host: str = "127.0.0.1"
    port: int = 8421
    home: Path = Path(".")
    model: str | None = None
    api_key: str | None = None
    peers: list[str] = field(default_factory=list)
    secret: str | None = None
    cluster_host: str = "auto"  # auto: this machine's private addresses (cluster_hosts)
    cluster_port: int = 0  # 0: port + 1
    cluster_tls: bool = True  # off only to measure what TLS costs (SHOAL_CLUSTER_TLS=off)
    tls_cert: str | None = None  # the user API over TLS, with the user's own certificate
    tls_key: str | None = None
    mdns: bool = True
    mdns_interfaces: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=list)  # browser origins allowed (CORS)
    allowed_hosts: list[str] = field(default_factory=list)  # Host names beside our own
    max_body_mb: float = 32.0  # request bodies over this are refused (413) unread
    max_streams: int = 16  # requests decoded together; more wait for a turn
    queue_wait_s: float = 60.0  # how long a request waits for a turn before a 503
    stall_s: float = 300.0  # a worker silent this long (no token, no prefill progress) is stuck
    speculative: bool = True  # draft tokens where it pays (a request may ask either way)
    draft_model: str | None = None  # a model id or folder; None: prompt lookup
    draft_tokens: int = 6  # the most guesses per verify pass
    kv_bits: int | None = None  # quantized KV (8 or 4) for launches that don't choose
    keep_alive_s: float | None = None  # unload a model unused this long (None: never)
    prefix_disk_gb: float = 0.0  # the prefix cache's disk tier per model (0: off)
    memory_limit_gb: float | None = None  # admission's budget (None: the machine's own)
    heal: bool = True  # place a failed instance again on the nodes left (engine/node/healing.py)


def draft_folder(cfg: NodeConfig, models: Path) -> Path | None:
    """The draft model's folder: a folder, or the id of a model in the models folder."""
    if not cfg.draft_model:
        return None
    folder = Path(cfg.draft_model).expanduser()
    if not folder.is_dir():
        folder = models / cfg.draft_model
    if not folder.is_dir():
        raise ShoalError(f"The draft model {cfg.draft_model} is neither a folder nor a "
                         f"model in {models}: download it first, or give its folder.")
    return folder


def drafting_args(cfg: NodeConfig, folder: Path | None) -> tuple[str, ...]:
    """A worker's drafting flags (a group's rank 0 loads the draft model, if the node that
    serves the group has one; the other ranks ignore it)."""
    return ("--speculative", "on" if cfg.speculative else "off",
            "--draft-tokens", str(cfg.draft_tokens),
            *(("--draft-model", str(folder)) if folder else ()))


def draft_size(folder: Path | None) -> DraftInfo | None:
    """What the planner counts for the draft model: its weights in memory and its KV per
    token (it keeps a cache of its own)."""
    if folder is None:
        return None
    import json

    from engine.hub.checkpoint import memory_bytes
    from engine.placement.model import ModelSpec

    config = json.loads((folder / "config.json").read_text())
    spec = ModelSpec.from_config(config, name=folder.name)
    return DraftInfo(folder.name, int(memory_bytes(folder, config) or 0),
                     float(spec.kv_per_token * spec.kv_bytes))


def check_bind(host: str, api_key: str | None) -> None:
    """The user API is reachable from the network only with a key."""
    if not is_loopback(host) and not api_key:
        raise ShoalError(f"Serving on {host} exposes the API to the network: give an API "
                         "key with --api-key (or SHOAL_API_KEY), or use --host 127.0.0.1.")


async def run_node(cfg: NodeConfig) -> None:
    check_bind(cfg.host, cfg.api_key)
    if bool(cfg.tls_cert) != bool(cfg.tls_key):
        raise ShoalError("Give both --tls-cert and --tls-key to serve the API over TLS.")
    loop = asyncio.get_running_loop()
    quiet_loop_errors(loop)
    more_descriptors()
    cport = cfg.cluster_port or _default_cluster_port(
        "0.0.0.0" if cfg.cluster_host == "auto" else cfg.cluster_host, cfg.port + 1)
    home = ensure(cfg.home)
    ensure(logs_dir(home))
    mdir = ensure(models_dir(home))
    from engine.hub.bundled import DEFAULT_MODEL_ID, is_imported
    importing = cfg.model in (None, "default") and not is_imported(mdir / DEFAULT_MODEL_ID)
    if cfg.model in (None, "default"):  # imported after the API is up, if it isn't yet
        default: str | None = DEFAULT_MODEL_ID if importing else \
            await asyncio.to_thread(_default_model, mdir)
    else:
        default = None if cfg.model == "none" else cfg.model
    draft = draft_folder(cfg, mdir)
    draft_args = drafting_args(cfg, draft)
    node = Node(home, mdir, default_model=default, port=cport, max_streams=cfg.max_streams,
                queue_wait_s=cfg.queue_wait_s, token_timeout=cfg.stall_s, kv_bits=cfg.kv_bits,
                keep_alive_s=cfg.keep_alive_s,
                prefix_disk_bytes=int(cfg.prefix_disk_gb * 1e9),
                memory_limit=int(cfg.memory_limit_gb * 1e9) if cfg.memory_limit_gb else None,
                worker_args=draft_args)
    ident = load_identity(home)
    store = SecretStore(home)
    secret = await asyncio.to_thread(store.ensure, cfg.secret)
    log.info("cluster secret kept in %s", store.where)
    me = _advertised(cfg.cluster_host, cfg.mdns_interfaces)
    if not cfg.cluster_tls:
        log.warning("TLS between nodes is OFF (SHOAL_CLUSTER_TLS=off): prompts and answers "
                    "cross the network in clear. Use this only to measure what TLS costs.")
    peers = Peers(home, cfg.peers, secret, ident.id, tls=cfg.cluster_tls)
    peers.self_url = peers.url_of(f"{me}:{cport}")
    cluster = Cluster(node, ident.id, ident.name, peers, me)
    cluster.healer.enabled = cfg.heal
    node.heal_hint, node.heal_note = cluster.healer.hint, cluster.healer.note
    if cfg.speculative:  # the draft is loaded beside the model (rank 0's): plans count it
        cluster.draft = await asyncio.to_thread(draft_size, draft)
    discovery: Discovery | None = None

    def start_discovery() -> None:
        nonlocal discovery
        discovery = Discovery(ident.id, ident.name, me, cport, __version__,
                              lambda url, fields: peers.add_discovered(url),
                              cfg.mdns_interfaces or None)
        try:
            discovery.start()
        except OSError as e:
            log.warning("mDNS discovery is off: %s. Add peers with --peer.", e)
            discovery = None

    def same_id(other_url: str) -> None:
        nonlocal ident
        # Both sides notice; only the one with the larger address changes.
        if peers.self_url > other_url:
            ident = regenerate_identity(home, ident)
            cluster.id = peers.node_id = ident.id
            if discovery is not None:
                discovery.close()
                start_discovery()
    peers.on_same_id = same_id

    app = build_app(node, cfg.api_key, cluster, Verifier(secret, lambda: cluster.id),
                    cluster_port=cport,
                    cors_origins=cfg.cors_origins, host=cfg.host,
                    allowed_hosts=cfg.allowed_hosts, max_body_mb=cfg.max_body_mb)
    # keep-alive also bounds how long a connection may take to send a request's head
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           keepalive_timeout=KEEPALIVE_S)
    await runner.setup()
    server: Any = runner.server
    user_tls = await asyncio.to_thread(user_api_context, cfg.tls_cert, cfg.tls_key) \
        if cfg.tls_cert and cfg.tls_key else None
    cluster_tls = await asyncio.to_thread(server_context, secret) if cfg.cluster_tls \
        else None
    listeners: list[Listener] = []

    async def listen(host: str, port: int, ctx: Any, limits: Limits, what: str) -> None:
        listener = Listener(server, host, port, ctx, limits, what)
        await listener.start()
        listeners.append(listener)

    async def listen_cluster(hosts: list[str]) -> None:
        for h in hosts:
            if not any(x.host == h and x.port == cport for x in listeners):
                await listen(h, cport, cluster_tls, CLUSTER_LIMITS, "cluster port")
    facts = NodeFacts(home, busy=node.generating)
    try:
        if importing:  # before the API answers: a model list read at once waits for it
            node.prepare_in_background(DEFAULT_MODEL_ID, "importing the default model",
                                       lambda: _default_model(mdir))
        await listen(cfg.host, cfg.port, user_tls, USER_LIMITS, "API")
        await listen_cluster(cluster_hosts(cfg.cluster_host, me))
        if cfg.cluster_host == "auto":  # an interface that comes up later (a cable)
            node.keep(asyncio.create_task(_rescan(listen_cluster, me)))
        await peers.start()
        cluster.facts = facts
        await facts.start()
        if cfg.mdns:
            await asyncio.to_thread(start_discovery)
        log.info("node serving %s://%s:%d/v1, cluster port %s on %s (home %s)",
                 "https" if user_tls else "http", cfg.host, cfg.port, cport,
                 ", ".join(x.host for x in listeners[1:]), home)
        stop: asyncio.Event = app["stop"]
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if default and not importing:
            node.load_in_background(default)
        node.keep(asyncio.create_task(node.unload_when_idle()))
        await stop.wait()
    finally:
        log.info("node stopping")
        if discovery is not None:
            await asyncio.to_thread(discovery.close)
        await cluster.close()
        await facts.close()
        await node.close()
        await peers.close()
        for x in listeners:
            x.close()
        await runner.cleanup()


def _default_cluster_port(host: str, wanted: int) -> int:
    """port + 1 when free; else any free port (announced over mDNS, shown in the status),
    so a busy neighbour port doesn't stop a node that only runs on its own."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server will
        try:
            s.bind((host, wanted))
            return wanted
        except OSError:
            s.bind((host, 0))
            port = s.getsockname()[1]
    log.warning("port %d is taken; other nodes reach this one on port %d", wanted, port)
    return port


def more_descriptors(want: int = 8192) -> None:
    """Raise this process's open-file limit toward its hard limit (macOS starts apps at
    256): the connection limits above need room beside the workers' pipes and files."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        cap = want if hard == resource.RLIM_INFINITY else min(want, hard)
        if soft < cap:
            resource.setrlimit(resource.RLIMIT_NOFILE, (cap, hard))
    except (ImportError, ValueError, OSError) as e:  # not fatal: the limits still hold
        log.info("the open-file limit stays as it is: %s", e)


def cluster_hosts(setting: str, me: str) -> list[str]:
    """Where the cluster port listens: the addresses given (comma-separated), or for
    "auto" every address of this machine that isn't on the internet (private, link-local
    such as a Thunderbolt bridge's, loopback, carrier-grade NAT as VPNs use) and the one
    this node announces; never a public address it wasn't told to use."""
    if setting != "auto":
        return [h.strip() for h in setting.split(",") if h.strip()]
    import ipaddress
    out = ["127.0.0.1"]
    try:
        import ifaddr  # zeroconf's own dependency
        adapters = ifaddr.get_adapters()
    except Exception as e:  # noqa: BLE001 - an odd interface list is not fatal
        log.warning("can't list this machine's interfaces (%s); the cluster port listens "
                    "on %s only", e, me)
        adapters = []
    for a in adapters:
        for ip in a.ips:
            if isinstance(ip.ip, str) and not ipaddress.ip_address(ip.ip).is_global:
                out.append(ip.ip)
    if me not in out:
        out.append(me)
    return list(dict.fromkeys(out))


async def _rescan(listen_cluster: Any, me: str) -> None:
    while True:
        await asyncio.sleep(RESCAN_S)
        try:
            await listen_cluster(await asyncio.to_thread(cluster_hosts, "auto", me))
        except ShoalError as e:
            log.warning("%s", e.message)


def _advertised(host: str, interfaces: list[str]) -> str:
    """The address other nodes reach this one at (for MLX's ring and the doorbells)."""
    if host not in ("0.0.0.0", "::", "", "auto"):
        first = host.split(",")[0].strip()
        return "127.0.0.1" if first == "localhost" else first
    if interfaces:
        return interfaces[0]
    try:  # the address of the interface that holds the default route
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET: nothing is sent by connect()
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


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
