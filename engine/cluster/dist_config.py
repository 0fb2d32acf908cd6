"""A group's configuration: the file the owner node writes for each rank (`DistConfig`), the
same on every rank but for `rank`, read back by the rank's worker
(engine/runtime/group/distributed.py) and carried in the cluster's records."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from engine.errors import BadRequest
from engine.placement.validate import max_lanes

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
