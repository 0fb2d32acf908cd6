"""One model across several worker processes: MLX's environment, a watchdog that bounds
every wait, and the fatal path that takes a broken group down.

The node writes one CONFIG.json per rank (engine/cluster/dist_config.py); the worker turns
it into the files and variables MLX reads (no ssh, no mlx.launch) and calls
`mx.distributed.init`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from engine.cluster.dist_config import BadDistConfig, DistConfig

log = logging.getLogger(__name__)

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
