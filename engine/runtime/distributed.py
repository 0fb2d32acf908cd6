"""One model across several worker processes: the group's configuration, MLX's environment,
a watchdog that bounds every wait, and the fatal path that takes a broken group down.

The node writes one CONFIG.json per rank (see `DistConfig`); the worker turns it into the
files and variables MLX reads (no ssh, no mlx.launch) and calls `mx.distributed.init`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args

from engine.errors import BadRequest
from engine.placement.validate import max_lanes

log = logging.getLogger(__name__)

Backend = Literal["ring", "jaccl", "jaccl-ring"]  # MLX's TCP ring; RDMA over Thunderbolt
BACKENDS: tuple[str, ...] = get_args(Backend)
STRATEGIES = ("pipeline", "tensor")


class BadDistConfig(BadRequest):
    code = "bad_dist_config"


def _addr(s: Any, what: str) -> str:
    host, _, port = s.rpartition(":") if isinstance(s, str) else ("", "", "")
    if not host or not port.isdigit():
        raise BadDistConfig(f"{what} must be an \"ip:port\" string, not {s!r}.")
    return s


@dataclass(frozen=True)
class DistConfig:
    """This rank's view of the group; every rank gets the same file except for `rank`."""

    rank: int
    world: int
    backend: str
    hosts: tuple[str, ...]
    bells: tuple[str, ...]
    strategy: str
    layers: tuple[tuple[int, int], ...] = ()
    timeout_s: float = 30.0
    devices: tuple[tuple[str | None, ...], ...] | None = None
    coordinator: str | None = None
    prefix_cache_tokens: int = 0  # the prefix cache's budget, the same on every rank
    lanes: int = 1  # micro-batches a batching pipeline keeps in flight (group/batch.py)
    kv_bits: int | None = None  # quantized KV on every rank (8 or 4; None: 16 bits)
    context_limit: int | None = None  # the user's limit below the model's context
    # a random token the owner gives its ranks (over the cluster's TLS): a doorbell
    # connection that doesn't show it isn't from the group
    token: str = ""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DistConfig:
        try:
            rank, world = int(d["rank"]), int(d["world"])
            backend, strategy = str(d.get("backend", "ring")), str(d["strategy"])
            hosts = tuple(_addr(h, "hosts[]") for h in d.get("hosts") or ())
            bells = tuple(_addr(b, "bells[]") for b in d["bells"])
            layers = tuple((int(s), int(e)) for s, e in d.get("layers") or ())
            timeout = float(d.get("timeout_s", 30))
            devices = d.get("devices")
            prefix_tokens = int(d.get("prefix_cache_tokens") or 0)
            lanes = int(d.get("lanes", 1))
            kv_bits = None if d.get("kv_bits") is None else int(d["kv_bits"])
            limit = None if d.get("context_limit") is None else int(d["context_limit"])
            token = str(d.get("token") or "")
        except (KeyError, TypeError, ValueError) as e:
            raise BadDistConfig(f"The distributed config is incomplete or malformed ({e}).") from e
        if world < 2 or not 0 <= rank < world:
            raise BadDistConfig(f"rank {rank} / world {world} is not a group of two or more.")
        if backend not in BACKENDS or strategy not in STRATEGIES:
            raise BadDistConfig(f"Unknown backend {backend!r} or strategy {strategy!r}.")
        if len(bells) != world or (backend == "ring" and len(hosts) != world):
            raise BadDistConfig(f"hosts and bells need one address per rank ({world}).")
        if strategy == "pipeline":
            check_layer_ranges(layers, world)
        if backend != "ring":
            if not devices or len(devices) != world or any(len(r) != world for r in devices) \
                    or any(devices[i][i] is not None for i in range(world)):
                raise BadDistConfig("jaccl needs an N×N \"devices\" matrix with a null diagonal.")
            _addr(d.get("coordinator"), "coordinator")
            devices = tuple(tuple(r) for r in devices)
        if timeout <= 0:
            raise BadDistConfig("timeout_s must be positive.")
        if kv_bits not in (None, 4, 8):
            raise BadDistConfig(f"kv_bits must be 8 or 4 (or absent for 16-bit KV), not "
                                f"{kv_bits}.")
        if not 1 <= lanes <= max_lanes(strategy, world):
            raise BadDistConfig(f"lanes must be 1 to {world} for a pipeline (one per rank at "
                                f"most), and 1 for tensor; not {lanes}.")
        return cls(rank, world, backend, hosts, bells, strategy, layers, timeout,
                   devices, d.get("coordinator"), max(0, prefix_tokens), lanes, kv_bits,
                   limit if limit and limit > 0 else None, token)

    def to_json(self) -> dict[str, Any]:
        """The JSON the node writes (and from_json reads back)."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_file(cls, path: Path) -> DistConfig:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise BadDistConfig(f"Couldn't read the distributed config {path}: {e}") from e
        if not isinstance(data, dict):
            raise BadDistConfig(f"The distributed config {path} is not a JSON object.")
        return cls.from_json(data)

    @property
    def successor(self) -> int:
        return (self.rank + 1) % self.world

    @property
    def predecessor(self) -> int:
        return (self.rank - 1) % self.world

    def where(self, rank: int) -> str:
        """How messages name a peer: "rank 2 (10.0.0.3:5001)"."""
        addr = self.hosts[rank] if rank < len(self.hosts) else self.bells[rank]
        return f"rank {rank} ({addr})"

    @property
    def group_id(self) -> bytes:
        """Same on every rank of one group, different between groups, and unknown outside
        it (the token): checked at connect."""
        return hashlib.sha256(json.dumps([self.hosts, self.bells, self.strategy,
                                          self.layers, self.token]).encode()).digest()[:16]


def check_layer_ranges(layers: tuple[tuple[int, int], ...], world: int,
                       total: int | None = None) -> None:
    """Pipeline ranges: one per rank, non-empty, contiguous from layer 0 (to `total`)."""
    if len(layers) != world:
        raise BadDistConfig(f"layers needs one [start, end) range per rank ({world}).")
    at = 0
    for r, (s, e) in enumerate(layers):
        if s != at or e <= s:
            raise BadDistConfig(f"layers {list(map(list, layers))} are not contiguous, "
                                f"non-empty ranges starting at 0 (rank {r}).")
        at = e
    if total is not None and at != total:
        raise BadDistConfig(f"layers cover {at} layers but the model has {total}.")


def mlx_environment(cfg: DistConfig, folder: Path) -> dict[str, str]:
    """Write the files MLX reads for `cfg.backend` into `folder`; return the variables."""
    env = {"MLX_RANK": str(cfg.rank)}
    if cfg.backend == "ring":
        hostfile = folder / "mlx-hosts.json"
        hostfile.write_text(json.dumps([[h] for h in cfg.hosts]))
        env["MLX_HOSTFILE"] = str(hostfile)
    else:
        devices = folder / "mlx-ibv-devices.json"
        devices.write_text(json.dumps([list(r) for r in cfg.devices or ()]))
        env["MLX_IBV_DEVICES"] = str(devices)
        env["MLX_JACCL_COORDINATOR"] = str(cfg.coordinator)
        if cfg.backend == "jaccl-ring":
            env["MLX_JACCL_RING"] = "1"
    return env


class Watchdog:
    """Bounds waits on peers. `watch()` arms a deadline; a thread that wakes a few times a
    timeout calls `on_expire` when one passes. Arming is two attribute writes, so it costs
    nothing per step (waking the thread per step would, on two cores)."""

    def __init__(self, timeout_s: float, on_expire: Callable[[str, int | None], None]):
        self.timeout_s = timeout_s
        self._on_expire = on_expire
        self._armed: tuple[float, str, int | None] | None = None
        self._period = max(0.05, min(1.0, timeout_s / 10))
        threading.Thread(target=self._run, name="watchdog", daemon=True).start()

    @contextmanager
    def watch(self, what: str, peer: int | None = None,
              timeout_s: float | None = None) -> Iterator[None]:
        prev = self._armed
        self._armed = (time.monotonic() + (timeout_s or self.timeout_s), what, peer)
        try:
            yield
        finally:
            self._armed = prev

    def _run(self) -> None:
        while True:
            time.sleep(self._period)
            armed = self._armed
            if armed is not None and time.monotonic() > armed[0]:
                self._on_expire(armed[1], armed[2])
                return


class Fatal:
    """The one way out of a broken group: rank 0 fails the requests in flight, every rank
    reports a `fatal` event, and the process exits at once (threads may be stuck in MLX)."""

    def __init__(self, emit: Callable[..., None], cfg: DistConfig,
                 close: Callable[[], None] = lambda: None):
        self.emit = emit
        self.cfg = cfg
        self.close = close
        self.inflight: set[str] = set()  # rank 0: the requests in flight
        self._lock = threading.Lock()

    def __call__(self, code: str, message: str, peer: int | None = None,
                 exit_code: int = 1) -> NoReturn:
        with self._lock:  # the first failure is the one reported
            address = None if peer is None else self.cfg.hosts[peer] \
                if peer < len(self.cfg.hosts) else self.cfg.bells[peer]
            log.error("fatal (%s): %s", code, message)
            try:
                for rid in sorted(self.inflight):
                    self.emit("error", id=rid, code=code, message=message, param=None,
                              status=502)
                self.emit("fatal", code=code, message=message, rank=self.cfg.rank,
                          peer=peer, address=address)
                self.close()
            finally:
                os._exit(exit_code)

    def peer_lost(self, peer: int, why: str) -> NoReturn:
        self("peer_lost", f"Rank {self.cfg.rank} lost {self.cfg.where(peer)} of the "
             f"model's group: {why}. The instance must be restarted.", peer=peer)


def init_group(cfg: DistConfig, watchdog: Watchdog, folder: Path) -> Any:
    """`mx.distributed.init` for this config, bounded by the watchdog."""
    import mlx.core as mx

    os.environ.update(mlx_environment(cfg, folder))
    backend = "jaccl" if cfg.backend.startswith("jaccl") else cfg.backend
    peers = sorted({cfg.predecessor, cfg.successor})
    with watchdog.watch("MLX " + cfg.backend + " initialisation with "
                        + " and ".join(cfg.where(p) for p in peers), peers[0]):
        group = mx.distributed.init(backend=backend, strict=True)
    if group.size() != cfg.world or group.rank() != cfg.rank:
        raise BadDistConfig(f"MLX formed a group of {group.size()} with this process as rank "
                            f"{group.rank()}; the config says {cfg.world} and {cfg.rank}.")
    return group
